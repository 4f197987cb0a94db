//! Authenticated acceptance on a bootstrap listener (the rendezvous, a rank's mesh listener).
//!
//! Anyone on the network can reach these listeners. A [`Gate`] accepts without blocking and
//! reads from each connection one fixed-size frame: the job secret, an 8-byte frame kind, then
//! a body of a size fixed by the caller (never read from the wire). The secret and kind are
//! checked, in constant time, before a single byte of the body is read. A connection that
//! closes, errs, sends anything else, or has not sent its whole frame within the handshake
//! deadline (`min(timeout, 5 s)`) is dropped without an answer and without affecting the job.
//!
//! All pending connections are served from one thread, so a slow or idle stranger never delays
//! another connection; at most [`MAX_PENDING`] wait at once (the oldest is dropped to make
//! room), which bounds the memory and file descriptors a flood can take. A member whose
//! connection was dropped that way sees it closed unanswered and dials again.

use super::secret::{ct_eq, Secret, SECRET_BYTES};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Most connections whose handshake is under way at once, per listener.
pub(crate) const MAX_PENDING: usize = 256;
/// Longest time a connection may take to send its first frame (less if the job's timeout is).
pub(crate) const HANDSHAKE_MAX: Duration = Duration::from_secs(5);
/// Bytes of the secret and the frame kind that open every frame.
pub(crate) const PREFIX: usize = SECRET_BYTES + 8;
/// Largest frame a gate reads.
pub(crate) const MAX_FRAME: usize = 256;

/// The handshake deadline for a job whose timeout is `timeout`.
pub(crate) fn handshake_time(timeout: Duration) -> Duration {
    timeout.min(HANDSHAKE_MAX).max(Duration::from_millis(50))
}

/// The first frame on a connection: `secret ++ kind ++ body`.
pub(crate) fn frame(secret: &Secret, kind: &[u8; 8], body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(PREFIX + body.len());
    f.extend_from_slice(secret.as_bytes());
    f.extend_from_slice(kind);
    f.extend_from_slice(body);
    f
}

/// Whether `e` means the other side closed or dropped the connection (a gate drops a
/// connection it does not let in without answering).
pub(crate) fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}

/// A connection whose frame is still arriving.
struct Pending {
    stream: TcpStream,
    buf: [u8; MAX_FRAME],
    got: usize,
    /// Whether the secret and kind were checked (and right).
    checked: bool,
    until: Instant,
}

/// What a pending connection did when read.
enum Step {
    /// Still short of its frame.
    Wait,
    /// Sent its whole frame, secret checked.
    Done,
    /// To be dropped.
    Drop,
}

/// Accepts connections and hands back those that proved they know the secret.
pub(crate) struct Gate<'a> {
    listener: &'a TcpListener,
    prefix: [u8; PREFIX],
    frame: usize,
    handshake: Duration,
    pending: VecDeque<Pending>,
    idle: u32,
}

impl<'a> Gate<'a> {
    /// A gate on `listener` (put in non-blocking mode) for frames of kind `kind` whose body is
    /// `body` bytes.
    pub(crate) fn new(
        listener: &'a TcpListener,
        secret: &Secret,
        kind: &[u8; 8],
        body: usize,
        timeout: Duration,
    ) -> Result<Self> {
        if PREFIX + body > MAX_FRAME {
            return Err(Error::internal(format!(
                "bootstrap frame of {body} bytes exceeds the gate's {MAX_FRAME}"
            )));
        }
        listener.set_nonblocking(true).map_err(|e| {
            Error::system(format!(
                "cannot make a bootstrap listener non-blocking: {e}"
            ))
        })?;
        let mut prefix = [0u8; PREFIX];
        prefix[..SECRET_BYTES].copy_from_slice(secret.as_bytes());
        prefix[SECRET_BYTES..].copy_from_slice(kind);
        Ok(Gate {
            listener,
            prefix,
            frame: PREFIX + body,
            handshake: handshake_time(timeout),
            pending: VecDeque::new(),
            idle: 0,
        })
    }

    /// Accepts what is waiting and advances every pending handshake. Returns the connections
    /// that completed (back in blocking mode) with their frame's body.
    pub(crate) fn poll(&mut self) -> Vec<(TcpStream, Vec<u8>)> {
        let mut done = Vec::new();
        let mut progress = false;
        // Accept at most one queue's worth per call so the pending ones are served too.
        for _ in 0..MAX_PENDING {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    progress = true;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let mut p = Pending {
                        stream,
                        buf: [0u8; MAX_FRAME],
                        got: 0,
                        checked: false,
                        until: Instant::now() + self.handshake,
                    };
                    // A member sends its frame right after connecting: it is often there.
                    match self.advance(&mut p) {
                        Step::Done => done.extend(self.finish(p)),
                        Step::Drop => {}
                        Step::Wait => {
                            if self.pending.len() >= MAX_PENDING {
                                self.pending.pop_front();
                            }
                            self.pending.push_back(p);
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionAborted => progress = true,
                Err(_) => {
                    // Out of file descriptors or similar: free one and try again later.
                    self.pending.pop_front();
                    break;
                }
            }
        }
        let now = Instant::now();
        let mut keep = VecDeque::with_capacity(self.pending.len());
        while let Some(mut p) = self.pending.pop_front() {
            let before = p.got;
            match self.advance(&mut p) {
                Step::Done => {
                    progress = true;
                    done.extend(self.finish(p));
                }
                Step::Drop => progress = true,
                Step::Wait if now >= p.until => progress = true,
                Step::Wait => {
                    progress |= p.got != before;
                    keep.push_back(p);
                }
            }
        }
        self.pending = keep;
        self.idle = if progress { 0 } else { self.idle + 1 };
        done
    }

    /// Sleeps a little after a [`Gate::poll`] that found nothing to do (longer the longer
    /// nothing happens, at most 4 ms).
    pub(crate) fn pause(&self) {
        if self.idle > 0 {
            std::thread::sleep(Duration::from_millis(u64::from(self.idle.min(4))));
        }
    }

    /// Reads what `p` sent so far, checking the secret as soon as it is in.
    fn advance(&self, p: &mut Pending) -> Step {
        loop {
            if !p.checked && p.got >= PREFIX {
                if !ct_eq(&p.buf[..PREFIX], &self.prefix) {
                    return Step::Drop;
                }
                p.checked = true;
            }
            if p.checked && p.got == self.frame {
                return Step::Done;
            }
            // Nothing past the secret and kind is read before they are checked.
            let want = if p.checked { self.frame } else { PREFIX };
            match p.stream.read(&mut p.buf[p.got..want]) {
                Ok(0) => return Step::Drop,
                Ok(n) => p.got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Wait,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Step::Drop,
            }
        }
    }

    /// The stream of a completed handshake, back in blocking mode, and its frame's body.
    fn finish(&self, p: Pending) -> Option<(TcpStream, Vec<u8>)> {
        p.stream.set_nonblocking(false).ok()?;
        Some((p.stream, p.buf[PREFIX..self.frame].to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Serves a gate on a fresh listener until `stop`, counting the bodies let in.
    fn served(
        timeout: Duration,
    ) -> (
        std::net::SocketAddr,
        Secret,
        std::sync::Arc<AtomicBool>,
        std::thread::JoinHandle<Vec<Vec<u8>>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let secret = Secret::random().unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (s2, st2) = (secret.clone(), stop.clone());
        let h = std::thread::spawn(move || {
            let mut gate = Gate::new(&listener, &s2, b"TESTKIND", 8, timeout).unwrap();
            let mut got = Vec::new();
            while !st2.load(Ordering::Relaxed) {
                got.extend(gate.poll().into_iter().map(|(_, b)| b));
                gate.pause();
            }
            got
        });
        (addr, secret, stop, h)
    }

    #[test]
    fn a_member_gets_in_past_a_flood_larger_than_the_pending_cap() {
        let (addr, secret, stop, h) = served(Duration::from_secs(30));
        let flood: Vec<TcpStream> = (0..MAX_PENDING + 100)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
            .collect();
        assert!(flood.len() > MAX_PENDING);
        let t = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&frame(&secret, b"TESTKIND", b"member!!"))
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        let got = h.join().unwrap();
        assert_eq!(got, vec![b"member!!".to_vec()]);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn strangers_are_dropped_unanswered() {
        let (addr, secret, stop, h) = served(Duration::from_millis(200));
        let closes = |mut s: TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut b = [0u8; 1];
            // Closed by the gate: end of stream (or a reset), not a timeout.
            match s.read(&mut b) {
                Ok(n) => n == 0,
                Err(e) => closed(&e),
            }
        };
        let idle = TcpStream::connect(addr).unwrap();
        let t = Instant::now();
        assert!(closes(idle), "an idle stranger must be dropped");
        assert!(t.elapsed() < Duration::from_secs(2));
        let mut wrong = TcpStream::connect(addr).unwrap();
        let mut f = frame(&secret, b"TESTKIND", b"12345678");
        f[0] ^= 1;
        wrong.write_all(&f).unwrap();
        assert!(closes(wrong), "a wrong secret must be dropped");
        let mut kind = TcpStream::connect(addr).unwrap();
        kind.write_all(&frame(&secret, b"OTHERKND", b"12345678"))
            .unwrap();
        assert!(closes(kind), "a wrong frame kind must be dropped");
        stop.store(true, Ordering::Relaxed);
        assert!(h.join().unwrap().is_empty());
    }
}
