//! One rank's end of its connection to one peer: the inbound side (a socket read as a
//! resumable stream of frames, or a shared-memory ring), what the link knows of the peer
//! (it said goodbye, it is gone), and the receive of one message with the board checked
//! while it waits.

mod inbound;
mod recv;

use super::wire::{self, Got, Header, Kind, HEADER, TRAILER};
use super::writer::{Job, SendJob};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Faults, Tag};
use crate::transport::shm::Ring;
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a control frame (or a header) that started arriving may take to finish before
/// the connection counts as broken.
const CONTROL_PATIENCE: Duration = Duration::from_secs(1);

/// Why a read of the inbound stream stopped.
pub(super) enum Stop {
    /// The wait's own reason (the board, the deadline, "not now" for the monitor).
    Fail(Error),
    /// The connection is closed (EOF after a goodbye, or the peer is dead).
    Closed,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Fail(e)
    }
}

/// Where a received message goes.
pub(super) enum Target<'a> {
    /// Straight into this memory (exactly the message's length).
    Into(&'a mut [u8]),
    /// Straight into these segments, in order (their lengths add up to the message's).
    Scatter(&'a mut [&'a mut [u8]]),
    /// To this sink, in pieces of at most the given length.
    Sink(&'a mut dyn FnMut(usize, &[u8]), usize),
}

/// The inbound socket as a stream of frames, resumable at any byte: a wait that gives up
/// in the middle of a header or a payload leaves the position here, so the stream never
/// loses its framing.
pub(super) struct Inbox {
    s: TcpStream,
    /// A partly read header and how many of its bytes arrived.
    head: [u8; HEADER],
    got: usize,
    /// A data frame whose header was read but whose message nobody took yet (a large one:
    /// its payload stays in the socket until its receive reads it).
    pub(super) pending: Option<Header>,
    /// Small data frames read whole ahead of their receive, oldest first, and the one being
    /// read (it follows them in the stream). Reading them out of the way lets the control
    /// frames behind them through: a peer's "ready" must never wait behind a message that
    /// this rank will only receive later (see [`wire::RENDEZVOUS`]).
    early: VecDeque<Early>,
    filling: Option<Early>,
    /// Payload bytes held in `early` and `filling`.
    early_bytes: usize,
    /// Bytes of an interrupted or dropped frame still to discard before the next header.
    pub(super) skip: u64,
    /// The monitor is reading ahead: reads take only what is there, never wait a step
    /// (the monitor holding the inbox through a socket step would hold up the receive
    /// that wants it).
    peek: bool,
    /// EOF or a broken stream was seen: nothing more will arrive.
    closed: bool,
    /// Staging for receives into a sink and for discarded bytes (u64 words keep every dtype
    /// aligned for the reduction kernels).
    scratch: Vec<u64>,
}

/// A small data frame read (or being read) whole ahead of its receive.
struct Early {
    head: Header,
    /// Payload then trailer, in u64 words so that every dtype is aligned.
    words: Vec<u64>,
    /// Bytes of payload and trailer read so far.
    got: usize,
}

impl Early {
    fn new(head: Header) -> Self {
        let n = head.len as usize + TRAILER;
        Early {
            head,
            words: vec![0; n.div_ceil(8)],
            got: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.head.len as usize + TRAILER]
    }

    fn payload(&self) -> &[u8] {
        &self.bytes()[..self.head.len as usize]
    }

    fn trailer(&self) -> u64 {
        let t = &self.bytes()[self.head.len as usize..];
        u64::from_le_bytes(t.try_into().unwrap_or([0; TRAILER]))
    }

    fn complete(&self) -> bool {
        self.got == self.head.len as usize + TRAILER
    }
}

/// The most payload bytes of small frames one link reads ahead of their receives; past it,
/// a frame's header waits as `pending` (and what follows it in the socket).
const EARLY_CAP: usize = 16 << 20;
/// Frames below this many bytes are small: the monitor reads them whole ahead of their
/// receive (up to [`EARLY_CAP`]), so a control frame or a short message never waits behind
/// them; larger ones wait in the socket for their receive, which reads them in place.
const EARLY_MAX: u64 = 64 * 1024;

impl Inbox {
    /// Whether nothing more will arrive (EOF or a broken stream was seen).
    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }
}

/// What a held rendezvous message may do ([`Link::take_ready`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Readiness {
    /// Its receive is under way: it leaves.
    Go,
    /// The receiver waits for a different message: it leaves, to fail there.
    Mismatch,
    /// Nothing said yet: it stays.
    Wait,
}

/// Rings the monitor's bell when dropped, if the monitor skipped the link meanwhile.
struct WakeMonitor<'a>(&'a Link);

impl Drop for WakeMonitor<'_> {
    fn drop(&mut self) {
        if self.0.skipped.swap(false, Ordering::AcqRel) {
            self.0.bell.ring();
        }
    }
}

/// Hands a message read ahead (`payload`, exactly the receive's length) to its target.
fn deliver(target: Target<'_>, payload: &[u8]) {
    match target {
        Target::Into(dst) => dst.copy_from_slice(payload),
        Target::Scatter(segs) => scatter_at(segs, 0, payload),
        Target::Sink(sink, chunk) => {
            let chunk = chunk.max(4096);
            for (i, piece) in payload.chunks(chunk).enumerate() {
                sink(i * chunk, piece);
            }
        }
    }
}

/// Copies `bytes`, message bytes from offset `at` on, into the segments laid end to end
/// (what lies beyond their total is dropped).
fn scatter_at(segs: &mut [&mut [u8]], at: usize, mut bytes: &[u8]) {
    let mut skip = at;
    for s in segs.iter_mut() {
        if bytes.is_empty() {
            return;
        }
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let n = (s.len() - skip).min(bytes.len());
        s[skip..skip + n].copy_from_slice(&bytes[..n]);
        bytes = &bytes[n..];
        skip = 0;
    }
}

/// One peer as seen from this rank.
pub(super) struct Link {
    pub(super) rank: usize,
    pub(super) peer: usize,
    /// Bytes from which this link's messages of recursive-doubling plans wait for their
    /// receiver: the larger of the two ends' `PCCL_TCP_RENDEZVOUS`, set by the transport
    /// once they are exchanged ([`wire::RENDEZVOUS`] until then).
    pub(super) rendezvous: usize,
    pub(super) faults: Arc<Faults>,
    pub(super) inbox: Mutex<Inbox>,
    /// The socket's descriptor, for the monitor's poll.
    pub(super) fd: RawFd,
    /// Another handle on the socket: direct control writes (shared-memory pairs, whose
    /// socket carries nothing else) and shutdown.
    socket: Mutex<TcpStream>,
    /// Inbound ring from a same-host peer, and the lock of its one consumer.
    pub(super) ring_in: Option<Arc<Ring>>,
    ring_rx: Mutex<()>,
    /// Outbound ring to a same-host peer: written by the writer thread, or by the poster
    /// itself for a small message with nothing queued before it (see `writer::post`).
    pub(super) ring_out: Option<Arc<Ring>>,
    /// Held by a poster while it decides whether to publish into `ring_out` itself (and
    /// while it does), so two posters never publish at once.
    pub(super) ring_tx: Mutex<()>,
    /// Messages handed to the writer thread and not yet finished by it (ring or socket), and
    /// a socket's control frames queued there: while any is, a poster queues behind them
    /// (messages to a peer keep their order, and a refusal notice reaches the peer before
    /// whatever this rank sends after it).
    pub(super) queued: AtomicUsize,
    /// The socket's write side, for a peer reached by socket: held by whoever writes a frame
    /// (the writer thread, one frame at a time, or a poster writing a small message itself,
    /// see `writer::post`). It holds the frame such a poster began and the socket did not
    /// take whole: the writer thread finishes it before it writes anything else.
    pub(super) wr: Mutex<Option<Arc<SendJob>>>,
    /// The queue of this peer's writer thread (taken when the transport closes).
    pub(super) writer: Mutex<Option<Sender<Job>>>,
    /// The monitor left this socket to a receive (one held it, or its next frame was
    /// announced): the receive rings `bell` when it lets go.
    pub(super) skipped: AtomicBool,
    /// Writers holding a message until the peer's "ready" comes: while any does, the
    /// monitor watches the socket at once instead of at its sweeps (see `monitor`).
    awaiting: AtomicUsize,
    bell: Arc<super::monitor::Bell>,
    /// The peer's "ready" frames not yet used: the stamp and length of each message it
    /// waits for, oldest first (see [`wire::RENDEZVOUS`]).
    ready: Mutex<VecDeque<(Tag, u64)>>,
    /// Receives whose "ready" went ahead ([`Link::expect`]): their receive sends none.
    announced: Mutex<Vec<(Tag, usize)>>,
    /// The peer said goodbye: its connection may close, normally.
    left: AtomicBool,
    /// The link is finished (the peer is gone, or this rank cut or closed it): writers stop.
    broken: AtomicBool,
    /// Fault injection `isolate`: the peer is across a partition. Nothing more is written to
    /// it or read from it (sends complete at once, lost; receives wait out their deadline),
    /// and nobody is told: the socket stays open, as a real partition leaves it.
    silenced: AtomicBool,
}

/// Whether a message stamped `got` must be dropped by a receive waiting for `want`: it
/// belongs to an earlier collective, or it is a collective's message found while waiting
/// for the transport's own traffic (which always follows what the peer sent before).
pub(super) fn superseded(got: Tag, want: Tag) -> bool {
    faults::is_stale(got, want) || (faults::is_control(want) && !faults::is_control(got))
}

impl Link {
    /// A link over `s` (timeouts set here), with the rings of a same-host peer.
    pub(super) fn new(
        rank: usize,
        peer: usize,
        faults: Arc<Faults>,
        s: TcpStream,
        ring_in: Option<Ring>,
        ring_out: Option<Ring>,
        bell: Arc<super::monitor::Bell>,
    ) -> Result<Self> {
        let opt = |e: std::io::Error| Error::system(format!("socket option for rank {peer}: {e}"));
        s.set_nodelay(true).map_err(opt)?;
        s.set_read_timeout(Some(wire::IO_STEP)).map_err(opt)?;
        s.set_write_timeout(Some(wire::IO_STEP)).map_err(opt)?;
        let other = s.try_clone().map_err(opt)?;
        Ok(Link {
            rank,
            peer,
            rendezvous: wire::RENDEZVOUS,
            faults,
            fd: s.as_raw_fd(),
            inbox: Mutex::new(Inbox {
                s,
                head: [0; HEADER],
                got: 0,
                pending: None,
                early: VecDeque::new(),
                filling: None,
                early_bytes: 0,
                skip: 0,
                peek: false,
                closed: false,
                scratch: Vec::new(),
            }),
            socket: Mutex::new(other),
            ring_in: ring_in.map(Arc::new),
            ring_rx: Mutex::new(()),
            ring_out: ring_out.map(Arc::new),
            ring_tx: Mutex::new(()),
            queued: AtomicUsize::new(0),
            wr: Mutex::new(None),
            writer: Mutex::new(None),
            skipped: AtomicBool::new(false),
            awaiting: AtomicUsize::new(0),
            bell,
            ready: Mutex::new(VecDeque::new()),
            announced: Mutex::new(Vec::new()),
            left: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            silenced: AtomicBool::new(false),
        })
    }

    /// Another handle on the socket (for a writer thread).
    pub(super) fn socket_clone(&self) -> Result<TcpStream> {
        lock(&self.socket).try_clone().map_err(|e| {
            Error::system(format!(
                "cannot clone the socket to rank {}: {e}",
                self.peer
            ))
        })
    }

    /// A writer starts holding a message for the peer's "ready": the monitor is told to
    /// watch the socket at once. Paired with [`Link::end_awaiting`].
    pub(super) fn begin_awaiting(&self) {
        self.awaiting.fetch_add(1, Ordering::AcqRel);
        self.bell.ring();
    }

    /// The writer of [`Link::begin_awaiting`] no longer waits.
    pub(super) fn end_awaiting(&self) {
        self.awaiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// A send or receive on this link begins: the transport is not idle (its monitor sweeps).
    pub(super) fn touch(&self) {
        self.bell.touch();
    }

    /// Whether a writer waits for the peer's "ready" (the monitor watches the socket at once).
    pub(super) fn urgent(&self) -> bool {
        self.awaiting.load(Ordering::Acquire) > 0
    }

    /// Whether the peer said goodbye.
    pub(super) fn left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    /// Whether the link is finished.
    pub(super) fn broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Marks the link finished (writers stop at their next step).
    pub(super) fn set_broken(&self) {
        self.broken.store(true, Ordering::Release);
    }

    /// Puts the peer across a partition (fault injection `isolate`; see the field).
    pub(super) fn silence(&self) {
        self.silenced.store(true, Ordering::Release);
    }

    /// Whether the peer is across a partition.
    pub(super) fn silenced(&self) -> bool {
        self.silenced.load(Ordering::Acquire)
    }

    /// The connection ended: a death unless the peer said goodbye first.
    fn on_eof(&self) {
        self.set_broken();
        if !self.left() {
            self.faults.dead(
                self.peer,
                "its connection closed without a goodbye: its process ended or its links were \
                 cut",
            );
        }
    }

    /// The connection failed (`what` happened): the peer counts as dead unless it left.
    pub(super) fn on_failure(&self, what: &str) {
        self.set_broken();
        if !self.left() {
            self.faults
                .dead(self.peer, &format!("its connection failed: {what}"));
        }
    }

    fn on_control(&self, h: &Header, payload: &[u8]) {
        let why = String::from_utf8_lossy(payload);
        match h.kind {
            Kind::Refused => {
                self.faults.refuse(h.tag as u32, self.peer, &why);
            }
            Kind::Aborted => self.faults.revoked(self.peer, &why),
            Kind::Goodbye => self.left.store(true, Ordering::Release),
            Kind::Ready => {
                let len = payload
                    .try_into()
                    .map(u64::from_le_bytes)
                    .unwrap_or(u64::MAX);
                let mut r = lock(&self.ready);
                // Those of earlier collectives (given up) are of no use any more.
                r.retain(|&(t, _)| !faults::is_stale(t, h.tag));
                r.push_back((h.tag, len));
                drop(r);
                // Wakes the writer if it waits for this very frame.
                if let Some(tx) = lock(&self.writer).as_ref() {
                    let _ = tx.send(Job::Wake);
                }
            }
            Kind::Data => {}
        }
    }

    /// Sends the "ready" of a receive that follows in this phase ahead of it (before this
    /// rank's own sends of the phase, which would delay it in the stream).
    pub(super) fn expect(&self, tag: Tag, len: usize) {
        if self.ring_in.is_some() || !wire::rendezvous(tag, len, self.rendezvous) || self.silenced()
        {
            return;
        }
        let mut a = lock(&self.announced);
        a.retain(|&(t, _)| !faults::is_stale(t, tag));
        a.push((tag, len));
        drop(a);
        self.send_control(wire::ready(tag, len));
    }

    fn take_announced(&self, tag: Tag, len: usize) -> bool {
        let mut a = lock(&self.announced);
        a.retain(|&(t, _)| !faults::is_stale(t, tag));
        match a.iter().position(|&e| e == (tag, len)) {
            Some(i) => {
                a.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether a held message of `len` bytes stamped `tag` may leave: the peer's "ready"
    /// for it came (taken), or the peer said it waits for a different message, which it
    /// can only be told by this one arriving (sent eagerly, it fails there as a mismatch).
    pub(super) fn take_ready(&self, tag: Tag, len: usize) -> Readiness {
        let mut r = lock(&self.ready);
        r.retain(|&(t, _)| !faults::is_stale(t, tag));
        if let Some(i) = r.iter().position(|&(t, l)| t == tag && l == len as u64) {
            r.remove(i);
            return Readiness::Go;
        }
        // The same stamp with another length is another piece of the same collective
        // (waited for), unless the receive wants a small message (which has no rendezvous).
        let other = |&(t, l): &(Tag, u64)| {
            (t != tag && faults::is_p2p(t) == faults::is_p2p(tag))
                || (t == tag && l < self.rendezvous as u64)
        };
        if r.iter().any(other) {
            Readiness::Mismatch
        } else {
            Readiness::Wait
        }
    }

    /// The error of a wait for `tag` from this peer whose connection is closed.
    pub(super) fn closed_error(&self, tag: Tag) -> Error {
        if let Err(e) = self.faults.check(tag, self.peer) {
            return e;
        }
        if self.left() {
            return Error::remote(format!(
                "rank {} left (it destroyed its communicator) while rank {} still expected a \
                 message of collective #{} from it",
                self.peer,
                self.rank,
                faults::seq_of(tag)
            ));
        }
        Error::remote(format!(
            "the connection between rank {} and rank {} is closed",
            self.rank, self.peer
        ))
    }

    /// Sends a control frame without blocking the caller for long: on a socket that also
    /// carries data it goes through the writer's queue (behind what is queued already, and
    /// counted in `queued`, so a small message posted after it is not written before it);
    /// on a shared-memory pair's socket, which carries nothing else, it is written at once.
    pub(super) fn send_control(&self, frame: Vec<u8>) {
        if self.broken() || self.silenced() {
            return;
        }
        if self.ring_out.is_none() {
            self.queued.fetch_add(1, Ordering::AcqRel);
            let sent = match lock(&self.writer).as_ref() {
                Some(tx) => tx.send(Job::Control(frame)).is_ok(),
                None => false,
            };
            if !sent {
                self.queued.fetch_sub(1, Ordering::AcqRel);
            }
            return;
        }
        let mut s = lock(&self.socket);
        let give_up = Instant::now() + CONTROL_PATIENCE;
        let mut done = 0;
        while done < frame.len() && Instant::now() < give_up && !self.broken() {
            match wire::write_some(&mut s, &[std::io::IoSlice::new(&frame[done..])]) {
                Ok(Got::Bytes(n)) => done += n,
                Ok(_) => {}
                Err(e) => {
                    drop(s);
                    self.on_failure(&e.to_string());
                    return;
                }
            }
        }
    }

    /// Cuts the link (fault injection `drop`): the socket is shut down both ways and the
    /// rings are marked cut, so the peer sees the cut at once.
    pub(super) fn cut(&self) {
        self.set_broken();
        let _ = lock(&self.socket).shutdown(Shutdown::Both);
        for r in self.ring_in.iter().chain(self.ring_out.iter()) {
            r.close();
        }
    }

    /// Shuts the socket's sending side after the goodbye went out (the transport closes).
    pub(super) fn finish(&self) {
        self.set_broken();
        let _ = lock(&self.socket).shutdown(Shutdown::Write);
    }
}

/// When a reader that keeps receiving bytes looks at the board and the deadline again.
struct Pace {
    last: Instant,
}

impl Pace {
    fn new() -> Self {
        Pace {
            last: Instant::now(),
        }
    }

    /// True at most once per [`faults::POLL`].
    fn due(&mut self) -> bool {
        if self.last.elapsed() < faults::POLL {
            return false;
        }
        self.last = Instant::now();
        true
    }
}

#[cfg(test)]
mod scatter_tests {
    use super::scatter_at;

    #[test]
    fn scattered_bytes_land_at_their_message_offset_across_segments() {
        let (mut a, mut b, mut c) = (vec![0u8; 3], vec![0u8; 0], vec![0u8; 4]);
        {
            let mut segs: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
            scatter_at(&mut segs, 2, &[1, 2, 3]);
            scatter_at(&mut segs, 5, &[4, 5, 6, 7]); // one byte past the end is dropped
        }
        assert_eq!(a, vec![0, 0, 1]);
        assert_eq!(c, vec![2, 3, 4, 5]);
    }
}
