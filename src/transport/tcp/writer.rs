//! The writer thread of each peer, and posted sends that can be given up.
//!
//! A send is a job on the peer's writer thread, which writes the caller's memory straight
//! into the socket (or the shared-memory ring) in bounded steps. Between steps it looks at
//! the job: a waiter whose collective failed (or whose deadline passed) asks it to stop, and
//! the writer then stops touching the caller's memory at once and says so, which is when
//! [`TcpSend::wait`] returns. The frame already begun is finished in the background — from
//! a buffer of zeros, marked abandoned by its trailer (socket) or by a marked slot (ring) —
//! so the peer's stream stays framed and the padding is never taken for data. A job still
//! queued is simply dropped. So no send outlives its collective's deadline by more than one
//! write step, and none holds the caller's memory after its wait returned.
//!
//! A small message with nothing queued before it skips the hand-off: the poster writes it
//! itself, into a shared-memory ring slot or into the socket without waiting (what the
//! socket takes now; a frame it took only part of is finished by the writer thread before
//! anything else, from where the poster stopped). On a busy host each hand-off to the writer
//! thread and back costs two wake-ups, which made small collectives CPU-bound.

use super::link::{lock, Link, Readiness};
use super::wire::{self, Got, Header, Kind, HEADER, TRAILER, TRAILER_ABANDONED, TRAILER_OK};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::shm::{Patience, Ring, SlotHead, ABANDONED, NAP, SLOT_BYTES};
use crate::transport::SendOp;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::Instant;

/// Bytes of the caller's memory one write step offers the socket.
const PIECE: usize = 1 << 20;
/// The largest message a poster writes into its socket itself (larger ones are written by
/// the writer thread while the caller goes on: a receive, a reduction).
const DIRECT_BYTES: usize = 64 * 1024;
/// Padding for abandoned frames.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Where a send job stands.
enum Phase {
    /// In the writer's queue.
    Queued,
    /// Being written from the caller's memory.
    Writing,
    /// The waiter asked the writer to stop using the caller's memory.
    Cancel,
    /// The writer no longer touches the caller's memory (given up, or never started).
    Released,
    /// The message is written (or failed: the error's text).
    Done(Option<String>),
}

/// One posted send.
pub(super) struct SendJob {
    tag: Tag,
    /// The caller's memory: `(address, bytes)` runs sent one after the other as one message
    /// (a vectored send's segments, written from where they lie: nothing packed).
    parts: Vec<(usize, usize)>,
    /// The message's length (the runs' total).
    len: usize,
    /// Bytes of the frame already written (by the poster, see [`direct`]).
    start: usize,
    phase: Mutex<Phase>,
    cv: Condvar,
}

impl SendJob {
    /// The writer takes the job; false if it was given up while queued.
    fn start(&self) -> bool {
        let mut p = lock(&self.phase);
        if matches!(*p, Phase::Queued) {
            *p = Phase::Writing;
            return true;
        }
        false
    }

    /// Between steps: whether the waiter gave the job up (it is then released).
    fn cancelled(&self) -> bool {
        let mut p = lock(&self.phase);
        if matches!(*p, Phase::Cancel) {
            *p = Phase::Released;
            self.cv.notify_all();
            return true;
        }
        false
    }

    /// Whether the job is still queued (not given up while the writer held it back).
    fn queued(&self) -> bool {
        matches!(*lock(&self.phase), Phase::Queued)
    }

    /// The caller's memory is no longer needed: report `r` unless the job was released.
    fn finish(&self, r: std::result::Result<(), String>) {
        let mut p = lock(&self.phase);
        if matches!(*p, Phase::Writing | Phase::Cancel) {
            *p = Phase::Done(r.err());
            self.cv.notify_all();
        }
    }

    /// The caller's bytes from message offset `off` to the end of the run holding it, at
    /// most `max` of them (empty at the end of the message).
    ///
    /// # Safety
    /// Only while the job is `Writing` (the `isend` contract keeps the memory valid until
    /// the waiter returned, which it does only once the job is released or done).
    unsafe fn bytes_at(&self, off: usize, max: usize) -> &[u8] {
        let mut at = off;
        for &(ptr, n) in &self.parts {
            if at < n {
                // SAFETY: as the caller guarantees: `n` valid bytes at `ptr`, `at < n`.
                return unsafe {
                    std::slice::from_raw_parts((ptr + at) as *const u8, (n - at).min(max))
                };
            }
            at -= n;
        }
        &[]
    }
}

/// What a writer thread is asked to do.
pub(super) enum Job {
    /// Write a message.
    Data(Arc<SendJob>),
    /// Write a control frame (notice, goodbye, ready).
    Control(Vec<u8>),
    /// Look again: the peer's "ready" came (for a writer holding a large message).
    Wake,
}

/// What every post checks first: the failure board, then the link. `Some`: the message is
/// already settled (across a partition, fault injection `isolate`: lost, silently).
fn admit(link: &Link, tag: Tag) -> Result<Option<Box<dyn SendOp>>> {
    link.touch();
    link.faults.check(tag, link.peer)?;
    if link.silenced() {
        return Ok(Some(Box::new(Sent)));
    }
    if link.broken() || link.left() {
        return Err(link.closed_error(tag));
    }
    Ok(None)
}

/// Queues a send of `len` bytes at `ptr` on `link`'s writer.
///
/// # Safety
/// As [`crate::transport::Transport::isend`]: the memory stays valid and unmodified until
/// the returned op's `wait` returned.
pub(super) unsafe fn post(
    link: &Arc<Link>,
    tag: Tag,
    ptr: *const u8,
    len: usize,
) -> Result<Box<dyn SendOp>> {
    if let Some(op) = admit(link, tag)? {
        return Ok(op);
    }
    // A peer reached by socket: the poster writes a small message itself when nothing is
    // queued or half-written before it and the socket takes it now.
    if link.ring_out.is_none()
        && len <= DIRECT_BYTES
        && !wire::rendezvous(tag, len, link.rendezvous)
    {
        // SAFETY: forwarded from the caller (the memory outlives the op's wait).
        if let Some(op) = unsafe { direct(link, tag, ptr, len) } {
            return Ok(op);
        }
    }
    // A same-host peer's ring: the poster publishes a message that fits a free slot itself
    // when nothing is queued before it (no hand-off to the writer thread and back, which on
    // a busy host costs two wake-ups per message).
    let _producer = match &link.ring_out {
        Some(ring) => {
            let g = lock(&link.ring_tx);
            if len <= SLOT_BYTES && link.queued.load(Ordering::Acquire) == 0 && ring.has_room() {
                if ring.is_closed() {
                    link.on_failure("it cut its shared-memory ring");
                    return Err(link.closed_error(tag));
                }
                let data: &[u8] = if len == 0 {
                    &[]
                } else {
                    // SAFETY: the caller keeps the memory valid during this call (the
                    // `isend` contract); it is read here and never after.
                    unsafe { std::slice::from_raw_parts(ptr, len) }
                };
                let head = SlotHead {
                    tag,
                    len: len as u64,
                    off: 0,
                    n: len as u64,
                    flags: 0,
                };
                ring.publish(head, data);
                return Ok(Box::new(Sent));
            }
            Some(g)
        }
        None => None,
    };
    enqueue(link, tag, vec![(ptr as usize, len)], len)
}

/// The shortest average run a vectored message is written from unpacked: the writer takes
/// one run per write step, and a copy of a few KiB costs less than a system call.
const MIN_RUN: usize = 32 * 1024;

/// Whether a vectored message of `len` bytes in `runs` non-empty runs to `link` is better
/// packed first ([`packs_vectored`], with the link's ring as the same host).
pub(super) fn packs(link: &Link, len: usize, runs: usize) -> bool {
    packs_vectored(len, runs, link.ring_out.is_some())
}

/// Whether the TCP transport packs a vectored message of `len` bytes in `runs` non-empty
/// runs before sending it: one small enough for the poster to write itself (a socket's
/// [`DIRECT_BYTES`], a ring slot to a peer on the same host), or one of short runs
/// ([`MIN_RUN`]). The model asks the same (`Strided::PackedSmall`).
pub(crate) fn packs_vectored(len: usize, runs: usize, same_host: bool) -> bool {
    len <= DIRECT_BYTES || (same_host && len <= SLOT_BYTES) || len < MIN_RUN * runs
}

/// Queues a send of the runs `parts` (`(pointer, bytes)`, in order) as one message on
/// `link`'s writer, which writes each run from where it lies: a strided message without
/// the copy that packing it would cost (and, to a same-host peer, into the ring directly).
///
/// # Safety
/// As [`post`], for every run.
pub(super) unsafe fn post_parts(
    link: &Arc<Link>,
    tag: Tag,
    parts: &[(*const u8, usize)],
) -> Result<Box<dyn SendOp>> {
    if let Some(op) = admit(link, tag)? {
        return Ok(op);
    }
    let len = parts.iter().map(|p| p.1).sum();
    let parts = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|&(p, n)| (p as usize, n))
        .collect();
    // A ring's messages are queued under its producer lock (see `post`).
    let _producer = link.ring_out.as_ref().map(|_| lock(&link.ring_tx));
    enqueue(link, tag, parts, len)
}

/// Hands a send job to `link`'s writer thread (the caller holds a ring's producer lock).
fn enqueue(
    link: &Arc<Link>,
    tag: Tag,
    parts: Vec<(usize, usize)>,
    len: usize,
) -> Result<Box<dyn SendOp>> {
    // Counted before it is queued (a ring's under its lock): a later poster sees it.
    link.queued.fetch_add(1, Ordering::AcqRel);
    let job = Arc::new(SendJob {
        tag,
        parts,
        len,
        start: 0,
        phase: Mutex::new(Phase::Queued),
        cv: Condvar::new(),
    });
    let sent = match lock(&link.writer).as_ref() {
        Some(tx) => tx.send(Job::Data(job.clone())).is_ok(),
        None => false,
    };
    if !sent {
        link.queued.fetch_sub(1, Ordering::AcqRel);
        return Err(link.closed_error(tag));
    }
    Ok(Box::new(TcpSend {
        job,
        link: link.clone(),
    }))
}

/// Writes the small message `len` bytes at `ptr` to `link`'s socket on the poster's thread,
/// when the socket's write side is free and nothing is queued before it: `None` when it must
/// go to the writer thread instead (the side busy, messages queued, a frame half-written, or
/// the socket took none of it now). A frame the socket took part of is left in `link.wr`
/// for the writer thread, which finishes it before anything else (from the caller's memory
/// until the body is written, so the op waits for that like a queued send).
///
/// # Safety
/// As [`post`].
unsafe fn direct(
    link: &Arc<Link>,
    tag: Tag,
    ptr: *const u8,
    len: usize,
) -> Option<Box<dyn SendOp>> {
    let mut w = match link.wr.try_lock() {
        Ok(w) => w,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    if w.is_some() || link.queued.load(Ordering::Acquire) != 0 || link.broken() {
        return None;
    }
    let data: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the caller keeps the memory valid until the op's wait returned (the `isend`
        // contract); here it is read during this call only.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    };
    let head = Header {
        kind: Kind::Data,
        tag,
        len: len as u64,
    }
    .encode();
    let trailer = TRAILER_OK.to_le_bytes();
    let n = send_now(link.fd, [&head, data, &trailer])?;
    if n == 0 {
        return None;
    }
    let body_done = n >= HEADER + len;
    if n < HEADER + len + TRAILER {
        // The writer thread writes the rest of the frame before anything else.
        let job = Arc::new(SendJob {
            tag,
            parts: vec![(ptr as usize, len)],
            len,
            start: n,
            phase: Mutex::new(if body_done {
                Phase::Done(None)
            } else {
                Phase::Writing
            }),
            cv: Condvar::new(),
        });
        link.queued.fetch_add(1, Ordering::AcqRel);
        *w = Some(job.clone());
        drop(w);
        let woke = lock(&link.writer)
            .as_ref()
            .is_some_and(|tx| tx.send(Job::Wake).is_ok());
        if !woke {
            // The transport is closing: nobody finishes the frame.
            if let Some(j) = lock(&link.wr).take() {
                j.finish(Err("the transport was closed".into()));
            }
        }
        if !body_done {
            return Some(Box::new(TcpSend {
                job,
                link: link.clone(),
            }));
        }
    }
    Some(Box::new(Sent))
}

/// Writes as much of the frame `parts` as the socket `fd` takes now, without waiting
/// (`MSG_DONTWAIT`; `MSG_NOSIGNAL`: a peer gone is an error, never a signal): the bytes
/// written, 0 when it takes nothing now, `None` on an error (the writer thread, taking the
/// message instead, meets it and reports it).
fn send_now(fd: RawFd, parts: [&[u8]; 3]) -> Option<usize> {
    let mut iov = parts.map(|p| libc::iovec {
        iov_base: p.as_ptr() as *mut libc::c_void,
        iov_len: p.len(),
    });
    // SAFETY: a zeroed msghdr is a valid empty one; only its iovec fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: `msg` points at `iov`, whose records describe the live slices `parts` for
        // the duration of the call; `fd` is the link's socket, open while the link lives.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Some(n as usize);
        }
        match std::io::Error::last_os_error().kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Some(0),
            _ => return None,
        }
    }
}

/// A send already complete when posted (published into a ring or written into the socket by
/// the poster).
struct Sent;

impl SendOp for Sent {
    fn wait(self: Box<Self>, _deadline: Instant) -> Result<()> {
        Ok(())
    }
}

/// A posted send on the TCP transport.
struct TcpSend {
    job: Arc<SendJob>,
    link: Arc<Link>,
}

impl SendOp for TcpSend {
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()> {
        let (link, job) = (&self.link, &self.job);
        let mut p = lock(&job.phase);
        let mut failure: Option<Error> = None;
        loop {
            match &*p {
                Phase::Done(None) if failure.is_none() => return Ok(()),
                Phase::Done(Some(msg)) if failure.is_none() => {
                    let msg = msg.clone();
                    drop(p);
                    link.faults.check(job.tag, link.peer)?;
                    if link.left() {
                        return Err(link.closed_error(job.tag));
                    }
                    return Err(Error::remote(format!(
                        "rank {} could not send to rank {}: {msg}",
                        link.rank, link.peer
                    )));
                }
                Phase::Done(_) | Phase::Released => {
                    return Err(failure.unwrap_or_else(|| Error::internal("send released twice")))
                }
                Phase::Queued | Phase::Writing if failure.is_none() => {
                    let f = link.faults.check(job.tag, link.peer).err().or_else(|| {
                        (Instant::now() >= deadline).then(|| {
                            faults::timed_out(
                                link.rank,
                                link.peer,
                                "sent a message never taken by",
                                true,
                            )
                        })
                    });
                    if let Some(e) = f {
                        if matches!(*p, Phase::Queued) {
                            *p = Phase::Released;
                            return Err(e);
                        }
                        *p = Phase::Cancel;
                        failure = Some(e);
                    }
                }
                _ => {}
            }
            let wait = if failure.is_some() {
                faults::POLL
            } else {
                deadline
                    .saturating_duration_since(Instant::now())
                    .clamp(std::time::Duration::from_millis(1), faults::POLL)
            };
            p = job
                .cv
                .wait_timeout(p, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The writer thread of a peer reached by socket: messages and control frames in order,
/// except that control frames overtake a large message held until the peer is ready for it
/// (see [`wire::RENDEZVOUS`]; the "ready" of this rank's own receive from that peer must get
/// through while the peer holds its message for this rank's "ready" in turn). Every frame is
/// written holding the socket's write side (`link.wr`), after the frame a poster left there
/// half-written.
pub(super) fn socket_writer(mut s: TcpStream, link: Arc<Link>, rx: Receiver<Job>) {
    let mut held: VecDeque<Job> = VecDeque::new();
    loop {
        let job = match held.pop_front() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => break,
            },
        };
        let mut w = lock(&link.wr);
        if let Some(p) = w.take() {
            finish_partial(&mut s, &link, &p);
        }
        let r = match job {
            Job::Wake => Ok(()),
            Job::Control(frame) => queued_control(&mut s, &link, &frame),
            Job::Data(j) => {
                let r = send_data(&mut s, &link, &j, &rx, &mut held);
                link.queued.fetch_sub(1, Ordering::AcqRel);
                r
            }
        };
        drop(w);
        if let Err(e) = r {
            if !link.broken() {
                link.on_failure(&format!("sending to it failed: {e}"));
            }
        }
    }
    // The transport closed: a frame a poster began is not finished by anyone.
    if let Some(p) = lock(&link.wr).take() {
        p.finish(Err("the transport was closed".into()));
        link.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Finishes the frame a poster began (`p.start` bytes of it written), from its caller's
/// memory, or from zeros once its waiter gave it up.
fn finish_partial(s: &mut TcpStream, link: &Link, p: &SendJob) {
    let r = if link.broken() {
        Err(closed())
    } else {
        write_data(s, link, p)
    };
    if let Err(e) = r {
        p.finish(Err(e.to_string()));
        if !link.broken() {
            link.on_failure(&format!("sending to it failed: {e}"));
        }
    }
    link.queued.fetch_sub(1, Ordering::AcqRel);
}

/// Writes message `j` (after the peer's "ready" where it waits for one); an error is the
/// connection's (the job is finished with it), a job given up or a link finished or
/// silenced is not one.
fn send_data(
    s: &mut TcpStream,
    link: &Link,
    j: &SendJob,
    rx: &Receiver<Job>,
    held: &mut VecDeque<Job>,
) -> std::io::Result<()> {
    if wire::rendezvous(j.tag, j.len, link.rendezvous) {
        if let Err(e) = await_ready(s, link, j, rx, held) {
            if !link.broken() {
                link.on_failure(&format!("sending to it failed: {e}"));
            }
        }
    }
    if !j.start() {
        return Ok(());
    }
    if link.broken() {
        j.finish(Err("the connection is closed".into()));
        return Ok(());
    }
    if link.silenced() {
        j.finish(Ok(()));
        return Ok(());
    }
    // Control frames queued meanwhile go first: a "ready" of this rank's own receive from
    // the peer would otherwise wait behind the whole message, and the peer's message to this
    // rank with it (the two directions in turn).
    if let Err(e) = write_controls(s, link, rx, held) {
        j.finish(Err(e.to_string()));
        return Err(e);
    }
    let r = write_data(s, link, j);
    if let Err(e) = &r {
        j.finish(Err(e.to_string()));
    }
    r
}

/// Writes the control frames already queued, keeping the messages among them in `held`
/// (in order).
fn write_controls(
    s: &mut TcpStream,
    link: &Link,
    rx: &Receiver<Job>,
    held: &mut VecDeque<Job>,
) -> std::io::Result<()> {
    while let Ok(job) = rx.try_recv() {
        match job {
            Job::Control(frame) => queued_control(s, link, &frame)?,
            Job::Wake => {}
            d @ Job::Data(_) => held.push_back(d),
        }
    }
    Ok(())
}

/// Holds large message `j` until the peer said it is ready for it (or waits for another
/// message: see [`Link::take_ready`]), writing the control frames queued meanwhile and
/// keeping the messages queued behind it in `held` (in order). Returns early, leaving the
/// caller to see why, once the job is given up, the link is finished or silenced, or the
/// transport closed; an error is a failed control write.
fn await_ready(
    s: &mut TcpStream,
    link: &Link,
    j: &SendJob,
    rx: &Receiver<Job>,
    held: &mut VecDeque<Job>,
) -> std::io::Result<()> {
    /// Ends the link's "awaiting" when the wait ends, however it does.
    struct Awaiting<'a>(&'a Link);
    impl Drop for Awaiting<'_> {
        fn drop(&mut self) {
            self.0.end_awaiting();
        }
    }
    let mut awaiting = None;
    while link.take_ready(j.tag, j.len) == Readiness::Wait {
        if !j.queued() || link.broken() || link.silenced() {
            return Ok(());
        }
        if awaiting.is_none() {
            // The monitor watches the socket at once from now on: look again after telling it.
            link.begin_awaiting();
            awaiting = Some(Awaiting(link));
            continue;
        }
        match rx.recv_timeout(faults::POLL) {
            Ok(Job::Control(frame)) => queued_control(s, link, &frame)?,
            Ok(Job::Wake) | Err(RecvTimeoutError::Timeout) => {}
            Ok(d @ Job::Data(_)) => held.push_back(d),
            Err(RecvTimeoutError::Disconnected) => {
                // The transport closed under a send nobody waits for any more.
                if j.start() {
                    j.finish(Err("the transport was closed".into()));
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotConnected, "the link is closed")
}

/// Writes a control frame [`Link::send_control`] queued (and counted in `link.queued`).
fn queued_control(s: &mut TcpStream, link: &Link, frame: &[u8]) -> std::io::Result<()> {
    let r = write_control(s, link, frame);
    link.queued.fetch_sub(1, Ordering::AcqRel);
    r
}

fn write_control(s: &mut TcpStream, link: &Link, frame: &[u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < frame.len() {
        if link.broken() {
            return Err(closed());
        }
        if let Got::Bytes(n) = wire::write_some(s, &[IoSlice::new(&frame[done..])])? {
            done += n;
        }
    }
    Ok(())
}

/// Writes one data frame: header, the caller's bytes (or zeros once the job is given up),
/// trailer. The job is finished as soon as the caller's bytes are all written.
fn write_data(s: &mut TcpStream, link: &Link, j: &SendJob) -> std::io::Result<()> {
    let head = Header {
        kind: Kind::Data,
        tag: j.tag,
        len: j.len as u64,
    }
    .encode();
    let body_end = HEADER + j.len;
    let total = body_end + TRAILER;
    let mut trailer = TRAILER_OK.to_le_bytes();
    let mut padding = false;
    let mut done = j.start.min(total);
    while done < total {
        if link.broken() {
            return Err(closed());
        }
        if link.silenced() {
            // Across a partition from now on: the rest is lost (the peer reads no more).
            j.finish(Ok(()));
            return Ok(());
        }
        if done < body_end && !padding && j.cancelled() {
            padding = true;
            trailer = TRAILER_ABANDONED.to_le_bytes();
        }
        let b = done.saturating_sub(HEADER).min(j.len);
        let body: &[u8] = if b == j.len {
            &[]
        } else if padding {
            let n = (j.len - b).min(ZEROS.len());
            &ZEROS[..n]
        } else {
            // SAFETY: the job is `Writing` (not given up: checked just above, and only this
            // thread releases it), so the caller's memory is valid.
            unsafe { j.bytes_at(b, PIECE) }
        };
        let mut parts: [IoSlice<'_>; 3] = [IoSlice::new(&[]); 3];
        let mut k = 0;
        if done < HEADER {
            parts[k] = IoSlice::new(&head[done..]);
            k += 1;
        }
        if b < j.len {
            parts[k] = IoSlice::new(body);
            k += 1;
        }
        if b + body.len() == j.len {
            let t = done.saturating_sub(body_end);
            parts[k] = IoSlice::new(&trailer[t..]);
            k += 1;
        }
        if let Got::Bytes(n) = wire::write_some(s, &parts[..k])? {
            let was_body = done < body_end;
            done += n;
            if was_body && done >= body_end && !padding {
                j.finish(Ok(()));
            }
        }
    }
    if j.len == 0 && !padding {
        j.finish(Ok(()));
    }
    Ok(())
}

/// The writer thread of a peer on this host: messages into its shared-memory ring (control
/// frames go on the pair's socket, see [`Link::send_control`]).
pub(super) fn ring_writer(ring: Arc<Ring>, link: Arc<Link>, rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let Job::Data(j) = job else { continue };
        if j.start() {
            if link.silenced() {
                j.finish(Ok(()));
            } else {
                push(&ring, &link, &j);
            }
        }
        // Every slot of the job is published (or it was dropped): posters may go direct.
        link.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits for a free slot (spinning briefly, then sleeping on the ring until the consumer
/// frees one); `None` if the ring or the link was cut, `Some(false)` if `give_up` said so.
fn room(ring: &Ring, link: &Link, mut give_up: impl FnMut() -> bool) -> Option<bool> {
    let mut patience = Patience::default();
    loop {
        if ring.has_room() {
            return Some(true);
        }
        if patience.busy() {
            continue;
        }
        if ring.is_closed() || link.broken() {
            return None;
        }
        if give_up() {
            return Some(false);
        }
        ring.wait_room(NAP);
    }
}

fn push(ring: &Ring, link: &Link, j: &SendJob) {
    let cut = || {
        if ring.is_closed() && !link.broken() {
            link.on_failure("it cut its shared-memory ring");
        }
        j.finish(Err("the shared-memory ring is closed".into()));
    };
    let mut off = 0;
    loop {
        if link.silenced() {
            // Across a partition from now on (fault injection `isolate`): the rest is lost.
            j.finish(Ok(()));
            return;
        }
        match room(ring, link, || j.cancelled()) {
            None => return cut(),
            Some(false) => break,
            Some(true) => {}
        }
        // SAFETY: the job is `Writing` (`cancelled` said no, and only this thread releases
        // it), so the caller's memory is valid.
        let piece = unsafe { j.bytes_at(off, SLOT_BYTES) };
        let n = piece.len();
        let head = SlotHead {
            tag: j.tag,
            len: j.len as u64,
            off: off as u64,
            n: n as u64,
            flags: 0,
        };
        ring.publish(head, piece);
        off += n;
        if off >= j.len {
            j.finish(Ok(()));
            return;
        }
        if j.cancelled() {
            break;
        }
    }
    // Given up (the job is released): mark the message abandoned if any of it went out.
    if off > 0 && room(ring, link, || false) == Some(true) {
        let head = SlotHead {
            tag: j.tag,
            len: j.len as u64,
            off: off as u64,
            n: 0,
            flags: ABANDONED,
        };
        ring.publish(head, &[]);
    }
}
