//! NCCL, loaded at run time: the intra-node level of the device collectives.
//!
//! NCCL ships as `libnccl.so.2` (its soname; the `libnccl.so` link exists only where the
//! development package is installed, and pip's `nvidia-nccl-cu*` wheels have no such link).
//! cudarc's loader searches `libnccl.so` and `.so.{1,9..12}` but never `.so.2`, so PCCL loads
//! NCCL itself with `libloading`, trying in order: the path in `PCCL_NCCL_LIBRARY`,
//! `libnccl.so.2`, `libnccl.so`. A process that already holds NCCL (PyTorch loads it) gets that
//! copy back from the dynamic loader, which matches the soname.
//!
//! Only the calls PCCL makes are bound; their signatures are those of `nccl.h` since NCCL 2.10
//! (bfloat16 and `ncclAvg`), which is the oldest version accepted.

use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// The variable naming the NCCL library file to load before the usual names.
pub const LIBRARY_VAR: &str = "PCCL_NCCL_LIBRARY";

/// `ncclComm_t`.
type RawComm = *mut c_void;
/// `ncclResult_t`.
type RawResult = c_int;
const NCCL_SUCCESS: RawResult = 0;
const NCCL_IN_PROGRESS: RawResult = 7;

/// `ncclUniqueId`: the 128 opaque bytes one rank creates and the others receive out of band.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// The bytes, as NCCL wrote them.
    pub internal: [c_char; 128],
}

impl NcclUniqueId {
    /// The id as bytes, to send over a transport.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.internal.map(|c| c as u8)
    }

    /// The id from bytes received over a transport.
    pub fn from_bytes(b: &[u8; 128]) -> Self {
        NcclUniqueId {
            internal: b.map(|c| c as c_char),
        }
    }
}

type VersionFn = unsafe extern "C" fn(*mut c_int) -> RawResult;
type UniqueIdFn = unsafe extern "C" fn(*mut NcclUniqueId) -> RawResult;
type InitRankFn = unsafe extern "C" fn(*mut RawComm, c_int, NcclUniqueId, c_int) -> RawResult;
type CommFn = unsafe extern "C" fn(RawComm) -> RawResult;
type AsyncErrorFn = unsafe extern "C" fn(RawComm, *mut RawResult) -> RawResult;
type ErrorStringFn = unsafe extern "C" fn(RawResult) -> *const c_char;
type AllGatherFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    RawComm,
    *mut c_void,
) -> RawResult;
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> RawResult;
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> RawResult;

/// The NCCL entry points PCCL calls, resolved once per process.
struct Api {
    /// Keeps the library mapped while the function pointers are in use.
    _lib: libloading::Library,
    path: String,
    version: c_int,
    unique_id: UniqueIdFn,
    init_rank: InitRankFn,
    destroy: CommFn,
    abort: CommFn,
    async_error: AsyncErrorFn,
    error_string: ErrorStringFn,
    all_gather: AllGatherFn,
    reduce_scatter: ReduceFn,
    all_reduce: ReduceFn,
    broadcast: BroadcastFn,
}

/// The library names tried, in order.
fn candidates() -> Vec<String> {
    let mut c = Vec::new();
    if let Ok(p) = std::env::var(LIBRARY_VAR) {
        if !p.is_empty() {
            c.push(p);
        }
    }
    c.push("libnccl.so.2".into());
    c.push("libnccl.so".into());
    c
}

fn load() -> std::result::Result<Api, String> {
    let names = candidates();
    let mut tried = Vec::new();
    let (lib, path) = names
        .iter()
        .find_map(|n| {
            // SAFETY: loading NCCL runs its library initialisers, which only set up NCCL's own
            // state; no other code is run.
            match unsafe { libloading::Library::new(n) } {
                Ok(l) => Some((l, n.clone())),
                Err(e) => {
                    tried.push(format!("{n} ({e})"));
                    None
                }
            }
        })
        .ok_or_else(|| {
            format!(
                "NCCL could not be loaded: tried {}. Install NCCL (libnccl2, or pip's \
                 nvidia-nccl-cu12/cu13) and set {LIBRARY_VAR} to the full path of libnccl.so.2 \
                 if it is not on the loader path",
                tried.join(", ")
            )
        })?;
    macro_rules! sym {
        ($name:literal, $t:ty) => {{
            // SAFETY: the symbol is declared in nccl.h with the signature `$t` spells out
            // (NCCL >= 2.10, checked below through ncclGetVersion).
            let s: libloading::Symbol<$t> = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path} has no {}: {e}", $name))?;
            *s
        }};
    }
    let get_version = sym!("ncclGetVersion", VersionFn);
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid out-pointer.
    let r = unsafe { get_version(&mut version) };
    if r != NCCL_SUCCESS {
        return Err(format!("ncclGetVersion failed in {path} (error {r})"));
    }
    if version < 21000 {
        return Err(format!(
            "{path} is NCCL {version}, older than 2.10 (no bfloat16 or avg); install a newer NCCL"
        ));
    }
    Ok(Api {
        unique_id: sym!("ncclGetUniqueId", UniqueIdFn),
        init_rank: sym!("ncclCommInitRank", InitRankFn),
        destroy: sym!("ncclCommDestroy", CommFn),
        abort: sym!("ncclCommAbort", CommFn),
        async_error: sym!("ncclCommGetAsyncError", AsyncErrorFn),
        error_string: sym!("ncclGetErrorString", ErrorStringFn),
        all_gather: sym!("ncclAllGather", AllGatherFn),
        reduce_scatter: sym!("ncclReduceScatter", ReduceFn),
        all_reduce: sym!("ncclAllReduce", ReduceFn),
        broadcast: sym!("ncclBroadcast", BroadcastFn),
        version,
        path,
        _lib: lib,
    })
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|m| Error::system(m.clone()))
}

/// Loads NCCL (once per process) and returns its version as `major * 10000 + minor * 100 +
/// patch` (NCCL's `NCCL_VERSION_CODE`), or a System error saying what was searched.
pub fn version() -> Result<i32> {
    api().map(|a| a.version)
}

/// The file NCCL was loaded from (as named to the loader).
pub fn library_path() -> Result<&'static str> {
    api().map(|a| a.path.as_str())
}

/// NCCL's `ncclDataType_t` for a PCCL dtype.
pub fn nccl_dtype(d: DType) -> c_int {
    match d {
        DType::I8 => 0,
        DType::U8 => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::U64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// NCCL's `ncclRedOp_t` for a PCCL operator.
pub fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    }
}

fn check(a: &Api, what: &str, r: RawResult) -> Result<()> {
    if r == NCCL_SUCCESS {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let msg = unsafe { CStr::from_ptr((a.error_string)(r)) }.to_string_lossy();
    let text = format!("NCCL {what} failed: {msg} (ncclResult {r})");
    Err(match r {
        4 | 5 => Error::usage(text),
        6 => Error::remote(text),
        _ => Error::system(text),
    })
}

/// A fresh unique id (call on one rank, send to the others).
pub fn unique_id() -> Result<NcclUniqueId> {
    let a = api()?;
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out-pointer to a 128-byte ncclUniqueId.
    check(a, "ncclGetUniqueId", unsafe { (a.unique_id)(&mut id) })?;
    Ok(id)
}

/// One rank's NCCL communicator. Its calls are queued on the stream passed to each; the
/// caller's CUDA context must be current on the calling thread.
pub struct NcclComm {
    raw: RawComm,
    rank: usize,
    size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; every NcclComm is owned by one PCCL communicator, which serialises its
// collectives.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// `ncclCommInitRank`: collective over the `size` ranks holding `id`. The device is the
    /// one whose context is current on the calling thread.
    pub fn init(id: &NcclUniqueId, size: usize, rank: usize) -> Result<NcclComm> {
        let a = api()?;
        if rank >= size || size > c_int::MAX as usize {
            return Err(Error::invalid(format!(
                "NCCL rank {rank} of {size} is out of range"
            )));
        }
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the id is passed by value as nccl.h declares.
        check(a, "ncclCommInitRank", unsafe {
            (a.init_rank)(&mut raw, size as c_int, *id, rank as c_int)
        })?;
        Ok(NcclComm { raw, rank, size })
    }

    /// This rank's index in the NCCL communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// An error the communicator met asynchronously (a peer failed, a network error), if any.
    pub fn async_error(&self) -> Result<()> {
        let a = api()?;
        let mut r: RawResult = NCCL_SUCCESS;
        // SAFETY: `self.raw` is a live communicator and `r` a valid out-pointer.
        check(a, "ncclCommGetAsyncError", unsafe {
            (a.async_error)(self.raw, &mut r)
        })?;
        if r == NCCL_IN_PROGRESS {
            return Ok(());
        }
        check(a, "asynchronous operation", r)
    }

    /// `ncclAllGather` of `count` elements per rank.
    ///
    /// # Safety
    /// `send` must address `count` elements of `dtype` and `recv` `count * size()` elements
    /// of device memory valid until `stream` has run the call; `stream` must belong to the
    /// current context.
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        stream: *mut c_void,
    ) -> Result<()> {
        let a = api()?;
        check(
            a,
            "ncclAllGather",
            (a.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                self.raw,
                stream,
            ),
        )
    }

    /// `ncclReduceScatter` into `count` elements per rank.
    ///
    /// # Safety
    /// As [`NcclComm::all_gather`] with the sizes swapped.
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<()> {
        let a = api()?;
        self.reduction(
            a,
            a.reduce_scatter,
            "ncclReduceScatter",
            send,
            recv,
            count,
            dtype,
            op,
            stream,
        )
    }

    /// `ncclAllReduce` of `count` elements.
    ///
    /// # Safety
    /// `send` and `recv` must address `count` elements of device memory valid until `stream`
    /// has run the call.
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<()> {
        let a = api()?;
        self.reduction(
            a,
            a.all_reduce,
            "ncclAllReduce",
            send,
            recv,
            count,
            dtype,
            op,
            stream,
        )
    }

    /// Calls one of NCCL's reductions (they share a signature).
    ///
    /// # Safety
    /// As the calling wrapper.
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduction(
        &self,
        a: &Api,
        f: ReduceFn,
        what: &str,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<()> {
        let r = f(
            send as *const c_void,
            recv as *mut c_void,
            count,
            nccl_dtype(dtype),
            nccl_op(op),
            self.raw,
            stream,
        );
        check(a, what, r)
    }

    /// `ncclBroadcast` of `count` elements from NCCL rank `root`.
    ///
    /// # Safety
    /// As [`NcclComm::all_reduce`] (`send` is read on the root only).
    pub unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        let a = api()?;
        check(
            a,
            "ncclBroadcast",
            (a.broadcast)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_dtype(dtype),
                root as c_int,
                self.raw,
                stream,
            ),
        )
    }

    /// Ends the communicator without waiting for its peers (after a timeout or error).
    pub fn abort(mut self) {
        if let Ok(a) = api() {
            // SAFETY: `self.raw` is live; it is nulled so that Drop does not destroy it again.
            unsafe { (a.abort)(self.raw) };
        }
        self.raw = std::ptr::null_mut();
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        if let Ok(a) = api() {
            // SAFETY: `self.raw` is a live communicator, destroyed once. Errors cannot be
            // reported from drop; ncclCommDestroy frees the resources regardless.
            unsafe { (a.destroy)(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_and_op_codes_match_nccl_h() {
        let codes: Vec<c_int> = DType::ALL.iter().map(|&d| nccl_dtype(d)).collect();
        // DType::ALL order: i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64.
        assert_eq!(codes, vec![0, 1, 2, 3, 4, 5, 6, 9, 7, 8]);
        assert_eq!(nccl_op(ReduceOp::Sum), 0);
        assert_eq!(nccl_op(ReduceOp::Prod), 1);
        assert_eq!(nccl_op(ReduceOp::Max), 2);
        assert_eq!(nccl_op(ReduceOp::Min), 3);
        assert_eq!(nccl_op(ReduceOp::Avg), 4);
    }

    #[test]
    fn unique_id_survives_a_byte_round_trip() {
        let mut b = [0u8; 128];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 37 % 256) as u8;
        }
        assert_eq!(NcclUniqueId::from_bytes(&b).to_bytes(), b);
    }

    #[test]
    fn missing_nccl_is_a_system_error_naming_the_variable() {
        match version() {
            Ok(v) => eprintln!("NCCL {v} present at {:?}", library_path()),
            Err(e) => {
                eprintln!("skipped the NCCL load check: {e}");
                assert_eq!(e.kind(), crate::ErrorKind::System);
                assert!(e.message().contains(LIBRARY_VAR), "{e}");
                assert!(e.message().contains("libnccl.so.2"), "{e}");
            }
        }
    }
}
