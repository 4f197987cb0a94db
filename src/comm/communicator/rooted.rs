//! Rooted collectives (reduce, gather, scatter) and all-to-all as plans, and the uneven
//! all-to-all (`all_to_all_v`) as a direct pairwise exchange after a count agreement round.

use super::{len_mul, Call, Communicator, Inner};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{abandon, BlockLayout};
use crate::plan::alltoall::round_peers;
use crate::plan::Collective;
use crate::transport::faults::{self as stamps, stamp};
use crate::transport::SendOp;
use std::time::Instant;

/// A rooted collective or all-to-all named for the raw-pointer entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawRooted {
    /// Reduce toward the root (`count` = elements per rank).
    Reduce(ReduceOp, usize),
    /// Gather to the root (`count` = elements each rank sends).
    Gather(usize),
    /// Scatter from the root (`count` = elements each rank receives).
    Scatter(usize),
    /// All-to-all (`count` = elements sent to each rank).
    AllToAll,
}

fn uniform(count: usize, parts: usize) -> BlockLayout {
    BlockLayout::Uniform { count, parts }
}

/// One rank's side of an uneven all-to-all, checked: element ranges per peer.
/// `(offset, count)` in elements of the block sent to and received from each rank.
pub(crate) type AllToAllBlocks = (Vec<(usize, usize)>, Vec<(usize, usize)>);

struct Exchange<T> {
    send: *const T,
    recv: *mut T,
    /// `(offset, count)` of the block sent to each rank.
    out: Vec<(usize, usize)>,
    /// `(offset, count)` of the block received from each rank.
    inp: Vec<(usize, usize)>,
}

// SAFETY: an Exchange only carries pointers into buffers that the front end keeps alive and
// untouched until the call completes.
unsafe impl<T: Send> Send for Exchange<T> {}

/// Checks per-peer counts and displacements against a buffer of `len` elements.
fn ranges(
    what: &str,
    counts: &[usize],
    displs: &[usize],
    len: usize,
    p: usize,
) -> Result<Vec<(usize, usize)>> {
    if counts.len() != p || displs.len() != p {
        return Err(Error::invalid(format!(
            "all_to_all_v: {what} counts ({}) and displacements ({}) must have one entry per \
             rank ({p})",
            counts.len(),
            displs.len()
        )));
    }
    let mut v = Vec::with_capacity(p);
    for (r, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        match d.checked_add(c) {
            Some(end) if end <= len => v.push((d, c)),
            _ => {
                return Err(Error::invalid(format!(
                    "all_to_all_v: {what} block for rank {r} ({c} elements at {d}) runs past the \
                     {len}-element buffer"
                )))
            }
        }
    }
    Ok(v)
}

impl Communicator {
    /// Reduces every rank's `input` with `op` into `output` on `root` only (binomial tree,
    /// reducing on the way). On `root`, `output.len() == input.len()`; elsewhere `output` is
    /// not used (pass an empty slice).
    pub fn reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("reduce", || {
                self.reduce_call(input.as_ptr(), input.len(), o, n, op, root)
            })
        }
    }

    /// In-place reduce: `buf` is every rank's input, and on `root` it receives the result.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (b, n) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for the whole call; the aliasing is the in-place form.
        unsafe { self.blocking("reduce_in_place", || self.reduce_call(b, n, b, n, op, root)) }
    }

    /// Gathers every rank's `input` into `output` on `root`, in rank order
    /// (`output.len() == input.len() * size()` there; elsewhere `output` is not used).
    pub fn gather<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("gather", || {
                self.gather_call(input.as_ptr(), input.len(), o, n, root)
            })
        }
    }

    /// Scatters `root`'s `input` (`output.len() * size()` elements, block `i` for rank `i`):
    /// every rank's `output` gets its block. Elsewhere than `root`, `input` is not used.
    pub fn scatter<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("scatter", || {
                self.scatter_call(input.as_ptr(), input.len(), o, n, root)
            })
        }
    }

    /// All-to-all of equal blocks: block `j` of `input` goes to rank `j`, and block `i` of
    /// `output` comes from rank `i` (`input.len() == output.len()`, a multiple of `size()`).
    /// Pairwise exchange in `size() - 1` rounds.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("all_to_all", || {
                self.all_to_all_call(input.as_ptr(), input.len(), o, n)
            })
        }
    }

    /// Non-blocking [`Communicator::all_to_all`]; `wait` gives the buffers back.
    pub fn all_to_all_async<T, I, O>(&self, input: I, output: O) -> Result<crate::Request<(I, O)>>
    where
        T: Element,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        self.nonblocking_io("all_to_all_async", input, output, |ip, il, op, ol| {
            self.all_to_all_call(ip, il, op, ol)
        })
    }

    /// Uneven all-to-all (MPI's `MPI_Alltoallv`): this rank sends
    /// `input[send_displs[j]..][..send_counts[j]]` to rank `j` and receives rank `i`'s block
    /// into `output[recv_displs[i]..][..recv_counts[i]]`. The counts must agree pairwise
    /// (rank `i`'s send count to `j` equals `j`'s receive count from `i`): a disagreement is
    /// found before any data moves and fails the call on every rank. Receive blocks must not
    /// overlap.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        let check = || -> Result<Exchange<T>> {
            let p = self.size();
            let out = ranges("send", send_counts, send_displs, input.len(), p)?;
            let inp = ranges("receive", recv_counts, recv_displs, n, p)?;
            no_overlap(&inp)?;
            Ok(Exchange {
                send: input.as_ptr(),
                recv: o,
                out,
                inp,
            })
        };
        // SAFETY: both slices are borrowed for the whole call; the ranges were checked.
        unsafe { self.exchange::<T>("all_to_all_v", check) }
    }

    /// [`Communicator::all_to_all_v`] on raw buffers (the C ABI): `sendcounts` etc. are the
    /// per-rank arrays (already read from the caller's memory), `send_len`/`recv_len` the
    /// element extents they imply.
    ///
    /// # Safety
    /// `send` must be readable and `recv` writable for every block the counts and
    /// displacements name, untouched by others until the call returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn raw_all_to_all_v<T: Element>(
        &self,
        send: *const T,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: *mut T,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let check = || -> Result<Exchange<T>> {
            let p = self.size();
            let out = ranges("send", send_counts, send_displs, usize::MAX, p)?;
            let inp = ranges("receive", recv_counts, recv_displs, usize::MAX, p)?;
            let es = std::mem::size_of::<T>();
            let extent = |v: &[(usize, usize)]| -> Result<usize> {
                let n = v.iter().map(|&(d, c)| d + c).max().unwrap_or(0);
                len_mul(n, es, "all_to_all_v buffer size in bytes")
            };
            let (sb, rb) = (extent(&out)?, extent(&inp)?);
            if (sb > 0 && send.is_null()) || (rb > 0 && recv.is_null()) {
                return Err(Error::invalid(
                    "all_to_all_v: a buffer pointer is NULL but its counts are above zero",
                ));
            }
            let align = std::mem::align_of::<T>();
            if send as usize % align != 0 || recv as usize % align != 0 {
                return Err(Error::invalid(format!(
                    "all_to_all_v: buffers of dtype {} must be aligned to {align} bytes",
                    T::DTYPE
                )));
            }
            let (s0, r0) = (send as usize, recv as usize);
            if sb > 0 && rb > 0 && s0 < r0.saturating_add(rb) && r0 < s0.saturating_add(sb) {
                return Err(Error::invalid(
                    "all_to_all_v: send and receive buffers overlap (no in-place form)",
                ));
            }
            no_overlap(&inp)?;
            Ok(Exchange {
                send,
                recv,
                out,
                inp,
            })
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.exchange::<T>("all_to_all_v", check) }
    }

    /// The blocks of an uneven all-to-all on this communicator, checked as
    /// [`Communicator::all_to_all_v`] checks them: `(offset, count)` sent to and received from
    /// each rank, in elements.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn all_to_all_v_blocks(
        &self,
        send_counts: &[usize],
        send_displs: &[usize],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<AllToAllBlocks> {
        let p = self.size();
        let out = ranges("send", send_counts, send_displs, usize::MAX, p)?;
        let inp = ranges("receive", recv_counts, recv_displs, usize::MAX, p)?;
        no_overlap(&inp)?;
        Ok((out, inp))
    }

    /// An uneven all-to-all of checked blocks as collective `seq` (taken earlier) on the
    /// calling thread, without waiting for queued work: the host part of a queued device
    /// call (see [`Communicator::host_collective_as`]).
    ///
    /// # Safety
    /// `send` must be readable and `recv` writable for every block, untouched by others until
    /// this returns.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) unsafe fn host_all_to_all_v_as<T: Element>(
        &self,
        send: *const T,
        recv: *mut T,
        blocks: AllToAllBlocks,
        seq: u32,
    ) -> Result<()> {
        let (out, inp) = blocks;
        let ex = Exchange {
            send,
            recv,
            out,
            inp,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.exchange(&ex, seq) }
    }

    /// Rooted collectives and all-to-all on raw buffers with NCCL's conventions (see
    /// [`RawRooted`]). In-place forms recognised from the addresses: reduce `send == recv`;
    /// gather on the root `send == recv + root*count`; scatter on the root
    /// `recv == send + root*count`. Buffers a rank does not use (the receive buffer of a
    /// reduce or gather off the root, the send buffer of a scatter off the root) may be NULL.
    ///
    /// # Safety
    /// The buffers must be valid for the element counts the collective implies and stay
    /// untouched by others until the call returns.
    pub unsafe fn raw_rooted<T: Element>(
        &self,
        coll: RawRooted,
        send: *const T,
        recv: *mut T,
        count: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.blocking("collective", || {
                self.raw_rooted_call(coll, send, recv, count)
            })
        }
    }

    /// Non-blocking [`Communicator::raw_rooted`].
    ///
    /// # Safety
    /// As for [`Communicator::raw_rooted`], until the request has completed.
    pub unsafe fn raw_rooted_async<T: Element>(
        &self,
        coll: RawRooted,
        send: *const T,
        recv: *mut T,
        count: usize,
    ) -> Result<crate::Request<()>> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.nonblocking(
                "collective",
                || self.raw_rooted_call(coll, send, recv, count),
                (),
            )
        }
    }

    /// [`Communicator::raw_rooted`] as collective `seq` (taken earlier) on the calling
    /// thread without waiting for queued work: the host part of a queued device call (see
    /// [`Communicator::host_collective_as`]).
    ///
    /// # Safety
    /// As [`Communicator::raw_rooted`].
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) unsafe fn host_rooted_as<T: Element>(
        &self,
        coll: RawRooted,
        send: *const T,
        recv: *mut T,
        count: usize,
        seq: u32,
    ) -> Result<()> {
        self.run_as(self.raw_rooted_call(coll, send, recv, count), seq)
    }

    fn raw_rooted_call<T: Element>(
        &self,
        coll: RawRooted,
        send: *const T,
        recv: *mut T,
        count: usize,
    ) -> Result<Call<T>> {
        let (p, me) = (self.size(), self.rank());
        let es = std::mem::size_of::<T>();
        let root = match coll {
            RawRooted::Reduce(_, r) | RawRooted::Gather(r) | RawRooted::Scatter(r) => r,
            RawRooted::AllToAll => me,
        };
        if root >= p {
            return Err(Error::invalid(format!(
                "root {root} is not a rank of this communicator of {p}"
            )));
        }
        let all = len_mul(count, p, "count")?;
        let at_root = |n: usize| if me == root { n } else { 0 };
        let (in_len, out_len) = match coll {
            RawRooted::Reduce(..) => (count, at_root(count)),
            RawRooted::Gather(_) => (count, at_root(all)),
            RawRooted::Scatter(_) => (at_root(all), count),
            RawRooted::AllToAll => (all, all),
        };
        len_mul(in_len.max(out_len), es, "buffer size in bytes")?;
        if (in_len > 0 && send.is_null()) || (out_len > 0 && recv.is_null()) {
            return Err(Error::invalid(
                "a buffer pointer is NULL but the count is above zero",
            ));
        }
        let align = std::mem::align_of::<T>();
        if (in_len > 0 && send as usize % align != 0) || (out_len > 0 && recv as usize % align != 0)
        {
            return Err(Error::invalid(format!(
                "buffers of dtype {} must be aligned to {align} bytes",
                T::DTYPE
            )));
        }
        let (s0, s1) = (send as usize, send as usize + in_len * es);
        let (r0, r1) = (recv as usize, recv as usize + out_len * es);
        let overlap = in_len > 0 && out_len > 0 && s0 < r1 && r0 < s1;
        let inplace = match coll {
            RawRooted::Reduce(..) => s0 == r0,
            RawRooted::Gather(_) => s0 == r0 + root * count * es,
            RawRooted::Scatter(_) => r0 == s0 + root * count * es,
            RawRooted::AllToAll => false,
        };
        if overlap && !inplace {
            return Err(Error::invalid(
                "send and receive buffers overlap without being the in-place form \
                 (reduce: send = recv; gather: send = recv + root*count; scatter: \
                 recv = send + root*count; all-to-all has none)",
            ));
        }
        match coll {
            RawRooted::Reduce(op, root) => self.reduce_call(send, in_len, recv, out_len, op, root),
            RawRooted::Gather(root) => self.gather_call(send, in_len, recv, out_len, root),
            RawRooted::Scatter(root) => self.scatter_call(send, in_len, recv, out_len, root),
            RawRooted::AllToAll => self.all_to_all_call(send, in_len, recv, out_len),
        }
    }

    fn check_root(&self, what: &str, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "{what}: root {root} is not a rank of this communicator of {}",
                self.size()
            )));
        }
        Ok(())
    }

    fn reduce_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
        op: ReduceOp,
        root: usize,
    ) -> Result<Call<T>> {
        T::DTYPE.check_op(op)?;
        self.check_root("reduce", root)?;
        let at_root = self.rank() == root;
        if at_root && out_len != in_len {
            return Err(Error::invalid(format!(
                "reduce: the root's output holds {out_len} elements but the input has {in_len}"
            )));
        }
        Ok(Call {
            coll: Collective::Reduce {
                root,
                average: op == ReduceOp::Avg,
            },
            op,
            block_bytes: in_len * std::mem::size_of::<T>(),
            input: (inp, in_len, uniform(in_len, 1)),
            output: (out, out_len, uniform(in_len, usize::from(at_root))),
            scratch: uniform(in_len, usize::from(!at_root)),
        })
    }

    fn gather_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
        root: usize,
    ) -> Result<Call<T>> {
        self.check_root("gather", root)?;
        let p = self.size();
        let at_root = self.rank() == root;
        let need = len_mul(in_len, p, "gather")?;
        if at_root && out_len != need {
            return Err(Error::invalid(format!(
                "gather: the root's output holds {out_len} elements but {p} ranks x {in_len} \
                 needs {need}"
            )));
        }
        Ok(Call {
            coll: Collective::Gather { root },
            op: ReduceOp::Sum,
            block_bytes: in_len * std::mem::size_of::<T>(),
            input: (inp, in_len, uniform(in_len, 1)),
            output: (out, out_len, uniform(in_len, if at_root { p } else { 0 })),
            scratch: uniform(in_len, if at_root { 0 } else { p }),
        })
    }

    fn scatter_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
        root: usize,
    ) -> Result<Call<T>> {
        self.check_root("scatter", root)?;
        let p = self.size();
        let at_root = self.rank() == root;
        let need = len_mul(out_len, p, "scatter")?;
        if at_root && in_len != need {
            return Err(Error::invalid(format!(
                "scatter: the root's input holds {in_len} elements but {p} ranks x {out_len} \
                 needs {need}"
            )));
        }
        Ok(Call {
            coll: Collective::Scatter { root },
            op: ReduceOp::Sum,
            block_bytes: out_len * std::mem::size_of::<T>(),
            input: (inp, in_len, uniform(out_len, if at_root { p } else { 0 })),
            output: (out, out_len, uniform(out_len, 1)),
            scratch: uniform(out_len, if at_root { 0 } else { p }),
        })
    }

    fn all_to_all_call<T: Element>(
        &self,
        inp: *const T,
        in_len: usize,
        out: *mut T,
        out_len: usize,
    ) -> Result<Call<T>> {
        let count = self.block_of(in_len, "all_to_all")?;
        if out_len != in_len {
            return Err(Error::invalid(format!(
                "all_to_all: input has {in_len} elements but output has {out_len}; they must \
                 match"
            )));
        }
        let lay = uniform(count, self.size());
        Ok(Call {
            coll: Collective::AllToAll {
                direct: crate::plan::alltoall::use_direct(
                    count * std::mem::size_of::<T>(),
                    self.size(),
                    self.inner.cfg.alltoall_direct_max,
                ),
            },
            op: ReduceOp::Sum,
            block_bytes: count * std::mem::size_of::<T>(),
            input: (inp, in_len, lay),
            output: (out, out_len, lay),
            scratch: uniform(0, 0),
        })
    }

    /// Runs an uneven exchange as one collective: sequence number, refusal on every rank of
    /// bad arguments, then [`Inner::exchange`].
    ///
    /// # Safety
    /// The buffers the checked exchange points to must stay valid and otherwise untouched
    /// until this returns.
    unsafe fn exchange<T: Element>(
        &self,
        what: &str,
        check: impl FnOnce() -> Result<Exchange<T>>,
    ) -> Result<()> {
        let _one = self.inner.enter(what)?;
        let seq = self.inner.next_seq();
        let ex = check().map_err(|e| self.inner.refuse(seq, what, e))?;
        self.inner.quiesce();
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.exchange(&ex, seq) }
    }
}

/// Refuses receive blocks that overlap (two peers would write the same elements).
fn no_overlap(v: &[(usize, usize)]) -> Result<()> {
    let mut s: Vec<(usize, usize, usize)> = v
        .iter()
        .enumerate()
        .filter(|(_, &(_, c))| c > 0)
        .map(|(r, &(d, c))| (d, d + c, r))
        .collect();
    s.sort_unstable();
    for w in s.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::invalid(format!(
                "all_to_all_v: the receive blocks of ranks {} and {} overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(())
}

impl Inner {
    /// The uneven exchange of collective `seq`: round one tells every peer how many elements
    /// this rank expects from it (and checks what each peer expects from this rank); round
    /// two moves the data pairwise. Any disagreement fails the collective on every rank
    /// before data moves.
    ///
    /// # Safety
    /// As for [`Communicator::exchange`].
    unsafe fn exchange<T: Element>(&self, ex: &Exchange<T>, seq: u32) -> Result<()> {
        let tr = self.transport.as_ref();
        let (p, me) = (tr.size(), tr.rank());
        let tag = if self.cfg.checks {
            stamp(
                seq,
                stamps::fingerprint(12, T::DTYPE as u32 + 1, 0, &[p as u64]),
            )
        } else {
            stamp(seq, 0)
        };
        let deadline = Instant::now() + self.timeout();
        let es = std::mem::size_of::<T>();
        let r = (|| -> Result<()> {
            tr.faults().check(tag, me)?;
            // Round one: expectations (8 bytes per peer, bounded by the communicator size).
            let expect: Vec<[u8; 8]> = ex
                .inp
                .iter()
                .map(|&(_, c)| (c as u64).to_le_bytes())
                .collect();
            let mut sends: Vec<Box<dyn SendOp>> = Vec::with_capacity(p);
            let mut first: Option<Error> = None;
            for (j, e) in expect.iter().enumerate() {
                if j == me {
                    continue;
                }
                // SAFETY: `expect` outlives every send, waited for below on every path.
                match unsafe { tr.isend(j, tag, e.as_ptr(), 8) } {
                    Ok(s) => sends.push(s),
                    Err(e) => {
                        first = Some(e);
                        break;
                    }
                }
            }
            if first.is_none() && ex.out[me].1 != ex.inp[me].1 {
                first = Some(Error::invalid(format!(
                    "all_to_all_v: rank {me} sends {} elements to itself but expects {}",
                    ex.out[me].1, ex.inp[me].1
                )));
            }
            if first.is_none() {
                for j in (0..p).filter(|&j| j != me) {
                    let mut b = [0u8; 8];
                    if let Err(e) = tr.recv_into(j, tag, &mut b, deadline) {
                        first = Some(e);
                        break;
                    }
                    let theirs = u64::from_le_bytes(b);
                    if theirs != ex.out[j].1 as u64 {
                        first = Some(Error::invalid(format!(
                            "all_to_all_v: rank {me} sends {} elements to rank {j}, but rank {j} \
                             expects {theirs} from rank {me}: the counts must agree pairwise",
                            ex.out[j].1
                        )));
                        break;
                    }
                }
            }
            if let Some(e) = &first {
                abandon(tr, tag, e);
            }
            for s in sends {
                if let Err(e) = s.wait(deadline) {
                    first.get_or_insert(e);
                }
            }
            if let Some(e) = first {
                return Err(e);
            }
            // Own block.
            let (sd, n) = ex.out[me];
            let rd = ex.inp[me].0;
            if n > 0 {
                // SAFETY: checked ranges of the caller's buffers; the send and receive
                // buffers do not overlap (checked), and this block is written only here.
                unsafe { std::ptr::copy_nonoverlapping(ex.send.add(sd), ex.recv.add(rd), n) };
            }
            // Round two: pairwise data.
            for k in 1..p {
                let (to, from) = round_peers(me, p, k);
                let (sd, sn) = ex.out[to];
                let ptr = if sn > 0 {
                    // SAFETY: in bounds of the checked send range.
                    unsafe { ex.send.add(sd) as *const u8 }
                } else {
                    std::ptr::null()
                };
                // SAFETY: the send range stays valid and unmodified until the wait below.
                let s = unsafe { tr.isend(to, tag, ptr, sn * es)? };
                let (rd, rn) = ex.inp[from];
                let got = if rn > 0 {
                    // SAFETY: a checked receive range, disjoint from every other receive
                    // range and from the send buffer, written only by this receive.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ex.recv.add(rd), rn) };
                    tr.recv_into(from, tag, bytemuck::cast_slice_mut(dst), deadline)
                } else {
                    tr.recv_into(from, tag, &mut [], deadline)
                };
                if let Err(e) = &got {
                    abandon(tr, tag, e);
                }
                let sent = s.wait(deadline);
                got?;
                sent?;
            }
            Ok(())
        })();
        if let Err(e) = &r {
            abandon(tr, tag, e);
        }
        r
    }
}
