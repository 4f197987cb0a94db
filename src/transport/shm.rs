//! Shared-memory rings between two processes of one node (single producer, single consumer).
//!
//! The receiver creates its inbound ring as a file in `/dev/shm` (mode 0600, never an
//! existing file) under a random name that reveals nothing of the job, and tells the sender
//! the name over their authenticated connection; the sender maps the file and unlinks it. A message is cut into slots; the sender's writer thread copies each piece in,
//! and the receiver hands each slot straight to its sink (copy or reduction), so a byte is
//! written once into the ring and read once out of it, with sender and receiver working on
//! different slots at the same time.

use crate::error::{Error, Result};
use memmap2::MmapRaw;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Slots per ring.
const SLOTS: u64 = 4;
/// Payload bytes per slot.
pub const SLOT_BYTES: usize = 512 * 1024;
/// Per-slot header: tag, message length, piece length (u64 each).
const SLOT_HEAD: usize = 64;
/// Ring header: head (consumer) and tail (producer) on separate cache lines.
const RING_HEAD: usize = 128;
const RING_BYTES: usize = RING_HEAD + SLOTS as usize * (SLOT_HEAD + SLOT_BYTES);

/// One direction between two processes.
pub struct Ring {
    map: MmapRaw,
    path: Option<PathBuf>,
}

// SAFETY: the mapping is shared memory whose concurrent use follows the SPSC protocol below.
unsafe impl Send for Ring {}
// SAFETY: as above; the receiver's side is used under its own lock by the transport.
unsafe impl Sync for Ring {}

fn shm_dir() -> PathBuf {
    let d = PathBuf::from("/dev/shm");
    if d.is_dir() {
        d
    } else {
        std::env::temp_dir()
    }
}

/// Bytes of a ring file's random name.
pub const RING_NAME_BYTES: usize = 16;

/// The random name of a ring file (drawn by its creator, sent to its peer over the mesh).
pub type RingName = [u8; RING_NAME_BYTES];

/// The path of the ring file named `name`: `pccl-` and the name in hex, in `/dev/shm` (or the
/// temporary directory where there is none).
pub fn ring_path(name: &RingName) -> PathBuf {
    let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
    shm_dir().join(format!("pccl-{hex}"))
}

impl Ring {
    /// Creates the (inbound) ring file at `path`, readable and writable by this user only;
    /// an existing file (or link) there is an error, never reused.
    pub fn create(path: PathBuf) -> Result<Self> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::system(format!("cannot create {}: {e}", path.display())))?;
        f.set_len(RING_BYTES as u64)
            .map_err(|e| Error::system(format!("cannot size {}: {e}", path.display())))?;
        let map = MmapRaw::map_raw(&f)
            .map_err(|e| Error::system(format!("cannot map {}: {e}", path.display())))?;
        Ok(Ring {
            map,
            path: Some(path),
        })
    }

    /// Maps the ring another process created at `path`, then unlinks the file (the mapping
    /// stays valid, and nothing is left behind in /dev/shm).
    pub fn open(path: PathBuf) -> Result<Self> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::system(format!("cannot open {}: {e}", path.display())))?;
        let map = MmapRaw::map_raw(&f)
            .map_err(|e| Error::system(format!("cannot map {}: {e}", path.display())))?;
        if map.len() < RING_BYTES {
            return Err(Error::system(format!(
                "{} is too small to be a PCCL ring",
                path.display()
            )));
        }
        let _ = std::fs::remove_file(&path);
        Ok(Ring { map, path: None })
    }

    fn counter(&self, which: usize) -> &AtomicU64 {
        // SAFETY: offsets 0 and 64 are 8-byte aligned inside the mapping (page aligned), and
        // the memory is only ever accessed atomically at these offsets.
        unsafe { &*(self.map.as_mut_ptr().add(which * 64) as *const AtomicU64) }
    }

    fn slot(&self, i: u64) -> *mut u8 {
        let k = (i % SLOTS) as usize;
        // SAFETY: slot `k` lies inside the mapping (RING_BYTES checked at creation/open).
        unsafe {
            self.map
                .as_mut_ptr()
                .add(RING_HEAD + k * (SLOT_HEAD + SLOT_BYTES))
        }
    }

    fn wait(&self, deadline: Instant, ready: impl Fn() -> bool, what: &str) -> Result<()> {
        let mut spins = 0u32;
        while !ready() {
            spins += 1;
            if spins % 256 == 0 && Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "{what}: the peer process stopped (it may have died or be running a different \
                     collective; raise PCCL_TIMEOUT if it is only slow)"
                )));
            }
            if spins > 64 {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Producer side: copies one message into the ring, piece by piece.
    pub fn push(&self, tag: u64, data: &[u8], deadline: Instant) -> Result<()> {
        let (head, tail) = (self.counter(0), self.counter(1));
        let pieces = data.len().div_ceil(SLOT_BYTES).max(1);
        let mut t = tail.load(Ordering::Relaxed);
        for k in 0..pieces {
            self.wait(
                deadline,
                || t - head.load(Ordering::Acquire) < SLOTS,
                "sending through shared memory",
            )?;
            let off = k * SLOT_BYTES;
            let n = SLOT_BYTES.min(data.len() - off.min(data.len()));
            let s = self.slot(t);
            // SAFETY: the consumer is done with this slot (head passed it: Acquire above), and
            // it will not read it before the Release store of `tail` below.
            unsafe {
                let h = s as *mut u64;
                h.write(tag);
                h.add(1).write(data.len() as u64);
                h.add(2).write(n as u64);
                std::ptr::copy_nonoverlapping(data.as_ptr().add(off), s.add(SLOT_HEAD), n);
            }
            t += 1;
            tail.store(t, Ordering::Release);
        }
        Ok(())
    }

    /// Consumer side: hands the next message's pieces to `sink`; the message must carry
    /// `tag` and be `len` bytes.
    pub fn pop(
        &self,
        tag: u64,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<std::result::Result<(), (u64, u64)>> {
        let (head, tail) = (self.counter(0), self.counter(1));
        let pieces = len.div_ceil(SLOT_BYTES).max(1);
        let mut h = head.load(Ordering::Relaxed);
        for k in 0..pieces {
            self.wait(
                deadline,
                || tail.load(Ordering::Acquire) > h,
                "receiving through shared memory",
            )?;
            let s = self.slot(h);
            // SAFETY: the producer published this slot (Acquire above) and will not touch it
            // again before the Release store of `head` below.
            let (got_tag, got_len, n) = unsafe {
                let p = s as *const u64;
                (p.read(), p.add(1).read(), p.add(2).read() as usize)
            };
            if got_tag != tag || got_len != len as u64 || n > SLOT_BYTES {
                return Ok(Err((got_tag, got_len)));
            }
            // SAFETY: as above; `n <= SLOT_BYTES` was checked.
            let bytes = unsafe { std::slice::from_raw_parts(s.add(SLOT_HEAD), n) };
            sink(k * SLOT_BYTES, bytes);
            h += 1;
            head.store(h, Ordering::Release);
        }
        Ok(Ok(()))
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
