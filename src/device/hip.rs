//! AMD GPU kernels through HIP and hipRTC, and the RCCL library, all loaded at run time.
//!
//! The counterpart of [`cuda`](super) for ROCm: the same kernel sources (`csrc/reduce.cu`
//! and `csrc/transpose.cu`) are compiled by hipRTC for the device's architecture
//! (`gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`), once per device per process, and driven
//! with the same kernel names, arguments and launch arithmetic (shared with the CUDA back end
//! in `device::launch`).
//!
//! Nothing is linked at build time: `libamdhip64`, `libhiprtc` and `librccl` are opened with
//! `dlopen` (through [`libloading`]) the first time they are needed, into tables of typed
//! function pointers ([`HipApi`], [`HiprtcApi`], [`RcclApi`]). Each library is looked for
//! first at the path in an environment variable, then under its usual names:
//!
//! | library | environment variable | names tried |
//! | --- | --- | --- |
//! | HIP runtime | `PCCL_HIP_LIBRARY` | `libamdhip64.so`, `libamdhip64.so.6`, `libamdhip64.so.5` |
//! | hipRTC | `PCCL_HIPRTC_LIBRARY` | `libhiprtc.so`, `libhiprtc.so.6`, `libhiprtc.so.5`, then the HIP runtime itself (ROCm 5 before the split) |
//! | RCCL | `PCCL_RCCL_LIBRARY` | `librccl.so`, `librccl.so.1` |
//!
//! A missing library or symbol is an [`ErrorKind::System`](crate::ErrorKind::System) error
//! that names what was searched and the variable to set; nothing here panics for want of
//! ROCm. `PCCL_HIP_ARCH` overrides the architecture the kernels are compiled for.
//!
//! Device attributes are read with `hipDeviceGetAttribute` (values of `hipDeviceAttribute_t`
//! as laid out since ROCm 5.0, unchanged through 6.x). The one property no attribute gives,
//! `gcnArchName`, is found in the `hipDeviceProp_t` that `hipGetDeviceProperties` fills, by
//! scanning an oversized buffer for the architecture string rather than relying on the
//! struct's layout, which changed between ROCm 5 and 6.
//!
//! Buffers are [`HipBuffer`]s (device memory, freed on drop); every operation of a
//! [`HipDevice`] is ordered on the stream the handle owns, and [`HipDevice::download`]
//! synchronizes. Results are meant to be bit-identical to the host kernels, as on CUDA.

pub use super::launch::LaunchShape;
use super::launch::{self, Elementwise, TransposePlan, UNROLL};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use libloading::Library;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString, OsStr, OsString};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex, OnceLock};

/// Source of the reduction kernels (`csrc/reduce.cu`).
pub const REDUCE_SOURCE: &str = include_str!("../../csrc/reduce.cu");
/// Source of the block-transpose kernels (`csrc/transpose.cu`).
pub const TRANSPOSE_SOURCE: &str = include_str!("../../csrc/transpose.cu");

/// Prepended to each source for hipRTC. hipRTC predefines the HIP device API (`blockIdx`,
/// `__syncthreads`, `__fadd_rn`, `__forceinline__`, ...); the sources' only CUDA-only part,
/// the PTX of the half-precision conversions, has a `__HIP__` branch in `reduce.cu`. The
/// `#line` directive keeps compiler messages on the lines of the `.cu` file.
pub const HIP_PRELUDE: &str = "// PCCL: hipRTC prelude (src/device/hip.rs)\n\
#define PCCL_HIP 1\n\
#ifndef __forceinline__\n\
#define __forceinline__ inline __attribute__((always_inline))\n\
#endif\n";

/// Environment variable with an explicit path of the HIP runtime library.
pub const HIP_LIBRARY_ENV: &str = "PCCL_HIP_LIBRARY";
/// Environment variable with an explicit path of the hipRTC library.
pub const HIPRTC_LIBRARY_ENV: &str = "PCCL_HIPRTC_LIBRARY";
/// Environment variable with an explicit path of the RCCL library.
pub const RCCL_LIBRARY_ENV: &str = "PCCL_RCCL_LIBRARY";
/// Environment variable that overrides the architecture the kernels are compiled for.
pub const HIP_ARCH_ENV: &str = "PCCL_HIP_ARCH";

/// Names the HIP runtime is looked for under, after [`HIP_LIBRARY_ENV`].
pub const HIP_LIBRARY_NAMES: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];
/// Names hipRTC is looked for under, after [`HIPRTC_LIBRARY_ENV`].
pub const HIPRTC_LIBRARY_NAMES: [&str; 3] = ["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"];
/// Names RCCL is looked for under, after [`RCCL_LIBRARY_ENV`].
pub const RCCL_LIBRARY_NAMES: [&str; 2] = ["librccl.so", "librccl.so.1"];

// ---------------------------------------------------------------------------------------------
// C types (hip_runtime_api.h, driver_types.h, hiprtc.h, rccl.h)
// ---------------------------------------------------------------------------------------------

/// `hipError_t` (0 is `hipSuccess`).
pub type HipError = c_int;
/// `hipSuccess`.
pub const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice`: no GPU the runtime can use.
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipDevice_t`.
pub type HipDeviceId = c_int;
/// `hipStream_t` (opaque).
pub type HipStream = *mut c_void;
/// `hipModule_t` (opaque).
pub type HipModule = *mut c_void;
/// `hipFunction_t` (opaque).
pub type HipFunction = *mut c_void;
/// `hipEvent_t` (opaque).
pub type HipEvent = *mut c_void;
/// `hipMemcpyKind`.
pub type HipMemcpyKind = c_int;
/// `hipMemcpyHostToDevice`.
pub const HIP_MEMCPY_HOST_TO_DEVICE: HipMemcpyKind = 1;
/// `hipMemcpyDeviceToHost`.
pub const HIP_MEMCPY_DEVICE_TO_HOST: HipMemcpyKind = 2;
/// `hipMemcpyDeviceToDevice`.
pub const HIP_MEMCPY_DEVICE_TO_DEVICE: HipMemcpyKind = 3;
/// `hipDeviceAttribute_t`.
pub type HipDeviceAttribute = c_int;
/// `hipDeviceAttributeMaxThreadsPerBlock` (56 in the enum as rearranged for ROCm 5.0,
/// HIP commit "Rearrange device attributes", unchanged through ROCm 6.2).
pub const HIP_ATTR_MAX_THREADS_PER_BLOCK: HipDeviceAttribute = 56;
/// `hipDeviceAttributeMultiprocessorCount` (63, ROCm 5.0 to 6.2): compute units.
pub const HIP_ATTR_MULTIPROCESSOR_COUNT: HipDeviceAttribute = 63;
/// `hipDeviceAttributeMaxSharedMemoryPerBlock` (74, ROCm 5.0 to 6.2): LDS bytes per block.
pub const HIP_ATTR_MAX_SHARED_MEMORY_PER_BLOCK: HipDeviceAttribute = 74;
/// `hipDeviceAttributeWarpSize` (87, ROCm 5.0 to 6.2): 64 on CDNA, 32 on RDNA.
pub const HIP_ATTR_WARP_SIZE: HipDeviceAttribute = 87;
/// `hiprtcResult` (0 is `HIPRTC_SUCCESS`).
pub type HiprtcResult = c_int;
/// `HIPRTC_SUCCESS`.
pub const HIPRTC_SUCCESS: HiprtcResult = 0;
/// `hiprtcProgram` (opaque).
pub type HiprtcProgram = *mut c_void;
/// `ncclResult_t` (0 is `ncclSuccess`).
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclComm_t` (opaque).
pub type NcclComm = *mut c_void;
/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;

/// `ncclUniqueId`: 128 opaque bytes (`NCCL_UNIQUE_ID_BYTES`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclUniqueId {
    /// The bytes rank 0 makes and every rank passes to `ncclCommInitRank`.
    pub internal: [c_char; 128],
}

impl Default for NcclUniqueId {
    fn default() -> Self {
        NcclUniqueId { internal: [0; 128] }
    }
}

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

/// The RCCL (NCCL) data type of a PCCL dtype.
pub fn rccl_dtype(dtype: DType) -> NcclDataType {
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

/// The RCCL (NCCL) reduction of a PCCL op. Note the order differs: NCCL has max before min.
pub fn rccl_op(op: ReduceOp) -> NcclRedOp {
    match op {
        ReduceOp::Sum => NCCL_SUM,
        ReduceOp::Prod => NCCL_PROD,
        ReduceOp::Min => NCCL_MIN,
        ReduceOp::Max => NCCL_MAX,
        ReduceOp::Avg => NCCL_AVG,
    }
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// The paths to try for a library: the environment variable's value first (when set and not
/// empty), then the usual names.
pub(crate) fn library_candidates(env_value: Option<&OsStr>, names: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = Vec::new();
    if let Some(p) = env_value.filter(|p| !p.is_empty()) {
        v.push(p.to_os_string());
    }
    v.extend(names.iter().map(OsString::from));
    v
}

/// Opens the first loadable candidate; the error lists every attempt and the variable to set.
fn open_library(
    what: &str,
    env: &str,
    names: &[&str],
) -> std::result::Result<(Library, String), String> {
    let mut tried = Vec::new();
    for cand in library_candidates(std::env::var_os(env).as_deref(), names) {
        // SAFETY: dlopen runs the library's initialisers; the ROCm libraries' initialisers only
        // set up their own state. A file that is not a shared library is refused by the
        // loader with an error, not run.
        match unsafe { Library::new(&cand) } {
            Ok(lib) => return Ok((lib, cand.to_string_lossy().into_owned())),
            Err(e) => tried.push(format!("{}: {e}", cand.to_string_lossy())),
        }
    }
    Err(format!(
        "{what} could not be loaded (tried {}): install ROCm and add its lib folder \
         (/opt/rocm/lib) to LD_LIBRARY_PATH, or set {env} to the library's path",
        tried.join("; ")
    ))
}

/// Looks up symbol `name` in `lib` as a `T` (a function pointer type).
///
/// # Safety
/// `T` must be the exact function-pointer type of `name` in the library's C headers, and the
/// pointer must not be called after `lib` is unloaded.
unsafe fn symbol<T: Copy>(
    lib: &Library,
    path: &str,
    env: &str,
    name: &str,
) -> std::result::Result<T, String> {
    let cname = format!("{name}\0");
    lib.get::<T>(cname.as_bytes()).map(|s| *s).map_err(|e| {
        format!(
            "{path} has no symbol {name} ({e}): it is not the expected library, or too old a \
             version (ROCm 5 or newer is needed); set {env} to another one"
        )
    })
}

/// Looks up an optional symbol (`None` when absent).
///
/// # Safety
/// As [`symbol`].
unsafe fn optional_symbol<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    let cname = format!("{name}\0");
    lib.get::<T>(cname.as_bytes()).ok().map(|s| *s)
}

/// The HIP runtime's entry points PCCL uses (`libamdhip64`), with the C signatures of
/// `hip_runtime_api.h`. Obtained from [`hip_api`]; the library stays loaded for the life of
/// the process.
#[allow(non_snake_case)]
pub struct HipApi {
    /// The path the library was loaded from.
    pub path: String,
    /// `hipInit(unsigned flags)`
    pub hipInit: unsafe extern "C" fn(c_uint) -> HipError,
    /// `hipRuntimeGetVersion(int*)`
    pub hipRuntimeGetVersion: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipGetDeviceCount(int*)`
    pub hipGetDeviceCount: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipSetDevice(int)`
    pub hipSetDevice: unsafe extern "C" fn(c_int) -> HipError,
    /// `hipDeviceGet(hipDevice_t*, int ordinal)`
    pub hipDeviceGet: unsafe extern "C" fn(*mut HipDeviceId, c_int) -> HipError,
    /// `hipDeviceGetAttribute(int*, hipDeviceAttribute_t, int device)`
    pub hipDeviceGetAttribute:
        unsafe extern "C" fn(*mut c_int, HipDeviceAttribute, c_int) -> HipError,
    /// `hipDeviceGetName(char*, int len, hipDevice_t)`
    pub hipDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, HipDeviceId) -> HipError,
    /// `hipGetDeviceProperties(hipDeviceProp_t*, int)`: `hipGetDevicePropertiesR0600` where
    /// the library has it (ROCm 6), else the unversioned symbol. The struct is treated as
    /// opaque bytes (see [`find_arch_in_properties`]).
    pub hipGetDeviceProperties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    /// `hipStreamCreate(hipStream_t*)`
    pub hipStreamCreate: unsafe extern "C" fn(*mut HipStream) -> HipError,
    /// `hipStreamDestroy(hipStream_t)`
    pub hipStreamDestroy: unsafe extern "C" fn(HipStream) -> HipError,
    /// `hipStreamSynchronize(hipStream_t)`
    pub hipStreamSynchronize: unsafe extern "C" fn(HipStream) -> HipError,
    /// `hipMalloc(void**, size_t)`
    pub hipMalloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    /// `hipFree(void*)`
    pub hipFree: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `hipMemcpyAsync(void* dst, const void* src, size_t, hipMemcpyKind, hipStream_t)`
    pub hipMemcpyAsync: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        HipMemcpyKind,
        HipStream,
    ) -> HipError,
    /// `hipMemsetAsync(void*, int value, size_t, hipStream_t)`
    pub hipMemsetAsync: unsafe extern "C" fn(*mut c_void, c_int, usize, HipStream) -> HipError,
    /// `hipModuleLoadData(hipModule_t*, const void* image)`
    pub hipModuleLoadData: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    /// `hipModuleGetFunction(hipFunction_t*, hipModule_t, const char*)`
    pub hipModuleGetFunction:
        unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipError,
    /// `hipModuleLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMemBytes,
    /// stream, void** kernelParams, void** extra)`
    #[allow(clippy::type_complexity)]
    pub hipModuleLaunchKernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    /// `hipGetErrorString(hipError_t)`
    pub hipGetErrorString: unsafe extern "C" fn(HipError) -> *const c_char,
    /// `hipEventCreate(hipEvent_t*)`
    pub hipEventCreate: unsafe extern "C" fn(*mut HipEvent) -> HipError,
    /// `hipEventRecord(hipEvent_t, hipStream_t)`
    pub hipEventRecord: unsafe extern "C" fn(HipEvent, HipStream) -> HipError,
    /// `hipEventSynchronize(hipEvent_t)`
    pub hipEventSynchronize: unsafe extern "C" fn(HipEvent) -> HipError,
    /// `hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop)`
    pub hipEventElapsedTime: unsafe extern "C" fn(*mut f32, HipEvent, HipEvent) -> HipError,
    /// `hipEventDestroy(hipEvent_t)`
    pub hipEventDestroy: unsafe extern "C" fn(HipEvent) -> HipError,
    lib: Library,
}

impl HipApi {
    fn load() -> std::result::Result<HipApi, String> {
        let (lib, path) = open_library("the HIP runtime", HIP_LIBRARY_ENV, &HIP_LIBRARY_NAMES)?;
        let env = HIP_LIBRARY_ENV;
        macro_rules! sym {
            ($name:ident) => {
                // SAFETY: the field's type is the symbol's C signature from hip_runtime_api.h;
                // the pointer lives in the same struct as `lib`, which is never unloaded.
                unsafe { symbol(&lib, &path, env, stringify!($name))? }
            };
        }
        // SAFETY: as for `sym!`: both symbols have the signature of `hipGetDeviceProperties`
        // (only the struct they fill differs, which is read as bytes).
        let props = unsafe {
            match optional_symbol(&lib, "hipGetDevicePropertiesR0600") {
                Some(f) => f,
                None => symbol(&lib, &path, env, "hipGetDeviceProperties")?,
            }
        };
        Ok(HipApi {
            hipInit: sym!(hipInit),
            hipRuntimeGetVersion: sym!(hipRuntimeGetVersion),
            hipGetDeviceCount: sym!(hipGetDeviceCount),
            hipSetDevice: sym!(hipSetDevice),
            hipDeviceGet: sym!(hipDeviceGet),
            hipDeviceGetAttribute: sym!(hipDeviceGetAttribute),
            hipDeviceGetName: sym!(hipDeviceGetName),
            hipGetDeviceProperties: props,
            hipStreamCreate: sym!(hipStreamCreate),
            hipStreamDestroy: sym!(hipStreamDestroy),
            hipStreamSynchronize: sym!(hipStreamSynchronize),
            hipMalloc: sym!(hipMalloc),
            hipFree: sym!(hipFree),
            hipMemcpyAsync: sym!(hipMemcpyAsync),
            hipMemsetAsync: sym!(hipMemsetAsync),
            hipModuleLoadData: sym!(hipModuleLoadData),
            hipModuleGetFunction: sym!(hipModuleGetFunction),
            hipModuleLaunchKernel: sym!(hipModuleLaunchKernel),
            hipGetErrorString: sym!(hipGetErrorString),
            hipEventCreate: sym!(hipEventCreate),
            hipEventRecord: sym!(hipEventRecord),
            hipEventSynchronize: sym!(hipEventSynchronize),
            hipEventElapsedTime: sym!(hipEventElapsedTime),
            hipEventDestroy: sym!(hipEventDestroy),
            path,
            lib,
        })
    }

    /// Turns a `hipError_t` into a result, naming the call that failed.
    pub fn check(&self, r: HipError, what: &str) -> Result<()> {
        if r == HIP_SUCCESS {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static NUL-terminated string (or null) for any
        // error value.
        let s = unsafe { (self.hipGetErrorString)(r) };
        // SAFETY: the library returned a static NUL-terminated string or null (see above).
        let msg = unsafe { static_message(s) };
        Err(Error::system(format!("HIP {what} failed: {msg} ({r})")))
    }

    /// The HIP runtime version, `HIP_VERSION` encoded (`major * 10^7 + minor * 10^5 + patch`).
    pub fn runtime_version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        self.check(
            unsafe { (self.hipRuntimeGetVersion)(&mut v) },
            "hipRuntimeGetVersion",
        )?;
        Ok(v)
    }
}

/// The HIP runtime table, loaded (and `hipInit` called) once per process. A
/// [`System`](crate::ErrorKind::System) error names what was searched and
/// [`HIP_LIBRARY_ENV`] when the library or one of its symbols is missing, or when
/// `hipInit` fails for another reason than the absence of GPUs.
pub fn hip_api() -> Result<&'static HipApi> {
    static HIP: OnceLock<std::result::Result<HipApi, String>> = OnceLock::new();
    HIP.get_or_init(|| {
        let api = HipApi::load()?;
        // SAFETY: hipInit takes flags, which must be 0.
        let r = unsafe { (api.hipInit)(0) };
        if r != HIP_SUCCESS && r != HIP_ERROR_NO_DEVICE {
            return Err(api
                .check(r, "hipInit")
                .err()
                .map(|e| e.message().to_string())
                .unwrap_or_default());
        }
        Ok(api)
    })
    .as_ref()
    .map_err(|m| Error::system(format!("ROCm is not available: {m}")))
}

/// hipRTC's entry points (`hiprtc.h`). Obtained from [`hiprtc_api`].
#[allow(non_snake_case)]
pub struct HiprtcApi {
    /// The path the library was loaded from.
    pub path: String,
    /// `hiprtcCreateProgram(prog*, const char* src, const char* name, int numHeaders,
    /// const char** headers, const char** includeNames)`
    pub hiprtcCreateProgram: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    /// `hiprtcCompileProgram(prog, int numOptions, const char** options)`
    pub hiprtcCompileProgram:
        unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult,
    /// `hiprtcGetProgramLogSize(prog, size_t*)`
    pub hiprtcGetProgramLogSize: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    /// `hiprtcGetProgramLog(prog, char*)`
    pub hiprtcGetProgramLog: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    /// `hiprtcGetCodeSize(prog, size_t*)`
    pub hiprtcGetCodeSize: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    /// `hiprtcGetCode(prog, char*)`
    pub hiprtcGetCode: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    /// `hiprtcDestroyProgram(prog*)`
    pub hiprtcDestroyProgram: unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult,
    /// `hiprtcGetErrorString(hiprtcResult)`
    pub hiprtcGetErrorString: unsafe extern "C" fn(HiprtcResult) -> *const c_char,
    /// `hiprtcVersion(int* major, int* minor)`, where the library has it.
    pub hiprtcVersion: Option<unsafe extern "C" fn(*mut c_int, *mut c_int) -> HiprtcResult>,
    // `None` when the symbols come from the HIP runtime's library (held by `hip_api`).
    lib: Option<Library>,
}

impl HiprtcApi {
    fn from_library(
        lib: &Library,
        path: &str,
        env: &str,
    ) -> std::result::Result<HiprtcApi, String> {
        macro_rules! sym {
            ($name:ident) => {
                // SAFETY: the field's type is the symbol's C signature from hiprtc.h; the
                // library stays loaded as long as this table (it is owned by it, or by the
                // process-wide HIP table).
                unsafe { symbol(lib, path, env, stringify!($name))? }
            };
        }
        Ok(HiprtcApi {
            path: path.to_string(),
            hiprtcCreateProgram: sym!(hiprtcCreateProgram),
            hiprtcCompileProgram: sym!(hiprtcCompileProgram),
            hiprtcGetProgramLogSize: sym!(hiprtcGetProgramLogSize),
            hiprtcGetProgramLog: sym!(hiprtcGetProgramLog),
            hiprtcGetCodeSize: sym!(hiprtcGetCodeSize),
            hiprtcGetCode: sym!(hiprtcGetCode),
            hiprtcDestroyProgram: sym!(hiprtcDestroyProgram),
            hiprtcGetErrorString: sym!(hiprtcGetErrorString),
            // SAFETY: as above.
            hiprtcVersion: unsafe { optional_symbol(lib, "hiprtcVersion") },
            lib: None,
        })
    }

    fn load() -> std::result::Result<HiprtcApi, String> {
        match open_library("hipRTC", HIPRTC_LIBRARY_ENV, &HIPRTC_LIBRARY_NAMES) {
            Ok((lib, path)) => {
                let mut api = Self::from_library(&lib, &path, HIPRTC_LIBRARY_ENV)?;
                api.lib = Some(lib);
                Ok(api)
            }
            Err(own) => {
                // Before ROCm 5.3 (and optionally until 6.0) hipRTC lived in libamdhip64.
                match hip_api() {
                    Ok(hip) => Self::from_library(&hip.lib, &hip.path, HIPRTC_LIBRARY_ENV)
                        .map_err(|e| format!("{own}; {e}")),
                    Err(_) => Err(own),
                }
            }
        }
    }

    /// Turns a `hiprtcResult` into a result, naming the call that failed.
    pub fn check(&self, r: HiprtcResult, what: &str) -> Result<()> {
        if r == HIPRTC_SUCCESS {
            return Ok(());
        }
        // SAFETY: hiprtcGetErrorString returns a static NUL-terminated string (or null).
        let s = unsafe { (self.hiprtcGetErrorString)(r) };
        // SAFETY: the library returned a static NUL-terminated string or null (see above).
        let msg = unsafe { static_message(s) };
        Err(Error::system(format!("hipRTC {what} failed: {msg} ({r})")))
    }

    /// hipRTC's version `(major, minor)`, when the library reports one.
    pub fn version(&self) -> Option<(i32, i32)> {
        let f = self.hiprtcVersion?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both are valid out-pointers.
        (unsafe { f(&mut major, &mut minor) } == HIPRTC_SUCCESS).then_some((major, minor))
    }
}

/// The hipRTC table, loaded once per process (see the module docs for where it is looked
/// for); a [`System`](crate::ErrorKind::System) error naming [`HIPRTC_LIBRARY_ENV`] otherwise.
/// Compiling needs no GPU.
pub fn hiprtc_api() -> Result<&'static HiprtcApi> {
    static RTC: OnceLock<std::result::Result<HiprtcApi, String>> = OnceLock::new();
    RTC.get_or_init(HiprtcApi::load)
        .as_ref()
        .map_err(|m| Error::system(format!("hipRTC is not available: {m}")))
}

/// RCCL's entry points (`rccl.h`, the NCCL API), with HIP streams. Obtained from
/// [`rccl_api`]; map PCCL types with [`rccl_dtype`] and [`rccl_op`].
#[allow(non_snake_case)]
pub struct RcclApi {
    /// The path the library was loaded from.
    pub path: String,
    /// `ncclGetUniqueId(ncclUniqueId*)`
    pub ncclGetUniqueId: unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult,
    /// `ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId, int rank)`
    pub ncclCommInitRank:
        unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> NcclResult,
    /// `ncclCommDestroy(ncclComm_t)`
    pub ncclCommDestroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    /// `ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t,
    /// ncclComm_t, hipStream_t)`
    pub ncclAllGather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    /// `ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t,
    /// ncclRedOp_t, ncclComm_t, hipStream_t)`
    pub ncclReduceScatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    /// `ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t,
    /// ncclRedOp_t, ncclComm_t, hipStream_t)`
    pub ncclAllReduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    /// `ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t, int root,
    /// ncclComm_t, hipStream_t)`
    pub ncclBroadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        c_int,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    /// `ncclGetErrorString(ncclResult_t)`
    pub ncclGetErrorString: unsafe extern "C" fn(NcclResult) -> *const c_char,
    /// `ncclGroupStart()`
    pub ncclGroupStart: unsafe extern "C" fn() -> NcclResult,
    /// `ncclGroupEnd()`
    pub ncclGroupEnd: unsafe extern "C" fn() -> NcclResult,
    /// `ncclGetVersion(int*)`, where the library has it.
    pub ncclGetVersion: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    _lib: Library,
}

impl RcclApi {
    fn load() -> std::result::Result<RcclApi, String> {
        let (lib, path) = open_library("RCCL", RCCL_LIBRARY_ENV, &RCCL_LIBRARY_NAMES)?;
        let env = RCCL_LIBRARY_ENV;
        macro_rules! sym {
            ($name:ident) => {
                // SAFETY: the field's type is the symbol's C signature from rccl.h; the
                // pointer lives in the same struct as the library, which is never unloaded.
                unsafe { symbol(&lib, &path, env, stringify!($name))? }
            };
        }
        Ok(RcclApi {
            ncclGetUniqueId: sym!(ncclGetUniqueId),
            ncclCommInitRank: sym!(ncclCommInitRank),
            ncclCommDestroy: sym!(ncclCommDestroy),
            ncclAllGather: sym!(ncclAllGather),
            ncclReduceScatter: sym!(ncclReduceScatter),
            ncclAllReduce: sym!(ncclAllReduce),
            ncclBroadcast: sym!(ncclBroadcast),
            ncclGetErrorString: sym!(ncclGetErrorString),
            ncclGroupStart: sym!(ncclGroupStart),
            ncclGroupEnd: sym!(ncclGroupEnd),
            // SAFETY: as for `sym!`.
            ncclGetVersion: unsafe { optional_symbol(&lib, "ncclGetVersion") },
            path,
            _lib: lib,
        })
    }

    /// Turns an `ncclResult_t` into a result, naming the call that failed.
    pub fn check(&self, r: NcclResult, what: &str) -> Result<()> {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null).
        let s = unsafe { (self.ncclGetErrorString)(r) };
        // SAFETY: the library returned a static NUL-terminated string or null (see above).
        let msg = unsafe { static_message(s) };
        Err(Error::system(format!("RCCL {what} failed: {msg} ({r})")))
    }

    /// RCCL's version code (`NCCL_VERSION_CODE`, e.g. 21804), when the library reports one.
    pub fn version(&self) -> Option<i32> {
        let f = self.ncclGetVersion?;
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer.
        (unsafe { f(&mut v) } == NCCL_SUCCESS).then_some(v)
    }
}

/// The RCCL table, loaded once per process; a [`System`](crate::ErrorKind::System) error
/// naming [`RCCL_LIBRARY_ENV`] when the library or a symbol is missing.
pub fn rccl_api() -> Result<&'static RcclApi> {
    static RCCL: OnceLock<std::result::Result<RcclApi, String>> = OnceLock::new();
    RCCL.get_or_init(RcclApi::load)
        .as_ref()
        .map_err(|m| Error::system(format!("RCCL is not available: {m}")))
}

// ---------------------------------------------------------------------------------------------
// Compiling
// ---------------------------------------------------------------------------------------------

/// Checks an AMD GPU target ID (`gcnArchName`): a processor `gfx<...>` (letters, digits and
/// `-` for the generic targets such as `gfx9-generic`) followed by any number of
/// `:<feature>+` / `:<feature>-` settings (`gfx90a:sramecc+:xnack-`). Surrounding
/// whitespace and NUL padding are dropped; the result is what hipRTC's `--offload-arch`
/// takes.
pub fn parse_arch(raw: &str) -> Result<String> {
    let s = raw.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    let bad = || {
        Error::invalid(format!(
            "'{raw}' is not an AMD GPU architecture: expected gfx<id> with optional \
             :feature+ / :feature- settings, such as gfx90a or gfx90a:sramecc+:xnack-"
        ))
    };
    let mut parts = s.split(':');
    let proc_ = parts.next().unwrap_or_default();
    let id = proc_.strip_prefix("gfx").ok_or_else(bad)?;
    if id.is_empty()
        || !id.starts_with(|c: char| c.is_ascii_digit())
        || !id
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase() || c == '-')
    {
        return Err(bad());
    }
    for f in parts {
        let name = f
            .strip_suffix('+')
            .or_else(|| f.strip_suffix('-'))
            .ok_or_else(bad)?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(bad());
        }
    }
    Ok(s.to_string())
}

/// The hipRTC options the kernels are compiled with for target `arch` (checked with
/// [`parse_arch`]): the architecture (`--offload-arch`, which hipRTC treats as its
/// `--gpu-architecture`), the unroll factor the host's launch arithmetic assumes, C++17,
/// full optimisation, and no floating-point contraction (results must match the host's
/// separately rounded operations).
pub fn compile_options(arch: &str) -> Result<Vec<String>> {
    let arch = parse_arch(arch)?;
    Ok(vec![
        format!("--offload-arch={arch}"),
        format!("-DPCCL_UNROLL={UNROLL}"),
        "-std=c++17".to_string(),
        "-O3".to_string(),
        "-ffp-contract=off".to_string(),
    ])
}

/// The text hipRTC compiles for kernel source `src` named `name`: [`HIP_PRELUDE`], then the
/// source with its own line numbers.
pub fn hip_source(name: &str, src: &str) -> String {
    format!("{HIP_PRELUDE}#line 1 \"{name}\"\n{src}")
}

/// Finds the architecture string (`gcnArchName`) in the bytes of a `hipDeviceProp_t`
/// without knowing its layout: the NUL-terminated strings starting with `gfx` that
/// [`parse_arch`] accepts, preferring one with feature settings (the marketing `name` field
/// comes first and holds none), else the last one.
pub fn find_arch_in_properties(bytes: &[u8]) -> Option<String> {
    let mut found: Vec<String> = Vec::new();
    let mut i = 0;
    while i + 3 <= bytes.len() {
        if &bytes[i..i + 3] == b"gfx" && (i == 0 || bytes[i - 1] == 0) {
            let end = bytes[i..]
                .iter()
                .position(|&b| b == 0)
                .map_or(bytes.len(), |p| i + p);
            if let Ok(s) = std::str::from_utf8(&bytes[i..end]) {
                if let Ok(a) = parse_arch(s) {
                    found.push(a);
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    found
        .iter()
        .find(|a| a.contains(':'))
        .or(found.last())
        .cloned()
}

/// The two kernel modules compiled for one architecture: AMD GPU code objects.
#[derive(Clone, Debug)]
pub struct HipKernelImages {
    /// The architecture they were compiled for.
    pub arch: String,
    /// `csrc/reduce.cu`
    pub reduce: Vec<u8>,
    /// `csrc/transpose.cu`
    pub transpose: Vec<u8>,
}

struct RtcProgram<'a> {
    api: &'a HiprtcApi,
    prog: HiprtcProgram,
}

impl Drop for RtcProgram<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by hiprtcCreateProgram and is destroyed only here.
        let _ = unsafe { (self.api.hiprtcDestroyProgram)(&mut self.prog) };
    }
}

fn compile_one(rtc: &HiprtcApi, name: &str, src: &str, options: &[String]) -> Result<Vec<u8>> {
    let c_src = CString::new(hip_source(name, src))
        .map_err(|_| Error::internal(format!("{name}: NUL byte in kernel source")))?;
    let c_name = CString::new(name).map_err(|_| Error::internal("NUL byte in kernel name"))?;
    let c_opts = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::internal("NUL byte in a hipRTC option"))?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = RtcProgram {
        api: rtc,
        prog: null_mut(),
    };
    // SAFETY: source and name are NUL-terminated and outlive the call; no headers are passed
    // (0 and null arrays); `prog.prog` is a valid out-pointer.
    let r = unsafe {
        (rtc.hiprtcCreateProgram)(
            &mut prog.prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    rtc.check(r, &format!("hiprtcCreateProgram ({name})"))?;
    // SAFETY: `prog` is live; `opt_ptrs` holds `len` pointers to NUL-terminated options that
    // `c_opts` keeps alive.
    let r = unsafe {
        (rtc.hiprtcCompileProgram)(prog.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr())
    };
    if r != HIPRTC_SUCCESS {
        let mut size = 0usize;
        // SAFETY: `prog` is live; `size` is a valid out-pointer.
        let log = if unsafe { (rtc.hiprtcGetProgramLogSize)(prog.prog, &mut size) }
            == HIPRTC_SUCCESS
            && size > 0
        {
            let mut buf = vec![0u8; size];
            // SAFETY: `buf` holds the `size` bytes hipRTC reported for the log.
            let ok = unsafe { (rtc.hiprtcGetProgramLog)(prog.prog, buf.as_mut_ptr().cast()) };
            if ok == HIPRTC_SUCCESS {
                let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                String::from_utf8_lossy(&buf[..end]).into_owned()
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        let err = rtc.check(r, "hiprtcCompileProgram").unwrap_err();
        return Err(Error::system(format!(
            "{} for {name} ({}):\n{log}",
            err.message(),
            options.join(" ")
        )));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
    rtc.check(
        unsafe { (rtc.hiprtcGetCodeSize)(prog.prog, &mut size) },
        "hiprtcGetCodeSize",
    )?;
    let mut code = vec![0u8; size];
    // SAFETY: `code` holds the `size` bytes hipRTC reported.
    rtc.check(
        unsafe { (rtc.hiprtcGetCode)(prog.prog, code.as_mut_ptr().cast()) },
        "hiprtcGetCode",
    )?;
    if code.is_empty() {
        return Err(Error::system(format!(
            "hipRTC produced no code for {name} ({})",
            options.join(" ")
        )));
    }
    Ok(code)
}

/// Compiles both kernel modules with hipRTC for AMD architecture `arch` (a `gcnArchName`
/// such as `gfx942:sramecc+:xnack-`). Needs only hipRTC, no GPU.
pub fn compile_kernels(arch: &str) -> Result<HipKernelImages> {
    let options = compile_options(arch)?;
    let rtc = hiprtc_api()?;
    Ok(HipKernelImages {
        arch: parse_arch(arch)?,
        reduce: compile_one(rtc, "reduce.cu", REDUCE_SOURCE, &options)?,
        transpose: compile_one(rtc, "transpose.cu", TRANSPOSE_SOURCE, &options)?,
    })
}

// ---------------------------------------------------------------------------------------------
// Pure argument validation (unit-tested without a device)
// ---------------------------------------------------------------------------------------------

/// A device buffer as the validation sees it: its address and length in bytes.
pub(crate) type Span = (u64, usize);

/// Validates `dst = a op b` over the first `n` elements of `dtype` of three buffers; returns
/// the launch's element count and head, or `None` when there is nothing to do.
pub(crate) fn plan_reduce(
    op: ReduceOp,
    dtype: DType,
    n: usize,
    dst: Span,
    a: Span,
    b: Span,
) -> Result<Option<Elementwise>> {
    dtype.check_op(op)?;
    let bytes = check_count(
        dtype,
        n,
        &[
            ("destination", dst.1),
            ("first input", a.1),
            ("second input", b.1),
        ],
    )?;
    if bytes == 0 {
        return Ok(None);
    }
    launch::check_elementwise(dtype, [dst.0, a.0, b.0], bytes).map(Some)
}

/// Bytes of `n` elements of `dtype`, checking for overflow and that every named buffer
/// length holds them.
pub(crate) fn check_count(dtype: DType, n: usize, lens: &[(&str, usize)]) -> Result<usize> {
    let bytes = n.checked_mul(dtype.size()).ok_or_else(|| {
        Error::invalid(format!(
            "{n} elements of {dtype} overflow the address space"
        ))
    })?;
    for (what, len) in lens {
        if *len < bytes {
            return Err(Error::invalid(format!(
                "{n} {dtype} elements need {bytes} bytes, the {what} buffer holds {len}"
            )));
        }
    }
    Ok(bytes)
}

/// Validates a transpose of `m` x `n` blocks of `block_bytes` bytes from `src` to `dst`
/// with `threads` threads per block: sizes, overflow, overlap. Returns the bytes moved and
/// the plan, or `None` when there is nothing to do.
pub(crate) fn plan_transpose_spans(
    src: Span,
    dst: Span,
    m: usize,
    n: usize,
    block_bytes: usize,
    threads: u32,
) -> Result<Option<(usize, TransposePlan)>> {
    let total = launch::transpose_total(src.1, dst.1, m, n, block_bytes)?;
    if total == 0 {
        return Ok(None);
    }
    let plan = launch::plan_transpose(src.0, dst.0, m, n, block_bytes, total, threads)?;
    Ok(Some((total, plan)))
}

/// Checks a host slice of `len` bytes against a device buffer of `buf` bytes for an exact
/// copy (`upload_into`).
pub(crate) fn check_same_len(what: &str, len: usize, buf: usize) -> Result<()> {
    if len != buf {
        return Err(Error::invalid(format!(
            "{what} of {len} bytes into a device buffer of {buf} bytes"
        )));
    }
    Ok(())
}

/// Checks that a device buffer of `len` bytes holds whole elements of `dtype` (`download`).
pub(crate) fn check_whole_elements(len: usize, dtype: DType) -> Result<()> {
    if len % dtype.size() != 0 {
        return Err(Error::invalid(format!(
            "device buffer of {len} bytes is not a whole number of {dtype} elements"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Devices and buffers
// ---------------------------------------------------------------------------------------------

/// Number of HIP devices: 0 when ROCm is installed but sees no GPU, a
/// [`System`](crate::ErrorKind::System) error when the HIP runtime cannot be loaded.
pub fn device_count() -> Result<usize> {
    let api = hip_api()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    let r = unsafe { (api.hipGetDeviceCount)(&mut n) };
    if r == HIP_ERROR_NO_DEVICE {
        return Ok(0);
    }
    api.check(r, "hipGetDeviceCount")?;
    Ok(n.max(0) as usize)
}

/// A compiled kernel handle; HIP functions may be launched from any thread.
#[derive(Clone, Copy)]
struct KernelFn(HipFunction);
// SAFETY: a hipFunction_t is an immutable handle into a module that is never unloaded; the
// runtime allows launching it from any thread.
unsafe impl Send for KernelFn {}
// SAFETY: as above; it is only read.
unsafe impl Sync for KernelFn {}

/// A device's properties and loaded kernels, shared by every [`HipDevice`] opened on it.
struct DeviceShared {
    api: &'static HipApi,
    ordinal: c_int,
    name: String,
    arch: String,
    compute_units: u32,
    code_bytes: usize,
    functions: HashMap<String, KernelFn>,
}

impl DeviceShared {
    fn function(&self, name: &str) -> Result<HipFunction> {
        self.functions.get(name).map(|f| f.0).ok_or_else(|| {
            Error::internal(format!("kernel {name} missing from the compiled module"))
        })
    }
}

fn attribute(api: &HipApi, attr: HipDeviceAttribute, ordinal: c_int, what: &str) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; an unknown attribute is reported as an error.
    api.check(
        unsafe { (api.hipDeviceGetAttribute)(&mut v, attr, ordinal) },
        &format!("hipDeviceGetAttribute ({what})"),
    )?;
    Ok(v)
}

/// Bytes handed to `hipGetDeviceProperties`: far more than any `hipDeviceProp_t` (about
/// 1.5 KiB in ROCm 6), so that no layout can write past it.
const PROPS_BUFFER_BYTES: usize = 64 << 10;

fn device_arch(api: &HipApi, ordinal: c_int) -> Result<String> {
    if let Some(a) = std::env::var_os(HIP_ARCH_ENV).filter(|a| !a.is_empty()) {
        return parse_arch(&a.to_string_lossy());
    }
    let mut buf = vec![0u64; PROPS_BUFFER_BYTES / 8];
    // SAFETY: the buffer is 8-byte aligned and larger than any version's hipDeviceProp_t.
    let r = unsafe { (api.hipGetDeviceProperties)(buf.as_mut_ptr().cast(), ordinal) };
    api.check(r, "hipGetDeviceProperties")?;
    find_arch_in_properties(bytemuck::cast_slice(&buf)).ok_or_else(|| {
        Error::system(format!(
            "could not find the architecture (gcnArchName) of HIP device {ordinal} in its \
             properties: set {HIP_ARCH_ENV} to it (rocminfo lists it, e.g. gfx90a)"
        ))
    })
}

fn device_name(api: &HipApi, ordinal: c_int) -> Result<String> {
    let mut dev: HipDeviceId = 0;
    // SAFETY: `dev` is a valid out-pointer.
    api.check(
        unsafe { (api.hipDeviceGet)(&mut dev, ordinal) },
        "hipDeviceGet",
    )?;
    let mut buf = [0 as c_char; 256];
    // SAFETY: `buf` has room for the 256 bytes the call may write, NUL included.
    api.check(
        unsafe { (api.hipDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, dev) },
        "hipDeviceGetName",
    )?;
    buf[255] = 0;
    // SAFETY: `buf` is NUL-terminated (its last byte at least).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

fn load_module(api: &HipApi, image: &[u8], what: &str) -> Result<HipModule> {
    let mut module: HipModule = null_mut();
    // SAFETY: `image` is a complete code object from hipRTC, alive for the call (the runtime
    // copies it); `module` is a valid out-pointer. Modules are never unloaded.
    api.check(
        unsafe { (api.hipModuleLoadData)(&mut module, image.as_ptr().cast()) },
        &format!("hipModuleLoadData ({what})"),
    )?;
    Ok(module)
}

fn shared_for(ordinal: usize) -> Result<Arc<DeviceShared>> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Arc<DeviceShared>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache
        .lock()
        .map_err(|_| Error::internal("HIP module cache poisoned"))?;
    if let Some(s) = map.get(&ordinal) {
        return Ok(s.clone());
    }
    let api = hip_api()?;
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::invalid(format!(
            "HIP device {ordinal} does not exist: this machine has {count} HIP device(s)"
        )));
    }
    let ord = ordinal as c_int;
    // SAFETY: `ord` is a valid device ordinal (checked above).
    api.check(unsafe { (api.hipSetDevice)(ord) }, "hipSetDevice")?;
    let name = device_name(api, ord)?;
    let arch = device_arch(api, ord)?;
    let compute_units = attribute(
        api,
        HIP_ATTR_MULTIPROCESSOR_COUNT,
        ord,
        "multiprocessor count",
    )?
    .max(1) as u32;
    let images = compile_kernels(&arch)?;
    let reduce = load_module(api, &images.reduce, "reduce.cu")?;
    let transpose = load_module(api, &images.transpose, "transpose.cu")?;
    let mut functions = HashMap::new();
    for kname in launch::kernel_names() {
        let module = if kname.starts_with("pccl_transpose") {
            transpose
        } else {
            reduce
        };
        let c = CString::new(kname.as_str()).map_err(|_| Error::internal("NUL in kernel name"))?;
        let mut f: HipFunction = null_mut();
        // SAFETY: `module` is a loaded module; `c` is NUL-terminated; `f` is an out-pointer.
        api.check(
            unsafe { (api.hipModuleGetFunction)(&mut f, module, c.as_ptr()) },
            &format!("hipModuleGetFunction ({kname})"),
        )?;
        functions.insert(kname, KernelFn(f));
    }
    let shared = Arc::new(DeviceShared {
        api,
        ordinal: ord,
        name,
        arch,
        compute_units,
        code_bytes: images.reduce.len() + images.transpose.len(),
        functions,
    });
    map.insert(ordinal, shared.clone());
    Ok(shared)
}

/// Device memory on one HIP device, freed when dropped (see also [`HipDevice::free`]).
pub struct HipBuffer {
    api: &'static HipApi,
    ordinal: c_int,
    ptr: u64,
    len: usize,
}

// SAFETY: the buffer is device memory owned by this value; HIP allows freeing and using it
// from any thread, and access goes through `&`/`&mut` of the owner.
unsafe impl Send for HipBuffer {}
// SAFETY: shared references only hand out the address for reading.
unsafe impl Sync for HipBuffer {}

impl HipBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device address of the first byte (0 for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// The ordinal of the device the memory is on.
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }
    fn span(&self) -> Span {
        (self.ptr, self.len)
    }
    fn release(&mut self) -> Result<()> {
        if self.ptr == 0 {
            return Ok(());
        }
        let p = std::mem::replace(&mut self.ptr, 0);
        // SAFETY: the ordinal is the device the memory was allocated on.
        self.api.check(
            unsafe { (self.api.hipSetDevice)(self.ordinal) },
            "hipSetDevice",
        )?;
        // SAFETY: `p` came from hipMalloc and is freed once (the field is cleared first);
        // hipFree waits for work still using it.
        self.api
            .check(unsafe { (self.api.hipFree)(p as *mut c_void) }, "hipFree")
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl std::fmt::Debug for HipBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBuffer")
            .field("ordinal", &self.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

/// One AMD GPU with a stream of its own, on which every operation of this handle is ordered.
pub struct HipDevice {
    shared: Arc<DeviceShared>,
    stream: HipStream,
    shape: LaunchShape,
}

// SAFETY: the stream handle is owned by this value and HIP streams may be used from any
// thread; the shared part is immutable.
unsafe impl Send for HipDevice {}
// SAFETY: every method through `&self` only enqueues on the stream, which the HIP runtime
// serialises internally.
unsafe impl Sync for HipDevice {}

impl Drop for HipDevice {
    fn drop(&mut self) {
        let api = self.shared.api;
        // SAFETY: the stream was created on this device by this handle and is destroyed only
        // here; HIP releases it once the work queued on it has finished.
        unsafe {
            let _ = (api.hipSetDevice)(self.shared.ordinal);
            let _ = (api.hipStreamDestroy)(self.stream);
        }
    }
}

impl std::fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipDevice")
            .field("ordinal", &self.shared.ordinal)
            .field("name", &self.shared.name)
            .field("arch", &self.shared.arch)
            .field("shape", &self.shape)
            .finish()
    }
}

impl HipDevice {
    /// Number of HIP devices, or a [`System`](crate::ErrorKind::System) error (naming the
    /// library searched and [`HIP_LIBRARY_ENV`]) when the HIP runtime cannot be loaded.
    pub fn count() -> Result<usize> {
        device_count()
    }

    /// Opens device `ordinal`: loads HIP and hipRTC, compiles the kernels for the device's
    /// architecture the first time it is opened in the process, and creates a stream for
    /// this handle.
    pub fn open(ordinal: usize) -> Result<HipDevice> {
        let shared = shared_for(ordinal)?;
        let api = shared.api;
        // SAFETY: the ordinal is a valid device (checked when `shared` was made).
        api.check(
            unsafe { (api.hipSetDevice)(shared.ordinal) },
            "hipSetDevice",
        )?;
        let mut stream: HipStream = null_mut();
        // SAFETY: `stream` is a valid out-pointer; the stream is destroyed in Drop.
        api.check(
            unsafe { (api.hipStreamCreate)(&mut stream) },
            "hipStreamCreate",
        )?;
        Ok(HipDevice {
            shared,
            stream,
            shape: LaunchShape::default(),
        })
    }

    fn api(&self) -> &'static HipApi {
        self.shared.api
    }

    /// Makes this device current on the calling thread (every method does so itself).
    pub fn bind(&self) -> Result<()> {
        let api = self.api();
        // SAFETY: the ordinal is a valid device.
        api.check(
            unsafe { (api.hipSetDevice)(self.shared.ordinal) },
            "hipSetDevice",
        )
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.shared.ordinal as usize
    }

    /// The device's name (`AMD Instinct MI250X`, ...).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The architecture the kernels were compiled for (`gcnArchName`, such as
    /// `gfx90a:sramecc+:xnack-`).
    pub fn arch(&self) -> &str {
        &self.shared.arch
    }

    /// Number of compute units.
    pub fn compute_units(&self) -> u32 {
        self.shared.compute_units
    }

    /// Bytes of compiled code (both modules) loaded for this device.
    pub fn code_bytes(&self) -> usize {
        self.shared.code_bytes
    }

    /// The raw stream this handle orders its work on (for RCCL calls).
    pub fn stream_handle(&self) -> HipStream {
        self.stream
    }

    /// The launch shape in use.
    pub fn launch_shape(&self) -> LaunchShape {
        self.shape
    }

    /// Changes the launch shape (threads a multiple of 32 in 32..=1024).
    pub fn set_launch_shape(&mut self, shape: LaunchShape) -> Result<()> {
        shape.validate()?;
        self.shape = shape;
        Ok(())
    }

    /// Waits until all work queued on this handle's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        let api = self.api();
        // SAFETY: the stream is live (owned by `self`).
        api.check(
            unsafe { (api.hipStreamSynchronize)(self.stream) },
            "hipStreamSynchronize",
        )
    }

    fn own(&self, buf: &HipBuffer, what: &str) -> Result<()> {
        if buf.ordinal != self.shared.ordinal {
            return Err(Error::invalid(format!(
                "{what} buffer is on HIP device {}, this handle is device {}",
                buf.ordinal, self.shared.ordinal
            )));
        }
        Ok(())
    }

    /// Allocates `bytes` bytes of device memory (contents undefined).
    pub fn alloc(&self, bytes: usize) -> Result<HipBuffer> {
        self.bind()?;
        let api = self.api();
        let mut p: *mut c_void = null_mut();
        if bytes > 0 {
            // SAFETY: `p` is a valid out-pointer; the memory is freed by the HipBuffer.
            api.check(unsafe { (api.hipMalloc)(&mut p, bytes) }, "hipMalloc")?;
        }
        Ok(HipBuffer {
            api,
            ordinal: self.shared.ordinal,
            ptr: p as u64,
            len: bytes,
        })
    }

    /// Allocates `bytes` bytes of device memory, zeroed (stream-ordered).
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<HipBuffer> {
        let mut b = self.alloc(bytes)?;
        self.fill(&mut b, 0)?;
        Ok(b)
    }

    /// Frees a buffer now, reporting an error (dropping it frees it too, silently).
    pub fn free(&self, mut buf: HipBuffer) -> Result<()> {
        self.own(&buf, "freed")?;
        buf.release()
    }

    /// Sets every byte of `buf` to `byte` (stream-ordered).
    pub fn fill(&self, buf: &mut HipBuffer, byte: u8) -> Result<()> {
        self.own(buf, "filled")?;
        if buf.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let api = self.api();
        // SAFETY: `buf` addresses `len` bytes of device memory it owns, mutably borrowed
        // until the memset is queued; the stream orders it after earlier work.
        api.check(
            unsafe {
                (api.hipMemsetAsync)(buf.ptr as *mut c_void, byte as c_int, buf.len, self.stream)
            },
            "hipMemsetAsync",
        )
    }

    /// Copies host elements into a new device buffer of bytes (waits for the copy).
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<HipBuffer> {
        let mut b = self.alloc(std::mem::size_of_val(data))?;
        self.upload_into(data, &mut b)?;
        Ok(b)
    }

    /// Copies host elements into an existing device buffer, which must hold exactly as many
    /// bytes (waits for the copy, since `data` is only borrowed).
    pub fn upload_into<T: Element>(&self, data: &[T], dst: &mut HipBuffer) -> Result<()> {
        self.own(dst, "upload destination")?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        check_same_len("upload", bytes.len(), dst.len)?;
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let api = self.api();
        // SAFETY: `bytes` and `dst` hold `len` bytes each; the host slice stays borrowed until
        // the stream is synchronized below.
        api.check(
            unsafe {
                (api.hipMemcpyAsync)(
                    dst.ptr as *mut c_void,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    HIP_MEMCPY_HOST_TO_DEVICE,
                    self.stream,
                )
            },
            "host-to-device hipMemcpyAsync",
        )?;
        self.synchronize()
    }

    /// Waits for this handle's stream, then copies a device buffer back as elements of `T`.
    pub fn download<T: Element>(&self, src: &HipBuffer) -> Result<Vec<T>> {
        self.own(src, "download source")?;
        check_whole_elements(src.len, T::DTYPE)?;
        let mut out: Vec<T> =
            vec![<T as bytemuck::Zeroable>::zeroed(); src.len / std::mem::size_of::<T>()];
        if src.is_empty() {
            return Ok(out);
        }
        self.bind()?;
        let api = self.api();
        let dst: &mut [u8] = bytemuck::cast_slice_mut(out.as_mut_slice());
        // SAFETY: `dst` and `src` hold `len` bytes each; `dst` stays borrowed until the
        // stream is synchronized below.
        api.check(
            unsafe {
                (api.hipMemcpyAsync)(
                    dst.as_mut_ptr().cast(),
                    src.ptr as *const c_void,
                    src.len,
                    HIP_MEMCPY_DEVICE_TO_HOST,
                    self.stream,
                )
            },
            "device-to-host hipMemcpyAsync",
        )?;
        self.synchronize()?;
        Ok(out)
    }

    /// Device-to-device copy of all of `src` into the front of `dst` (stream-ordered).
    pub fn copy(&self, src: &HipBuffer, dst: &mut HipBuffer) -> Result<()> {
        self.own(src, "copy source")?;
        self.own(dst, "copy destination")?;
        if dst.len < src.len {
            return Err(Error::invalid(format!(
                "copy of {} bytes into a device buffer of {} bytes",
                src.len, dst.len
            )));
        }
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: both buffers hold at least `src.len` bytes and are borrowed (so distinct)
        // until the copy is queued.
        unsafe { self.copy_dtod_raw(dst.ptr, src.ptr, src.len) }
    }

    /// Queues a device-to-device copy of `len` bytes on this handle's stream.
    ///
    /// # Safety
    /// Both addresses must hold `len` valid bytes of this device until the copy completes;
    /// they must not overlap.
    pub unsafe fn copy_dtod_raw(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        if len == 0 || dst == src {
            return Ok(());
        }
        self.bind()?;
        let api = self.api();
        api.check(
            (api.hipMemcpyAsync)(
                dst as *mut c_void,
                src as *const c_void,
                len,
                HIP_MEMCPY_DEVICE_TO_DEVICE,
                self.stream,
            ),
            "device-to-device hipMemcpyAsync",
        )
    }

    /// Launches `kernel` on `grid` blocks of `self.shape.threads` threads.
    ///
    /// # Safety
    /// `args` must point at values of exactly the kernel's parameter types, in order, and
    /// every device address among them must stay valid until the kernel completes.
    unsafe fn launch(
        &self,
        kernel: &str,
        grid: u32,
        smem: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.shared.function(kernel)?;
        self.bind()?;
        let api = self.api();
        let r = (api.hipModuleLaunchKernel)(
            f,
            grid,
            1,
            1,
            self.shape.threads,
            1,
            1,
            smem,
            self.stream,
            args.as_mut_ptr(),
            null_mut(),
        );
        api.check(r, &format!("launch of {kernel}"))
    }

    /// Launches a reduction over validated pointers.
    ///
    /// # Safety
    /// `ptrs` (dst, a, b) must address `ew.n` elements of `dtype` that stay valid until the
    /// kernel completes, validated by [`launch::check_elementwise`].
    unsafe fn launch_reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        ptrs: [u64; 3],
        ew: Elementwise,
    ) -> Result<()> {
        let kernel = launch::reduce_kernel(op, dtype);
        let work = self.shape.elementwise_work(ew.n, ew.head, dtype.size());
        let grid = self.shape.grid_blocks(work, self.shared.compute_units);
        let (mut d, mut a, mut b, mut n, mut head) = (ptrs[0], ptrs[1], ptrs[2], ew.n, ew.head);
        let mut args: [*mut c_void; 5] = [
            (&mut d as *mut u64).cast(),
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut head as *mut u64).cast(),
        ];
        // `pccl_reduce_<dtype>_<op>(T* dst, const T* a, const T* b, u64 n, u64 head)`: five
        // 8-byte arguments, the pointers as device addresses.
        self.launch(&kernel, grid, 0, &mut args)
    }

    /// `dst[i] = a[i] op b[i]` for the first `n` elements of `dtype` of each buffer. For
    /// [`ReduceOp::Avg`] this sums; finish with [`HipDevice::divide`], as on the host.
    pub fn reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: &mut HipBuffer,
        a: &HipBuffer,
        b: &HipBuffer,
        n: usize,
    ) -> Result<()> {
        self.own(dst, "destination")?;
        self.own(a, "first input")?;
        self.own(b, "second input")?;
        let (pd, pa, pb) = (dst.span(), a.span(), b.span());
        let Some(ew) = plan_reduce(op, dtype, n, pd, pa, pb)? else {
            return Ok(());
        };
        // SAFETY: the three buffers hold `n` elements (checked), are aligned and disjoint
        // (checked; `dst` is borrowed mutably, so distinct), and stay borrowed until queued;
        // device memory is freed only after queued work (hipFree synchronizes).
        unsafe { self.launch_reduce(op, dtype, [pd.0, pa.0, pb.0], ew) }
    }

    /// `dst[i] = dst[i] op src[i]` for the first `n` elements (in place).
    pub fn reduce_into(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: &mut HipBuffer,
        src: &HipBuffer,
        n: usize,
    ) -> Result<()> {
        self.own(dst, "destination")?;
        self.own(src, "source")?;
        let (pd, ps) = (dst.span(), src.span());
        let Some(ew) = plan_reduce(op, dtype, n, pd, pd, ps)? else {
            return Ok(());
        };
        // SAFETY: as in `reduce`, with `dst` also the first input.
        unsafe { self.launch_reduce(op, dtype, [pd.0, pd.0, ps.0], ew) }
    }

    /// `dst = a op b` over `bytes` bytes of `dtype` at device addresses, on this handle's
    /// stream.
    ///
    /// # Safety
    /// The three addresses must hold `bytes` valid bytes of this device until the kernel
    /// completes; `dst` equals an input or overlaps neither (checked).
    pub unsafe fn reduce_raw(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: u64,
        a: u64,
        b: u64,
        bytes: usize,
    ) -> Result<()> {
        launch::check_lengths(dtype, &[bytes])?;
        let n = bytes / dtype.size();
        let Some(ew) = plan_reduce(op, dtype, n, (dst, bytes), (a, bytes), (b, bytes))? else {
            return Ok(());
        };
        self.launch_reduce(op, dtype, [dst, a, b], ew)
    }

    /// `dst[i] /= ranks` for the first `n` elements of a floating-point `dtype` (the
    /// division that finishes an average), in the precision the host uses; a no-op for
    /// integer types, as on the host.
    pub fn divide(&self, dtype: DType, dst: &mut HipBuffer, n: usize, ranks: usize) -> Result<()> {
        self.own(dst, "destination")?;
        let bytes = check_count(dtype, n, &[("destination", dst.len)])?;
        // SAFETY: `dst` holds `bytes` bytes (checked) and is borrowed until queued.
        unsafe { self.divide_raw(dtype, dst.ptr, bytes, ranks) }
    }

    /// `dst /= ranks` over `bytes` bytes of `dtype` at a device address.
    ///
    /// # Safety
    /// `dst` must hold `bytes` valid bytes of this device until the kernel completes.
    pub unsafe fn divide_raw(
        &self,
        dtype: DType,
        dst: u64,
        bytes: usize,
        ranks: usize,
    ) -> Result<()> {
        if ranks == 0 {
            return Err(Error::invalid("divide by zero ranks"));
        }
        let bytes = launch::check_lengths(dtype, &[bytes])?;
        if !dtype.is_float() || bytes == 0 {
            return Ok(());
        }
        let Elementwise { n, head } = launch::check_divide(dtype, dst, bytes)?;
        let kernel = launch::divide_kernel(dtype);
        let work = self.shape.elementwise_work(n, head, dtype.size());
        let grid = self.shape.grid_blocks(work, self.shared.compute_units);
        let (mut d, mut n, mut head) = (dst, n, head);
        let mut d32 = ranks as f32;
        let mut d64 = ranks as f64;
        let divisor: *mut c_void = if dtype == DType::F64 {
            (&mut d64 as *mut f64).cast()
        } else {
            (&mut d32 as *mut f32).cast()
        };
        let mut args: [*mut c_void; 4] = [
            (&mut d as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut head as *mut u64).cast(),
            divisor,
        ];
        // `pccl_divide_<dtype>(T* dst, u64 n, u64 head, D divisor)`, the divisor a double for
        // f64 and a float otherwise; `dst` addresses `n` aligned elements (checked).
        self.launch(&kernel, grid, 0, &mut args)
    }

    /// Transposes an `m` x `n` grid of blocks of `block_bytes` bytes: `src` holds it as
    /// `[m][n]` (block `(i, j)` at byte `(i*n + j) * block_bytes`), `dst` receives it as
    /// `[n][m]`. Only the first `m * n * block_bytes` bytes of each buffer are touched.
    pub fn transpose_blocks(
        &self,
        src: &HipBuffer,
        dst: &mut HipBuffer,
        m: usize,
        n: usize,
        block_bytes: usize,
    ) -> Result<()> {
        self.own(src, "transpose source")?;
        self.own(dst, "transpose destination")?;
        let Some((total, plan)) = plan_transpose_spans(
            src.span(),
            dst.span(),
            m,
            n,
            block_bytes,
            self.shape.threads,
        )?
        else {
            return Ok(());
        };
        // SAFETY: both buffers hold `total` bytes (checked), are disjoint (checked, and
        // distinct borrows) and stay borrowed until the work is queued.
        unsafe { self.launch_transpose(src.ptr, dst.ptr, m, n, total, plan) }
    }

    /// The inverse of [`HipDevice::transpose_blocks`]: `src` holds the grid as `[n][m]`,
    /// `dst` receives it as `[m][n]`.
    pub fn untranspose_blocks(
        &self,
        src: &HipBuffer,
        dst: &mut HipBuffer,
        m: usize,
        n: usize,
        block_bytes: usize,
    ) -> Result<()> {
        self.transpose_blocks(src, dst, n, m, block_bytes)
    }

    /// Queues a planned transpose.
    ///
    /// # Safety
    /// `ps` and `pd` must address `total` bytes of disjoint device memory of this device that
    /// stay valid until the work completes, as checked by [`plan_transpose_spans`].
    unsafe fn launch_transpose(
        &self,
        ps: u64,
        pd: u64,
        m: usize,
        n: usize,
        total: usize,
        plan: TransposePlan,
    ) -> Result<()> {
        let (mut s, mut d, mut mm, mut nn) = (ps, pd, m as u64, n as u64);
        match plan {
            TransposePlan::Copy => self.copy_dtod_raw(pd, ps, total),
            TransposePlan::Runs { k, work, .. } => {
                let kernel = plan.kernel().unwrap_or_default();
                let grid = self.shape.grid_blocks(work, self.shared.compute_units);
                let mut k = k;
                let mut args: [*mut c_void; 5] = [
                    (&mut s as *mut u64).cast(),
                    (&mut d as *mut u64).cast(),
                    (&mut mm as *mut u64).cast(),
                    (&mut nn as *mut u64).cast(),
                    (&mut k as *mut u64).cast(),
                ];
                // `pccl_transpose_copy_<unit>(const U* src, U* dst, u64 M, u64 N, u64 k)`.
                self.launch(&kernel, grid, 0, &mut args)
            }
            TransposePlan::Tiles {
                k,
                tm,
                tn,
                tiles,
                smem,
                ..
            } => {
                let kernel = plan.kernel().unwrap_or_default();
                let grid = self.shape.grid_blocks(tiles, self.shared.compute_units);
                let (mut k32, mut tm, mut tn) = (k as u32, tm, tn);
                let mut args: [*mut c_void; 7] = [
                    (&mut s as *mut u64).cast(),
                    (&mut d as *mut u64).cast(),
                    (&mut mm as *mut u64).cast(),
                    (&mut nn as *mut u64).cast(),
                    (&mut k32 as *mut u32).cast(),
                    (&mut tm as *mut u32).cast(),
                    (&mut tn as *mut u32).cast(),
                ];
                // `pccl_transpose_tile_<unit>(const U* src, U* dst, u64 M, u64 N, u32 k,
                // u32 TM, u32 TN)` with `smem` bytes of dynamic LDS (at most 16 KiB plus one
                // unit per row, under the 64 KiB of AMD GPUs).
                self.launch(&kernel, grid, smem, &mut args)
            }
        }
    }

    /// Runs `work` (which queues device work on this handle's stream) between two events and
    /// returns the device time in milliseconds.
    pub fn time_ms(&self, mut work: impl FnMut(&Self) -> Result<()>) -> Result<f64> {
        struct Event(&'static HipApi, HipEvent);
        impl Drop for Event {
            fn drop(&mut self) {
                // SAFETY: the event was created by hipEventCreate and is destroyed only here.
                let _ = unsafe { (self.0.hipEventDestroy)(self.1) };
            }
        }
        self.bind()?;
        let api = self.api();
        let make = || -> Result<Event> {
            let mut e: HipEvent = null_mut();
            // SAFETY: `e` is a valid out-pointer; the event is destroyed by `Event`.
            api.check(unsafe { (api.hipEventCreate)(&mut e) }, "hipEventCreate")?;
            Ok(Event(api, e))
        };
        let (start, stop) = (make()?, make()?);
        // SAFETY: the event and the stream are live.
        api.check(
            unsafe { (api.hipEventRecord)(start.1, self.stream) },
            "hipEventRecord",
        )?;
        work(self)?;
        // SAFETY: as above.
        api.check(
            unsafe { (api.hipEventRecord)(stop.1, self.stream) },
            "hipEventRecord",
        )?;
        // SAFETY: `stop` is live and recorded.
        api.check(
            unsafe { (api.hipEventSynchronize)(stop.1) },
            "hipEventSynchronize",
        )?;
        let mut ms = 0f32;
        // SAFETY: both events are recorded and complete; `ms` is a valid out-pointer.
        api.check(
            unsafe { (api.hipEventElapsedTime)(&mut ms, start.1, stop.1) },
            "hipEventElapsedTime",
        )?;
        Ok(f64::from(ms))
    }
}

/// The text of a static error string a library returned (`"unknown error"` for null).
///
/// # Safety
/// `s` is null or a NUL-terminated string that stays valid.
unsafe fn static_message(s: *const c_char) -> String {
    if s.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-null and NUL-terminated (the caller's promise).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn arch_parsing() {
        assert_eq!(parse_arch("gfx90a").unwrap(), "gfx90a");
        assert_eq!(
            parse_arch("gfx90a:sramecc+:xnack-\0\0").unwrap(),
            "gfx90a:sramecc+:xnack-"
        );
        assert_eq!(parse_arch(" gfx1100 ").unwrap(), "gfx1100");
        assert_eq!(parse_arch("gfx942:xnack+").unwrap(), "gfx942:xnack+");
        assert_eq!(parse_arch("gfx9-4-generic").unwrap(), "gfx9-4-generic");
        for bad in [
            "",
            "gfx",
            "sm_90",
            "gfxabc",
            "gfx90a:xnack",
            "gfx90a:+",
            "gfx90a;rm -rf",
            "gfx90a:sramecc+:xnack-:",
            "GFX90A",
        ] {
            let e = parse_arch(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn options() {
        let o = compile_options("gfx90a:sramecc+:xnack-").unwrap();
        assert_eq!(o[0], "--offload-arch=gfx90a:sramecc+:xnack-");
        assert!(o.contains(&format!("-DPCCL_UNROLL={UNROLL}")));
        assert!(o.contains(&"-ffp-contract=off".to_string()));
        assert!(compile_options("sm_90").is_err());
    }

    #[test]
    fn sources_are_hip_ready() {
        let s = hip_source("reduce.cu", REDUCE_SOURCE);
        assert!(s.starts_with(HIP_PRELUDE));
        assert!(s.contains("#line 1 \"reduce.cu\"\n// PCCL device reductions"));
        // The PTX conversions have a __HIP__ alternative.
        let hip_branch = REDUCE_SOURCE.find("#if defined(__HIP__)").unwrap();
        let first_asm = REDUCE_SOURCE.find("asm(").unwrap();
        assert!(hip_branch < first_asm);
        assert!(!TRANSPOSE_SOURCE.contains("asm("));
        assert!(REDUCE_SOURCE.contains("pccl_reduce_##NAME##_##OPNAME"));
        for d in ["f16", "bf16", "f32", "f64"] {
            assert!(
                REDUCE_SOURCE.contains(&format!("void pccl_divide_{d}(")),
                "{d}"
            );
        }
        assert!(TRANSPOSE_SOURCE.contains("pccl_transpose_copy_##NAME"));
        assert!(TRANSPOSE_SOURCE.contains("pccl_transpose_tile_##NAME"));
    }

    #[test]
    fn arch_from_property_bytes() {
        let mut props = vec![0u8; 1500];
        props[..19].copy_from_slice(b"AMD Instinct MI250X");
        props[1100..1122].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(
            find_arch_in_properties(&props).unwrap(),
            "gfx90a:sramecc+:xnack-"
        );
        let mut plain = vec![0u8; 600];
        plain[300..307].copy_from_slice(b"gfx1100");
        assert_eq!(find_arch_in_properties(&plain).unwrap(), "gfx1100");
        // Not at the start of a string, or not an architecture: ignored.
        let mut noise = vec![0u8; 64];
        noise[..9].copy_from_slice(b"xxgfx90a\0");
        noise[20..25].copy_from_slice(b"gfxzz");
        assert_eq!(find_arch_in_properties(&noise), None);
        let mut tail = vec![0u8; 16];
        tail[10..16].copy_from_slice(b"gfx942");
        assert_eq!(find_arch_in_properties(&tail).unwrap(), "gfx942");
    }

    #[test]
    fn rccl_enums() {
        let dt: Vec<_> = DType::ALL.iter().map(|&d| rccl_dtype(d)).collect();
        // I8 U8 I32 U32 I64 U64 F16 BF16 F32 F64
        assert_eq!(dt, [0, 1, 2, 3, 4, 5, 6, 9, 7, 8]);
        let ops: Vec<_> = ReduceOp::ALL.iter().map(|&o| rccl_op(o)).collect();
        // Sum Prod Min Max Avg
        assert_eq!(ops, [0, 1, 3, 2, 4]);
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
    }

    #[test]
    fn candidates() {
        let c = library_candidates(Some(OsStr::new("/x/libamdhip64.so")), &HIP_LIBRARY_NAMES);
        assert_eq!(c[0], OsString::from("/x/libamdhip64.so"));
        assert_eq!(c.len(), 4);
        assert_eq!(
            library_candidates(Some(OsStr::new("")), &RCCL_LIBRARY_NAMES),
            ["librccl.so", "librccl.so.1"]
        );
        assert_eq!(library_candidates(None, &HIPRTC_LIBRARY_NAMES).len(), 3);
    }

    #[test]
    fn reduce_validation() {
        let f32s = |n: usize| n * 4;
        // Fine: three disjoint aligned buffers, in place too.
        let ok = plan_reduce(
            ReduceOp::Sum,
            DType::F32,
            100,
            (0x10000, f32s(100)),
            (0x20000, f32s(100)),
            (0x30000, f32s(128)),
        )
        .unwrap()
        .unwrap();
        assert_eq!((ok.n, ok.head), (100, 0));
        let in_place = plan_reduce(
            ReduceOp::Max,
            DType::F32,
            100,
            (0x10000, 400),
            (0x10000, 400),
            (0x20000, 400),
        )
        .unwrap();
        assert!(in_place.is_some());
        // Nothing to do.
        assert!(
            plan_reduce(ReduceOp::Sum, DType::I8, 0, (0, 0), (0, 0), (0, 0))
                .unwrap()
                .is_none()
        );
        // Short buffer.
        let e = plan_reduce(
            ReduceOp::Sum,
            DType::F32,
            100,
            (0x10000, 400),
            (0x20000, 396),
            (0x30000, 400),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("first input buffer holds 396"), "{e}");
        // Overflowing count.
        let e = plan_reduce(
            ReduceOp::Sum,
            DType::F64,
            usize::MAX / 4,
            (0, usize::MAX),
            (0, usize::MAX),
            (0, usize::MAX),
        )
        .unwrap_err();
        assert!(e.message().contains("overflow"), "{e}");
        // Misaligned.
        let e = plan_reduce(
            ReduceOp::Sum,
            DType::F32,
            4,
            (0x10002, 16),
            (0x20000, 16),
            (0x30000, 16),
        )
        .unwrap_err();
        assert!(e.message().contains("destination buffer at 0x10002"), "{e}");
        // Partial overlap.
        let e = plan_reduce(
            ReduceOp::Sum,
            DType::F32,
            100,
            (0x10000, 400),
            (0x10010, 400),
            (0x30000, 400),
        )
        .unwrap_err();
        assert!(e.message().contains("partly overlaps"), "{e}");
        // Avg on integers.
        assert!(plan_reduce(
            ReduceOp::Avg,
            DType::I32,
            1,
            (0x10000, 4),
            (0x20000, 4),
            (0x30000, 4)
        )
        .is_err());
        // Copy checks.
        assert!(check_same_len("upload", 8, 8).is_ok());
        assert!(check_same_len("upload", 8, 12).is_err());
        assert!(check_whole_elements(6, DType::I32).is_err());
        assert!(check_whole_elements(8, DType::I32).is_ok());
    }

    #[test]
    fn transpose_validation() {
        let e = plan_transpose_spans((0x1000, 64), (0x9000, 64), usize::MAX / 2, 4, 2, 512)
            .unwrap_err();
        assert!(e.message().contains("overflows"), "{e}");
        let e = plan_transpose_spans((0x1000, 255), (0x9000, 256), 4, 4, 16, 512).unwrap_err();
        assert!(e.message().contains("needs 256 bytes"), "{e}");
        let e = plan_transpose_spans((0x1000, 256), (0x10f0, 256), 4, 4, 16, 512).unwrap_err();
        assert!(e.message().contains("overlap"), "{e}");
        assert!(plan_transpose_spans((0, 0), (0, 0), 0, 7, 16, 512)
            .unwrap()
            .is_none());
        let (total, plan) = plan_transpose_spans((0x1000, 4096), (0x9000, 4096), 2, 8, 256, 512)
            .unwrap()
            .unwrap();
        assert_eq!(total, 4096);
        assert_eq!(plan.kernel().unwrap(), "pccl_transpose_copy_16");
        // Misaligned addresses fall back to narrower units, not to an error.
        let (_, plan) = plan_transpose_spans((0x1001, 4096), (0x9000, 4096), 2, 8, 256, 512)
            .unwrap()
            .unwrap();
        assert_eq!(plan.kernel().unwrap(), "pccl_transpose_copy_1");
        let (_, plan) = plan_transpose_spans((0x1004, 96), (0x9000, 96), 4, 6, 4, 256)
            .unwrap()
            .unwrap();
        assert_eq!(plan.kernel().unwrap(), "pccl_transpose_tile_4");
        let (_, plan) = plan_transpose_spans((0x1000, 64), (0x9000, 64), 1, 4, 16, 512)
            .unwrap()
            .unwrap();
        assert_eq!(plan, TransposePlan::Copy);
    }
}
