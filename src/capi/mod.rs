//! The C ABI: NCCL-shaped entry points over [`Communicator`], built into `libpccl.so` and
//! `libpccl.a`. The header `include/pccl.h` is generated from this module by cbindgen
//! (`cbindgen.toml`); `tests/capi.rs` fails when it is out of date and rewrites it with
//! `PCCL_BLESS=1`.
//!
//! Conventions:
//! - every entry point returns a `pcclResult_t` (or a string) and never unwinds: bad
//!   arguments, destroyed handles and internal panics all come back as codes, with a message
//!   for [`pcclGetLastError`];
//! - `pcclDataType_t`, `pcclRedOp_t` and `pcclResult_t` are plain `int`s, so an out-of-range
//!   value is an error, not undefined behaviour;
//! - handles (`pcclComm_t`, `pcclRequest_t`, `pcclThreadWorld_t`) are numbered tokens checked
//!   against a registry: using one after it was destroyed gives `pcclInvalidUsage`, passing
//!   something PCCL never made gives `pcclInvalidArgument`;
//! - with a NULL `stream` the buffers are host memory; with a CUDA stream (`cudaStream_t`,
//!   including `cudaStreamLegacy` = 1 and `cudaStreamPerThread` = 2 for the default streams)
//!   they are device memory of that stream's GPU, and the collective is ordered on that stream
//!   (the library built with feature `cuda`; others answer `pcclInvalidUsage`). Like NCCL's,
//!   the call returns once the collective is queued: work queued later on the stream runs
//!   after it, and the buffers must stay valid until the stream has passed it. An error met
//!   while it runs is returned by the communicator's next device call.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
#![deny(unsafe_op_in_unsafe_fn)]

mod device;
mod handles;
mod ops;
mod quantized;

pub use quantized::{
    pcclAllGatherQuantized, pcclReduceScatterQuantized, PCCL_QUANT_ALLOW_NONFINITE,
    PCCL_QUANT_AVERAGE, PCCL_QUANT_HALVING, PCCL_QUANT_PER_LEVEL,
};

use crate::comm::request::Request;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Transport;
use crate::{Communicator, DType, Element, RawCollective, ReduceOp, ThreadWorld};
use handles::{lock, CommEntry};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

// ---- types and constants -------------------------------------------------------------------

/// Major version of this PCCL (also in `pcclGetVersion`).
pub const PCCL_MAJOR: c_int = 0;
/// Minor version of this PCCL.
pub const PCCL_MINOR: c_int = 1;
/// Patch level of this PCCL.
pub const PCCL_PATCH: c_int = 0;
/// `PCCL_MAJOR * 10000 + PCCL_MINOR * 100 + PCCL_PATCH`, as `pcclGetVersion` reports it.
pub const PCCL_VERSION_CODE: c_int = 100;

/// The most ranks a communicator or thread world may have. `pcclThreadWorldCreate` and
/// `pcclCommInitRank` answer a larger `nranks` with `pcclInvalidArgument` before allocating
/// anything for it, so a corrupted size is an error, not an out-of-memory abort.
pub const PCCL_MAX_RANKS: c_int = 1 << 22;

/// The colour to pass to `pcclCommSplit` on a rank that joins no new communicator
/// (any negative colour does the same).
pub const PCCL_SPLIT_NOCOLOR: c_int = -1;

/// Result of a PCCL call. The codes PCCL shares with NCCL's `ncclResult_t` have its values.
pub type pcclResult_t = c_int;
/// The call succeeded.
pub const pcclSuccess: pcclResult_t = 0;
/// A device runtime call failed (NCCL's `ncclUnhandledCudaError`); not returned by a
/// host-only build.
pub const pcclUnhandledDeviceError: pcclResult_t = 1;
/// The operating system (or the MPI library) failed: threads, memory, MPI calls.
pub const pcclSystemError: pcclResult_t = 2;
/// A bug in PCCL (including a caught panic); please report it with the message.
pub const pcclInternalError: pcclResult_t = 3;
/// An argument is wrong: NULL or misaligned buffer, unknown datatype or op, a count whose
/// buffer overflows, a root outside the communicator, a handle PCCL never made.
pub const pcclInvalidArgument: pcclResult_t = 4;
/// The call is not valid now: a destroyed or aborted communicator, a call made while another
/// thread is inside one on the same communicator, a stream (device memory) on a host-only
/// build, a library built without MPI, a thread-rank initialised twice.
pub const pcclInvalidUsage: pcclResult_t = 5;
/// Another rank caused the failure, named in the message: it refused the call (bad arguments
/// there), called a different collective, datatype, op, count or root, aborted the
/// communicator, or died.
pub const pcclRemoteError: pcclResult_t = 6;
/// A peer did not answer before the collective's deadline (`PCCL_TIMEOUT` seconds for the
/// whole collective): it is stuck or too slow.
pub const pcclTimeout: pcclResult_t = 7;
/// Number of result codes.
pub const pcclNumResults: pcclResult_t = 8;

/// Element type of a buffer (NCCL's `ncclDataType_t` values).
pub type pcclDataType_t = c_int;
/// `int8_t`.
pub const pcclInt8: pcclDataType_t = 0;
/// `char` (same as `pcclInt8`).
pub const pcclChar: pcclDataType_t = 0;
/// `uint8_t`.
pub const pcclUint8: pcclDataType_t = 1;
/// `int32_t`.
pub const pcclInt32: pcclDataType_t = 2;
/// `int` (same as `pcclInt32`).
pub const pcclInt: pcclDataType_t = 2;
/// `uint32_t`.
pub const pcclUint32: pcclDataType_t = 3;
/// `int64_t`.
pub const pcclInt64: pcclDataType_t = 4;
/// `uint64_t`.
pub const pcclUint64: pcclDataType_t = 5;
/// IEEE 754 binary16.
pub const pcclFloat16: pcclDataType_t = 6;
/// Same as `pcclFloat16`.
pub const pcclHalf: pcclDataType_t = 6;
/// `float`.
pub const pcclFloat32: pcclDataType_t = 7;
/// Same as `pcclFloat32`.
pub const pcclFloat: pcclDataType_t = 7;
/// `double`.
pub const pcclFloat64: pcclDataType_t = 8;
/// Same as `pcclFloat64`.
pub const pcclDouble: pcclDataType_t = 8;
/// bfloat16 (the upper half of a `float`).
pub const pcclBfloat16: pcclDataType_t = 9;
/// Number of datatypes.
pub const pcclNumTypes: pcclDataType_t = 10;

/// Reduction operator (NCCL's `ncclRedOp_t` values).
pub type pcclRedOp_t = c_int;
/// Element-wise sum.
pub const pcclSum: pcclRedOp_t = 0;
/// Element-wise product.
pub const pcclProd: pcclRedOp_t = 1;
/// Element-wise maximum.
pub const pcclMax: pcclRedOp_t = 2;
/// Element-wise minimum.
pub const pcclMin: pcclRedOp_t = 3;
/// Sum divided by the number of ranks (floating-point datatypes only).
pub const pcclAvg: pcclRedOp_t = 4;
/// Number of reduction operators.
pub const pcclNumOps: pcclRedOp_t = 5;

/// The GPU runtime whose streams a communicator's device calls take
/// (`pcclCommSetDeviceRuntime`).
pub type pcclDeviceRuntime_t = c_int;
/// Chosen per call: `PCCL_DEVICE_RUNTIME` when set, else CUDA when libcuda loads and HIP
/// otherwise (a library built with both).
pub const pcclRuntimeAuto: pcclDeviceRuntime_t = 0;
/// Streams are `cudaStream_t`s (feature `cuda`).
pub const pcclRuntimeCuda: pcclDeviceRuntime_t = 1;
/// Streams are `hipStream_t`s (feature `rocm`); torch's ROCm build, whose HIP tensors torch
/// calls "cuda", sets this.
pub const pcclRuntimeHip: pcclDeviceRuntime_t = 2;

/// Opaque communicator; only ever used through a `pcclComm_t`.
pub struct pcclComm {
    _opaque: [u8; 0],
}
/// A communicator: a group of ranks that run collectives together (`ncclComm_t`).
///
/// Thread safety: a communicator takes one call at a time. A call made while another thread
/// is inside a call on the same communicator returns `pcclInvalidUsage` at once and takes no
/// part in any collective; calls from several threads one after another must be made in the
/// same order on every rank (as with NCCL). `pcclCommAbort` may be called from any thread.
pub type pcclComm_t = *mut pcclComm;

/// Opaque request; only ever used through a `pcclRequest_t`.
pub struct pcclRequest {
    _opaque: [u8; 0],
}
/// A non-blocking collective in flight: finish it with `pcclWait` (which frees it),
/// poll it with `pcclTest`.
pub type pcclRequest_t = *mut pcclRequest;

/// Bytes of a [`pcclUniqueId`].
pub const PCCL_UNIQUE_ID_BYTES: usize = 128;

/// What the ranks of a job share to find each other (`ncclUniqueId`): made by
/// `pcclGetUniqueId` on one rank, handed to the others by the application (torch does it
/// through its store), passed to `pcclCommInitRank` on every rank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct pcclUniqueId {
    /// Opaque contents.
    pub internal: [c_char; PCCL_UNIQUE_ID_BYTES],
}

/// Opaque thread world; only ever used through a `pcclThreadWorld_t`.
pub struct pcclThreadWorld {
    _opaque: [u8; 0],
}
/// A group of in-process ranks (one thread each) that `pcclCommInitThreads` joins.
pub type pcclThreadWorld_t = *mut pcclThreadWorld;

// ---- error reporting -----------------------------------------------------------------------

/// A failed call: the error, and the communicator to record it on (if the call had one).
struct Failure {
    err: Error,
    comm: Option<Arc<CommEntry>>,
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure { err, comm: None }
    }
}

type Outcome<T> = std::result::Result<T, Failure>;

/// Attaches a communicator to an error, so `pcclGetLastError(comm)` reports it.
trait OnComm<T> {
    fn on(self, c: &Arc<CommEntry>) -> Outcome<T>;
}

impl<T> OnComm<T> for Result<T> {
    fn on(self, c: &Arc<CommEntry>) -> Outcome<T> {
        self.map_err(|err| Failure {
            err,
            comm: Some(c.clone()),
        })
    }
}

thread_local! {
    /// Message of the last failed call on this thread.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
    /// The string the last `pcclGetLastError` on this thread returned (kept alive here).
    static SHOWN: RefCell<CString> = RefCell::new(CString::default());
}

fn code_of(kind: ErrorKind) -> pcclResult_t {
    match kind {
        ErrorKind::InvalidArgument => pcclInvalidArgument,
        ErrorKind::InvalidUsage => pcclInvalidUsage,
        ErrorKind::System => pcclSystemError,
        ErrorKind::Remote => pcclRemoteError,
        ErrorKind::Timeout => pcclTimeout,
        ErrorKind::Internal => pcclInternalError,
    }
}

/// Records `f` as the last error of this thread (and of its communicator) and returns its
/// code.
fn record(func: &str, f: Failure) -> pcclResult_t {
    let msg = format!("{func}: {}", f.err.message());
    if let Some(c) = &f.comm {
        msg.clone_into(&mut lock(&c.last_error));
    }
    // A thread whose locals are already gone (exiting) just loses the message.
    let _ = LAST_ERROR.try_with(|l| msg.clone_into(&mut l.borrow_mut()));
    code_of(f.err.kind())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    format!("internal error (a panic inside PCCL: {what}); please report this")
}

/// Runs the body of entry point `func`: its error, or a panic, becomes a code and a message.
fn entry(func: &'static str, body: impl FnOnce() -> Outcome<()>) -> pcclResult_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => pcclSuccess,
        Ok(Err(f)) => record(func, f),
        Err(p) => record(func, Error::internal(panic_message(p.as_ref())).into()),
    }
}

/// Keeps `msg` in this thread's buffer and returns a pointer to it.
fn show(msg: &str) -> *const c_char {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    SHOWN
        .try_with(|s| {
            *s.borrow_mut() = c;
            s.borrow().as_ptr()
        })
        .unwrap_or(c"(the calling thread is exiting)".as_ptr())
}

// ---- argument conversion -------------------------------------------------------------------

fn datatype(v: pcclDataType_t) -> Result<DType> {
    Ok(match v {
        pcclInt8 => DType::I8,
        pcclUint8 => DType::U8,
        pcclInt32 => DType::I32,
        pcclUint32 => DType::U32,
        pcclInt64 => DType::I64,
        pcclUint64 => DType::U64,
        pcclFloat16 => DType::F16,
        pcclFloat32 => DType::F32,
        pcclFloat64 => DType::F64,
        pcclBfloat16 => DType::BF16,
        _ => {
            return Err(Error::invalid(format!(
                "datatype {v} is not a pcclDataType_t (expected 0..{}: pcclInt8 ... pcclBfloat16)",
                pcclNumTypes - 1
            )))
        }
    })
}

fn red_op(v: pcclRedOp_t) -> Result<ReduceOp> {
    Ok(match v {
        pcclSum => ReduceOp::Sum,
        pcclProd => ReduceOp::Prod,
        pcclMax => ReduceOp::Max,
        pcclMin => ReduceOp::Min,
        pcclAvg => ReduceOp::Avg,
        _ => {
            return Err(Error::invalid(format!(
                "op {v} is not a pcclRedOp_t (expected 0..{}: pcclSum pcclProd pcclMax pcclMin pcclAvg)",
                pcclNumOps - 1
            )))
        }
    })
}

/// `nranks` of an init call as a count, checked against `1..=PCCL_MAX_RANKS` before anything
/// is sized by it.
fn nranks_of(nranks: c_int) -> Result<usize> {
    if !(1..=PCCL_MAX_RANKS).contains(&nranks) {
        return Err(Error::invalid(format!(
            "nranks {nranks} is out of range: it must be at least 1 and at most \
             PCCL_MAX_RANKS ({PCCL_MAX_RANKS})"
        )));
    }
    usize::try_from(nranks).map_err(|_| Error::internal(format!("nranks {nranks} is not a size")))
}

fn int_of(v: usize, what: &str) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::internal(format!("{what} {v} does not fit in an int")))
}

/// The element counts of the send and receive buffers of `coll` with NCCL's `count`.
fn extents(coll: RawCollective, count: usize, p: usize) -> Result<(usize, usize)> {
    let times_p = || {
        count
            .checked_mul(p)
            .ok_or_else(|| Error::invalid(format!("count {count} x {p} ranks overflows size_t")))
    };
    Ok(match coll {
        RawCollective::AllGather => (count, times_p()?),
        RawCollective::ReduceScatter(_) => (times_p()?, count),
        RawCollective::AllReduce(_) | RawCollective::Broadcast(_) => (count, count),
    })
}

/// Checks that a buffer of `len` elements of `T` at `ptr` is one object Rust could address.
fn check_buffer<T>(name: &str, ptr: usize, len: usize) -> Result<()> {
    let es = std::mem::size_of::<T>();
    let bytes = len
        .checked_mul(es)
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "{name} of {len} elements x {es} bytes overflows the address space"
            ))
        })?;
    if len > 0 && ptr != 0 && ptr.checked_add(bytes).is_none() {
        return Err(Error::invalid(format!(
            "{name} at {ptr:#x} of {bytes} bytes wraps around the address space"
        )));
    }
    Ok(())
}

/// Starts `coll` on buffers of `T`: blocking (returns `None`) or not (returns the request).
///
/// # Safety
/// The buffers must be valid for the counts `coll` implies, until the call returns (blocking)
/// or the request completes.
unsafe fn typed<T: Element>(
    comm: &Communicator,
    coll: RawCollective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    nonblocking: bool,
) -> Result<Option<Request<()>>> {
    let checked = extents(coll, count, comm.size()).and_then(|(in_len, out_len)| {
        check_buffer::<T>("sendbuff", send as usize, in_len)?;
        check_buffer::<T>("recvbuff", recv as usize, out_len)
    });
    // A call refused here still takes its turn, so the peers fail it too and stay in step.
    checked.map_err(|e| comm.refuse_call("argument check", e))?;
    let (send, recv) = (send.cast::<T>(), recv.cast::<T>());
    // SAFETY: the caller guarantees the buffers for the counts of `coll` (checked above to
    // be addressable), for as long as the collective runs.
    unsafe {
        if nonblocking {
            comm.raw_collective_async(coll, send, recv, count).map(Some)
        } else {
            comm.raw_collective(coll, send, recv, count).map(|()| None)
        }
    }
}

/// How a collective is issued.
#[derive(Clone, Copy)]
enum How {
    /// Blocking, on host memory (a NULL stream) or on device memory ordered on the stream.
    Blocking(*mut c_void),
    /// A request on host memory.
    NonBlocking,
}

/// The shared body of the collectives: validates `comm`, `datatype`, then runs.
///
/// # Safety
/// As for `typed`.
unsafe fn collective(
    c: &Arc<CommEntry>,
    coll: RawCollective,
    dtype_code: pcclDataType_t,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    how: How,
) -> Outcome<Option<Request<()>>> {
    let comm = &c.comm;
    let dt = datatype(dtype_code)
        .map_err(|e| comm.refuse_call("argument check", e))
        .on(c)?;
    let nonblocking = matches!(how, How::NonBlocking);
    let device_stream = match how {
        How::Blocking(stream) if !stream.is_null() => Some(stream),
        _ => None,
    };
    if let Some(stream) = device_stream {
        // SAFETY: forwarded from the caller (device buffers valid for the counts, `stream` a
        // stream of their GPU).
        let runtime = c.runtime.load(std::sync::atomic::Ordering::SeqCst);
        let call = device::DeviceCall::Op {
            op: device::DeviceOp::Coll(coll),
            dt,
            send,
            recv,
            count,
        };
        return unsafe { device::run(comm, runtime, call, stream) }
            .map(|()| None)
            .on(c);
    }
    // SAFETY: forwarded from the caller (see `typed`).
    let r = unsafe {
        match dt {
            DType::I8 => typed::<i8>(comm, coll, send, recv, count, nonblocking),
            DType::U8 => typed::<u8>(comm, coll, send, recv, count, nonblocking),
            DType::I32 => typed::<i32>(comm, coll, send, recv, count, nonblocking),
            DType::U32 => typed::<u32>(comm, coll, send, recv, count, nonblocking),
            DType::I64 => typed::<i64>(comm, coll, send, recv, count, nonblocking),
            DType::U64 => typed::<u64>(comm, coll, send, recv, count, nonblocking),
            DType::F16 => typed::<half::f16>(comm, coll, send, recv, count, nonblocking),
            DType::BF16 => typed::<half::bf16>(comm, coll, send, recv, count, nonblocking),
            DType::F32 => typed::<f32>(comm, coll, send, recv, count, nonblocking),
            DType::F64 => typed::<f64>(comm, coll, send, recv, count, nonblocking),
        }
    };
    r.on(c)
}

fn root_of(root: c_int) -> Result<usize> {
    usize::try_from(root).map_err(|_| {
        Error::invalid(format!(
            "root {root} is negative; it must be a rank of comm"
        ))
    })
}

/// Writes `v` through the out-pointer `out` (already checked non-NULL).
///
/// # Safety
/// `out` must be valid for a write of one `T`.
unsafe fn put<T>(out: *mut T, v: T) {
    // SAFETY: the caller guarantees `out` is valid for a write.
    unsafe { out.write(v) };
}

fn not_null<T>(p: *const T, arg: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::invalid(format!("{arg} is NULL")))
    } else {
        Ok(())
    }
}

/// Sets the out-handle `out` (if non-NULL) to NULL, so a failed call leaves no stale value.
///
/// # Safety
/// `out` is NULL or valid for a write of one pointer.
unsafe fn clear<T>(out: *mut *mut T) {
    if !out.is_null() {
        // SAFETY: non-NULL, so valid for a write (the caller's guarantee).
        unsafe { out.write(std::ptr::null_mut()) };
    }
}

// ---- library and errors --------------------------------------------------------------------

/// Stores the version of this library, `major * 10000 + minor * 100 + patch`
/// (`PCCL_VERSION_CODE`), in `*version`.
///
/// # Safety
/// `version` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclGetVersion(version: *mut c_int) -> pcclResult_t {
    entry("pcclGetVersion", || {
        not_null(version, "version")?;
        // SAFETY: `version` is non-NULL and the caller promises it points to an int.
        unsafe { put(version, PCCL_VERSION_CODE) };
        Ok(())
    })
}

/// The optional parts this library was built with, comma-separated (`"mpi,cuda,rocm,hwloc,ofi"`
/// when all are; an empty string when none): a static string, never NULL.
#[no_mangle]
pub extern "C" fn pcclGetFeatures() -> *const c_char {
    static FEATURES: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    FEATURES
        .get_or_init(|| {
            // Feature names hold no NUL byte.
            std::ffi::CString::new(crate::features().join(",")).unwrap_or_default()
        })
        .as_ptr()
}

/// A short, static description of a result code (also for unknown codes).
#[no_mangle]
pub extern "C" fn pcclGetErrorString(result: pcclResult_t) -> *const c_char {
    let s: &'static CStr = match result {
        pcclSuccess => c"no error",
        pcclUnhandledDeviceError => c"unhandled device (CUDA/HIP) error",
        pcclSystemError => c"unhandled system error (see pcclGetLastError)",
        pcclInternalError => c"internal error - please report this issue",
        pcclInvalidArgument => c"invalid argument (see pcclGetLastError)",
        pcclInvalidUsage => c"invalid usage (see pcclGetLastError)",
        pcclRemoteError => c"remote process exited or there was a network error",
        pcclTimeout => c"timeout: a peer did not answer within PCCL_TIMEOUT",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The message of the last failed call on `comm`, or of the calling thread's last failed
/// call when `comm` is NULL; "" when there was none. The string stays valid until the next
/// `pcclGetLastError` on the same thread. A handle that is not a live communicator gets a
/// message saying so.
#[no_mangle]
pub extern "C" fn pcclGetLastError(comm: pcclComm_t) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if comm.is_null() {
            let msg = LAST_ERROR
                .try_with(|l| l.borrow().clone())
                .unwrap_or_default();
            return show(&msg);
        }
        match handles::comm(comm as usize, "comm", false) {
            Ok(c) => {
                let msg = lock(&c.last_error).clone();
                show(&msg)
            }
            Err(e) => show(&format!("pcclGetLastError: {}", e.message())),
        }
    }));
    r.unwrap_or(c"pcclGetLastError: internal error (a panic inside PCCL)".as_ptr())
}

// ---- communicators -------------------------------------------------------------------------

/// Creates a world of `nranks` in-process ranks, to be joined by `nranks` threads with
/// `pcclCommInitThreads`. Free it with `pcclThreadWorldDestroy` (communicators built
/// from it stay valid). `nranks` must be in `1..=PCCL_MAX_RANKS`, else the call returns
/// `pcclInvalidArgument` and leaves `*world = NULL`.
///
/// # Safety
/// `world` must be NULL (an error) or point to a writable `pcclThreadWorld_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclThreadWorldCreate(
    nranks: c_int,
    world: *mut pcclThreadWorld_t,
) -> pcclResult_t {
    entry("pcclThreadWorldCreate", || {
        not_null(world, "world")?;
        // SAFETY: `world` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(world) };
        let n = nranks_of(nranks)?;
        let h = handles::add_world(ThreadWorld::new(n))?;
        // SAFETY: as above.
        unsafe { put(world, h as pcclThreadWorld_t) };
        Ok(())
    })
}

/// Releases a thread world. Communicators already built from it keep working; ranks not yet
/// initialised can no longer join. NULL is a no-op.
#[no_mangle]
pub extern "C" fn pcclThreadWorldDestroy(world: pcclThreadWorld_t) -> pcclResult_t {
    entry("pcclThreadWorldDestroy", || {
        if !world.is_null() {
            handles::world(world as usize, "world", true)?;
        }
        Ok(())
    })
}

/// Builds the communicator of rank `rank` of `world`. Collective: every rank of the world
/// must call it, each from its own thread, and it returns once all have. Reads the `PCCL_*`
/// environment variables (`PCCL_RANKS_PER_NODE` makes the ranks pretend to be nodes).
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitThreads(
    comm: *mut pcclComm_t,
    world: pcclThreadWorld_t,
    rank: c_int,
) -> pcclResult_t {
    entry("pcclCommInitThreads", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let w = handles::world(world as usize, "world", false)?;
        let size = w.world.size();
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < size)
            .ok_or_else(|| {
                Error::invalid(format!("rank {rank} is not a rank of this world of {size}"))
            })?;
        if !lock(&w.claimed).insert(r) {
            return Err(Error::usage(format!(
                "rank {r} of this world already has (or is building) a communicator"
            ))
            .into());
        }
        let built = w
            .world
            .transport(r)
            .and_then(Communicator::new)
            .and_then(handles::add_comm);
        match built {
            Ok(h) => {
                // SAFETY: as above.
                unsafe { put(comm, h as pcclComm_t) };
                Ok(())
            }
            Err(e) => {
                lock(&w.claimed).remove(&r);
                Err(e.into())
            }
        }
    })
}

#[cfg(feature = "mpi")]
fn mpi_transport(fcomm: c_int) -> Result<Arc<dyn Transport>> {
    crate::transport::mpi::MpiTransport::from_fint(fcomm)
}

#[cfg(not(feature = "mpi"))]
fn mpi_transport(_fcomm: c_int) -> Result<Arc<dyn Transport>> {
    Err(Error::usage(
        "this libpccl was built without MPI support; rebuild it with `cargo build --features mpi`",
    ))
}

/// Builds a communicator over the ranks of an MPI communicator, given as its Fortran handle
/// (`MPI_Comm_c2f(comm)`, an `MPI_Fint`), so that this header needs no `mpi.h`. Collective
/// over the ranks of that communicator. Returns `pcclInvalidUsage` when the library was built
/// without MPI.
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitMPI(comm: *mut pcclComm_t, fcomm: c_int) -> pcclResult_t {
    entry("pcclCommInitMPI", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let h = mpi_transport(fcomm)
            .and_then(Communicator::new)
            .and_then(handles::add_comm)?;
        // SAFETY: as above.
        unsafe { put(comm, h as pcclComm_t) };
        Ok(())
    })
}

/// Opens the rendezvous of a new job on this host and writes its id to `*uniqueId`
/// (`ncclGetUniqueId`). Call it on one rank and give the id to every rank; the rendezvous is
/// served by a background thread until all ranks have joined (the job size is the `nranks`
/// they pass to `pcclCommInitRank`), or `PCCL_TIMEOUT` passes.
///
/// # Safety
/// `uniqueId` must be NULL (an error) or point to a writable `pcclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn pcclGetUniqueId(unique_id: *mut pcclUniqueId) -> pcclResult_t {
    entry("pcclGetUniqueId", || {
        not_null(unique_id, "uniqueId")?;
        let cfg = crate::config::Config::from_env()?;
        let id = crate::transport::tcp::UniqueId::new(cfg.timeout)?;
        let mut out = pcclUniqueId {
            internal: [0; PCCL_UNIQUE_ID_BYTES],
        };
        for (o, b) in out.internal.iter_mut().zip(id.to_bytes()) {
            *o = b as c_char;
        }
        // SAFETY: `unique_id` is non-NULL and writable (caller's promise).
        unsafe { put(unique_id, out) };
        Ok(())
    })
}

/// Joins the job of `uniqueId` as `rank` of `nranks` (`ncclCommInitRank`): ranks on the same
/// host talk through shared memory, others through TCP (`PCCL_TRANSPORT=ofi`: libfabric).
/// Collective over all `nranks` ranks.
/// `nranks` must be in `1..=PCCL_MAX_RANKS` and `rank` in `0..nranks`, and `uniqueId` one
/// that `pcclGetUniqueId` made, else the call returns `pcclInvalidArgument` at once, without
/// contacting anyone, and leaves `*comm = NULL`.
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitRank(
    comm: *mut pcclComm_t,
    nranks: c_int,
    unique_id: pcclUniqueId,
    rank: c_int,
) -> pcclResult_t {
    entry("pcclCommInitRank", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let n = nranks_of(nranks)?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < n)
            .ok_or_else(|| {
                Error::invalid(format!("rank {rank} of {nranks}: need 0 <= rank < nranks"))
            })?;
        let bytes = unique_id.internal.map(|c| c as u8);
        let id = crate::transport::tcp::UniqueId::from_bytes(&bytes)?;
        // PCCL_TRANSPORT: tcp (auto) or ofi. A bad variable here withdraws this rank, so the
        // others fail at once naming it (as `join` does for its own failures).
        let (cfg, kind) = crate::config::Config::from_env()
            .and_then(|cfg| Ok((cfg, crate::transport::select::from_env()?)))
            .inspect_err(|e| id.withdraw(r, n, e.message()))?;
        let t = crate::transport::select::join(kind, &id, n, r, cfg.chunk_bytes, cfg.timeout)?;
        let h = Communicator::with_config(t, cfg).and_then(handles::add_comm)?;
        // SAFETY: as above.
        unsafe { put(comm, h as pcclComm_t) };
        Ok(())
    })
}

/// Builds a communicator over `MPI_COMM_WORLD`, initialising MPI (thread level MULTIPLE) if
/// the application has not (for callers without `mpi.h`, such as Python). Returns
/// `pcclInvalidUsage` when the library was built without MPI.
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitMPIWorld(comm: *mut pcclComm_t) -> pcclResult_t {
    entry("pcclCommInitMPIWorld", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let h = mpi_world()
            .and_then(Communicator::new)
            .and_then(handles::add_comm)?;
        // SAFETY: as above.
        unsafe { put(comm, h as pcclComm_t) };
        Ok(())
    })
}

#[cfg(feature = "mpi")]
fn mpi_world() -> Result<Arc<dyn Transport>> {
    let cfg = crate::config::Config::from_env()?;
    // PCCL_TRANSPORT=ofi: libfabric, bootstrapped through the MPI world.
    let kind = crate::transport::select::from_env()?;
    crate::transport::select::world(kind, cfg.chunk_bytes, cfg.timeout)
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Result<Arc<dyn Transport>> {
    Err(Error::usage(
        "this libpccl was built without MPI support; rebuild it with `cargo build --features mpi`",
    ))
}

/// Frees a communicator. Requests still in flight on it keep it alive until they are waited
/// for. Any later use of the handle returns `pcclInvalidUsage`. NULL is a no-op.
#[no_mangle]
pub extern "C" fn pcclCommDestroy(comm: pcclComm_t) -> pcclResult_t {
    entry("pcclCommDestroy", || {
        if !comm.is_null() {
            handles::comm(comm as usize, "comm", true)?;
        }
        Ok(())
    })
}

/// Aborts and frees a communicator, from any thread: every call blocked on it (on any
/// thread) and every request in flight on it ends within a second with `pcclInvalidUsage`
/// ("aborted"), and the other ranks are told, so their calls on it fail with
/// `pcclRemoteError` naming this rank instead of timing out. Any later use of the handle
/// returns `pcclInvalidUsage`. NULL is a no-op.
#[no_mangle]
pub extern "C" fn pcclCommAbort(comm: pcclComm_t) -> pcclResult_t {
    entry("pcclCommAbort", || {
        if !comm.is_null() {
            let c = handles::comm(comm as usize, "comm", true)?;
            c.comm.abort();
        }
        Ok(())
    })
}

/// Makes `*newcomm`, a communicator of the ranks of `comm` not listed in `excluded`
/// (`nexcluded` ranks of `comm`; ranks renumbered in order, the hierarchy recomputed),
/// without the excluded ranks taking part: after a rank died, the survivors go on with
/// it. Every surviving rank calls it with the same list (checked: a disagreement is
/// `pcclInvalidArgument` on every survivor). `comm` stays valid (destroy it afterwards).
/// Works on thread-ranks and on the TCP transport (`pcclCommInitRank`); under MPI it needs
/// every rank of `comm` alive (see the README).
///
/// # Safety
/// `excluded` must be NULL with `nexcluded == 0`, or point to `nexcluded` readable ints;
/// `newcomm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommShrink(
    comm: pcclComm_t,
    excluded: *const c_int,
    nexcluded: c_int,
    newcomm: *mut pcclComm_t,
) -> pcclResult_t {
    entry("pcclCommShrink", || {
        // SAFETY: `newcomm` is NULL or points to a writable handle (caller's promise).
        unsafe { clear(newcomm) };
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(newcomm, "newcomm").on(&c)?;
        let p = c.comm.size();
        let n = usize::try_from(nexcluded)
            .ok()
            .filter(|&n| n <= p)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "nexcluded {nexcluded} must be between 0 and the communicator's {p} ranks"
                ))
            })
            .on(&c)?;
        if n > 0 {
            not_null(excluded, "excluded").on(&c)?;
        }
        let list: &[c_int] = if n == 0 {
            &[]
        } else {
            // SAFETY: non-NULL and readable for `n` ints (caller's promise); `n` is at most
            // the communicator's size, checked above.
            unsafe { std::slice::from_raw_parts(excluded, n) }
        };
        let ranks = list
            .iter()
            .map(|&r| {
                usize::try_from(r)
                    .map_err(|_| Error::invalid(format!("excluded rank {r} is negative")))
            })
            .collect::<Result<Vec<usize>>>()
            .on(&c)?;
        let sub = c.comm.shrink(&ranks).on(&c)?;
        let h = handles::add_comm(sub).on(&c)?;
        // SAFETY: as above.
        unsafe { put(newcomm, h as pcclComm_t) };
        Ok(())
    })
}

/// Makes `*newcomm`, a communicator of the ranks of `comm` that can still reach each other,
/// agreed among them (`Communicator::shrink_to_survivors`): after a failure, when the
/// survivors do not know whom to exclude (a partition, a stalled rank, a cut link). Every
/// rank still running calls it. Only a strict majority of the ranks not known to be dead
/// goes on: a rank on the minority side of a partition, or one the others counted out, gets
/// `pcclRemoteError` (and `*newcomm` stays NULL). Each round in which a rank does not answer
/// costs up to `PCCL_TIMEOUT`. `comm` stays valid (destroy it afterwards).
///
/// # Safety
/// `newcomm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommShrinkSurvivors(
    comm: pcclComm_t,
    newcomm: *mut pcclComm_t,
) -> pcclResult_t {
    entry("pcclCommShrinkSurvivors", || {
        // SAFETY: `newcomm` is NULL or points to a writable handle (caller's promise).
        unsafe { clear(newcomm) };
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(newcomm, "newcomm").on(&c)?;
        let sub = c.comm.shrink_to_survivors().on(&c)?;
        let h = handles::add_comm(sub).on(&c)?;
        // SAFETY: as above.
        unsafe { put(newcomm, h as pcclComm_t) };
        Ok(())
    })
}

/// Stores the number of ranks of `comm` in `*count`.
///
/// # Safety
/// `count` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommCount(comm: pcclComm_t, count: *mut c_int) -> pcclResult_t {
    entry("pcclCommCount", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(count, "count").on(&c)?;
        let n = int_of(c.comm.size(), "size").on(&c)?;
        // SAFETY: `count` is non-NULL and points to a writable int (caller's promise).
        unsafe { put(count, n) };
        Ok(())
    })
}

/// Stores the rank of the caller in `comm` in `*rank`.
///
/// # Safety
/// `rank` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommUserRank(comm: pcclComm_t, rank: *mut c_int) -> pcclResult_t {
    entry("pcclCommUserRank", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(rank, "rank").on(&c)?;
        let r = int_of(c.comm.rank(), "rank").on(&c)?;
        // SAFETY: `rank` is non-NULL and points to a writable int (caller's promise).
        unsafe { put(rank, r) };
        Ok(())
    })
}

/// Sets how long every later call on `comm` (collectives, rooted calls, all-to-all,
/// point-to-point, device calls, and non-blocking requests not started yet) may wait on its
/// peers before failing with `pcclTimeout`, in milliseconds (> 0). Starts as `PCCL_TIMEOUT`;
/// local to this rank; communicators split from `comm` later inherit it.
#[no_mangle]
pub extern "C" fn pcclCommSetTimeout(comm: pcclComm_t, timeout_ms: u64) -> pcclResult_t {
    entry("pcclCommSetTimeout", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        c.comm
            .set_timeout(std::time::Duration::from_millis(timeout_ms))
            .on(&c)
    })
}

/// Sets which GPU runtime the streams of `comm`'s device calls belong to: `pcclRuntimeCuda`,
/// `pcclRuntimeHip` or `pcclRuntimeAuto` (the default: `PCCL_DEVICE_RUNTIME`, else CUDA
/// where libcuda loads, else HIP). `pcclInvalidUsage` when this library was built without
/// that runtime's feature (`cuda`, `rocm`). Local to this rank.
#[no_mangle]
pub extern "C" fn pcclCommSetDeviceRuntime(
    comm: pcclComm_t,
    runtime: pcclDeviceRuntime_t,
) -> pcclResult_t {
    entry("pcclCommSetDeviceRuntime", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        device::check_runtime(runtime).on(&c)?;
        c.runtime
            .store(runtime, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
}

/// Stores `comm`'s timeout (see `pcclCommSetTimeout`) in `*timeout_ms`, in milliseconds.
///
/// # Safety
/// `timeout_ms` must be NULL (an error) or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommGetTimeout(
    comm: pcclComm_t,
    timeout_ms: *mut u64,
) -> pcclResult_t {
    entry("pcclCommGetTimeout", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(timeout_ms, "timeout_ms").on(&c)?;
        let ms = u64::try_from(c.comm.timeout().as_millis()).unwrap_or(u64::MAX);
        // SAFETY: `timeout_ms` is non-NULL and points to a writable u64 (caller's promise).
        unsafe { put(timeout_ms, ms) };
        Ok(())
    })
}

/// Stores in `*async_error` the error a collective queued on a device stream met while
/// running (`pcclSuccess` when none), as `ncclCommGetAsyncError` does; when there is one,
/// `pcclGetLastError(comm)` says what failed (the collective, its number, the rank). The
/// stream of a failed collective stays held (work queued behind it does not run on a wrong
/// result) until `pcclCommAbort` or `pcclCommDestroy`; every later device call fails.
///
/// # Safety
/// `async_error` must be NULL (an error) or point to a writable `pcclResult_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommGetAsyncError(
    comm: pcclComm_t,
    async_error: *mut pcclResult_t,
) -> pcclResult_t {
    entry("pcclCommGetAsyncError", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(async_error, "async_error").on(&c)?;
        let code = match c.comm.async_error() {
            Some(e) => {
                let msg = format!("a queued device collective failed: {}", e.message());
                msg.clone_into(&mut lock(&c.last_error));
                code_of(e.kind())
            }
            None => pcclSuccess,
        };
        // SAFETY: `async_error` is non-NULL and writable (caller's promise).
        unsafe { put(async_error, code) };
        Ok(())
    })
}

/// Splits `comm` as `MPI_Comm_split`: ranks passing the same non-negative `color` form a new
/// communicator, ordered by `key` then by rank in `comm`; a rank passing a negative color
/// (`PCCL_SPLIT_NOCOLOR`) joins none and gets `*newcomm = NULL`. Collective over `comm`.
///
/// # Safety
/// `newcomm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommSplit(
    comm: pcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut pcclComm_t,
) -> pcclResult_t {
    entry("pcclCommSplit", || {
        // SAFETY: `newcomm` is NULL or points to a writable handle (caller's promise).
        unsafe { clear(newcomm) };
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(newcomm, "newcomm").on(&c)?;
        let color = u32::try_from(color).ok();
        if let Some(sub) = c.comm.split(color, key).on(&c)? {
            let h = handles::add_comm(sub).on(&c)?;
            // SAFETY: as above.
            unsafe { put(newcomm, h as pcclComm_t) };
        }
        Ok(())
    })
}

// ---- blocking collectives ------------------------------------------------------------------

/// Gathers `sendcount` elements from every rank into `recvbuff` (`sendcount * nranks`
/// elements) in rank order. In place when `sendbuff == recvbuff + rank * sendcount`
/// (in elements). `stream`: NULL for host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// `sendbuff` must be readable for `sendcount` elements and `recvbuff` writable for
/// `sendcount * nranks`, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: pcclDataType_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllGather", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                RawCollective::AllGather,
                datatype,
                sendbuff,
                recvbuff,
                sendcount,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// Reduces `recvcount * nranks` elements of every rank's `sendbuff` with `op` and leaves
/// block `rank` of the result (`recvcount` elements) in `recvbuff`. In place when
/// `recvbuff == sendbuff + rank * recvcount` (in elements). `stream`: NULL for host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// `sendbuff` must be readable for `recvcount * nranks` elements and `recvbuff` writable for
/// `recvcount`, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclReduceScatter", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let op = red_op(op).on(&c)?;
        let coll = RawCollective::ReduceScatter(op);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                recvcount,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// Reduces `count` elements of every rank's `sendbuff` with `op` into every rank's
/// `recvbuff`. In place when `sendbuff == recvbuff`. `stream`: NULL for host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// `sendbuff` must be readable and `recvbuff` writable for `count` elements, and neither
/// touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllReduce", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let op = red_op(op).on(&c)?;
        let coll = RawCollective::AllReduce(op);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// Copies `count` elements of `sendbuff` on rank `root` into `recvbuff` on every rank
/// (`sendbuff` is read on `root` only). In place when `sendbuff == recvbuff`. `stream`: NULL for
/// host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// On `root`, `sendbuff` must be readable for `count` elements; everywhere `recvbuff` must
/// be writable for `count`, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclBroadcast", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let coll = RawCollective::Broadcast(root_of(root).on(&c)?);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// In-place broadcast of `count` elements of `buff` from `root` (NCCL's `ncclBcast`).
///
/// # Safety
/// `buff` must be readable and writable for `count` elements and untouched by others during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn pcclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclBcast", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let coll = RawCollective::Broadcast(root_of(root).on(&c)?);
        // SAFETY: `buff` is valid for `count` elements (caller's promise, documented above).
        unsafe { collective(&c, coll, datatype, buff, buff, count, How::Blocking(stream)) }
            .map(drop)
    })
}

/// Returns once every rank of `comm` has entered the barrier (after this rank's earlier
/// non-blocking collectives).
#[no_mangle]
pub extern "C" fn pcclBarrier(comm: pcclComm_t) -> pcclResult_t {
    entry("pcclBarrier", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        c.comm.barrier().on(&c)
    })
}

// ---- non-blocking collectives --------------------------------------------------------------

/// Registers a started collective as a request and stores its handle in `*request`.
///
/// # Safety
/// `request` must be non-NULL and valid for a write.
unsafe fn hand_out(
    request: *mut pcclRequest_t,
    c: &Arc<CommEntry>,
    req: Option<Request<()>>,
    what: &'static str,
) -> Outcome<()> {
    let req = req
        .ok_or_else(|| Error::internal("a non-blocking collective returned no request"))
        .on(c)?;
    let h = handles::add_request(req, c.clone(), what).on(c)?;
    // SAFETY: the caller guarantees `request` is non-NULL and writable.
    unsafe { put(request, h as pcclRequest_t) };
    Ok(())
}

/// Validates the handle and the out-pointer of a non-blocking call.
///
/// # Safety
/// `request` is NULL or valid for a write.
unsafe fn start(comm: pcclComm_t, request: *mut pcclRequest_t) -> Outcome<Arc<CommEntry>> {
    // SAFETY: the caller guarantees `request` is NULL or writable.
    unsafe { clear(request) };
    let c = handles::comm(comm as usize, "comm", false)?;
    not_null(request, "request").on(&c)?;
    Ok(c)
}

/// Non-blocking `pcclAllGather` on host memory: stores a request in `*request`; the buffers
/// must stay valid and untouched until `pcclWait` on it returns.
///
/// # Safety
/// As for `pcclAllGather`, until the request completes; `request` must be NULL (an error)
/// or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIallGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: pcclDataType_t,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIallGather", || {
        // SAFETY: `request` is NULL or writable (caller's promise); the buffers stay valid
        // until the request completes (caller's promise, documented above).
        unsafe {
            let c = start(comm, request)?;
            let r = collective(
                &c,
                RawCollective::AllGather,
                datatype,
                sendbuff,
                recvbuff,
                sendcount,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIallGather")
        }
    })
}

/// Non-blocking `pcclReduceScatter` on host memory (see `pcclIallGather`).
///
/// # Safety
/// As for `pcclReduceScatter`, until the request completes; `request` must be NULL (an
/// error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIreduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIreduceScatter", || {
        // SAFETY: as in `pcclIallGather`.
        unsafe {
            let c = start(comm, request)?;
            let coll = RawCollective::ReduceScatter(red_op(op).on(&c)?);
            let r = collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                recvcount,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIreduceScatter")
        }
    })
}

/// Non-blocking `pcclAllReduce` on host memory (see `pcclIallGather`).
///
/// # Safety
/// As for `pcclAllReduce`, until the request completes; `request` must be NULL (an error)
/// or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIallReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIallReduce", || {
        // SAFETY: as in `pcclIallGather`.
        unsafe {
            let c = start(comm, request)?;
            let coll = RawCollective::AllReduce(red_op(op).on(&c)?);
            let r = collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIallReduce")
        }
    })
}

/// Non-blocking `pcclBroadcast` on host memory (see `pcclIallGather`).
///
/// # Safety
/// As for `pcclBroadcast`, until the request completes; `request` must be NULL (an error)
/// or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIbroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIbroadcast", || {
        // SAFETY: as in `pcclIallGather`.
        unsafe {
            let c = start(comm, request)?;
            let coll = RawCollective::Broadcast(root_of(root).on(&c)?);
            let r = collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIbroadcast")
        }
    })
}

/// Non-blocking `pcclBarrier`: stores a request in `*request`.
///
/// # Safety
/// `request` must be NULL (an error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIbarrier(
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIbarrier", || {
        // SAFETY: `request` is NULL or writable (caller's promise).
        unsafe {
            let c = start(comm, request)?;
            let r = c.comm.raw_barrier_async().on(&c)?;
            hand_out(request, &c, Some(r), "pcclIbarrier")
        }
    })
}

/// Blocks until `request` has completed, frees it, and returns the collective's result
/// (its message goes to `pcclGetLastError` of the communicator and of this thread).
/// Using the handle afterwards returns `pcclInvalidUsage`.
#[no_mangle]
pub extern "C" fn pcclWait(request: pcclRequest_t) -> pcclResult_t {
    entry("pcclWait", || {
        let r = handles::request(request as usize, "request", true)?;
        let req = lock(&r.req).take();
        let req = req
            .ok_or_else(|| Error::usage("request was already completed and freed by pcclWait"))
            .on(&r.comm)?;
        req.wait()
            .map_err(|e| Error::new(e.kind(), format!("{}: {}", r.what, e.message())))
            .on(&r.comm)
    })
}

/// Stores in `*done` whether `request` has completed (1) or not (0), without blocking.
/// It does not free the request: call `pcclWait` for the result, which then returns at
/// once.
///
/// # Safety
/// `done` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclTest(request: pcclRequest_t, done: *mut c_int) -> pcclResult_t {
    entry("pcclTest", || {
        let r = handles::request(request as usize, "request", false)?;
        not_null(done, "done").on(&r.comm)?;
        let finished = lock(&r.req)
            .as_ref()
            .map(Request::test)
            .ok_or_else(|| Error::usage("request was already completed and freed by pcclWait"))
            .on(&r.comm)?;
        // SAFETY: `done` is non-NULL and points to a writable int (caller's promise).
        unsafe { put(done, c_int::from(finished)) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_constants_match_the_crate() {
        let v = |s: &str| s.parse::<c_int>().unwrap();
        assert_eq!(PCCL_MAJOR, v(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(PCCL_MINOR, v(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(PCCL_PATCH, v(env!("CARGO_PKG_VERSION_PATCH")));
        assert_eq!(
            PCCL_VERSION_CODE,
            PCCL_MAJOR * 10000 + PCCL_MINOR * 100 + PCCL_PATCH
        );
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_a_message() {
        let rc = entry("pcclTestPanic", || panic!("deliberate"));
        assert_eq!(rc, pcclInternalError);
        // SAFETY: the pointer is valid until the next pcclGetLastError on this thread.
        let msg = unsafe { CStr::from_ptr(pcclGetLastError(std::ptr::null_mut())) };
        let msg = msg.to_str().unwrap();
        assert!(msg.starts_with("pcclTestPanic: internal error"), "{msg}");
        assert!(msg.contains("deliberate"), "{msg}");
    }

    #[test]
    fn every_code_has_a_string() {
        for rc in 0..pcclNumResults {
            // SAFETY: pcclGetErrorString returns a static C string.
            let s = unsafe { CStr::from_ptr(pcclGetErrorString(rc)) };
            assert_ne!(s.to_str().unwrap(), "unknown result code", "code {rc}");
        }
    }

    #[test]
    fn handles_of_one_kind_are_rejected_as_another() {
        let mut w: pcclThreadWorld_t = std::ptr::null_mut();
        // SAFETY: `w` is a valid out-pointer.
        assert_eq!(unsafe { pcclThreadWorldCreate(2, &mut w) }, pcclSuccess);
        assert_eq!(pcclBarrier(w as pcclComm_t), pcclInvalidArgument);
        assert_eq!(pcclWait(w as pcclRequest_t), pcclInvalidArgument);
        assert_eq!(pcclThreadWorldDestroy(w), pcclSuccess);
        assert_eq!(pcclThreadWorldDestroy(w), pcclInvalidUsage);
        assert_eq!(pcclBarrier(w as pcclComm_t), pcclInvalidArgument);
        assert_eq!(pcclBarrier(0x1234 as pcclComm_t), pcclInvalidArgument);
    }
}
