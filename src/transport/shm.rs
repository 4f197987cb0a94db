//! Shared-memory rings between two processes of one node (single producer, single consumer).
//!
//! The receiver creates its inbound ring as a file in `/dev/shm` (mode 0600, never an
//! existing file) under a random name that reveals nothing of the job, and tells the sender
//! the name over their authenticated connection; the sender maps the file and unlinks it. A message is cut into slots; the sender's writer thread copies each piece in,
//! and the receiver hands each slot straight to its sink (copy or reduction), so a byte is
//! written once into the ring and read once out of it, with sender and receiver working on
//! different slots at the same time.
//!
//! Every slot header says where its piece lies in its message, so a consumer that gave a
//! message up half-way (its collective failed) drops the rest of it by itself: a slot whose
//! piece does not start a message, or that carries [`ABANDONED`] (a producer that gave the
//! message up half-way), never starts one. Waiting is the transport's business: the ring only
//! answers whether a slot is free or published ([`Ring::has_room`], [`Ring::peek`]), so every
//! wait can look at the failure board, and a cut ring ([`Ring::close`]) is seen by both
//! sides.
//!
//! **Waiting without starving the peer.** A waiter spins briefly (the answer is often a few
//! microseconds away), yields a few times, then sleeps on a futex in the ring's header
//! ([`Ring::wait_published`], [`Ring::wait_room`]) for at most a short nap, so it looks at
//! the board and its deadline between naps. The other side rings that futex's bell after it
//! publishes (or frees) a slot, only when someone sleeps there: an uncontended publish costs
//! one fence and one load. On a host with more ranks than cores this matters most: a rank
//! that spun or yielded in a loop would take the core from the very peer it waits for.

use crate::error::{Error, Result};
use memmap2::MmapRaw;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Slots per ring.
const SLOTS: u64 = 4;
/// Payload bytes per slot.
pub const SLOT_BYTES: usize = 512 * 1024;
/// Per-slot header: tag, message length, piece offset, piece length, flags (u64 each).
const SLOT_HEAD: usize = 64;
/// Ring header: head (consumer), tail (producer) and the cut mark on separate cache lines;
/// the futex words ([`Bell`]) share the cut mark's line.
const RING_HEAD: usize = 192;

/// A futex in the ring header: a count of sleepers and the bell word they sleep on.
#[derive(Clone, Copy)]
struct Bell {
    waiters: usize,
    bell: usize,
}

/// Rung by the producer after it published a slot (the consumer sleeps on it).
const DATA: Bell = Bell {
    waiters: 136,
    bell: 140,
};
/// Rung by the consumer after it freed a slot (the producer sleeps on it when the ring is
/// full).
const ROOM: Bell = Bell {
    waiters: 144,
    bell: 148,
};
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
        // SAFETY: offsets 0, 64 and 128 are 8-byte aligned inside the mapping (page aligned,
        // at least RING_BYTES long), and the memory is only ever accessed atomically there.
        unsafe { &*(self.map.as_mut_ptr().add(which * 64) as *const AtomicU64) }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: the futex words (offsets 136..152) are 4-byte aligned inside the mapping's
        // header and only ever accessed atomically (here and by the kernel's futex calls).
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU32) }
    }

    /// Wakes whoever sleeps on `b` (after this side changed the ring).
    fn ring_bell(&self, b: Bell) {
        // Pairs with the fence in `sleep`: either the sleeper sees the change, or this side
        // sees the sleeper.
        fence(Ordering::SeqCst);
        if self.word(b.waiters).load(Ordering::SeqCst) != 0 {
            let bell = self.word(b.bell);
            bell.fetch_add(1, Ordering::SeqCst);
            futex_wake(bell);
        }
    }

    /// Sleeps on `b` until it rings or `max` passes, unless `ready()` (or a cut) already
    /// holds once this side announced itself. Wakes may be spurious: callers re-check.
    fn sleep(&self, b: Bell, max: Duration, ready: impl Fn() -> bool) {
        let (waiters, bell) = (self.word(b.waiters), self.word(b.bell));
        let seen = bell.load(Ordering::SeqCst);
        waiters.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !ready() && !self.is_closed() {
            futex_wait(bell, seen, max);
        }
        waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Consumer side: sleeps until the producer publishes a slot, the ring is cut, or `max`
    /// passes (or spuriously earlier).
    pub fn wait_published(&self, max: Duration) {
        self.sleep(DATA, max, || self.peek().is_some());
    }

    /// Producer side: sleeps until the consumer frees a slot, the ring is cut, or `max`
    /// passes (or spuriously earlier).
    pub fn wait_room(&self, max: Duration) {
        self.sleep(ROOM, max, || self.has_room());
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

    /// Producer side: whether a slot is free.
    pub fn has_room(&self) -> bool {
        let (head, tail) = (self.counter(0), self.counter(1));
        tail.load(Ordering::Relaxed) - head.load(Ordering::Acquire) < SLOTS
    }

    /// Producer side: fills the next slot with `head` and `data` (at most [`SLOT_BYTES`],
    /// `head.n` of them) and hands it to the consumer. Call only after [`Ring::has_room`]
    /// said yes, from the ring's one producer thread.
    pub fn publish(&self, head: SlotHead, data: &[u8]) {
        let tail = self.counter(1);
        let t = tail.load(Ordering::Relaxed);
        let n = data.len().min(SLOT_BYTES);
        let s = self.slot(t);
        // SAFETY: the consumer is done with this slot (`has_room` saw its head past it with
        // Acquire) and will not read it before the Release store of `tail` below; the header
        // words and `n <= SLOT_BYTES` payload bytes lie inside the slot.
        unsafe {
            let h = s as *mut u64;
            h.write(head.tag);
            h.add(1).write(head.len);
            h.add(2).write(head.off);
            h.add(3).write(n as u64);
            h.add(4).write(head.flags);
            std::ptr::copy_nonoverlapping(data.as_ptr(), s.add(SLOT_HEAD), n);
        }
        tail.store(t + 1, Ordering::Release);
        self.ring_bell(DATA);
    }

    /// Consumer side: the header of the next slot, if the producer published one.
    pub fn peek(&self) -> Option<SlotHead> {
        let (head, tail) = (self.counter(0), self.counter(1));
        let h = head.load(Ordering::Relaxed);
        if tail.load(Ordering::Acquire) <= h {
            return None;
        }
        let s = self.slot(h);
        // SAFETY: the producer published this slot (Acquire above) and will not touch it
        // again before the consumer's Release store of `head` (`take` / `skip`).
        let w = unsafe {
            let p = s as *const u64;
            [
                p.read(),
                p.add(1).read(),
                p.add(2).read(),
                p.add(3).read(),
                p.add(4).read(),
            ]
        };
        Some(SlotHead {
            tag: w[0],
            len: w[1],
            off: w[2],
            n: w[3].min(SLOT_BYTES as u64),
            flags: w[4],
        })
    }

    /// Consumer side: hands the next slot's payload to `sink`, then frees the slot. Call only
    /// after [`Ring::peek`] returned `head`, from the ring's one consumer thread.
    pub fn take(&self, head: &SlotHead, sink: impl FnOnce(&[u8])) {
        let h = self.counter(0).load(Ordering::Relaxed);
        let n = (head.n as usize).min(SLOT_BYTES);
        // SAFETY: published and not yet released (see `peek`); `n <= SLOT_BYTES`.
        let bytes = unsafe { std::slice::from_raw_parts(self.slot(h).add(SLOT_HEAD), n) };
        sink(bytes);
        self.counter(0).store(h + 1, Ordering::Release);
        self.ring_bell(ROOM);
    }

    /// Consumer side: frees the next slot without reading it (after [`Ring::peek`]).
    pub fn skip(&self) {
        let head = self.counter(0);
        head.store(head.load(Ordering::Relaxed) + 1, Ordering::Release);
        self.ring_bell(ROOM);
    }

    /// Marks the ring cut (fault injection `drop`): both sides see it while they wait.
    pub fn close(&self) {
        self.counter(2).store(1, Ordering::Release);
        self.ring_bell(DATA);
        self.ring_bell(ROOM);
    }

    /// Whether either side cut the ring.
    pub fn is_closed(&self) -> bool {
        self.counter(2).load(Ordering::Acquire) != 0
    }
}

/// The header of one slot: a piece of a message, or the mark of an abandoned one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHead {
    /// The message's stamp.
    pub tag: u64,
    /// The whole message's length.
    pub len: u64,
    /// Where this piece starts in the message (0 only for a message's first piece).
    pub off: u64,
    /// This piece's length.
    pub n: u64,
    /// [`ABANDONED`] or 0.
    pub flags: u64,
}

/// Slot flag: the sender gave the message up half-way; no more pieces of it follow.
pub const ABANDONED: u64 = 1;

/// Spins before a ring wait starts yielding.
const SPINS: u32 = 64;
/// Yields before it sleeps on the ring's futex.
const YIELDS: u32 = 8;
/// Longest sleep on a ring's futex between looks at the board and the deadline.
pub const NAP: Duration = Duration::from_millis(5);

/// How a ring wait spends an idle step: spin a little, yield a few times, then sleep on the
/// ring (see the module's doc).
#[derive(Default)]
pub struct Patience {
    n: u32,
}

impl Patience {
    /// Spins or yields once and returns true while the wait should keep doing so; false once
    /// it should sleep on the ring ([`Ring::wait_published`], [`Ring::wait_room`]) and look
    /// at slower conditions (the board, the deadline, the peer's state) between sleeps.
    pub fn busy(&mut self) -> bool {
        if self.n < SPINS {
            self.n += 1;
            std::hint::spin_loop();
            true
        } else if self.n < SPINS + YIELDS {
            self.n += 1;
            std::thread::yield_now();
            true
        } else {
            false
        }
    }
}

/// `FUTEX_WAIT` on a word of a shared mapping (not process-private: the peer is another
/// process) while it holds `seen`, for at most `max`.
fn futex_wait(word: &AtomicU32, seen: u32, max: Duration) {
    let ts = libc::timespec {
        tv_sec: max.as_secs() as libc::time_t,
        tv_nsec: max.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 4-byte atomic in a shared mapping; the kernel only
    // reads it and `ts`, which outlives the call. Every outcome (woken, value changed,
    // timed out, interrupted) is fine: callers re-check their condition.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

/// `FUTEX_WAKE` of every sleeper on `word` (shared, as [`futex_wait`]).
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 4-byte atomic; the kernel does not write it.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// Both ends of a fresh ring: (consumer, producer).
    fn pair() -> (Arc<Ring>, Arc<Ring>) {
        let name: RingName = crate::transport::secret::random_bytes().unwrap();
        let path = ring_path(&name);
        let consumer = Ring::create(path.clone()).unwrap();
        let producer = Ring::open(path).unwrap();
        (Arc::new(consumer), Arc::new(producer))
    }

    fn head(tag: u64, n: usize) -> SlotHead {
        SlotHead {
            tag,
            len: n as u64,
            off: 0,
            n: n as u64,
            flags: 0,
        }
    }

    const SLOW: Duration = Duration::from_millis(200);
    /// How soon after the other side acted a sleeper must be up (a loaded host is slow).
    const WAKE: Duration = Duration::from_millis(150);

    #[test]
    fn a_sleeping_consumer_wakes_when_a_slow_producer_publishes() {
        let (rx, tx) = pair();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || {
            std::thread::sleep(SLOW);
            tx.publish(head(7, 3), b"abc");
            Instant::now()
        });
        // A long nap: only the producer's bell can end it in time.
        while rx.peek().is_none() {
            rx.wait_published(Duration::from_secs(10));
        }
        let woke = Instant::now();
        let published = h.join().unwrap();
        assert!(woke - t0 >= SLOW, "woke before the publish");
        assert!(
            woke.saturating_duration_since(published) < WAKE,
            "woke {:?} after the publish",
            woke.saturating_duration_since(published)
        );
        let got = rx.peek().unwrap();
        assert_eq!(got.tag, 7);
        let mut bytes = Vec::new();
        rx.take(&got, |b| bytes.extend_from_slice(b));
        assert_eq!(bytes, b"abc");
    }

    #[test]
    fn a_sleeping_producer_wakes_when_a_slow_consumer_frees_a_slot() {
        let (rx, tx) = pair();
        for i in 0..SLOTS {
            assert!(tx.has_room());
            tx.publish(head(i, 1), b"x");
        }
        assert!(!tx.has_room());
        let h = std::thread::spawn(move || {
            std::thread::sleep(SLOW);
            let got = rx.peek().unwrap();
            rx.take(&got, |_| {});
            Instant::now()
        });
        let t0 = Instant::now();
        while !tx.has_room() {
            tx.wait_room(Duration::from_secs(10));
        }
        let woke = Instant::now();
        let freed = h.join().unwrap();
        assert!(woke - t0 >= SLOW - Duration::from_millis(5));
        assert!(woke.saturating_duration_since(freed) < WAKE);
    }

    #[test]
    fn a_cut_ring_wakes_its_sleepers() {
        let (rx, tx) = pair();
        let h = std::thread::spawn(move || {
            std::thread::sleep(SLOW);
            tx.close();
            Instant::now()
        });
        while !rx.is_closed() {
            rx.wait_published(Duration::from_secs(10));
        }
        let woke = Instant::now();
        assert!(woke.saturating_duration_since(h.join().unwrap()) < WAKE);
    }

    #[test]
    fn a_wait_on_a_silent_peer_ends_at_its_nap() {
        // A dead producer never rings: the sleeper is back within its nap to look at the
        // board and its deadline.
        let (rx, _tx) = pair();
        let t0 = Instant::now();
        rx.wait_published(NAP);
        let took = t0.elapsed();
        assert!(rx.peek().is_none());
        assert!(took < NAP + WAKE, "a {NAP:?} nap took {took:?}");
    }

    #[test]
    fn patience_spins_then_asks_to_sleep() {
        let mut p = Patience::default();
        let busy = (0..SPINS + YIELDS + 10).filter(|_| p.busy()).count();
        assert_eq!(busy as u32, SPINS + YIELDS);
        assert!(!p.busy());
    }
}
