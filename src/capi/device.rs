//! The device branch of the C ABI: a collective called with a CUDA stream runs on device
//! memory of that stream's GPU, ordered on the stream; the call returns once it is queued
//! (NCCL's semantics, see `Communicator::enqueue_collective_device`). With a HIP stream (a
//! `rocm` build, or a `cuda,rocm` build where CUDA cannot be used) it waits for the stream,
//! then runs the collective to completion (`Communicator::collective_on`): blocking, so
//! ordered after the stream's earlier work and before its later work.

#[cfg(not(all(feature = "cuda", not(feature = "rocm"))))]
use crate::error::Error;
use crate::error::Result;
use crate::{Communicator, DType, RawCollective};
use std::ffi::c_void;

/// Queues `coll` on device buffers, ordered on `stream`.
///
/// # Safety
/// `send` and `recv` must be device memory valid for the counts `coll` implies, and `stream`
/// a valid CUDA stream (or `cudaStreamLegacy` / `cudaStreamPerThread`) of their GPU.
#[cfg(feature = "cuda")]
pub(super) unsafe fn collective(
    comm: &Communicator,
    coll: RawCollective,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    // Both back ends built: HIP when CUDA cannot run here but HIP loads.
    #[cfg(feature = "rocm")]
    if crate::device::cuda::ensure_available().is_err() && crate::device::hip::hip_api().is_ok() {
        // SAFETY: forwarded from the caller.
        return unsafe { hip_collective(comm, coll, dt, send, recv, count, stream) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { cuda_collective(comm, coll, dt, send, recv, count, stream) }
}

/// The CUDA branch of [`collective`].
///
/// # Safety
/// As [`collective`].
#[cfg(feature = "cuda")]
unsafe fn cuda_collective(
    comm: &Communicator,
    coll: RawCollective,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    use crate::device::cuda::CudaDevice;
    if count == 0 {
        return Ok(());
    }
    // The receive buffer is read on every rank (the send buffer of a broadcast only on root).
    let ordinal = CudaDevice::ordinal_of(recv as u64)?;
    // SAFETY: the caller guarantees `stream` is a stream of the buffers' GPU.
    let dev = unsafe { CudaDevice::with_stream(ordinal, stream) }?;
    let (s, r) = (send as u64, recv as u64);
    // SAFETY: forwarded from the caller.
    unsafe {
        match dt {
            DType::I8 => comm.enqueue_collective_device::<i8>(&dev, coll, s, r, count),
            DType::U8 => comm.enqueue_collective_device::<u8>(&dev, coll, s, r, count),
            DType::I32 => comm.enqueue_collective_device::<i32>(&dev, coll, s, r, count),
            DType::U32 => comm.enqueue_collective_device::<u32>(&dev, coll, s, r, count),
            DType::I64 => comm.enqueue_collective_device::<i64>(&dev, coll, s, r, count),
            DType::U64 => comm.enqueue_collective_device::<u64>(&dev, coll, s, r, count),
            DType::F16 => comm.enqueue_collective_device::<half::f16>(&dev, coll, s, r, count),
            DType::BF16 => comm.enqueue_collective_device::<half::bf16>(&dev, coll, s, r, count),
            DType::F32 => comm.enqueue_collective_device::<f32>(&dev, coll, s, r, count),
            DType::F64 => comm.enqueue_collective_device::<f64>(&dev, coll, s, r, count),
        }
    }
}

/// Runs `coll` on device buffers of a HIP stream's GPU, after the stream's queued work, to
/// completion.
///
/// # Safety
/// `send` and `recv` must be device memory valid for the counts `coll` implies, and `stream`
/// a valid HIP stream of their GPU.
#[cfg(feature = "rocm")]
unsafe fn hip_collective(
    comm: &Communicator,
    coll: RawCollective,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    use crate::device::hip::HipDevice;
    if count == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees `stream` is a valid HIP stream.
    let ordinal = unsafe { HipDevice::ordinal_of_stream(stream) }?;
    let dev = HipDevice::open(ordinal).map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "opening HIP device {ordinal} of the stream: {}",
                e.message()
            ),
        )
    })?;
    // SAFETY: as above.
    unsafe { HipDevice::sync_raw_stream(stream) }?;
    let (s, r) = (send as u64, recv as u64);
    // SAFETY: forwarded from the caller.
    unsafe {
        match dt {
            DType::I8 => comm.collective_on::<i8, HipDevice>(&dev, coll, s, r, count),
            DType::U8 => comm.collective_on::<u8, HipDevice>(&dev, coll, s, r, count),
            DType::I32 => comm.collective_on::<i32, HipDevice>(&dev, coll, s, r, count),
            DType::U32 => comm.collective_on::<u32, HipDevice>(&dev, coll, s, r, count),
            DType::I64 => comm.collective_on::<i64, HipDevice>(&dev, coll, s, r, count),
            DType::U64 => comm.collective_on::<u64, HipDevice>(&dev, coll, s, r, count),
            DType::F16 => comm.collective_on::<half::f16, HipDevice>(&dev, coll, s, r, count),
            DType::BF16 => comm.collective_on::<half::bf16, HipDevice>(&dev, coll, s, r, count),
            DType::F32 => comm.collective_on::<f32, HipDevice>(&dev, coll, s, r, count),
            DType::F64 => comm.collective_on::<f64, HipDevice>(&dev, coll, s, r, count),
        }
    }
}

/// A `rocm` build without `cuda`: the stream is a HIP stream.
///
/// # Safety
/// As [`hip_collective`].
#[cfg(all(feature = "rocm", not(feature = "cuda")))]
pub(super) unsafe fn collective(
    comm: &Communicator,
    coll: RawCollective,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { hip_collective(comm, coll, dt, send, recv, count, stream) }
}

/// Without feature `cuda` or `rocm`, a stream is an error.
///
/// # Safety
/// None (nothing is dereferenced); `unsafe` to match the device builds' signature.
#[cfg(not(any(feature = "cuda", feature = "rocm")))]
pub(super) unsafe fn collective(
    _comm: &Communicator,
    _coll: RawCollective,
    _dt: DType,
    _send: *const c_void,
    _recv: *mut c_void,
    _count: usize,
    _stream: *mut c_void,
) -> Result<()> {
    Err(Error::usage(
        "a stream was given (device buffers), but this libpccl was built without CUDA or ROCm: \
         rebuild with `--features cuda` (or `rocm`), or pass stream = NULL with host buffers",
    ))
}
