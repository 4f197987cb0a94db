//! The MPI transport's messages, notices and waits, under faults.
//!
//! **Framing.** A message is a 24-byte header (its full 64-bit stamp, its length, the sender's
//! piece size) followed by its pieces. The MPI tag holds only the collective's sequence number
//! (headers on `1 + 2·(seq mod W)`, pieces on the next tag, `W = (MPI_TAG_UB - 1) / 2`), so
//! MPI never matches one collective's data with another's receive. The receiver pre-posts
//! only the header receive (every header is 24 bytes), then checks the header: the exact
//! stamp, length and piece size, or the message is refused (a different call of the same
//! collective: [`faults::mismatch`]) or dropped (a stale message of a sequence number `W`
//! collectives back). The pieces are matched with `MPI_Improbe` and received at their probed
//! size with `MPI_Imrecv` (no round trip is added: the sender posts them with the header), so
//! no receive is ever truncated — MPICH 4.0 reports a truncation in `MPI_Test` on
//! `MPI_COMM_WORLD`'s fatal handler, whatever our communicator's handler, aborting the job.
//! The pieces of a refused or dropped message are received at their own size and thrown away
//! (the sender's requests complete), never left to match later.
//!
//! **Notices and the board.** Notices ([`Notice`]) travel on tag 0 of the same communicator;
//! every wait polls them (`MPI_Improbe` from any source) every millisecond, records them on
//! the board, and checks [`Faults::check`], so a refusal or an abort anywhere ends every wait.
//!
//! **Leftovers.** Messages of a failed collective that nobody will receive are drained by every
//! later wait (the "janitor": the last few failed sequence numbers, from any source), so a
//! peer's send blocked on them completes and MPI's unexpected queue does not grow.
//!
//! **Buffers.** A request is never released while MPI may still use its buffer. A wait that
//! gives up cancels its requests and waits (up to [`CONFIRM`]) for MPI to confirm each ended.
//! MPICH cannot cancel a send that was not matched (its UCX device never can): the send ends
//! only when the peer drains it. If MPI cannot confirm in time, a request on PCCL's own buffer
//! is leaked with its buffer (and `MPI_Finalize` is skipped at exit); a request on the
//! caller's buffer ends the job with `MPI_Abort` and a message naming the peer, since control
//! cannot return to a caller whose buffer MPI may still read or write.

use super::{call, check, is_finalized};

mod notices;
mod recv;
mod send;
use crate::error::{Error, Result};
use crate::transport::faults::{self, Faults, Tag};
pub(crate) use crate::transport::seg_parts;
use crate::transport::staging::Staging;
use crate::transport::Notice;
use mpi::ffi;
pub use recv::{Dest, Direct, Scattered, Staged};
pub use send::MpiSend;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The MPI tag of notices.
const NOTICE_TAG: i32 = 0;
/// Header: stamp, length, piece size.
const HEADER: usize = 24;
/// How long a cancelled request may take to end before PCCL gives up on it.
pub const CONFIRM: Duration = Duration::from_secs(1);
/// How often a wait polls notices, drains leftovers and checks the board.
const SERVICE: Duration = Duration::from_millis(1);
/// Failed collectives whose leftovers are drained.
const JUNK_KEPT: usize = 16;
/// Notices being sent at most (more are dropped: notices are best effort).
const OUTBOX_MAX: usize = 4096;
/// Pieces a staged receive keeps in flight.
const DEPTH: usize = 3;

/// Transports whose latest collective failed, over the process.
static UNSETTLED: AtomicUsize = AtomicUsize::new(0);
/// Requests PCCL gave up on (their buffers leaked), over the process.
static LEAKED: AtomicUsize = AtomicUsize::new(0);
/// The latest failure, for the message at exit.
static LAST_FAILURE: Mutex<String> = Mutex::new(String::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why `MPI_Finalize` could hang or is unsafe now: a collective failed and was not followed
/// by a successful one (its peers may never reach `MPI_Finalize`), or a request PCCL gave up
/// on may still be in flight. `None` when finalising is safe.
pub fn unsettled() -> Option<String> {
    let leaked = LEAKED.load(Ordering::SeqCst);
    let failed = UNSETTLED.load(Ordering::SeqCst);
    if leaked == 0 && failed == 0 {
        return None;
    }
    let last = lock(&LAST_FAILURE).clone();
    Some(if leaked > 0 {
        format!("{leaked} MPI request(s) could not be cancelled (last failure: {last})")
    } else {
        format!("a collective failed: {last}")
    })
}

/// Live transports, which the service thread keeps draining.
static LIVE: Mutex<Vec<Weak<Core>>> = Mutex::new(Vec::new());
/// The service thread and its stop flag.
static SERVICE_THREAD: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>> =
    Mutex::new(None);

/// Registers `core` with the service thread.
pub fn register(core: &Arc<Core>) {
    let mut live = lock(&LIVE);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(core));
}

/// Starts the service thread (once): every 2 ms it takes notices and drains leftovers on every
/// live transport, so a rank outside PCCL (computing, sleeping, or stalled) still takes the
/// messages of a failed collective that a peer's send waits on. Only while PCCL owns MPI (it
/// is stopped by [`stop_service`] before `MPI_Finalize`).
pub fn start_service() {
    let mut st = lock(&SERVICE_THREAD);
    if st.is_some() {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("pccl-mpi-service".into())
        .spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                let cores: Vec<Arc<Core>> = lock(&LIVE).iter().filter_map(Weak::upgrade).collect();
                for c in &cores {
                    c.service();
                }
                drop(cores);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
    if let Ok(h) = spawned {
        *st = Some((stop, h));
    }
}

/// Stops the service thread (before `MPI_Finalize`).
pub fn stop_service() {
    let st = lock(&SERVICE_THREAD).take();
    if let Some((stop, h)) = st {
        stop.store(true, Ordering::SeqCst);
        let _ = h.join();
    }
}

/// An MPI request handle (plain data; completed from any thread).
#[derive(Clone, Copy)]
struct Req(ffi::MPI_Request);

// SAFETY: a request handle may be tested or cancelled from any thread (calls serialised by
// `call` when MPI is not MPI_THREAD_MULTIPLE).
unsafe impl Send for Req {}

/// A message matched by `MPI_Improbe`, not yet received.
struct Probed(ffi::MPI_Message);

impl Req {
    fn live(&self) -> bool {
        // SAFETY: reading the exported null-request constant.
        self.0 != unsafe { ffi::RSMPI_REQUEST_NULL }
    }
}

fn zero_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is plain integers.
    unsafe { std::mem::zeroed() }
}

/// The number of pieces of a `len`-byte message cut at `chunk` bytes (one for empty).
pub fn pieces(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk.max(1)).max(1)
}

/// Piece `k`'s (offset, length).
fn piece(len: usize, chunk: usize, k: usize) -> (usize, usize) {
    let off = (k * chunk).min(len);
    (off, chunk.min(len - off))
}

/// One communicator's link state: see the module documentation.
pub struct Core {
    /// Our own duplicate communicator (freed by the owner's `Drop`).
    pub comm: ffi::MPI_Comm,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Piece size in bytes (below 2^31).
    pub chunk: usize,
    /// Sequence numbers the tag space tells apart.
    window: u32,
    /// The failure board.
    pub faults: Faults,
    /// Failed collectives (sequence numbers) whose leftover messages are drained.
    junk: Mutex<VecDeque<u32>>,
    any_junk: AtomicBool,
    /// The newest sequence number this rank sent or received.
    latest: AtomicU32,
    /// Notices still being sent, with their buffers.
    outbox: Mutex<Vec<(Req, Box<[u8]>)>>,
    /// This transport's unrecovered failure (its sequence number).
    failed: Mutex<Option<u32>>,
    any_failed: AtomicBool,
    /// The communicator was aborted (here or by a peer): every message on it is a leftover.
    finished: AtomicBool,
}

// SAFETY: MPI handles may be used from any thread (serialised by `call` when needed); the
// rest is atomics and mutexes.
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

impl Drop for Core {
    fn drop(&mut self) {
        if !mpi::environment::is_initialized() || is_finalized() {
            return;
        }
        // Notices and leftovers that arrived since the last wait, so MPI holds none at exit.
        self.service();
        let mut out = std::mem::take(&mut *lock(&self.outbox));
        let mut reqs: Vec<Req> = out.iter().map(|(r, _)| *r).collect();
        let (_, live) = self.retire(&mut reqs);
        if live > 0 {
            // A notice nobody received: its buffers stay with MPI.
            self.give_up(live, std::mem::take(&mut out));
        }
        // SAFETY: `comm` is this transport's own duplicate, freed once here.
        call(|| unsafe { ffi::MPI_Comm_free(&mut self.comm) });
    }
}

impl Core {
    /// The piece size of a call: `piece` (the call's own) or the creation-time size, within
    /// the bounds MPI counts allow.
    pub fn cut(&self, piece: Option<usize>) -> usize {
        piece.map_or(self.chunk, |p| p.clamp(4096, i32::MAX as usize))
    }

    /// Link state over `comm` (a communicator this transport owns, errors returned).
    pub fn new(comm: ffi::MPI_Comm, rank: usize, size: usize, chunk: usize) -> Result<Core> {
        let mut ub: *mut i32 = std::ptr::null_mut();
        let mut flag = 0;
        // SAFETY: MPI_TAG_UB's value is a pointer to an int owned by MPI, written into `ub`.
        check(
            call(|| unsafe {
                ffi::MPI_Comm_get_attr(
                    comm,
                    ffi::MPI_TAG_UB as i32,
                    &mut ub as *mut *mut i32 as *mut _,
                    &mut flag,
                )
            }),
            "MPI_Comm_get_attr(MPI_TAG_UB)",
        )?;
        let tag_ub = if flag != 0 && !ub.is_null() {
            // SAFETY: MPI returned a pointer to its attribute value, valid for the process.
            unsafe { *ub }
        } else {
            32767
        };
        Ok(Core {
            comm,
            rank,
            size,
            chunk: chunk.clamp(4096, i32::MAX as usize),
            window: ((tag_ub.max(32767) - 1) / 2) as u32,
            faults: Faults::default(),
            junk: Mutex::new(VecDeque::new()),
            any_junk: AtomicBool::new(false),
            latest: AtomicU32::new(0),
            outbox: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            any_failed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        })
    }

    fn header_tag(&self, seq: u32) -> i32 {
        1 + 2 * (seq % self.window) as i32
    }

    fn seen(&self, tag: Tag) {
        self.latest.store(faults::seq_of(tag), Ordering::Relaxed);
    }

    // ---- failures and exit ----------------------------------------------------------------

    /// Records that collective `seq` failed here (`why`), for the exit decision.
    pub fn note_failure(&self, seq: u32, why: &str) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            UNSETTLED.fetch_add(1, Ordering::SeqCst);
        }
        *f = Some(seq);
        self.any_failed.store(true, Ordering::SeqCst);
        *lock(&LAST_FAILURE) = format!("rank {}: {why}", self.rank);
    }

    /// A message of `tag` went through: a later collective than the failed one settles it.
    fn note_success(&self, tag: Tag) {
        if !self.any_failed.load(Ordering::Relaxed) {
            return;
        }
        let mut f = lock(&self.failed);
        if let Some(s) = *f {
            let later = faults::seq_of(tag).wrapping_sub(s) as i32 > 0;
            if later && self.faults.check(tag, self.rank).is_ok() {
                *f = None;
                self.any_failed.store(false, Ordering::SeqCst);
                UNSETTLED.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Ends the job: MPI still uses the caller's memory and control cannot return.
    fn fatal(&self, what: &str) -> ! {
        eprintln!(
            "PCCL FATAL rank {}: {what}; MPI could not confirm the request ended within {:?}, so \
             the caller's buffer cannot be released: ending the job with MPI_Abort",
            self.rank, CONFIRM
        );
        // Give the launcher a moment to forward the message before it kills the job.
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: aborting the job through the world communicator; it does not return.
        call(|| unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 70) });
        std::process::abort()
    }

    // ---- requests -------------------------------------------------------------------------

    /// Tests `req` once; true (and the request released by MPI) when it has ended.
    fn test(&self, req: &mut Req) -> bool {
        if !req.live() {
            return true;
        }
        let mut flag = 0;
        let mut status = zero_status();
        // SAFETY: `req` is a live request we posted.
        let rc = call(|| unsafe { ffi::MPI_Test(&mut req.0, &mut flag, &mut status) });
        flag != 0 || (rc != 0 && !req.live())
    }

    /// Tests the live request `req` once: `Ok(true)` (released by MPI) when it has ended.
    fn test_ok(&self, req: &mut Req) -> Result<bool> {
        let mut flag = 0;
        let mut status = zero_status();
        // SAFETY: `req` is a live request we posted.
        let rc = call(|| unsafe { ffi::MPI_Test(&mut req.0, &mut flag, &mut status) });
        check(rc, "MPI_Test")?;
        Ok(flag != 0)
    }

    /// Waits for `req`, polling notices and the board; `Err` (the request still live) on a
    /// failure on the board, the deadline, or an MPI error.
    fn poll(
        &self,
        req: &mut Req,
        tag: Tag,
        peer: usize,
        deadline: Instant,
        what: &str,
    ) -> Result<ffi::MPI_Status> {
        self.spin(tag, peer, deadline, what, || {
            let mut flag = 0;
            let mut status = zero_status();
            // SAFETY: `req` is a live request we posted.
            let rc = call(|| unsafe { ffi::MPI_Test(&mut req.0, &mut flag, &mut status) });
            if rc != 0 {
                check(rc, what)?;
            }
            Ok((flag != 0).then_some(status))
        })
    }

    /// Calls `step` until it yields a value, taking notices and checking the board every
    /// [`SERVICE`]; `Err` on a failure on the board, the deadline, or `step`'s error.
    fn spin<T>(
        &self,
        tag: Tag,
        peer: usize,
        deadline: Instant,
        what: &str,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let mut next = Instant::now() + SERVICE;
        let mut spins = 0u32;
        loop {
            if let Some(v) = step()? {
                return Ok(v);
            }
            spins = spins.wrapping_add(1);
            if spins % 16 == 0 {
                let now = Instant::now();
                if now >= next {
                    self.service();
                    self.faults.check(tag, peer)?;
                    next = now + SERVICE;
                }
                if now >= deadline {
                    self.faults.check(tag, peer)?;
                    return Err(faults::timed_out(self.rank, peer, what, true));
                }
            }
            std::thread::yield_now();
        }
    }

    /// Cancels every live request of `reqs` and waits (up to [`CONFIRM`]) for each to end;
    /// returns (how many ended by completing instead of being cancelled, how many are still
    /// live).
    fn retire(&self, reqs: &mut [Req]) -> (usize, usize) {
        for r in reqs.iter_mut().filter(|r| r.live()) {
            // SAFETY: cancelling a live request we posted (it stays live until tested).
            call(|| unsafe { ffi::MPI_Cancel(&mut r.0) });
        }
        let end = Instant::now() + CONFIRM;
        let mut completed = 0;
        loop {
            let mut live = 0;
            for r in reqs.iter_mut().filter(|r| r.live()) {
                let mut flag = 0;
                let mut status = zero_status();
                // SAFETY: `r` is a live request we posted.
                let rc = call(|| unsafe { ffi::MPI_Test(&mut r.0, &mut flag, &mut status) });
                if flag != 0 {
                    let mut cancelled = 0;
                    // SAFETY: `status` belongs to the request that just ended.
                    call(|| unsafe { ffi::MPI_Test_cancelled(&status, &mut cancelled) });
                    if cancelled == 0 {
                        completed += 1;
                    }
                } else if rc != 0 && !r.live() {
                    completed += 1; // ended with an error (truncated): it matched a message
                } else {
                    live += 1;
                }
            }
            if live == 0 || Instant::now() >= end {
                return (completed, live);
            }
            self.service();
            std::thread::yield_now();
        }
    }

    /// [`Core::retire`] for requests on the caller's memory: ends the job if one stays live.
    fn retire_or_die(&self, reqs: &mut [Req], what: &str) -> usize {
        let (completed, live) = self.retire(reqs);
        if live > 0 {
            self.fatal(what);
        }
        completed
    }

    /// Leaks a live request's own buffer (MPI may still use it) and counts it.
    fn give_up<T>(&self, live: usize, buf: T) {
        if live > 0 {
            std::mem::forget(buf);
            LEAKED.fetch_add(live, Ordering::SeqCst);
            *lock(&LAST_FAILURE) = format!("rank {}: a request outlived its wait", self.rank);
        }
    }

    /// Receives (and discards) `count` pieces on `tag` from `peer`, until `until`.
    fn drain(&self, peer: usize, tag: i32, count: usize, until: Instant) {
        let mut left = count;
        while left > 0 && Instant::now() < until {
            if self.take(peer as i32, tag).is_some() {
                left -= 1;
            } else {
                self.service();
                std::thread::yield_now();
            }
        }
    }

    fn irecv(&self, ptr: *mut u8, len: usize, peer: usize, tag: i32) -> Result<Req> {
        let mut req = Req(null_req());
        // SAFETY: the caller keeps `len` bytes at `ptr` valid until the request ends.
        let rc = call(|| unsafe {
            ffi::MPI_Irecv(
                ptr as *mut _,
                len as i32,
                ffi::RSMPI_UINT8_T,
                peer as i32,
                tag,
                self.comm,
                &mut req.0,
            )
        });
        check(rc, "MPI_Irecv")?;
        Ok(req)
    }

    fn isend_bytes(&self, ptr: *const u8, len: usize, peer: usize, tag: i32) -> Result<Req> {
        let mut req = Req(null_req());
        // SAFETY: the caller keeps `len` bytes at `ptr` valid until the request ends.
        let rc = call(|| unsafe {
            ffi::MPI_Isend(
                ptr as *const _,
                len as i32,
                ffi::RSMPI_UINT8_T,
                peer as i32,
                tag,
                self.comm,
                &mut req.0,
            )
        });
        check(rc, "MPI_Isend")?;
        Ok(req)
    }
}

fn count_of(st: &ffi::MPI_Status) -> usize {
    let mut got = 0i32;
    // SAFETY: `st` came from a completed receive.
    call(|| unsafe { ffi::MPI_Get_count(st, ffi::RSMPI_UINT8_T, &mut got) });
    got.max(0) as usize
}

fn null_req() -> ffi::MPI_Request {
    // SAFETY: reading the exported null-request constant.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}
