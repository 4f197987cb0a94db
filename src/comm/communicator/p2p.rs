//! Point-to-point: `send` / `recv` with NCCL's semantics, and groups that post several of them
//! together (`ncclGroupStart` / `ncclGroupEnd`).
//!
//! Point-to-point calls are not collective: they take no communicator sequence number (the
//! ranks not involved would fall out of step). Each (sender, receiver) pair counts its own
//! messages instead, and a message's stamp carries that number with the [`stamps::P2P`] flag
//! and a fingerprint of (kind, dtype, sender, receiver), so it is never taken for collective
//! traffic, never dropped as a stale collective message, and never failed by a collective's
//! refusal. Sends to a peer are matched in order with that peer's receives; the receiver
//! checks the exact byte count, so a count (or dtype) mismatch fails the receive (and, on
//! transports whose sends complete only when taken, such as thread-ranks, the send too):
//! never wrong data.

use super::{lock, Communicator, Inner};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::transport::faults::{self as stamps, stamp, Tag};
use crate::transport::SendOp;
use crate::Request;
use std::marker::PhantomData;
use std::time::Instant;

/// Direction of a point-to-point operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Send to the peer.
    Send,
    /// Receive from the peer.
    Recv,
}

/// One send or receive of a batch, on raw memory (the C ABI builds these).
#[derive(Clone, Copy, Debug)]
pub struct P2pOp {
    /// The other rank.
    pub peer: usize,
    /// Send or receive.
    pub dir: Dir,
    /// Address of the buffer (read for a send, written for a receive).
    pub addr: usize,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
}

/// Per-pair message counters of a communicator (sends per receiver, receives per sender).
#[derive(Default)]
pub(super) struct P2pSeq {
    sent: Vec<u32>,
    received: Vec<u32>,
    /// Per sender, the number of the receive whose turn it is to take the next message
    /// (receives of separate requests finish on separate threads, in this order).
    taken: Vec<u32>,
}

/// Sends and receives posted together ([`Communicator::group_start`]); nothing moves until
/// [`Group::end`]. The buffers stay borrowed until then.
pub struct Group<'a> {
    comm: &'a Communicator,
    ops: Vec<P2pOp>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Group<'a> {
    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: usize) -> &mut Self {
        self.ops.push(P2pOp {
            peer,
            dir: Dir::Send,
            addr: buf.as_ptr() as usize,
            count: buf.len(),
            dtype: T::DTYPE,
        });
        self
    }

    /// Adds a receive from `peer` into `buf`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: usize) -> &mut Self {
        self.ops.push(P2pOp {
            peer,
            dir: Dir::Recv,
            addr: buf.as_mut_ptr() as usize,
            count: buf.len(),
            dtype: T::DTYPE,
        });
        self
    }

    /// Posts every send and receive of the group at once and waits for all of them (so a ring
    /// where every rank sends right and receives left cannot deadlock).
    pub fn end(self) -> Result<()> {
        // SAFETY: every buffer is borrowed for `'a`, which outlives this call; receive
        // buffers are exclusive borrows.
        unsafe { self.comm.raw_p2p("group_end", &self.ops) }
    }
}

impl Communicator {
    /// Starts a group of point-to-point operations (NCCL's `ncclGroupStart`): add sends and
    /// receives to the returned [`Group`], then [`Group::end`] posts them together.
    pub fn group_start(&self) -> Group<'_> {
        Group {
            comm: self,
            ops: Vec::new(),
            _borrow: PhantomData,
        }
    }

    /// Sends `buf` to `peer`; matched in order with `peer`'s receives from this rank, which
    /// must name the same count and dtype. Not collective: only the two ranks take part.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        let mut g = self.group_start();
        g.send(buf, peer);
        g.end()
    }

    /// Receives from `peer` into `buf` (the matching send must have `buf.len()` elements of
    /// the same dtype).
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let mut g = self.group_start();
        g.recv(buf, peer);
        g.end()
    }

    /// Non-blocking [`Communicator::send`]: queued behind this rank's earlier non-blocking
    /// calls; `wait` gives the buffer back.
    pub fn send_async<T, B>(&self, buf: B, peer: usize) -> Result<Request<B>>
    where
        T: Element,
        B: AsRef<[T]> + Send + 'static,
    {
        let b = buf.as_ref();
        let op = P2pOp {
            peer,
            dir: Dir::Send,
            addr: b.as_ptr() as usize,
            count: b.len(),
            dtype: T::DTYPE,
        };
        // SAFETY: the job owns `buf` until it completes; moving it does not move its heap
        // contents, which is what the op points into.
        unsafe { self.p2p_async("send_async", vec![op], buf) }
    }

    /// Non-blocking [`Communicator::recv`].
    pub fn recv_async<T, B>(&self, mut buf: B, peer: usize) -> Result<Request<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let b = buf.as_mut();
        let op = P2pOp {
            peer,
            dir: Dir::Recv,
            addr: b.as_mut_ptr() as usize,
            count: b.len(),
            dtype: T::DTYPE,
        };
        // SAFETY: as in `send_async`.
        unsafe { self.p2p_async("recv_async", vec![op], buf) }
    }

    /// Runs a batch of sends and receives on raw memory: every send posted, then every
    /// receive completed in order, then every send waited for. Arguments are checked for the
    /// whole batch before anything moves. Runs after this rank's earlier non-blocking calls
    /// have taken their place in each pair's message order (not after they completed: an
    /// earlier `send_async` still waiting for its receiver does not hold this call back).
    ///
    /// # Safety
    /// Every op's buffer must be valid for its count (readable for a send, writable and
    /// exclusive for a receive) until this returns.
    pub unsafe fn raw_p2p(&self, what: &str, ops: &[P2pOp]) -> Result<()> {
        let _one = self.inner.enter(what)?;
        self.inner.check_p2p(what, ops)?;
        self.inner.outstanding.wait_idle();
        // SAFETY: forwarded from the caller.
        unsafe {
            let posted = self.inner.post_p2p(ops);
            self.inner.finish_p2p(ops, posted)
        }
    }

    /// Queues a batch of sends and receives (as [`Communicator::raw_p2p`]); the request
    /// yields `keep`. The progress worker posts the sends and takes the receives' places in
    /// issue order, then hands the rest (receiving, waiting for the sends) to a thread of its
    /// own, so separate requests progress together: a ring of separate `send_async` /
    /// `recv_async` completes whatever their order and sizes. Sends to and receives from one
    /// peer still match in issue order, and collectives issued later wait for the receives.
    ///
    /// # Safety
    /// As for [`Communicator::raw_p2p`], until the request completes.
    pub unsafe fn p2p_async<K: Send + 'static>(
        &self,
        what: &str,
        ops: Vec<P2pOp>,
        keep: K,
    ) -> Result<Request<K>> {
        let _one = self.inner.enter(what)?;
        self.inner.check_p2p(what, &ops)?;
        let (req, done) = crate::comm::request::pair();
        let me = self.inner.clone();
        let job = Box::new(move || {
            // SAFETY: the caller keeps the buffers valid until the request completes.
            let posted = unsafe { me.post_p2p(&ops) };
            let receives = posted.receives;
            if receives {
                me.recvs.add();
            }
            // The finishing thread holds the communicator; this one lets go of it before
            // the request can complete (the last reference must not go on this thread
            // after the application finalised MPI).
            let pool = me.p2p_pool.clone();
            let inner = me;
            let finish = Box::new(move || {
                // SAFETY: as above.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                    inner.finish_p2p(&ops, posted)
                }))
                .unwrap_or_else(|_| Err(Error::internal("a point-to-point call panicked")))
                .map(|()| keep);
                if receives {
                    inner.recvs.done();
                }
                // The last reference must not go on this thread after the request completes.
                drop(inner);
                done.complete(r);
            });
            if let Err(finish) = pool.submit(finish) {
                finish(); // no thread to be had: finish it here, in order, as a blocking call
            }
        });
        self.queue_job(job, false)?;
        Ok(req)
    }
}

/// A checked batch of sends and receives whose per-pair message numbers were taken at the
/// call, to run later on other buffers (a batch queued on a device stream runs on pinned
/// copies of its buffers): it keeps its place in each pair's order whatever this rank calls
/// meanwhile. Dropped without running, it gives its receive turns back.
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) struct StampedP2p {
    comm: Communicator,
    ops: Vec<P2pOp>,
    tags: Option<Vec<(Tag, u32)>>,
}

#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
impl Communicator {
    /// Checks a batch's arguments as [`Communicator::raw_p2p`] does, taking nothing.
    pub(crate) fn check_p2p(&self, what: &str, ops: &[P2pOp]) -> Result<()> {
        self.inner.check_p2p(what, ops)
    }

    /// Checks a batch (as [`Communicator::raw_p2p`] does) and takes its message numbers.
    pub(crate) fn stamp_p2p(&self, what: &str, ops: &[P2pOp]) -> Result<StampedP2p> {
        self.inner.check_p2p(what, ops)?;
        Ok(StampedP2p {
            comm: self.handle(),
            ops: ops.to_vec(),
            tags: Some(self.inner.stamp_p2p(ops)),
        })
    }
}

#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
impl StampedP2p {
    /// The batch's operations (their buffers as given at the call).
    pub(crate) fn ops(&self) -> &[P2pOp] {
        &self.ops
    }

    /// Runs the batch with op `i`'s buffer at `addrs[i]` instead, to completion.
    ///
    /// # Safety
    /// Each `addrs[i]` must be valid for op `i`'s count and dtype (readable for a send,
    /// writable and exclusive for a receive) until this returns.
    pub(crate) unsafe fn run_at(mut self, addrs: &[usize]) -> Result<()> {
        let tags = self.tags.take().unwrap_or_default();
        let ops: Vec<P2pOp> = self
            .ops
            .iter()
            .zip(addrs)
            .map(|(op, &addr)| P2pOp { addr, ..*op })
            .collect();
        if ops.len() != tags.len() {
            self.comm.inner.forgo_p2p(&self.ops, &tags);
            return Err(Error::internal(
                "a stamped batch ran with the wrong buffers",
            ));
        }
        let inner = &self.comm.inner;
        // SAFETY: forwarded from the caller.
        unsafe {
            let posted = inner.post_stamped(&ops, tags);
            inner.finish_p2p(&ops, posted)
        }
    }
}

impl Drop for StampedP2p {
    fn drop(&mut self) {
        if let Some(tags) = self.tags.take() {
            self.comm.inner.forgo_p2p(&self.ops, &tags);
        }
    }
}

/// What [`Inner::post_p2p`] did: the stamps given, the sends posted, the first error.
pub(super) struct Posted {
    tags: Vec<(Tag, u32)>,
    sends: Vec<(usize, Box<dyn SendOp>)>,
    first: Option<Error>,
    deadline: Instant,
    /// Whether the batch receives from another rank.
    receives: bool,
}

impl Inner {
    fn check_p2p(&self, what: &str, ops: &[P2pOp]) -> Result<()> {
        let (p, me) = (self.transport.size(), self.transport.rank());
        for op in ops {
            if op.peer >= p {
                return Err(Error::invalid(format!(
                    "{what} on rank {me}: peer {} is not a rank of this communicator of {p}",
                    op.peer
                )));
            }
            let es = op.dtype.size();
            let bytes = op
                .count
                .checked_mul(es)
                .filter(|&b| isize::try_from(b).is_ok())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{what} on rank {me}: {} elements of {} overflow the address space",
                        op.count, op.dtype
                    ))
                })?;
            if op.count > 0 {
                if op.addr == 0 {
                    return Err(Error::invalid(format!(
                        "{what} on rank {me}: the buffer for rank {} is NULL but the count is {}",
                        op.peer, op.count
                    )));
                }
                if op.addr % es != 0 || op.addr.checked_add(bytes).is_none() {
                    return Err(Error::invalid(format!(
                        "{what} on rank {me}: the buffer for rank {} at {:#x} is misaligned for \
                         {} or wraps around the address space",
                        op.peer, op.addr, op.dtype
                    )));
                }
            }
        }
        Ok(())
    }

    /// The stamp of message `seq` from `src` to `dst` of `dtype`.
    fn p2p_tag(&self, seq: u32, src: usize, dst: usize, dtype: DType) -> Tag {
        let call = if self.cfg.checks {
            stamps::fingerprint(
                stamps::KIND_P2P,
                dtype as u32 + 1,
                0,
                &[src as u64, dst as u64],
            )
        } else {
            stamps::KIND_P2P
        };
        stamp(seq, call | stamps::P2P)
    }

    /// Gives a checked batch its stamps: per-pair message numbers, in issue order. Every
    /// receive's turn taken here must be given back ([`Inner::finish_p2p`], or
    /// [`Inner::forgo_p2p`] when the batch never runs).
    fn stamp_p2p(&self, ops: &[P2pOp]) -> Vec<(Tag, u32)> {
        let tr = self.transport.as_ref();
        let (p, me) = (tr.size(), tr.rank());
        let mut s = lock(&self.p2p);
        if s.sent.len() != p {
            s.sent = vec![0; p];
            s.received = vec![0; p];
            s.taken = vec![0; p];
        }
        ops.iter()
            .map(|op| {
                let (ctr, src, dst) = match op.dir {
                    Dir::Send => (&mut s.sent[op.peer], me, op.peer),
                    Dir::Recv => (&mut s.received[op.peer], op.peer, me),
                };
                let seq = *ctr;
                *ctr = ctr.wrapping_add(1);
                (self.p2p_tag(seq, src, dst, op.dtype), seq)
            })
            .collect()
    }

    /// Gives back the receive turns of a stamped batch that will not run (in order: each
    /// after the earlier receives from its peer ended), so later receives are not held.
    fn forgo_p2p(&self, ops: &[P2pOp], tags: &[(Tag, u32)]) {
        let me = self.transport.rank();
        for (op, &(_, seq)) in ops.iter().zip(tags) {
            if op.dir == Dir::Recv && op.peer != me {
                self.wait_turn(op.peer, seq);
                self.end_turn(op.peer);
            }
        }
    }

    /// Gives a checked batch its stamps, copies its messages to itself and posts its sends;
    /// never blocks. Every receive's turn taken here must be given back by
    /// [`Inner::finish_p2p`].
    ///
    /// # Safety
    /// As for [`Communicator::raw_p2p`], until `finish_p2p` has returned.
    pub(super) unsafe fn post_p2p(&self, ops: &[P2pOp]) -> Posted {
        let tags = self.stamp_p2p(ops);
        // SAFETY: forwarded from the caller.
        unsafe { self.post_stamped(ops, tags) }
    }

    /// [`Inner::post_p2p`] with stamps taken earlier ([`Inner::stamp_p2p`]).
    ///
    /// # Safety
    /// As for [`Inner::post_p2p`].
    unsafe fn post_stamped(&self, ops: &[P2pOp], tags: Vec<(Tag, u32)>) -> Posted {
        let tr = self.transport.as_ref();
        let me = tr.rank();
        let deadline = Instant::now() + self.timeout();
        let receives = ops.iter().any(|o| o.dir == Dir::Recv && o.peer != me);
        let mut posted = Posted {
            tags,
            sends: Vec::new(),
            first: None,
            deadline,
            receives,
        };
        // Messages to itself: the k-th send to itself goes to the k-th receive from itself.
        let selfs: Vec<&P2pOp> = ops
            .iter()
            .filter(|o| o.peer == me && o.dir == Dir::Send)
            .collect();
        let selfr: Vec<&P2pOp> = ops
            .iter()
            .filter(|o| o.peer == me && o.dir == Dir::Recv)
            .collect();
        if selfs.len() != selfr.len() {
            posted.first = Some(Error::invalid(format!(
                "rank {me}: {} sends to itself but {} receives from itself in one call or group; \
                 they must pair up",
                selfs.len(),
                selfr.len()
            )));
            return posted;
        }
        for (s, r) in selfs.iter().zip(&selfr) {
            let (sb, rb) = (s.count * s.dtype.size(), r.count * r.dtype.size());
            if sb != rb || s.dtype != r.dtype {
                posted.first = Some(Error::invalid(format!(
                    "rank {me}: a send to itself of {} {} meets a receive of {} {}",
                    s.count, s.dtype, r.count, r.dtype
                )));
                return posted;
            }
            if sb > 0 {
                // SAFETY: both buffers are valid for their (equal) byte counts (caller's
                // promise); `copy` allows them to overlap.
                unsafe { std::ptr::copy(s.addr as *const u8, r.addr as *mut u8, sb) };
            }
        }
        for (i, op) in ops.iter().enumerate() {
            if op.dir != Dir::Send || op.peer == me {
                continue;
            }
            let bytes = op.count * op.dtype.size();
            let ptr = if bytes > 0 {
                op.addr as *const u8
            } else {
                std::ptr::null()
            };
            // SAFETY: the buffer stays valid and unmodified until the wait below (caller's
            // promise), on every path.
            match unsafe { tr.isend(op.peer, posted.tags[i].0, ptr, bytes) } {
                Ok(s) => posted.sends.push((i, s)),
                Err(e) => {
                    posted.first = Some(p2p_context(me, op, posted.tags[i].1, e));
                    break;
                }
            }
        }
        posted
    }

    /// Completes a batch [`Inner::post_p2p`] posted: its receives in order, each after the
    /// earlier receives from the same peer (its turn), then the waits for its sends; the
    /// first error wins. Every receive's turn is given back, on every path.
    ///
    /// # Safety
    /// As for [`Communicator::raw_p2p`].
    pub(super) unsafe fn finish_p2p(&self, ops: &[P2pOp], posted: Posted) -> Result<()> {
        let tr = self.transport.as_ref();
        let me = tr.rank();
        let Posted {
            tags,
            sends,
            mut first,
            deadline,
            ..
        } = posted;
        for (i, op) in ops.iter().enumerate() {
            if op.dir != Dir::Recv || op.peer == me {
                continue;
            }
            let seq = tags[i].1;
            self.wait_turn(op.peer, seq);
            if first.is_none() {
                let bytes = op.count * op.dtype.size();
                let r = if bytes > 0 {
                    // SAFETY: the receive buffer is valid, writable and exclusive for its
                    // byte count (caller's promise).
                    let dst = unsafe { std::slice::from_raw_parts_mut(op.addr as *mut u8, bytes) };
                    tr.recv_into(op.peer, tags[i].0, dst, deadline)
                } else {
                    tr.recv_into(op.peer, tags[i].0, &mut [], deadline)
                };
                if let Err(e) = r {
                    first = Some(p2p_context(me, op, seq, e));
                }
            }
            self.end_turn(op.peer);
        }
        for (i, s) in sends {
            if let Err(e) = s.wait(deadline) {
                first.get_or_insert_with(|| p2p_context(me, &ops[i], tags[i].1, e));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Blocks until receive `seq` from `peer` is the next one to take that pair's message
    /// (every earlier one ends: by its message, an error or its deadline).
    fn wait_turn(&self, peer: usize, seq: u32) {
        let mut s = lock(&self.p2p);
        while s.taken.get(peer).is_some_and(|&t| t != seq) {
            s = self.p2p_turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Lets the next receive from `peer` go.
    fn end_turn(&self, peer: usize) {
        let mut s = lock(&self.p2p);
        if let Some(t) = s.taken.get_mut(peer) {
            *t = t.wrapping_add(1);
        }
        self.p2p_turn.notify_all();
    }
}

/// `e` with the point-to-point operation it happened in.
fn p2p_context(me: usize, op: &P2pOp, seq: u32, e: Error) -> Error {
    let way = match op.dir {
        Dir::Send => "send to",
        Dir::Recv => "receive from",
    };
    Error::new(
        e.kind(),
        format!(
            "rank {me}: {way} rank {} (point-to-point message #{seq} of that pair, {} \
             elements of {}): {}",
            op.peer,
            op.count,
            op.dtype,
            e.message()
        ),
    )
}
