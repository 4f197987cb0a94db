//! The device branch of the C ABI: a collective (or a rooted collective / all-to-all) called
//! with a stream runs on device memory of that stream's GPU, ordered on the stream; the call
//! returns once it is queued (NCCL's semantics, [`Communicator::enqueue_on`],
//! [`Communicator::enqueue_rooted_on`]), on CUDA and HIP alike. Which runtime a stream
//! belongs to is the communicator's setting (`pcclCommSetDeviceRuntime`, set by the torch
//! backend from `torch.version.hip`), else `PCCL_DEVICE_RUNTIME`, else CUDA where libcuda
//! loads and HIP otherwise.

use super::{pcclDeviceRuntime_t, pcclRuntimeAuto, pcclRuntimeCuda, pcclRuntimeHip};
use crate::error::{Error, Result};
use crate::{Communicator, DType, P2pOp, RawCollective, RawRooted};
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

/// One call of the C ABI on device memory, as [`run`] takes it.
#[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(super) enum DeviceCall<'a> {
    /// A collective, rooted collective or all-to-all: NCCL's buffers and count.
    Op {
        op: DeviceOp,
        dt: DType,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
    },
    /// `pcclAllToAllv`: the buffers and the four per-rank arrays (send counts and
    /// displacements, receive counts and displacements), in elements.
    AllToAllV {
        dt: DType,
        send: *const c_void,
        recv: *mut c_void,
        arrays: [&'a [usize]; 4],
    },
    /// `pcclSend` / `pcclRecv`, alone or a group's.
    P2p(&'a [P2pOp]),
    /// `pcclAllGatherQuantized` (`rs` None) or `pcclReduceScatterQuantized` (`rs`: average,
    /// scheme), queued on the stream where the communicator queues its device calls. `entered` is set once the call reaches the device collective (and
    /// so its agreement): before that, the caller takes part in the agreement with the error.
    Quantized {
        dt: DType,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        q: crate::Quant,
        rs: Option<(bool, crate::QuantScheme)>,
        entered: &'a std::cell::Cell<bool>,
    },
}

impl DeviceCall<'_> {
    /// A device address the call uses on this rank (0: none), to find its GPU (CUDA).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn any_ptr(&self) -> u64 {
        match self {
            // The receive buffer is used on every rank (the send buffer of a broadcast only on
            // root), except in a reduce or gather off the root.
            DeviceCall::Op { send, recv, .. }
            | DeviceCall::AllToAllV { send, recv, .. }
            | DeviceCall::Quantized { send, recv, .. } => {
                if recv.is_null() {
                    *send as u64
                } else {
                    *recv as u64
                }
            }
            DeviceCall::P2p(ops) => ops
                .iter()
                .find(|o| o.count > 0)
                .map_or(0, |o| o.addr as u64),
        }
    }

    /// Whether it moves nothing on this rank and needs no other rank (a zero count: callers
    /// probe the runtime with one). An all-to-all-v or a batch still runs: peers may wait
    /// for its (empty) messages.
    fn is_probe(&self) -> bool {
        matches!(self, DeviceCall::Op { count: 0, .. })
    }

    /// Queues the call on `dev`'s stream.
    ///
    /// # Safety
    /// As [`run`].
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    unsafe fn run_on<D: crate::device::api::Device>(
        &self,
        comm: &Communicator,
        dev: &D,
    ) -> Result<()> {
        match *self {
            DeviceCall::Op {
                op,
                dt,
                send,
                recv,
                count,
            } => {
                let (s, r) = (send as u64, recv as u64);
                // SAFETY: forwarded from the caller.
                unsafe {
                    match op {
                        DeviceOp::Coll(c) => {
                            by_dtype!(dt, comm.enqueue_on::<_, D>(dev, c, s, r, count))
                        }
                        DeviceOp::Rooted(c) => {
                            by_dtype!(dt, comm.enqueue_rooted_on::<_, D>(dev, c, s, r, count))
                        }
                    }
                }
            }
            DeviceCall::AllToAllV {
                dt,
                send,
                recv,
                arrays: [sc, sd, rc, rd],
            } => {
                let (s, r) = (send as u64, recv as u64);
                // SAFETY: forwarded from the caller.
                unsafe {
                    by_dtype!(
                        dt,
                        comm.enqueue_all_to_all_v_on::<_, D>(dev, s, sc, sd, r, rc, rd)
                    )
                }
            }
            // SAFETY: forwarded from the caller.
            DeviceCall::P2p(ops) => unsafe { comm.enqueue_p2p_on::<D>(dev, ops) },
            DeviceCall::Quantized {
                dt,
                send,
                recv,
                count,
                q,
                rs,
                entered,
            } => {
                entered.set(true);
                let b = (send as u64, recv as u64);
                // SAFETY: forwarded from the caller.
                unsafe {
                    match dt {
                        DType::F32 => quantized_on::<f32, D>(comm, dev, b, count, q, rs),
                        DType::F64 => quantized_on::<f64, D>(comm, dev, b, count, q, rs),
                        DType::F16 => quantized_on::<half::f16, D>(comm, dev, b, count, q, rs),
                        DType::BF16 => quantized_on::<half::bf16, D>(comm, dev, b, count, q, rs),
                        _ => Err(Error::internal("a quantized call of an integer type")),
                    }
                }
            }
        }
    }
}

/// A quantized collective on device memory of `dev`, typed.
///
/// # Safety
/// As [`run`].
#[cfg(any(feature = "cuda", feature = "rocm"))]
unsafe fn quantized_on<T: crate::quant::QuantFloat, D: crate::device::api::Device>(
    comm: &Communicator,
    dev: &D,
    bufs: (u64, u64),
    count: usize,
    q: crate::Quant,
    rs: Option<(bool, crate::QuantScheme)>,
) -> Result<()> {
    // The buffers hold count × ranks elements (the caller's promise); an overflow fails the
    // agreement on every rank.
    let sizes = (count, count.saturating_mul(comm.size()));
    // SAFETY: forwarded from the caller.
    unsafe {
        match rs {
            None => comm.enqueue_all_gather_quantized_on::<T, D>(dev, bufs, sizes, q),
            Some((avg, scheme)) => {
                comm.enqueue_reduce_scatter_quantized_on::<T, D>(dev, bufs, sizes, (q, avg, scheme))
            }
        }
    }
}

/// Calls `$comm.$method::<T, D>(args)` with `T` the element type of `$dt` (the `_` in the
/// call's turbofish).
#[cfg(any(feature = "cuda", feature = "rocm"))]
macro_rules! by_dtype {
    ($dt:expr, $comm:ident . $method:ident :: <_, $d:ident> ( $($a:expr),* )) => {
        match $dt {
            DType::I8 => $comm.$method::<i8, $d>($($a),*),
            DType::U8 => $comm.$method::<u8, $d>($($a),*),
            DType::I32 => $comm.$method::<i32, $d>($($a),*),
            DType::U32 => $comm.$method::<u32, $d>($($a),*),
            DType::I64 => $comm.$method::<i64, $d>($($a),*),
            DType::U64 => $comm.$method::<u64, $d>($($a),*),
            DType::F16 => $comm.$method::<half::f16, $d>($($a),*),
            DType::BF16 => $comm.$method::<half::bf16, $d>($($a),*),
            DType::F32 => $comm.$method::<f32, $d>($($a),*),
            DType::F64 => $comm.$method::<f64, $d>($($a),*),
        }
    };
}
#[cfg(any(feature = "cuda", feature = "rocm"))]
use by_dtype;

/// Queues `call` on device buffers, ordered on `stream` of the runtime `runtime` (a
/// `pcclDeviceRuntime_t`, see [`runtime_of`]).
///
/// # Safety
/// The buffers `call` names must be device memory valid for the counts it implies, and
/// `stream` a valid stream of their GPU in that runtime (for CUDA also `cudaStreamLegacy` /
/// `cudaStreamPerThread`).
pub(super) unsafe fn run(
    comm: &Communicator,
    runtime: pcclDeviceRuntime_t,
    call: DeviceCall<'_>,
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
    if call.is_probe() {
        // Nothing to move, but a runtime that cannot run here is still an error (callers
        // probe with a zero-count call).
        return available(rt);
    }
    match rt {
        // SAFETY: forwarded from the caller.
        Runtime::Cuda => unsafe { cuda_run(comm, &call, stream) },
        // SAFETY: forwarded from the caller.
        Runtime::Hip => unsafe { hip_run(comm, &call, stream) },
    }
}

/// The CUDA branch of [`run`].
///
/// # Safety
/// As [`run`].
#[cfg(feature = "cuda")]
unsafe fn cuda_run(comm: &Communicator, call: &DeviceCall<'_>, stream: *mut c_void) -> Result<()> {
    use crate::device::cuda::CudaDevice;
    crate::device::cuda::ensure_available()?;
    let any = call.any_ptr();
    if any == 0 {
        // Every block of this rank is empty: nothing to order on the stream, and no buffer
        // to find its GPU by. The (empty) messages are exchanged on the host.
        return match *call {
            // SAFETY: no operation has a byte to read or write.
            DeviceCall::P2p(ops) => unsafe { comm.raw_p2p("group", ops) },
            DeviceCall::AllToAllV {
                dt,
                arrays: [sc, sd, rc, rd],
                ..
            } => {
                // SAFETY: every block is empty: no pointer is read or written.
                unsafe { by_type_null(comm, dt, [sc, sd, rc, rd]) }
            }
            DeviceCall::Op { .. } | DeviceCall::Quantized { .. } => Err(Error::invalid(
                "a device call with a count above zero was given NULL buffers",
            )),
        };
    }
    let ordinal = CudaDevice::ordinal_of(any)?;
    // SAFETY: the caller guarantees `stream` is a stream of the buffers' GPU.
    let dev = unsafe { CudaDevice::with_stream(ordinal, stream) }?;
    // SAFETY: forwarded from the caller.
    unsafe { call.run_on(comm, &dev) }
}

/// An all-to-all-v whose blocks are all empty on this rank, on the host.
///
/// # Safety
/// Every block the arrays name must be empty.
#[cfg(feature = "cuda")]
unsafe fn by_type_null(comm: &Communicator, dt: DType, arrays: [&[usize]; 4]) -> Result<()> {
    fn run<T: crate::Element>(c: &Communicator, [sc, sd, rc, rd]: [&[usize]; 4]) -> Result<()> {
        // SAFETY: no block has an element (the caller's promise).
        unsafe { c.raw_all_to_all_v::<T>(std::ptr::null(), sc, sd, std::ptr::null_mut(), rc, rd) }
    }
    // Each dtype as itself: the exchange's stamps carry it.
    match dt {
        DType::I8 => run::<i8>(comm, arrays),
        DType::U8 => run::<u8>(comm, arrays),
        DType::I32 => run::<i32>(comm, arrays),
        DType::U32 => run::<u32>(comm, arrays),
        DType::I64 => run::<i64>(comm, arrays),
        DType::U64 => run::<u64>(comm, arrays),
        DType::F16 => run::<half::f16>(comm, arrays),
        DType::BF16 => run::<half::bf16>(comm, arrays),
        DType::F32 => run::<f32>(comm, arrays),
        DType::F64 => run::<f64>(comm, arrays),
    }
}

/// Without feature `cuda`: CUDA streams are refused.
///
/// # Safety
/// None; `unsafe` to match the CUDA build's signature.
#[cfg(not(feature = "cuda"))]
unsafe fn cuda_run(
    _comm: &Communicator,
    _call: &DeviceCall<'_>,
    _stream: *mut c_void,
) -> Result<()> {
    check_runtime(pcclRuntimeCuda)
}

/// The HIP branch of [`run`]: queued on the caller's HIP stream.
///
/// # Safety
/// As [`run`].
#[cfg(feature = "rocm")]
unsafe fn hip_run(comm: &Communicator, call: &DeviceCall<'_>, stream: *mut c_void) -> Result<()> {
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
    // SAFETY: forwarded from the caller.
    unsafe { call.run_on(comm, &dev) }
}

/// Without feature `rocm`: HIP streams are refused.
///
/// # Safety
/// None; `unsafe` to match the ROCm build's signature.
#[cfg(not(feature = "rocm"))]
unsafe fn hip_run(
    _comm: &Communicator,
    _call: &DeviceCall<'_>,
    _stream: *mut c_void,
) -> Result<()> {
    check_runtime(pcclRuntimeHip)
}
