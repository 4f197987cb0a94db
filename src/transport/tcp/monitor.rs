//! The monitor thread: reads what peers say while the application waits on someone else.
//!
//! Every [`POLL`] it sweeps (poll(2) without waiting) the socket of every peer that nobody is
//! reading: a socket the application is receiving from is read by the application itself,
//! which handles the control frames it meets; a socket whose next data frame is already
//! announced waits for the receive it belongs to. From the others the monitor reads frame
//! headers: notices go to the board, a goodbye marks the peer as leaving, an end of stream
//! without a goodbye marks it dead, the rest of an abandoned frame is discarded, and a data
//! frame's header is kept for its receive (the payload stays in the socket: the monitor
//! never copies a message). So a notice, a goodbye or a death is seen within a sweep.
//!
//! Between sweeps it sleeps, except on the sockets of peers whose "ready" a writer waits for
//! (a held rendezvous message, [`Link::urgent`]): those it watches at once, since a "ready"
//! read a sweep late would hold a large message back for it. Until 2026-12-02 it watched
//! every socket at once; each early message then woke it (and each receive that overlapped
//! it rang its bell), which on a host with more ranks than cores cost as much as the
//! messages themselves: 1 KiB hierarchical all-gathers on the emulated 4x4 cluster took
//! 1.7-2.4x as long as without those wake-ups.
//!
//! While the transport is idle (no send or receive began since the last sweep: a
//! communicator between calls, or one of several a job keeps) the monitor sleeps on every
//! socket at once instead, for up to [`IDLE_STEP`]: nothing arrives there but notices,
//! goodbyes and deaths, each seen at once, and the first message of the next call, which
//! wakes it once and brings the sweeps back. Sweeping idle transports cost the busy ones:
//! with 8 communicators per rank on the 4x4 cluster (pccl-bench's algorithm list), each
//! monitor waking 50 times a second, a 1 KiB hierarchical all-gather took 1.2-1.5x its time
//! with 3.

use super::link::Link;
use crate::error::Error;
use crate::transport::faults::POLL;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest the monitor of an idle transport sleeps (the transport's close rings the bell).
const IDLE_STEP: Duration = Duration::from_secs(1);

/// Wakes the monitor out of its poll(2) (a pipe it always watches): a receive that held a
/// socket the monitor skipped rings it when it lets go, so the monitor watches that socket
/// again at once instead of after its poll step (a peer's "ready" may be waiting there).
/// It also counts the transport's sends and receives, which tell the monitor whether the
/// transport is idle.
pub(super) struct Bell {
    rd: OwnedFd,
    wr: OwnedFd,
    activity: AtomicU64,
}

impl Bell {
    /// A new bell (a non-blocking pipe).
    pub(super) fn new() -> crate::error::Result<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if r != 0 {
            return Err(Error::system(format!(
                "cannot create the monitor's pipe: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: pipe2 succeeded: both descriptors are fresh and owned by nobody else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Bell {
            rd,
            wr,
            activity: AtomicU64::new(0),
        })
    }

    /// A send or receive begins (the transport is not idle).
    pub(super) fn touch(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    /// Wakes the monitor (a full pipe already holds a wake-up: the error is ignored).
    pub(super) fn ring(&self) {
        let b = 1u8;
        // SAFETY: writes one byte from a valid local to a descriptor this bell owns.
        let _ = unsafe { libc::write(self.wr.as_raw_fd(), (&b as *const u8).cast(), 1) };
    }

    fn drain(&self) {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: reads into a valid local buffer of its length from a descriptor this
            // bell owns (non-blocking: ends when the pipe is empty).
            let n = unsafe { libc::read(self.rd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
        }
    }
}

/// Starts the monitor of `links`; it ends when `stop` is set.
pub(super) fn spawn(
    links: Vec<Arc<Link>>,
    bell: Arc<Bell>,
    stop: Arc<AtomicBool>,
) -> crate::error::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pccl-tcp-monitor".into())
        .spawn(move || run(&links, &bell, &stop))
        .map_err(|e| Error::system(format!("cannot start the monitor thread: {e}")))
}

/// Whether the monitor should watch `l`'s socket now. A socket left to a receive (one
/// holds it, or its next frame is announced) while a writer waits for the peer's "ready"
/// is marked `skipped`: that receive rings the bell when it lets go, so a "ready" behind
/// its message is seen at once (the others wait for the next sweep).
fn watched(l: &Link) -> bool {
    if l.silenced() {
        return false; // across a partition: nothing is read from it
    }
    let mut ib = l.inbox.try_lock();
    if ib.is_err() && l.urgent() {
        l.skipped.store(true, Ordering::Release);
        // The receive may have let go between the two steps without seeing the mark.
        ib = l.inbox.try_lock();
    }
    match ib {
        Ok(ib) if ib.is_closed() => false,
        Ok(ib) if ib.pending.is_some() => {
            if l.urgent() {
                l.skipped.store(true, Ordering::Release);
            }
            false
        }
        Ok(_) => true,
        Err(_) => false,
    }
}

/// Reads what `l`'s socket holds without waiting for more.
fn pump(l: &Link) {
    let Ok(mut ib) = l.inbox.try_lock() else {
        return;
    };
    l.read_ahead(&mut ib);
}

fn run(links: &[Arc<Link>], bell: &Bell, stop: &AtomicBool) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(links.len() + 1);
    let mut which: Vec<&Link> = Vec::with_capacity(links.len());
    let mut next_sweep = Instant::now();
    let mut seen = u64::MAX;
    let mut idle = false;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        let sweep = now >= next_sweep;
        if sweep {
            next_sweep = now + POLL;
            // Idle: no send or receive began since the last sweep.
            let a = bell.activity.load(Ordering::Relaxed);
            idle = a == seen;
            seen = a;
        }
        // A sweep looks without waiting; between sweeps the bell and the urgent sockets
        // wake it; an idle transport's monitor sleeps on every socket.
        let step = if idle {
            IDLE_STEP.as_millis() as libc::c_int
        } else if sweep {
            0
        } else {
            (next_sweep - now).as_millis().clamp(1, POLL.as_millis()) as libc::c_int
        };
        let sweep = sweep || idle;
        fds.clear();
        which.clear();
        fds.push(libc::pollfd {
            fd: bell.rd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for l in links.iter().filter(|l| (sweep || l.urgent()) && watched(l)) {
            fds.push(libc::pollfd {
                fd: l.fd,
                events: libc::POLLIN,
                revents: 0,
            });
            which.push(l);
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd records for the duration of
        // the call, and every descriptor in it belongs to a socket its link keeps open (or
        // to the bell, which outlives this thread).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, step) };
        if idle {
            // Woken (or a long step passed): sweep again now, and leave idleness if a send
            // or receive began meanwhile.
            next_sweep = Instant::now();
        }
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            bell.drain();
        }
        for (f, l) in fds[1..].iter().zip(&which) {
            if f.revents != 0 {
                pump(l);
            }
        }
    }
}
