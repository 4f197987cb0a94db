//! C types and the dlopen'd function tables of HIP, hipRTC and RCCL.

use super::*;

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
/// `hipHostMallocPortable`: page-locked memory usable from every device.
pub const HIP_HOST_MALLOC_PORTABLE: c_uint = 0x1;
/// `hipHostMallocMapped`: page-locked memory mapped into the devices' address space.
pub const HIP_HOST_MALLOC_MAPPED: c_uint = 0x2;
/// `hipStreamWaitValueGte`: wait until `(int32_t)(*ptr & mask - value) >= 0`.
pub const HIP_STREAM_WAIT_VALUE_GTE: c_uint = 0x0;
/// `hipErrorNotReady`: an event or stream query found work still running.
pub const HIP_ERROR_NOT_READY: HipError = 600;
/// `HIPRTC_SUCCESS`.
pub const HIPRTC_SUCCESS: HiprtcResult = 0;
/// `hiprtcProgram` (opaque).
pub type HiprtcProgram = *mut c_void;
// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

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
    /// `hipEventQuery(hipEvent_t)`: `hipSuccess` when done, `hipErrorNotReady` when not.
    pub hipEventQuery: unsafe extern "C" fn(HipEvent) -> HipError,
    /// `hipStreamWaitEvent(hipStream_t, hipEvent_t, unsigned flags)`
    pub hipStreamWaitEvent: unsafe extern "C" fn(HipStream, HipEvent, c_uint) -> HipError,
    /// `hipHostMalloc(void**, size_t, unsigned flags)`: page-locked host memory.
    pub hipHostMalloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    /// `hipHostFree(void*)`
    pub hipHostFree: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `hipDeviceGetUuid(hipUUID*, hipDevice_t)` (ROCm 5.2 and newer), where present.
    pub hipDeviceGetUuid: Option<unsafe extern "C" fn(*mut [u8; 16], HipDeviceId) -> HipError>,
    /// `hipStreamGetDevice(hipStream_t, hipDevice_t*)` (ROCm 5.x and newer), where present.
    pub hipStreamGetDevice: Option<unsafe extern "C" fn(HipStream, *mut HipDeviceId) -> HipError>,
    /// `hipStreamWaitValue32(hipStream_t, void* ptr, uint32_t value, unsigned flags,
    /// uint32_t mask)`, where present (the stream gate).
    pub hipStreamWaitValue32:
        Option<unsafe extern "C" fn(HipStream, *mut c_void, u32, c_uint, u32) -> HipError>,
    /// `hipStreamIsCapturing(hipStream_t, hipStreamCaptureStatus*)`, where present.
    pub hipStreamIsCapturing: Option<unsafe extern "C" fn(HipStream, *mut c_int) -> HipError>,
    /// `hipHostGetDevicePointer(void** devPtr, void* hostPtr, unsigned flags)`, where present.
    pub hipHostGetDevicePointer:
        Option<unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError>,
    lib: Library,
}

impl HipApi {
    fn load() -> std::result::Result<HipApi, String> {
        let (lib, path) = open_library(&HIP_SPEC)?;
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
            hipEventQuery: sym!(hipEventQuery),
            hipStreamWaitEvent: sym!(hipStreamWaitEvent),
            hipHostMalloc: sym!(hipHostMalloc),
            hipHostFree: sym!(hipHostFree),
            // SAFETY: as for `sym!` (`hipUUID` is 16 bytes).
            hipDeviceGetUuid: unsafe { optional_symbol(&lib, "hipDeviceGetUuid") },
            // SAFETY: as for `sym!`.
            hipStreamGetDevice: unsafe { optional_symbol(&lib, "hipStreamGetDevice") },
            // SAFETY: as for `sym!`.
            hipStreamWaitValue32: unsafe { optional_symbol(&lib, "hipStreamWaitValue32") },
            // SAFETY: as for `sym!`.
            hipHostGetDevicePointer: unsafe { optional_symbol(&lib, "hipHostGetDevicePointer") },
            // SAFETY: as for `sym!` (`hipStreamCaptureStatus` is a C enum, an int).
            hipStreamIsCapturing: unsafe { optional_symbol(&lib, "hipStreamIsCapturing") },
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
        match open_library(&HIPRTC_SPEC) {
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

/// The text of a static error string a library returned (`"unknown error"` for null).
///
/// # Safety
/// `s` is null or a NUL-terminated string that stays valid.
pub(super) unsafe fn static_message(s: *const c_char) -> String {
    if s.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-null and NUL-terminated (the caller's promise).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}
