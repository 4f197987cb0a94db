//! Messages over the endpoint: tagged sends and receives in pieces, their waits, and how a
//! failed wait lets go of the caller's memory.
//!
//! **Wire.** A message of `len` bytes travels as `max(1, ⌈len / piece⌉)` tagged messages of
//! at most `piece` bytes (the piece size all ranks agreed on at bootstrap), each tagged with
//! the message's full stamp and, where the provider has remote completion data, carrying the
//! whole message's length. Receives match the stamp's sequence number and flags only (see
//! [`IGNORE`](super::fabric::IGNORE)); the fingerprint and the length are checked on arrival,
//! so ranks running different calls or counts fail with a remote error naming both. Pieces
//! let a receive hand each piece to its consumer (a reduction) while the next ones arrive.
//! A vectored (strided) message is the same pieces: each sent from its segment and received
//! into it where it lies whole in one, packed and scattered where it spans several.
//!
//! **Waits** read the completion queue (which drives the provider) and look at the failure
//! board ([`Faults::check`](crate::transport::Faults::check)) and the collective's deadline
//! on every step, so notices, deaths (seen by the control connections) and aborts end them
//! within a step.
//!
//! **Letting go.** Recovery never depends on the provider honouring a cancel (rxm does not
//! cancel sends; 1.17 sometimes never ended a truncated large message). A wait that fails:
//! - *sends*: unposted pieces are withdrawn; posted ones end when the peer takes them (its
//!   receive, or its drain receive of the failed collective), waited for up to [`CONFIRM`]
//!   while the peer lives, then parked in the endpoint's limbo (contexts kept alive, reaped
//!   when their completion comes, freed when the endpoint closes);
//! - *receives into bounce buffers* are cancelled and parked at once with their buffer;
//! - *receives into the caller's memory* are cancelled and waited for up to [`CONFIRM`]
//!   (normally immediate); only if that runs out is the endpoint closed, since the caller
//!   may free its memory once it has the error ([`recv`] says why).
//!
//! No receive is ever truncated (each has room for a whole piece), stamps carry the
//! collective's sequence number in the bits receives match, so a stale message never matches
//! a later collective's receive, and the drain receives of failed collectives take stale
//! messages off the provider's unexpected queue.

use super::fabric::{ctx, Ctx, State};
use super::mr::Mem;
use super::Shared;
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::staging::Staging;
use crate::transport::{pack_parts, scatter, seg_parts, seg_starts, SendOp};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long cancelled operations may take to end before the endpoint is closed.
pub const CONFIRM: Duration = Duration::from_secs(2);
/// Longest block on the completion queue's descriptor in one idle step of a wait (ms).
const BLOCK_MS: i32 = 1;
/// Pieces of one receive straight into its destination in flight at most.
const INTO_WINDOW: usize = 16;
/// Pieces of one receive through bounce buffers (handed to a consumer) in flight.
const SINK_WINDOW: usize = 4;

/// What one step of a wait achieved.
#[derive(PartialEq, Eq)]
enum Step {
    Done,
    Moved,
    Idle,
}

/// Runs `step` under the endpoint's lock (after reading the completion queue) until it is
/// done, the board fails `tag`/`peer`, or the deadline passes (`what`: the timeout's words).
fn wait(
    sh: &Shared,
    tag: Tag,
    peer: usize,
    deadline: Instant,
    what: &str,
    mut step: impl FnMut(&mut State) -> Result<Step>,
) -> Result<()> {
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    let blocks = sh.ep.lock().blocks();
    loop {
        let s = {
            let mut st = sh.ep.lock();
            st.progress();
            st.drain_refused(sh.ctl.faults(), sh.piece);
            // The board's cause (a death, a refusal) explains a failure better than its
            // consequence (say, the endpoint closed because of the death).
            step(&mut st).map_err(|e| sh.ctl.faults().check(tag, peer).err().unwrap_or(e))?
        };
        match s {
            Step::Done => return Ok(()),
            Step::Moved => {
                idle_since = Instant::now();
                spins = 0;
                continue;
            }
            Step::Idle => {}
        }
        sh.ctl.faults().check(tag, peer)?;
        let now = Instant::now();
        if now >= deadline {
            return Err(faults::timed_out(sh.rank, peer, what, true));
        }
        spins += 1;
        if blocks {
            // Block until the provider's traffic signals the completion queue (a socket of
            // rxm over tcp became readable), at most BLOCK: the failure board and the
            // deadline are looked at between blocks. Polling on a timer instead made every
            // protocol round of a small message (rxm's segments, acknowledgements) wait for
            // a sleep or a yield, which on a loaded host is milliseconds.
            if spins < 16 {
                std::hint::spin_loop();
            } else if let Some(fd) = sh.ep.lock().may_block() {
                // SAFETY: a plain poll(2) on the descriptor, no libfabric call (none may run
                // without the lock). Should another thread close the endpoint meanwhile, the
                // poll ends at once (invalid descriptor) or within BLOCK_MS.
                unsafe { super::sys::pccl_ofi_block(fd, BLOCK_MS) };
            }
        } else if spins < 64 {
            std::hint::spin_loop();
        } else if now.duration_since(idle_since) < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Whether `peer` is known dead.
fn is_dead(sh: &Shared, peer: usize) -> bool {
    sh.ctl.faults().dead_ranks().iter().any(|(r, _)| *r == peer)
}

/// What to do with operations still not ended after their bounded wait.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Otherwise {
    /// Park them in limbo (the caller's memory is at most read afterwards).
    Park,
    /// Close the endpoint (the provider might still write the caller's memory).
    Close,
    /// Sends: park them after a death; if a live peer did not take them, park them and
    /// retire the endpoint (a provider whose later messages would queue behind them).
    CloseSends,
}

/// Cancels the operations of `ctxs` (with `peer`) and waits up to `bound` for each to end,
/// driving the provider; what is still not ended afterwards is parked or closes the endpoint
/// (`otherwise`; parked ones keep `keep` alive, memory of this rank's own the provider may
/// still read). The wait ends early when the peer is dead. Returns how many were not
/// ended.
fn settle(
    sh: &Shared,
    peer: usize,
    ctxs: Vec<Ctx>,
    bound: Duration,
    otherwise: Otherwise,
    keep: Option<Arc<Staging>>,
) -> usize {
    if ctxs.is_empty() {
        return 0;
    }
    let mut left = ctxs;
    {
        let mut st = sh.ep.lock();
        for c in &left {
            st.cancel(c);
        }
    }
    let give_up = Instant::now() + bound;
    loop {
        let mut st = sh.ep.lock();
        if st.is_closed() {
            return 0; // the provider let go of everything
        }
        st.progress();
        left.retain(|c| st.take(c).is_none());
        if left.is_empty() {
            return 0;
        }
        // A dead process takes and sends nothing more: waiting for it is pointless. After
        // any death, a live peer may have failed its side before posting anything (the
        // communicator only shrinks now): sends are not waited for either.
        let dead = is_dead(sh, peer);
        let any_death = otherwise != Otherwise::Close && !sh.ctl.faults().dead_ranks().is_empty();
        let stop = dead || any_death || Instant::now() >= give_up;
        if stop {
            let n = left.len();
            if super::debug_info() {
                eprintln!(
                    "pccl: rank {}: {n} operation(s) with rank {peer} not ended {} ms after a \
                     failed collective: {}",
                    sh.rank,
                    bound.as_millis(),
                    if otherwise == Otherwise::Park {
                        "parked"
                    } else {
                        "closing the endpoint unless a rank died"
                    }
                );
            }
            match otherwise {
                Otherwise::Park => left.into_iter().for_each(|c| st.park(c, keep.clone())),
                Otherwise::CloseSends if dead || any_death => {
                    left.into_iter().for_each(|c| st.park(c, keep.clone()))
                }
                Otherwise::CloseSends => {
                    st.retire(format!(
                        "rank {}: {n} send(s) to rank {peer} were not taken within {} ms after \
                         a failed collective, and provider {} would hold later messages to it \
                         behind them; create a new communicator",
                        sh.rank,
                        bound.as_millis(),
                        sh.ep.caps.provider
                    ));
                    left.into_iter().for_each(|c| st.park(c, keep.clone()));
                }
                // After a death the communicator can only shrink (onto a fresh endpoint), so
                // closing this one costs nothing more.
                Otherwise::Close if dead => st.close_with(format!(
                    "rank {peer} died while rank {} was receiving from it",
                    sh.rank
                )),
                Otherwise::Close => st.close_with(format!(
                    "rank {}: {n} receive(s) from rank {peer} into the caller's memory did not \
                     end within {} ms of being cancelled after a failed collective (the \
                     provider could still write that memory); create a new communicator",
                    sh.rank,
                    bound.as_millis()
                )),
            }
            return n;
        }
        drop(st);
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The error of a failed operation's completion.
fn failed(sh: &Shared, peer: usize, tag: Tag, what: &str, err: i32) -> Error {
    if let Err(e) = sh.ctl.faults().check(tag, peer) {
        return e;
    }
    Error::system(format!(
        "rank {}: libfabric {what} rank {peer} failed: {} (provider {})",
        sh.rank,
        super::sys::strerror(i64::from(err)),
        sh.ep.caps.provider
    ))
}

/// Pieces of a message of `len` bytes.
fn pieces(len: usize, piece: usize) -> usize {
    len.div_ceil(piece).max(1)
}

/// A send in flight.
pub struct OfiSend {
    sh: Arc<Shared>,
    peer: usize,
    tag: Tag,
    /// Contexts of the pieces not yet completed.
    left: Vec<Ctx>,
    /// The pieces of a vectored send that lie over several segments, packed; parked with
    /// the pieces after a failure (the provider may still read it).
    packed: Option<Arc<Staging>>,
}

impl OfiSend {
    /// Queues a send of `len` bytes at `ptr` (memory `mem`: host, or device memory through
    /// `FI_HMEM`) to `peer`, in pieces, and posts what the provider takes now (the rest is
    /// posted by whoever progresses the endpoint next).
    ///
    /// # Safety
    /// The memory stays valid and unmodified until the op's wait has returned (or it is
    /// dropped). `ptr` is only handed to the provider, never dereferenced here.
    pub unsafe fn post(
        sh: Arc<Shared>,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        mem: Mem,
    ) -> Result<Self> {
        let piece = sh.piece;
        // SAFETY: every piece lies inside the caller's buffer (forwarded contract).
        unsafe {
            Self::post_pieces(sh, peer, tag, len, mem, None, |i| {
                (ptr as usize + i * piece) as *const u8
            })
        }
    }

    /// Queues a send of the host segments `segs` laid end to end, on the wire the message
    /// [`OfiSend::post`] sends for them packed: a piece within one segment goes from where
    /// it lies, only pieces over several segments are packed (into one staging buffer the
    /// op keeps), so a strided message of large blocks costs no copy.
    ///
    /// # Safety
    /// As [`crate::transport::Transport::isendv`]: every segment's bytes stay valid and
    /// unmodified until the op's wait has returned (or it is dropped).
    pub unsafe fn post_segs(
        sh: Arc<Shared>,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
    ) -> Result<Self> {
        let addrs: Vec<(usize, usize)> = segs.iter().map(|&(p, n)| (p as usize, n)).collect();
        let len: usize = addrs.iter().map(|s| s.1).sum();
        let piece = sh.piece;
        let parts: Vec<Vec<(usize, usize)>> = (0..pieces(len, piece))
            .map(|i| {
                let off = (i * piece).min(len);
                seg_parts(&addrs, off, (len - off).min(piece))
            })
            .collect();
        let over_several = |p: &&Vec<(usize, usize)>| p.len() > 1;
        let packed_len: usize = parts
            .iter()
            .filter(over_several)
            .flat_map(|p| p.iter().map(|q| q.1))
            .sum();
        let mut packed = (packed_len > 0).then(|| Staging::take(packed_len));
        // Each piece's first byte: in a segment, or in `packed`.
        let mut from = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in &parts {
            from.push(match (p.as_slice(), packed.as_mut()) {
                // An empty message: one empty piece (the address is never read).
                ([], _) => std::ptr::NonNull::<u8>::dangling().as_ptr() as usize,
                ([(q, _)], _) => *q,
                (several, Some(b)) => {
                    let dst = &mut b.bytes_mut()[at..];
                    let first = dst.as_ptr() as usize;
                    // SAFETY: the caller's segment bytes (`seg_parts` keeps within them; this
                    // function's contract); `packed_len` counted them.
                    at += unsafe { pack_parts(several, dst) };
                    first
                }
                (_, None) => unreachable!("packed_len counts every piece over several segments"),
            });
        }
        // SAFETY: each piece's address is in a caller's segment (valid per the contract) or
        // in `packed`, whose heap block the op keeps (and parks) until the provider is done.
        unsafe {
            Self::post_pieces(sh, peer, tag, len, Mem::Host, packed.map(Arc::new), |i| {
                from[i] as *const u8
            })
        }
    }

    /// Queues the pieces of a `len`-byte message, piece `i` read from `at(i)`.
    ///
    /// # Safety
    /// Each `at(i)` addresses the piece's bytes (of `mem`), valid and unmodified until the
    /// op's wait has returned or it is dropped (`packed`, if any, is kept that long).
    unsafe fn post_pieces(
        sh: Arc<Shared>,
        peer: usize,
        tag: Tag,
        len: usize,
        mem: Mem,
        packed: Option<Arc<Staging>>,
        at: impl Fn(usize) -> *const u8,
    ) -> Result<Self> {
        let n = pieces(len, sh.piece);
        let mut op = OfiSend {
            sh: sh.clone(),
            peer,
            tag,
            left: Vec::with_capacity(n),
            packed,
        };
        let mut st = sh.ep.lock();
        for i in 0..n {
            let off = i * sh.piece;
            let plen = (len - off.min(len)).min(sh.piece);
            let c = ctx();
            // SAFETY: the piece's memory is valid until the wait returns or the op is dropped
            // (both withdraw or settle every piece; this function's contract); `c` is kept
            // in `left` until then.
            let r = unsafe { st.send(at(i), plen, sh.addrs[peer], tag, len as u64, &c, mem) };
            op.left.push(c);
            if let Err(e) = r {
                drop(st);
                return Err(e); // the op's drop withdraws what was queued
            }
        }
        Ok(op)
    }

    /// Takes finished pieces; `Done` when every piece completed.
    fn pump(&mut self, st: &mut State) -> Result<Step> {
        let before = self.left.len();
        let mut err = 0;
        self.left.retain(|c| match st.take(c) {
            Some(comp) => {
                if comp.err != 0 {
                    err = comp.err;
                }
                false
            }
            None => true,
        });
        if err != 0 {
            return Err(failed(&self.sh, self.peer, self.tag, "send to", err));
        }
        Ok(if self.left.is_empty() {
            Step::Done
        } else if self.left.len() < before {
            Step::Moved
        } else {
            Step::Idle
        })
    }

    /// Withdraws queued pieces and lets go of posted ones: a posted send ends when the peer
    /// takes it (its receive, or its drain receive once its side of the collective failed
    /// too), which the wait allows up to [`CONFIRM`] while the peer lives; then it is parked.
    /// Cancelling sends is not relied on (rxm does not cancel sends). A parked send's buffer
    /// may still be *read* by the provider after the caller got its error, never written.
    fn release(&mut self) {
        let left = std::mem::take(&mut self.left);
        if left.is_empty() {
            return;
        }
        let keys: Vec<usize> = left.iter().map(super::fabric::key).collect();
        let posted = self.sh.ep.lock().withdraw(&keys);
        let posted: Vec<Ctx> = left
            .into_iter()
            .filter(|c| posted.contains(&super::fabric::key(c)))
            .collect();
        // Only rxm is known to keep messages to one peer independent (a rendezvous waits for
        // its own match): with 1.17's shm a send left in flight holds up every later message
        // to that peer, so there an unended send closes the endpoint (later calls fail with
        // an error saying so) rather than letting the next collective hang.
        let otherwise = if self.sh.ep.caps.provider.contains("ofi_rxm") {
            Otherwise::Park
        } else {
            Otherwise::CloseSends
        };
        settle(
            &self.sh,
            self.peer,
            posted,
            CONFIRM,
            otherwise,
            self.packed.clone(),
        );
    }
}

impl SendOp for OfiSend {
    fn wait(mut self: Box<Self>, deadline: Instant) -> Result<()> {
        let sh = self.sh.clone();
        let (tag, peer) = (self.tag, self.peer);
        let r = wait(
            &sh,
            tag,
            peer,
            deadline,
            "sent a message never taken by",
            |st| self.pump(st),
        );
        if r.is_err() {
            self.release();
            if !faults::is_control(tag) && !faults::is_p2p(tag) {
                // This rank's receives of the failed collective will not come: drain them.
                sh.ep.lock().add_junk(faults::seq_of(tag), sh.piece);
            }
        }
        r
    }
}

impl Drop for OfiSend {
    fn drop(&mut self) {
        // A send dropped without its wait must still let go of the caller's memory.
        self.release();
    }
}

/// Where a receive puts its pieces.
pub enum Target<'a> {
    /// Straight into the destination.
    Into(&'a mut [u8]),
    /// Through bounce buffers, each piece handed to the consumer in order.
    Sink(&'a mut dyn FnMut(usize, &[u8])),
    /// Into host segments laid end to end (`Transport::recvv_into`: writable, exclusive to
    /// this receive): a whole piece within one segment straight into it, the others through
    /// bounce buffers and scattered on arrival.
    Scatter(&'a [(*mut u8, usize)]),
    /// Straight into device memory at this address (`FI_HMEM` of the given kind): every
    /// piece, the last one included, is posted with its own length into the destination and
    /// written by the provider only (never through a host buffer, never copied here).
    Device(u64, Mem),
}

/// Receives the next message stamped `tag` from `peer`: exactly `len` bytes.
///
/// Every receive is posted with room for a whole piece (a piece shorter than that, the last
/// of an `Into` message, lands in a bounce buffer and is copied), so no message is ever
/// truncated whatever a mismatched peer sends: its length is checked on arrival instead.
/// (rxm 1.17 may never complete the sender of a truncated large message.)
///
/// Device receives ([`Target::Device`]) post the last piece with its exact length (no host
/// buffer may hold device bytes), so a longer message from a mismatched peer ends that piece
/// truncated (an error naming both ranks); its sender is waited for as any unended send.
///
/// **After a failure** the pieces still posted are cancelled. Those into this call's bounce
/// buffers are parked at once with their buffer (limbo owns it until the provider ends
/// them). Those into the caller's destination are waited for, up to [`CONFIRM`]: the caller
/// may free its memory as soon as it has the error, so control must not return while the
/// provider could still write there. The wait is short in practice (both providers cancel a
/// receive that has not matched at once, and one that has matched ends when its transfer
/// does); if it runs out the endpoint is closed, the only way to make a provider let go.
/// Receiving every piece through bounce buffers would avoid that wait at the price of a copy
/// of every received byte on the fast path.
pub fn recv(
    sh: &Shared,
    peer: usize,
    tag: Tag,
    len: usize,
    deadline: Instant,
    mut target: Target<'_>,
) -> Result<()> {
    let piece = sh.piece;
    let n = pieces(len, piece);
    let plen_of = |i: usize| (len - (i * piece).min(len)).min(piece);
    // Scatter: where each piece goes when it lies whole in one segment.
    let (starts, direct) = match &target {
        Target::Scatter(segs) => {
            let (starts, _) = seg_starts(segs);
            let addrs: Vec<(usize, usize)> = segs.iter().map(|&(p, n)| (p as usize, n)).collect();
            let direct: Vec<Option<usize>> = (0..n)
                .map(
                    |i| match seg_parts(&addrs, i * piece, plen_of(i)).as_slice() {
                        [(p, _)] if plen_of(i) == piece => Some(*p),
                        _ => None,
                    },
                )
                .collect();
            (starts, direct)
        }
        _ => (Vec::new(), Vec::new()),
    };
    let sink = match &target {
        Target::Sink(_) => true,
        Target::Scatter(_) => direct.iter().any(Option::is_none),
        _ => false,
    };
    let window = if sink { SINK_WINDOW } else { INTO_WINDOW };
    // Sink (and Scatter with pieces over several segments): `window` slots of a piece each;
    // Into: one slot for a short last piece; Device: none (from the shared staging pool: a
    // buffer parked after a failure returns to it only once the provider has ended every
    // operation on it).
    let mut bounce = match &target {
        Target::Sink(_) | Target::Scatter(_) if sink => Some(sh.take_bounce(window * piece)),
        Target::Into(_) if plen_of(n - 1) < piece => Some(sh.take_bounce(piece)),
        _ => None,
    };
    let src = sh.addrs[peer];
    // Posted pieces: index, context, whether into the bounce buffer.
    let mut posted: VecDeque<(usize, Ctx, bool)> = VecDeque::new();
    let mut next = 0usize;
    let check = |i: usize, c: &super::sys::Comp| -> Result<()> {
        let plen = plen_of(i);
        if c.tag != tag {
            // A later collective's piece: the peer gave this one up, and the refusal saying
            // why may still be on its way (as on the TCP and thread transports).
            sh.ctl.faults().explain(tag, c.tag, peer, deadline)?;
            return Err(faults::mismatch(sh.rank, peer, tag, c.tag));
        }
        if c.err == super::sys::FI_ETRUNC {
            return Err(Error::remote(format!(
                "rank {} expected a message of {len} bytes from rank {peer} ({}) but it sent \
                 more",
                sh.rank,
                faults::describe(faults::call_of(tag))
            )));
        }
        if c.err != 0 {
            return Err(failed(sh, peer, tag, "receive from", c.err));
        }
        let total_known = c.flags & super::sys::fi_remote_cq_data() != 0;
        if c.len as usize != plen || (total_known && c.data != len as u64) {
            let sent = if total_known {
                format!("{} bytes", c.data)
            } else {
                "a different length".into()
            };
            return Err(Error::remote(format!(
                "rank {} expected a message of {len} bytes from rank {peer} ({}) but it sent \
                 {sent}: do all ranks pass the same counts?",
                sh.rank,
                faults::describe(faults::call_of(tag))
            )));
        }
        Ok(())
    };
    let r = wait(
        sh,
        tag,
        peer,
        deadline,
        "waited in vain for a message from",
        |st| {
            let mut moved = false;
            while let Some((i, c, _)) = posted.front() {
                let Some(comp) = st.take(c) else { break };
                let i = *i;
                posted.pop_front();
                moved = true;
                check(i, &comp)?;
                let got = comp.len as usize;
                match (&mut target, &bounce) {
                    (Target::Sink(sink), Some(b)) => {
                        let slot = (i % window) * piece;
                        sink(i * piece, &b.bytes()[slot..slot + got]);
                    }
                    (Target::Into(dst), Some(b)) if got < piece => {
                        dst[i * piece..i * piece + got].copy_from_slice(&b.bytes()[..got]);
                    }
                    (Target::Scatter(segs), Some(b)) if direct[i].is_none() => {
                        let slot = (i % window) * piece;
                        scatter(segs, &starts, i * piece, &b.bytes()[slot..slot + got]);
                    }
                    _ => {}
                }
            }
            let done_upto = posted.front().map_or(next, |(i, _, _)| *i);
            while next < n && next < done_upto + window {
                let off = next * piece;
                // Room posted: a whole piece (nothing is truncated), except on device memory.
                let mut room = piece;
                let mut mem = Mem::Host;
                let straight = direct.get(next).copied().flatten();
                let (ptr, viab) = match (&mut target, &mut bounce, straight) {
                    (Target::Into(dst), _, _) if plen_of(next) == piece => {
                        (dst[off..].as_mut_ptr(), false)
                    }
                    (Target::Into(_), Some(b), _) => (b.bytes_mut().as_mut_ptr(), true),
                    (Target::Scatter(_), _, Some(p)) => (p as *mut u8, false),
                    (Target::Sink(_) | Target::Scatter(_), Some(b), _) => {
                        (b.bytes_mut()[(next % window) * piece..].as_mut_ptr(), true)
                    }
                    (Target::Device(base, m), _, _) => {
                        room = plen_of(next);
                        mem = *m;
                        ((*base as usize + off) as *mut u8, false)
                    }
                    _ => unreachable!(
                        "a bounce buffer is taken for every host piece shorter than a piece"
                    ),
                };
                let c = ctx();
                // SAFETY: the piece's memory (a whole piece of the caller's destination or of
                // one of its segments, or a piece-sized slot of this call's bounce buffer) is
                // not touched by this thread until its completion is taken; on failure it is
                // waited for (destination) or parked with the bounce buffer (see the
                // function's documentation). Only the last piece of an `Into` message uses
                // the bounce buffer there, and Sink and Scatter pieces take slot `i % window`
                // with at most `window` consecutive pieces posted, so no two posted pieces
                // share a slot.
                if !unsafe { st.recv(ptr, room, src, tag, &c, mem)? } {
                    break;
                }
                posted.push_back((next, c, viab));
                next += 1;
                moved = true;
            }
            Ok(if next == n && posted.is_empty() {
                Step::Done
            } else if moved {
                Step::Moved
            } else {
                Step::Idle
            })
        },
    );
    if r.is_err() {
        let (viab, user): (Vec<_>, Vec<_>) = posted.into_iter().partition(|(_, _, b)| *b);
        if let (false, Some(b)) = (viab.is_empty(), bounce.take()) {
            // Parked with the bounce buffer, which limbo now owns: it returns to the staging
            // pool only when the last of these operations has ended (or the endpoint closed).
            let buf = Arc::new(b);
            let mut st = sh.ep.lock();
            for (_, c, _) in viab {
                st.cancel(&c);
                st.park(c, Some(buf.clone()));
            }
        }
        let user: Vec<Ctx> = user.into_iter().map(|(_, c, _)| c).collect();
        settle(sh, peer, user, CONFIRM, Otherwise::Close, None);
        if !faults::is_control(tag) && !faults::is_p2p(tag) {
            // The sender's other pieces of this message must not wait for a receive.
            sh.ep.lock().add_junk(faults::seq_of(tag), sh.piece);
        }
    }
    if let Some(b) = bounce {
        sh.give_bounce(b); // nothing posted targets it any more
    }
    r
}
