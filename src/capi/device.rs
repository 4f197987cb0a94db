//! The device branch of the C ABI: a collective (or a rooted collective / all-to-all) called
//! with a stream runs on device memory of that stream's GPU, ordered on the stream; the call
//! returns once it is queued (NCCL's semantics, [`Communicator::enqueue_on`],
//! [`Communicator::enqueue_rooted_on`]), on CUDA and HIP alike. Which runtime a stream
//! belongs to is the communicator's setting (`pcclCommSetDeviceRuntime`, set by the torch
//! backend from `torch.version.hip`), else `PCCL_DEVICE_RUNTIME`, else CUDA where libcuda
//! loads and HIP otherwise.

use super::{pcclDeviceRuntime_t, pcclRuntimeAuto, pcclRuntimeCuda, pcclRuntimeHip};
use crate::error::{Error, Result};
use crate::{Communicator, DType, RawCollective, RawRooted};
use std::ffi::c_void;

/// The device runtimes a stream can belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runtime {
    Cuda,
    Hip,
}

/// Checks a `pcclDeviceRuntime_t` (known, and built into this library).
pub(super) fn check_runtime(runtime: pcclDeviceRuntime_t) -> Result<()> {
    match runtime {
        pcclRuntimeAuto => Ok(()),
        pcclRuntimeCuda if cfg!(feature = "cuda") => Ok(()),
        pcclRuntimeHip if cfg!(feature = "rocm") => Ok(()),
        pcclRuntimeCuda => Err(Error::usage(
            "pcclRuntimeCuda: this libpccl was built without CUDA (rebuild with `--features cuda`)",
        )),
        pcclRuntimeHip => Err(Error::usage(
            "pcclRuntimeHip: this libpccl was built without ROCm (rebuild with `--features rocm`)",
        )),
        v => Err(Error::invalid(format!(
            "device runtime {v} is not a pcclDeviceRuntime_t (0 pcclRuntimeAuto, 1 \
             pcclRuntimeCuda, 2 pcclRuntimeHip)"
        ))),
    }
}

/// The runtime of a call: the communicator's setting, else `PCCL_DEVICE_RUNTIME`
/// (`cuda`, `hip`, `auto`), else CUDA where it loads (or is the only one built), else HIP.
fn runtime_of(setting: pcclDeviceRuntime_t) -> Result<Runtime> {
    check_runtime(setting)?;
    let from_env = match std::env::var("PCCL_DEVICE_RUNTIME")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
        .as_str()
    {
        "" | "auto" => pcclRuntimeAuto,
        "cuda" => pcclRuntimeCuda,
        "hip" | "rocm" => pcclRuntimeHip,
        v => {
            return Err(Error::usage(format!(
                "PCCL_DEVICE_RUNTIME={v}: expected cuda, hip or auto"
            )))
        }
    };
    let chosen = if setting != pcclRuntimeAuto {
        setting
    } else {
        check_runtime(from_env)
            .map_err(|e| Error::new(e.kind(), format!("PCCL_DEVICE_RUNTIME: {}", e.message())))?;
        from_env
    };
    Ok(match chosen {
        pcclRuntimeCuda => Runtime::Cuda,
        pcclRuntimeHip => Runtime::Hip,
        _ => auto_runtime(),
    })
}

/// Whether runtime `rt` is built in and loads here.
fn available(rt: Runtime) -> Result<()> {
    match rt {
        #[cfg(feature = "cuda")]
        Runtime::Cuda => crate::device::cuda::ensure_available(),
        #[cfg(feature = "rocm")]
        Runtime::Hip => crate::device::hip::hip_api().map(|_| ()),
        #[allow(unreachable_patterns)]
        Runtime::Cuda => check_runtime(pcclRuntimeCuda),
        #[allow(unreachable_patterns)]
        Runtime::Hip => check_runtime(pcclRuntimeHip),
    }
}

/// CUDA where it can run (or where it is the only runtime built), else HIP.
fn auto_runtime() -> Runtime {
    #[cfg(all(feature = "cuda", feature = "rocm"))]
    if crate::device::cuda::ensure_available().is_err() && crate::device::hip::hip_api().is_ok() {
        return Runtime::Hip;
    }
    if cfg!(feature = "cuda") {
        Runtime::Cuda
    } else {
        Runtime::Hip
    }
}

/// What a device call runs: a collective, or a rooted collective / all-to-all.
#[derive(Clone, Copy, Debug)]
// Read only by the CUDA and HIP branches (a build without either refuses every stream).
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(super) enum DeviceOp {
    /// `pcclAllGather`, `pcclReduceScatter`, `pcclAllReduce`, `pcclBroadcast`.
    Coll(RawCollective),
    /// `pcclReduce`, `pcclGather`, `pcclScatter`, `pcclAllToAll`.
    Rooted(RawRooted),
}

/// Queues `op` on device buffers, ordered on `stream` of the runtime `runtime` (a
/// `pcclDeviceRuntime_t`, see [`runtime_of`]).
///
/// # Safety
/// `send` and `recv` must be device memory valid for the counts `coll` implies, and `stream`
/// a valid stream of their GPU in that runtime (for CUDA also `cudaStreamLegacy` /
/// `cudaStreamPerThread`).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn collective(
    comm: &Communicator,
    runtime: pcclDeviceRuntime_t,
    coll: DeviceOp,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    if cfg!(not(any(feature = "cuda", feature = "rocm"))) {
        return Err(Error::usage(
            "a stream was given (device buffers), but this libpccl was built without CUDA or \
             ROCm: rebuild with `--features cuda` (or `rocm`), or pass stream = NULL with host \
             buffers",
        ));
    }
    let rt = runtime_of(runtime)?;
    if count == 0 {
        // Nothing to move, but a runtime that cannot run here is still an error (callers
        // probe with a zero-count call).
        return available(rt);
    }
    match rt {
        // SAFETY: forwarded from the caller.
        Runtime::Cuda => unsafe { cuda_collective(comm, coll, dt, send, recv, count, stream) },
        // SAFETY: forwarded from the caller.
        Runtime::Hip => unsafe { hip_collective(comm, coll, dt, send, recv, count, stream) },
    }
}

/// Calls `$method::<T, $devty>(...)` with `T` the element type of `$dt`.
#[cfg(any(feature = "cuda", feature = "rocm"))]
macro_rules! by_dtype {
    ($method:ident, $comm:ident, $dev:ident, $devty:ty, $dt:expr, $coll:ident, $s:ident, $r:ident, $n:ident) => {
        match $dt {
            DType::I8 => $comm.$method::<i8, $devty>(&$dev, $coll, $s, $r, $n),
            DType::U8 => $comm.$method::<u8, $devty>(&$dev, $coll, $s, $r, $n),
            DType::I32 => $comm.$method::<i32, $devty>(&$dev, $coll, $s, $r, $n),
            DType::U32 => $comm.$method::<u32, $devty>(&$dev, $coll, $s, $r, $n),
            DType::I64 => $comm.$method::<i64, $devty>(&$dev, $coll, $s, $r, $n),
            DType::U64 => $comm.$method::<u64, $devty>(&$dev, $coll, $s, $r, $n),
            DType::F16 => $comm.$method::<half::f16, $devty>(&$dev, $coll, $s, $r, $n),
            DType::BF16 => $comm.$method::<half::bf16, $devty>(&$dev, $coll, $s, $r, $n),
            DType::F32 => $comm.$method::<f32, $devty>(&$dev, $coll, $s, $r, $n),
            DType::F64 => $comm.$method::<f64, $devty>(&$dev, $coll, $s, $r, $n),
        }
    };
}

/// Runs `op` through the right entry point of `dev`'s back end.
#[cfg(any(feature = "cuda", feature = "rocm"))]
macro_rules! run_op {
    ($comm:ident, $dev:ident, $devty:ty, $dt:expr, $op:expr, $s:ident, $r:ident, $n:ident) => {
        match $op {
            DeviceOp::Coll(c) => by_dtype!(enqueue_on, $comm, $dev, $devty, $dt, c, $s, $r, $n),
            DeviceOp::Rooted(c) => {
                by_dtype!(enqueue_rooted_on, $comm, $dev, $devty, $dt, c, $s, $r, $n)
            }
        }
    };
}

/// The CUDA branch of [`collective`].
///
/// # Safety
/// As [`collective`].
#[cfg(feature = "cuda")]
unsafe fn cuda_collective(
    comm: &Communicator,
    coll: DeviceOp,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    use crate::device::cuda::CudaDevice;
    crate::device::cuda::ensure_available()?;
    // The receive buffer is read on every rank (the send buffer of a broadcast only on root),
    // except in a reduce or gather off the root.
    let any = if recv.is_null() {
        send as u64
    } else {
        recv as u64
    };
    let ordinal = CudaDevice::ordinal_of(any)?;
    // SAFETY: the caller guarantees `stream` is a stream of the buffers' GPU.
    let dev = unsafe { CudaDevice::with_stream(ordinal, stream) }?;
    let (s, r) = (send as u64, recv as u64);
    // SAFETY: forwarded from the caller.
    unsafe { run_op!(comm, dev, CudaDevice, dt, coll, s, r, count) }
}

/// Without feature `cuda`: CUDA streams are refused.
///
/// # Safety
/// None; `unsafe` to match the CUDA build's signature.
#[cfg(not(feature = "cuda"))]
unsafe fn cuda_collective(
    _comm: &Communicator,
    _coll: DeviceOp,
    _dt: DType,
    _send: *const c_void,
    _recv: *mut c_void,
    _count: usize,
    _stream: *mut c_void,
) -> Result<()> {
    check_runtime(pcclRuntimeCuda)
}

/// The HIP branch of [`collective`]: queued on the caller's HIP stream.
///
/// # Safety
/// As [`collective`].
#[cfg(feature = "rocm")]
unsafe fn hip_collective(
    comm: &Communicator,
    coll: DeviceOp,
    dt: DType,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Result<()> {
    use crate::device::hip::HipDevice;
    // SAFETY: the caller guarantees `stream` is a valid HIP stream.
    let ordinal = unsafe { HipDevice::ordinal_of_stream(stream) }?;
    // SAFETY: as above; the handle borrows the stream for this call only.
    let dev = unsafe { HipDevice::with_stream(ordinal, stream) }.map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "opening HIP device {ordinal} of the stream: {}",
                e.message()
            ),
        )
    })?;
    let (s, r) = (send as u64, recv as u64);
    // SAFETY: forwarded from the caller.
    unsafe { run_op!(comm, dev, HipDevice, dt, coll, s, r, count) }
}

/// Without feature `rocm`: HIP streams are refused.
///
/// # Safety
/// None; `unsafe` to match the ROCm build's signature.
#[cfg(not(feature = "rocm"))]
unsafe fn hip_collective(
    _comm: &Communicator,
    _coll: DeviceOp,
    _dt: DType,
    _send: *const c_void,
    _recv: *mut c_void,
    _count: usize,
    _stream: *mut c_void,
) -> Result<()> {
    check_runtime(pcclRuntimeHip)
}
