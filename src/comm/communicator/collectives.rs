//! The collectives of [`Communicator`] on slices: blocking, non-blocking (a [`Request`] that
//! owns its buffers until it completes), and the raw-pointer forms the C ABI calls.

use super::{Communicator, RawCollective};
use crate::comm::request::Request;
use crate::dtype::{Element, ReduceOp};
use crate::error::Result;

impl Communicator {
    // ---- blocking collectives -------------------------------------------------------------

    /// Gathers every rank's `input` into `output` in rank order
    /// (`output.len() == input.len() * size()`).
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("all_gather", || {
                self.all_gather_call(input.as_ptr(), input.len(), o, n)
            })
        }
    }

    /// In-place all-gather: this rank's share is already at block `rank()` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let (base, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for the whole call; the aliasing is the in-place form.
        unsafe {
            self.blocking("all_gather_in_place", || {
                let count = self.block_of(len, "all_gather_in_place")?;
                // Block `rank` of `buf` is in bounds (`count * size == len`).
                let inp = base.wrapping_add(self.rank() * count);
                self.all_gather_call(inp, count, base, len)
            })
        }
    }

    /// Reduces everyone's `input` with `op` and leaves block `rank()` of the result in
    /// `output` (`input.len() == output.len() * size()`).
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("reduce_scatter", || {
                self.reduce_scatter_call::<T>(input.as_ptr(), input.len(), o, n, op)
            })
        }
    }

    /// In-place reduce-scatter: the result lands in block `rank()` of `buf`; the other blocks
    /// are not written (partial sums live in the communicator's scratch space).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (base, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for the whole call; the aliasing is the in-place form.
        unsafe {
            self.blocking("reduce_scatter_in_place", || {
                let count = self.block_of(len, "reduce_scatter_in_place")?;
                // Block `rank` of `buf` is in bounds.
                let out = base.wrapping_add(self.rank() * count);
                self.reduce_scatter_call::<T>(base, len, out, count, op)
            })
        }
    }

    /// Reduces everyone's `input` with `op` into every rank's `output` (same lengths).
    pub fn all_reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        // SAFETY: both slices are borrowed for the whole blocking call.
        unsafe {
            self.blocking("all_reduce", || {
                self.all_reduce_call::<T>(input.as_ptr(), input.len(), o, n, op)
            })
        }
    }

    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (b, n) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for the whole call; the aliasing is the in-place form.
        unsafe {
            self.blocking("all_reduce_in_place", || {
                self.all_reduce_call::<T>(b, n, b, n, op)
            })
        }
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let (b, n) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.blocking("broadcast", || self.broadcast_call::<T>(b, n, root)) }
    }

    /// Returns only when every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: the barrier touches no memory.
        unsafe { self.blocking("barrier", || Ok(self.barrier_call())) }
    }

    // ---- non-blocking collectives ---------------------------------------------------------

    /// Non-blocking [`Communicator::all_gather`]; `wait` gives the buffers back.
    pub fn all_gather_async<T, I, O>(&self, input: I, output: O) -> Result<Request<(I, O)>>
    where
        T: Element,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        self.nonblocking_io("all_gather_async", input, output, |ip, il, op, ol| {
            self.all_gather_call(ip, il, op, ol)
        })
    }

    /// Non-blocking [`Communicator::reduce_scatter`].
    pub fn reduce_scatter_async<T, I, O>(
        &self,
        input: I,
        output: O,
        op: ReduceOp,
    ) -> Result<Request<(I, O)>>
    where
        T: Element,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        self.nonblocking_io("reduce_scatter_async", input, output, |ip, il, outp, ol| {
            self.reduce_scatter_call::<T>(ip, il, outp, ol, op)
        })
    }

    /// Non-blocking in-place [`Communicator::all_reduce_in_place`].
    pub fn all_reduce_async<T, B>(&self, mut buf: B, op: ReduceOp) -> Result<Request<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let b = buf.as_mut();
        let (bp, n) = (b.as_mut_ptr(), b.len());
        // SAFETY: as in `all_gather_async`.
        unsafe {
            self.nonblocking(
                "all_reduce_async",
                || self.all_reduce_call::<T>(bp, n, bp, n, op),
                buf,
            )
        }
    }

    /// Non-blocking [`Communicator::broadcast`].
    pub fn broadcast_async<T, B>(&self, mut buf: B, root: usize) -> Result<Request<B>>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let b = buf.as_mut();
        let (bp, n) = (b.as_mut_ptr(), b.len());
        // SAFETY: as in `all_gather_async`.
        unsafe {
            self.nonblocking(
                "broadcast_async",
                || self.broadcast_call::<T>(bp, n, root),
                buf,
            )
        }
    }

    /// Non-blocking [`Communicator::barrier`].
    pub fn barrier_async(&self) -> Result<Request<()>> {
        // SAFETY: the barrier touches no memory.
        unsafe { self.nonblocking("barrier_async", || Ok(self.barrier_call()), ()) }
    }

    // ---- raw-pointer entry points (the C ABI) ----------------------------------------------

    /// Runs `coll` on raw buffers with NCCL's conventions: `count` is the all-gather send
    /// count, the reduce-scatter receive count, the all-reduce / broadcast element count. The
    /// in-place forms are recognised from the addresses (all-gather: `send == recv +
    /// rank*count`; reduce-scatter: `recv == send + rank*count`; all-reduce and broadcast:
    /// `send == recv`); any other overlap is an error.
    ///
    /// # Safety
    /// The buffers must be valid for the element counts the collective implies and stay
    /// untouched by others until the call returns.
    pub unsafe fn raw_collective<T: Element>(
        &self,
        coll: RawCollective,
        send: *const T,
        recv: *mut T,
        count: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.blocking("collective", || self.raw_call(coll, send, recv, count)) }
    }

    /// Non-blocking [`Communicator::raw_collective`].
    ///
    /// # Safety
    /// As for [`Communicator::raw_collective`], until the request has completed.
    pub unsafe fn raw_collective_async<T: Element>(
        &self,
        coll: RawCollective,
        send: *const T,
        recv: *mut T,
        count: usize,
    ) -> Result<Request<()>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.nonblocking("collective", || self.raw_call(coll, send, recv, count), ()) }
    }

    /// Non-blocking barrier for the C ABI.
    pub fn raw_barrier_async(&self) -> Result<Request<()>> {
        self.barrier_async()
    }
}
