//! Collectives on GPU memory: the device front end of [`Communicator`].
//!
//! The buffers are device memory of one [`CudaDevice`] handle (cudarc `CudaSlice<u8>`s or
//! views of them, holding elements of `T`, as the rest of `device::cuda` takes them; or raw
//! device addresses in [`Communicator::raw_collective_device`]). They run the plans of the
//! host path (same tags, same tuner choice and plan cache, so host and device collectives
//! interleave on one communicator) on the device executor ([`crate::exec::device`]), which
//! stages messages through pinned host memory and reduces on the device. Staged messages are
//! cut as the host path cuts them (an explicit `PCCL_CHUNK_SIZE`, else the tuner's piece for
//! the call), so every rank must use the same `PCCL_CHUNK_SIZE` setting and tuning profile.
//!
//! The calls are blocking: they return once the collective's device work is done, ordered
//! after the work already queued on the handle's stream.

use super::communicator::{Communicator, RawCollective};
use crate::device::cuda::CudaDevice;
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut};

fn elems_of<T: Element>(bytes: usize, what: &str) -> Result<usize> {
    let es = std::mem::size_of::<T>();
    if bytes % es != 0 {
        return Err(Error::invalid(format!(
            "{what}: device buffer of {bytes} bytes is not a whole number of {} elements",
            T::DTYPE
        )));
    }
    Ok(bytes / es)
}

/// Elements of `T` in `bytes` bytes; `usize::MAX` (which no agreement accepts) when they
/// are not whole.
fn whole_elems<T>(bytes: usize) -> usize {
    let es = std::mem::size_of::<T>();
    if bytes % es == 0 {
        bytes / es
    } else {
        usize::MAX
    }
}

fn count_of(n: usize, p: usize, what: &str) -> Result<usize> {
    if n % p != 0 {
        return Err(Error::invalid(format!(
            "{what}: buffer of {n} elements is not {p} equal blocks (one per rank)"
        )));
    }
    Ok(n / p)
}

impl Communicator {
    /// [`Communicator::all_gather`] on device buffers of `dev`: `input` holds `count`
    /// elements of `T`, `output` `count * size()`.
    pub fn all_gather_device<T: Element>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
    ) -> Result<()> {
        let count = elems_of::<T>(input.len(), "all_gather_device")?;
        let out = elems_of::<T>(output.len(), "all_gather_device")?;
        if out != count * self.size() {
            return Err(Error::invalid(format!(
                "all_gather_device: output holds {out} elements but {} ranks x {count} needs {}",
                self.size(),
                count * self.size()
            )));
        }
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: both buffers are borrowed for the whole blocking call and distinct borrows.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllGather, s, r, count) }
    }

    /// [`Communicator::reduce_scatter`] on device buffers: `input` holds `count * size()`
    /// elements, `output` `count`.
    pub fn reduce_scatter_device<T: Element>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(input.len(), "reduce_scatter_device")?;
        let count = elems_of::<T>(output.len(), "reduce_scatter_device")?;
        if n != count * self.size() {
            return Err(Error::invalid(format!(
                "reduce_scatter_device: input holds {n} elements but {} ranks x {count} needs {}",
                self.size(),
                count * self.size()
            )));
        }
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: as in `all_gather_device`.
        unsafe {
            self.raw_collective_device::<T>(dev, RawCollective::ReduceScatter(op), s, r, count)
        }
    }

    /// [`Communicator::all_reduce`] on device buffers of equal length.
    pub fn all_reduce_device<T: Element>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(input.len(), "all_reduce_device")?;
        if output.len() != input.len() {
            return Err(Error::invalid(format!(
                "all_reduce_device: input has {} bytes but output has {}; they must match",
                input.len(),
                output.len()
            )));
        }
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: as in `all_gather_device`.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllReduce(op), s, r, n) }
    }

    /// In-place [`Communicator::all_reduce_device`].
    pub fn all_reduce_device_in_place<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "all_reduce_device_in_place")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        // SAFETY: `buf` is borrowed for the whole call; send == recv is the in-place form.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllReduce(op), b, b, n) }
    }

    /// In-place reduce-scatter on a device buffer of `count * size()` elements: the result
    /// lands in block `rank()`.
    pub fn reduce_scatter_device_in_place<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "reduce_scatter_device_in_place")?;
        let count = count_of(n, self.size(), "reduce_scatter_device_in_place")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        let r = b + (self.rank() * count * std::mem::size_of::<T>()) as u64;
        // SAFETY: `buf` is borrowed for the whole call; recv = send + rank*count is the
        // in-place form.
        unsafe {
            self.raw_collective_device::<T>(dev, RawCollective::ReduceScatter(op), b, r, count)
        }
    }

    /// In-place all-gather on a device buffer of `count * size()` elements whose block
    /// `rank()` holds this rank's share.
    pub fn all_gather_device_in_place<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "all_gather_device_in_place")?;
        let count = count_of(n, self.size(), "all_gather_device_in_place")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        let s = b + (self.rank() * count * std::mem::size_of::<T>()) as u64;
        // SAFETY: `buf` is borrowed for the whole call; send = recv + rank*count is the
        // in-place form.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllGather, s, b, count) }
    }

    /// [`Communicator::broadcast`] of a device buffer.
    pub fn broadcast_device<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
        root: usize,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "broadcast_device")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::Broadcast(root), b, b, n) }
    }

    /// [`Communicator::all_gather_quantized`] on device buffers of `dev`: `input` holds
    /// `count` elements of `T`, `output` `count * size()`; encoded and decoded by the GPU's
    /// kernels ([`Communicator::all_gather_quantized_on`]). Buffers that do not fit fail the
    /// call on every rank.
    pub fn all_gather_quantized_device<T: crate::quant::QuantFloat>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
        q: crate::Quant,
    ) -> Result<()> {
        let (count, out) = (
            whole_elems::<T>(input.len()),
            whole_elems::<T>(output.len()),
        );
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: both buffers are borrowed for the whole blocking call, distinct borrows;
        // their lengths are checked in the call's agreement.
        unsafe { self.all_gather_quantized_on::<T, CudaDevice>(dev, (s, r), (count, out), q) }
    }

    /// [`Communicator::reduce_scatter_quantized`] on device buffers of `dev`: `input` holds
    /// `count * size()` elements of `T`, `output` `count`
    /// ([`Communicator::reduce_scatter_quantized_on`]).
    pub fn reduce_scatter_quantized_device<T: crate::quant::QuantFloat>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
        q: crate::Quant,
        average: bool,
    ) -> Result<()> {
        let (n, count) = (
            whole_elems::<T>(input.len()),
            whole_elems::<T>(output.len()),
        );
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        let how = (q, average, crate::QuantScheme::TwoHop);
        // SAFETY: as in `all_gather_quantized_device`.
        unsafe { self.reduce_scatter_quantized_on::<T, CudaDevice>(dev, (s, r), (count, n), how) }
    }

    /// [`Communicator::raw_collective`] on device addresses of `dev`'s context, with NCCL's
    /// count conventions and in-place forms: [`Communicator::collective_on`] on CUDA.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory valid for the element counts the collective
    /// implies, untouched by others until the call returns.
    pub unsafe fn raw_collective_device<T: Element>(
        &self,
        dev: &CudaDevice,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.collective_on::<T, CudaDevice>(dev, coll, send, recv, count) }
    }

    /// [`Communicator::raw_collective_device`] ordered on `dev`'s stream without blocking the
    /// caller: [`Communicator::enqueue_on`] on CUDA (its stream gate is a
    /// [`crate::device::cuda::StreamGate`]).
    ///
    /// # Safety
    /// `send` and `recv` must be device memory valid for the counts the collective implies,
    /// untouched by other work until `dev`'s stream has passed the collective.
    pub unsafe fn enqueue_collective_device<T: Element>(
        &self,
        dev: &CudaDevice,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_on::<T, CudaDevice>(dev, coll, send, recv, count) }
    }
}
