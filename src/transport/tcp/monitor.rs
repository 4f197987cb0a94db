//! The monitor thread: reads what peers say while the application waits on someone else.
//!
//! It polls (poll(2)) the socket of every peer that nobody is reading: a socket the
//! application is receiving from is read by the application itself, which handles the
//! control frames it meets; a socket whose next data frame is already announced waits for
//! the receive it belongs to. From the others the monitor reads frame headers: notices go to
//! the board, a goodbye marks the peer as leaving, an end of stream without a goodbye marks
//! it dead, the rest of an abandoned frame is discarded, and a data frame's header is kept
//! for its receive (the payload stays in the socket: the monitor never copies a message).

use super::link::Link;
use crate::error::Error;
use crate::transport::faults::POLL;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Starts the monitor of `links`; it ends when `stop` is set.
pub(super) fn spawn(
    links: Vec<Arc<Link>>,
    stop: Arc<AtomicBool>,
) -> crate::error::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pccl-tcp-monitor".into())
        .spawn(move || run(&links, &stop))
        .map_err(|e| Error::system(format!("cannot start the monitor thread: {e}")))
}

/// Whether the monitor should watch `l`'s socket now.
fn watched(l: &Link) -> bool {
    if l.silenced() {
        return false; // across a partition: nothing is read from it
    }
    match l.inbox.try_lock() {
        Ok(ib) => ib.pending.is_none() && !ib.is_closed(),
        Err(_) => false,
    }
}

/// Reads what `l`'s socket holds without waiting for more.
fn pump(l: &Link) {
    let Ok(mut ib) = l.inbox.try_lock() else {
        return;
    };
    if ib.pending.is_some() {
        return;
    }
    let mut not_now = || Err(Error::internal("nothing more to read now"));
    // Reads never wait: a receive (or a notice's handling) that wants this inbox next must
    // not wait for the monitor to sit out a socket step on a drained socket.
    ib.peek = true;
    if let Ok(h) = l.next(&mut ib, &mut not_now) {
        ib.pending = Some(h);
    }
    ib.peek = false;
}

fn run(links: &[Arc<Link>], stop: &AtomicBool) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(links.len());
    let mut which: Vec<&Link> = Vec::with_capacity(links.len());
    let step = POLL.as_millis() as libc::c_int;
    while !stop.load(Ordering::Acquire) {
        fds.clear();
        which.clear();
        for l in links.iter().filter(|l| watched(l)) {
            fds.push(libc::pollfd {
                fd: l.fd,
                events: libc::POLLIN,
                revents: 0,
            });
            which.push(l);
        }
        if fds.is_empty() {
            std::thread::sleep(POLL);
            continue;
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd records for the duration of
        // the call, and every descriptor in it belongs to a socket its link keeps open.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, step) };
        if n <= 0 {
            continue;
        }
        for (f, l) in fds.iter().zip(&which) {
            if f.revents != 0 {
                pump(l);
            }
        }
    }
}
