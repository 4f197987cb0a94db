//! Rooted collectives (reduce, gather, scatter) and the even all-to-all as plans; the uneven
//! all-to-all is in `alltoallv`.

use super::{len_mul, Call, Communicator};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::BlockLayout;
use crate::plan::Collective;

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
}
