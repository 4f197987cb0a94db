//! The device branch of the C ABI: a collective called with a CUDA stream runs on device
//! memory of that stream's GPU, ordered on the stream; the call returns once it is queued
//! (NCCL's semantics, see `Communicator::enqueue_collective_device`).

#[cfg(not(feature = "cuda"))]
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

/// Without feature `cuda`, a stream is an error.
///
/// # Safety
/// None (nothing is dereferenced); `unsafe` to match the CUDA build's signature.
#[cfg(not(feature = "cuda"))]
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
        "a stream was given (device buffers), but this libpccl was built without CUDA: \
         rebuild with `--features cuda`, or pass stream = NULL with host buffers",
    ))
}
