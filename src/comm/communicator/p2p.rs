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
    /// whole batch before anything moves.
    ///
    /// # Safety
    /// Every op's buffer must be valid for its count (readable for a send, writable and
    /// exclusive for a receive) until this returns.
    pub unsafe fn raw_p2p(&self, what: &str, ops: &[P2pOp]) -> Result<()> {
        let _one = self.inner.enter(what)?;
        self.inner.check_p2p(what, ops)?;
        self.inner.outstanding.wait_idle();
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.run_p2p(ops) }
    }

    /// Queues a batch of sends and receives (as [`Communicator::raw_p2p`]) on the progress
    /// worker; the request yields `keep`.
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
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                me.run_p2p(&ops)
            }))
            .unwrap_or_else(|_| Err(Error::internal("a point-to-point call panicked")))
            .map(|()| keep);
            drop(me);
            done.complete(r);
        });
        self.submit_job(job)?;
        Ok(req)
    }
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

    /// Runs a checked batch; see [`Communicator::raw_p2p`].
    ///
    /// # Safety
    /// As for [`Communicator::raw_p2p`].
    unsafe fn run_p2p(&self, ops: &[P2pOp]) -> Result<()> {
        let tr = self.transport.as_ref();
        let (p, me) = (tr.size(), tr.rank());
        let deadline = Instant::now() + self.timeout();
        // Sequence numbers per pair and direction, taken in issue order.
        let tags: Vec<(Tag, u32)> = {
            let mut s = lock(&self.p2p);
            if s.sent.len() != p {
                s.sent = vec![0; p];
                s.received = vec![0; p];
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
        };
        let ctx = |op: &P2pOp, seq: u32, e: Error| {
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
            return Err(Error::invalid(format!(
                "rank {me}: {} sends to itself but {} receives from itself in one call or group; \
                 they must pair up",
                selfs.len(),
                selfr.len()
            )));
        }
        for (s, r) in selfs.iter().zip(&selfr) {
            let (sb, rb) = (s.count * s.dtype.size(), r.count * r.dtype.size());
            if sb != rb || s.dtype != r.dtype {
                return Err(Error::invalid(format!(
                    "rank {me}: a send to itself of {} {} meets a receive of {} {}",
                    s.count, s.dtype, r.count, r.dtype
                )));
            }
            if sb > 0 {
                // SAFETY: both buffers are valid for their (equal) byte counts (caller's
                // promise); `copy` allows them to overlap.
                unsafe { std::ptr::copy(s.addr as *const u8, r.addr as *mut u8, sb) };
            }
        }
        let mut sends: Vec<(usize, Box<dyn SendOp>)> = Vec::new();
        let mut first: Option<Error> = None;
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
            match unsafe { tr.isend(op.peer, tags[i].0, ptr, bytes) } {
                Ok(s) => sends.push((i, s)),
                Err(e) => {
                    first = Some(ctx(op, tags[i].1, e));
                    break;
                }
            }
        }
        if first.is_none() {
            for (i, op) in ops.iter().enumerate() {
                if op.dir != Dir::Recv || op.peer == me {
                    continue;
                }
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
                    first = Some(ctx(op, tags[i].1, e));
                    break;
                }
            }
        }
        for (i, s) in sends {
            if let Err(e) = s.wait(deadline) {
                first.get_or_insert_with(|| ctx(&ops[i], tags[i].1, e));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
