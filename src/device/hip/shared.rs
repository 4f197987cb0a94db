//! Per-device state shared by every handle: properties and loaded kernels.

use super::*;

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
pub(super) struct KernelFn(pub(super) HipFunction);
// SAFETY: a hipFunction_t is an immutable handle into a module that is never unloaded; the
// runtime allows launching it from any thread.
unsafe impl Send for KernelFn {}
// SAFETY: as above; it is only read.
unsafe impl Sync for KernelFn {}

/// A device's properties and loaded kernels, shared by every [`HipDevice`] opened on it.
pub(super) struct DeviceShared {
    pub(super) api: &'static HipApi,
    pub(super) ordinal: c_int,
    pub(super) name: String,
    pub(super) arch: String,
    pub(super) compute_units: u32,
    pub(super) code_bytes: usize,
    pub(super) functions: HashMap<String, KernelFn>,
}

impl DeviceShared {
    pub(super) fn function(&self, name: &str) -> Result<HipFunction> {
        self.functions.get(name).map(|f| f.0).ok_or_else(|| {
            Error::internal(format!("kernel {name} missing from the compiled module"))
        })
    }
}

pub(super) fn attribute(
    api: &HipApi,
    attr: HipDeviceAttribute,
    ordinal: c_int,
    what: &str,
) -> Result<i32> {
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
pub(super) const PROPS_BUFFER_BYTES: usize = 64 << 10;

pub(super) fn device_arch(api: &HipApi, ordinal: c_int) -> Result<String> {
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

pub(super) fn device_name(api: &HipApi, ordinal: c_int) -> Result<String> {
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

pub(super) fn load_module(api: &HipApi, image: &[u8], what: &str) -> Result<HipModule> {
    let mut module: HipModule = null_mut();
    // SAFETY: `image` is a complete code object from hipRTC, alive for the call (the runtime
    // copies it); `module` is a valid out-pointer. Modules are never unloaded.
    api.check(
        unsafe { (api.hipModuleLoadData)(&mut module, image.as_ptr().cast()) },
        &format!("hipModuleLoadData ({what})"),
    )?;
    Ok(module)
}

pub(super) fn shared_for(ordinal: usize) -> Result<Arc<DeviceShared>> {
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
