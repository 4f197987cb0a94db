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
//!
//! **Waits** read the completion queue (which drives the provider) and look at the failure
//! board ([`Faults::check`](crate::transport::Faults::check)) and the collective's deadline
//! on every step, so notices, deaths (seen by the control connections) and aborts end them
//! within a step.
//!
//! **Letting go.** A wait that fails cancels its operations still in flight and keeps
//! progressing until the provider reports each one ended (a peer's drain receives take an
//! unmatched send of a failed collective). If that does not happen within [`CONFIRM`], the
//! endpoint is closed (the provider then lets go of every buffer) and the transport fails
//! every later call: control never returns to a caller whose buffer the provider may still
//! use.

use super::fabric::{ctx, Ctx, State};
use super::Shared;
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::{SendOp, Transport};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long cancelled operations may take to end before the endpoint is closed.
pub const CONFIRM: Duration = Duration::from_secs(2);
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
    loop {
        let s = {
            let mut st = sh.ep.lock();
            st.progress();
            step(&mut st)?
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
        if spins < 64 {
            std::hint::spin_loop();
        } else if now.duration_since(idle_since) < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Cancels the operations of `ctxs` and waits for each to end; closes the endpoint when the
/// provider does not confirm within [`CONFIRM`]. Afterwards their memory is free.
fn settle(sh: &Shared, peer: usize, ctxs: Vec<Ctx>) {
    if ctxs.is_empty() {
        return;
    }
    let mut left = ctxs;
    {
        let mut st = sh.ep.lock();
        for c in &left {
            st.cancel(c);
        }
    }
    let give_up = Instant::now() + CONFIRM;
    let dead = || sh.ctl.faults().dead_ranks().iter().any(|(r, _)| *r == peer);
    loop {
        let mut st = sh.ep.lock();
        if st.is_broken() {
            return;
        }
        st.progress();
        left.retain(|c| st.take(c).is_none());
        if left.is_empty() {
            return;
        }
        if dead() {
            // A dead peer never takes its messages: nothing to wait for (after a death the
            // communicator only shrinks, onto a fresh endpoint).
            st.close_with(format!(
                "rank {peer} died with operations of rank {} still in flight",
                sh.rank
            ));
            return;
        }
        if Instant::now() >= give_up {
            st.close_with(format!(
                "rank {}: {} operation(s) with rank {peer} could not be cancelled within {} s \
                 after a failed collective (the provider may still have used the caller's \
                 memory); create a new communicator",
                sh.rank,
                left.len(),
                CONFIRM.as_secs()
            ));
            return;
        }
        drop(st);
        std::thread::sleep(Duration::from_micros(200));
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
}

impl OfiSend {
    /// Queues a send of `len` bytes at `ptr` to `peer`, in pieces, and posts what the
    /// provider takes now (the rest is posted by whoever progresses the endpoint next).
    ///
    /// # Safety
    /// The memory stays valid and unmodified until the op's wait has returned (or it is
    /// dropped).
    pub unsafe fn post(
        sh: Arc<Shared>,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Self> {
        let n = pieces(len, sh.piece);
        let mut op = OfiSend {
            sh: sh.clone(),
            peer,
            tag,
            left: Vec::with_capacity(n),
        };
        let mut st = sh.ep.lock();
        for i in 0..n {
            let off = i * sh.piece;
            let plen = (len - off.min(len)).min(sh.piece);
            let c = ctx();
            // SAFETY: the piece lies inside the caller's buffer, valid until the wait returns
            // or the op is dropped (both withdraw or settle every piece); `c` is kept in
            // `left` until then.
            let r = unsafe {
                st.send(
                    (ptr as usize + off) as *const u8,
                    plen,
                    sh.addrs[peer],
                    tag,
                    len as u64,
                    &c,
                )
            };
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

    /// Withdraws queued pieces and lets go of posted ones (see [`settle`]).
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
        settle(&self.sh, self.peer, posted);
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
}

/// Receives the next message stamped `tag` from `peer`: exactly `len` bytes.
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
    let into = matches!(target, Target::Into(_));
    let window = if into { INTO_WINDOW } else { SINK_WINDOW };
    let mut bounce = if into {
        Vec::new()
    } else {
        sh.take_bounce(window * piece)
    };
    let src = sh.addrs[peer];
    let mut posted: VecDeque<(usize, Ctx)> = VecDeque::new();
    let mut next = 0usize;
    let check = |i: usize, c: &super::sys::Comp| -> Result<()> {
        let plen = (len - (i * piece).min(len)).min(piece);
        if c.tag != tag {
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
            while let Some((i, c)) = posted.front() {
                let Some(comp) = st.take(c) else { break };
                let i = *i;
                posted.pop_front();
                moved = true;
                check(i, &comp)?;
                if let Target::Sink(sink) = &mut target {
                    let slot = (i % window) * piece;
                    sink(i * piece, &bounce[slot..slot + comp.len as usize]);
                }
            }
            let done_upto = posted.front().map_or(next, |(i, _)| *i);
            while next < n && next < done_upto + window {
                let off = next * piece;
                let plen = (len - off.min(len)).min(piece);
                let ptr = match &mut target {
                    Target::Into(dst) => dst[off..].as_mut_ptr(),
                    Target::Sink(_) => bounce[(next % window) * piece..].as_mut_ptr(),
                };
                let c = ctx();
                // SAFETY: the piece's memory (the caller's destination or this call's bounce
                // buffer) is not touched by this thread until its completion is taken, and
                // this function does not return before every posted piece ended (settle).
                if !unsafe { st.recv(ptr, plen, src, tag, &c)? } {
                    break;
                }
                posted.push_back((next, c));
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
        settle(sh, peer, posted.into_iter().map(|(_, c)| c).collect());
        if !faults::is_control(tag) && !faults::is_p2p(tag) {
            // The sender's other pieces of this message must not wait for a receive.
            sh.ep.lock().add_junk(faults::seq_of(tag), sh.piece);
        }
    }
    if !into {
        sh.give_bounce(std::mem::take(&mut bounce));
    }
    r
}
