//! The NCCL-shaped collective library ABI, shared by NCCL (CUDA) and RCCL (ROCm): the
//! unique-id type, the dtype and op codes, the result codes and their mapping to PCCL
//! errors, the function table and a communicator handle. Both libraries export the same C
//! API (RCCL is NCCL's port, with `hipStream_t` where NCCL takes `cudaStream_t`; both are
//! opaque pointers), so one table serves both, loaded through [`super::dl`] from a
//! [`LibrarySpec`].
//!
//! NCCL ships as `libnccl.so.2` (its soname; the `libnccl.so` link exists only where the
//! development package is installed, and pip's `nvidia-nccl-cu*` wheels have no such link),
//! so PCCL loads it itself, trying the path in `PCCL_NCCL_LIBRARY`, `libnccl.so.2`,
//! `libnccl.so`; RCCL is looked for at `PCCL_RCCL_LIBRARY`, `librccl.so`, `librccl.so.1`. A
//! process that already holds the library (PyTorch loads it) gets that copy back from the
//! dynamic loader, which matches the soname.
//!
//! Only the calls PCCL makes are bound; their signatures are those of `nccl.h` since NCCL 2.10
//! (bfloat16 and `ncclAvg`), which is the oldest version accepted.

use super::dl::{open_library, symbol, LibrarySpec};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// The variable naming the NCCL library file to load before the usual names.
pub const LIBRARY_VAR: &str = "PCCL_NCCL_LIBRARY";

/// Where NCCL is looked for.
pub const NCCL_SPEC: LibrarySpec = LibrarySpec {
    what: "NCCL",
    env: LIBRARY_VAR,
    names: &["libnccl.so.2", "libnccl.so"],
    hint: "install NCCL (libnccl2, or pip's nvidia-nccl-cu12/cu13) and put it on the loader path",
};

/// Where RCCL is looked for.
pub const RCCL_SPEC: LibrarySpec = LibrarySpec {
    what: "RCCL",
    env: "PCCL_RCCL_LIBRARY",
    names: &["librccl.so", "librccl.so.1"],
    hint: "install ROCm and add its lib folder (/opt/rocm/lib) to LD_LIBRARY_PATH",
};

/// `ncclComm_t`.
type RawComm = *mut c_void;
/// `ncclResult_t`.
type RawResult = c_int;
const NCCL_SUCCESS: RawResult = 0;
const NCCL_IN_PROGRESS: RawResult = 7;

/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;
/// `ncclInt8`.
pub const NCCL_INT8: NcclDataType = 0;
/// `ncclUint8`.
pub const NCCL_UINT8: NcclDataType = 1;
/// `ncclInt32`.
pub const NCCL_INT32: NcclDataType = 2;
/// `ncclUint32`.
pub const NCCL_UINT32: NcclDataType = 3;
/// `ncclInt64`.
pub const NCCL_INT64: NcclDataType = 4;
/// `ncclUint64`.
pub const NCCL_UINT64: NcclDataType = 5;
/// `ncclFloat16`.
pub const NCCL_FLOAT16: NcclDataType = 6;
/// `ncclFloat32`.
pub const NCCL_FLOAT32: NcclDataType = 7;
/// `ncclFloat64`.
pub const NCCL_FLOAT64: NcclDataType = 8;
/// `ncclBfloat16`.
pub const NCCL_BFLOAT16: NcclDataType = 9;
/// `ncclSum`.
pub const NCCL_SUM: NcclRedOp = 0;
/// `ncclProd`.
pub const NCCL_PROD: NcclRedOp = 1;
/// `ncclMax`.
pub const NCCL_MAX: NcclRedOp = 2;
/// `ncclMin`.
pub const NCCL_MIN: NcclRedOp = 3;
/// `ncclAvg`.
pub const NCCL_AVG: NcclRedOp = 4;

/// `ncclUniqueId`: the 128 opaque bytes one rank creates and the others receive out of band.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclUniqueId {
    /// The bytes, as NCCL wrote them.
    pub internal: [c_char; 128],
}

impl Default for NcclUniqueId {
    fn default() -> Self {
        NcclUniqueId { internal: [0; 128] }
    }
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

/// The entry points PCCL calls, resolved once per process per library.
pub struct NcclApi {
    /// "NCCL" or "RCCL", for messages.
    name: &'static str,
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

fn load(spec: &LibrarySpec) -> std::result::Result<NcclApi, String> {
    let (lib, path) = open_library(spec)?;
    let env = spec.env;
    macro_rules! sym {
        ($name:literal, $t:ty) => {{
            // SAFETY: the symbol is declared in nccl.h with the signature `$t` spells out
            // (NCCL >= 2.10, checked below through ncclGetVersion); the pointer lives in the
            // same table as the library, which is never unloaded.
            let f: $t = unsafe { symbol(&lib, &path, env, $name)? };
            f
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
            "{path} is {} {version}, older than 2.10 (no bfloat16 or avg); install a newer one",
            spec.what
        ));
    }
    Ok(NcclApi {
        name: spec.what,
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

/// The NCCL table, loaded once per process; a System error saying what was searched.
pub fn nccl() -> Result<&'static NcclApi> {
    static API: OnceLock<std::result::Result<NcclApi, String>> = OnceLock::new();
    API.get_or_init(|| load(&NCCL_SPEC))
        .as_ref()
        .map_err(|m| Error::system(m.clone()))
}

/// The RCCL table, loaded once per process; a System error naming `PCCL_RCCL_LIBRARY`.
pub fn rccl() -> Result<&'static NcclApi> {
    static API: OnceLock<std::result::Result<NcclApi, String>> = OnceLock::new();
    API.get_or_init(|| load(&RCCL_SPEC))
        .as_ref()
        .map_err(|m| Error::system(m.clone()))
}

impl NcclApi {
    /// The library's version as `major * 10000 + minor * 100 + patch` (`NCCL_VERSION_CODE`).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The file the library was loaded from (as named to the loader).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// "NCCL" or "RCCL".
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A fresh unique id (call on one rank, send to the others).
    pub fn unique_id(&'static self) -> Result<NcclUniqueId> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out-pointer to a 128-byte ncclUniqueId.
        check(self, "ncclGetUniqueId", unsafe {
            (self.unique_id)(&mut id)
        })?;
        Ok(id)
    }
}

/// Loads NCCL (once per process) and returns its version, or a System error saying what was
/// searched.
pub fn version() -> Result<i32> {
    nccl().map(|a| a.version)
}

/// The file NCCL was loaded from.
pub fn library_path() -> Result<&'static str> {
    nccl().map(|a| a.path.as_str())
}

/// The `ncclDataType_t` of a PCCL dtype (NCCL and RCCL alike).
pub fn nccl_dtype(dtype: DType) -> NcclDataType {
    match dtype {
        DType::I8 => NCCL_INT8,
        DType::U8 => NCCL_UINT8,
        DType::I32 => NCCL_INT32,
        DType::U32 => NCCL_UINT32,
        DType::I64 => NCCL_INT64,
        DType::U64 => NCCL_UINT64,
        DType::F16 => NCCL_FLOAT16,
        DType::BF16 => NCCL_BFLOAT16,
        DType::F32 => NCCL_FLOAT32,
        DType::F64 => NCCL_FLOAT64,
    }
}

/// The `ncclRedOp_t` of a PCCL op. Note the order differs: NCCL has max before min.
pub fn nccl_op(op: ReduceOp) -> NcclRedOp {
    match op {
        ReduceOp::Sum => NCCL_SUM,
        ReduceOp::Prod => NCCL_PROD,
        ReduceOp::Min => NCCL_MIN,
        ReduceOp::Max => NCCL_MAX,
        ReduceOp::Avg => NCCL_AVG,
    }
}

fn check(a: &NcclApi, what: &str, r: RawResult) -> Result<()> {
    if r == NCCL_SUCCESS {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let msg = unsafe { CStr::from_ptr((a.error_string)(r)) }.to_string_lossy();
    let text = format!("{} {what} failed: {msg} (ncclResult {r})", a.name);
    Err(match r {
        4 | 5 => Error::usage(text),
        6 => Error::remote(text),
        _ => Error::system(text),
    })
}

/// A fresh NCCL unique id (call on one rank, send to the others).
pub fn unique_id() -> Result<NcclUniqueId> {
    nccl()?.unique_id()
}

/// One rank's NCCL communicator. Its calls are queued on the stream passed to each; the
/// caller's CUDA context must be current on the calling thread.
pub struct NcclComm {
    api: &'static NcclApi,
    raw: RawComm,
    rank: usize,
    size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; every NcclComm is owned by one PCCL communicator, which serialises its
// collectives.
unsafe impl Send for NcclComm {}

/// Reads an [`NcclComm`]'s asynchronous error from any thread (`ncclCommGetAsyncError` is
/// thread-safe); made by [`NcclComm::probe`], whose contract keeps the communicator alive.
#[derive(Clone, Copy)]
pub struct AsyncErrorProbe {
    api: &'static NcclApi,
    raw: RawComm,
}

// SAFETY: ncclCommGetAsyncError may be called from any thread, concurrently with the
// communicator's other calls; the probe's maker guarantees the communicator outlives it.
unsafe impl Send for AsyncErrorProbe {}
// SAFETY: as for Send: the probe only reads the error state.
unsafe impl Sync for AsyncErrorProbe {}

impl AsyncErrorProbe {
    /// As [`NcclComm::async_error`].
    pub fn check(&self) -> Result<()> {
        let a = self.api;
        let mut r: RawResult = NCCL_SUCCESS;
        // SAFETY: the communicator is live (the probe's contract); `r` is a valid out-pointer.
        check(a, "ncclCommGetAsyncError", unsafe {
            (a.async_error)(self.raw, &mut r)
        })?;
        if r == NCCL_IN_PROGRESS {
            return Ok(());
        }
        check(a, "asynchronous operation", r)
    }
}

impl NcclComm {
    /// `ncclCommInitRank`: collective over the `size` ranks holding `id`. The device is the
    /// one whose context is current on the calling thread.
    pub fn init(id: &NcclUniqueId, size: usize, rank: usize) -> Result<NcclComm> {
        Self::init_with(nccl()?, id, size, rank)
    }

    /// `ncclCommInitRank` of library `a` (NCCL or RCCL).
    pub fn init_with(
        a: &'static NcclApi,
        id: &NcclUniqueId,
        size: usize,
        rank: usize,
    ) -> Result<NcclComm> {
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
        Ok(NcclComm {
            api: a,
            raw,
            rank,
            size,
        })
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
        // SAFETY: the probe is used while `self` (a live communicator) is borrowed.
        unsafe { self.probe() }.check()
    }

    /// A handle that reads this communicator's asynchronous error from another thread (the
    /// watch of a queued collective), while the communicator lives.
    ///
    /// # Safety
    /// The probe must not be used after the communicator was destroyed or aborted.
    pub unsafe fn probe(&self) -> AsyncErrorProbe {
        AsyncErrorProbe {
            api: self.api,
            raw: self.raw,
        }
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
        let a = self.api;
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
        let a = self.api;
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
        let a = self.api;
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
        a: &NcclApi,
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
        let a = self.api;
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

    /// Ends the communicator without waiting for its peers (after a timeout or error); later
    /// calls on it are refused by the library (its handle is null), and Drop does nothing.
    pub fn abort(&mut self) {
        if self.raw.is_null() {
            return;
        }
        // SAFETY: `self.raw` is live; it is nulled so that Drop does not destroy it again.
        unsafe { (self.api.abort)(self.raw) };
        self.raw = std::ptr::null_mut();
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        // SAFETY: `self.raw` is a live communicator, destroyed once. Errors cannot be
        // reported from drop; ncclCommDestroy frees the resources regardless.
        unsafe { (self.api.destroy)(self.raw) };
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
