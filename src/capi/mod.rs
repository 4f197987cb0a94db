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

// The entry points, in the order of the header (cbindgen reads the modules in this order).
mod lifecycle;

mod collectives;

mod ops;

mod quantized;

pub use collectives::*;
pub use lifecycle::*;

pub use quantized::{
    pcclAllGatherQuantized, pcclReduceScatterQuantized, PCCL_QUANT_ALLOW_NONFINITE,
    PCCL_QUANT_AVERAGE, PCCL_QUANT_HALVING, PCCL_QUANT_PER_LEVEL,
};

use crate::comm::request::Request;
use crate::error::{Error, ErrorKind, Result};
use crate::{DType, RawCollective, ReduceOp};
use handles::{lock, CommEntry};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
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

// ---- requests ------------------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

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
