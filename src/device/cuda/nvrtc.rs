//! The CUDA toolkit at run time: probing the driver and NVRTC, and compiling the kernels
//! (`csrc/*.cu`) for a compute capability.

use super::*;

/// Source of the reduction kernels (`csrc/reduce.cu`).
pub const REDUCE_SOURCE: &str = include_str!("../../../csrc/reduce.cu");
/// Source of the block-transpose kernels (`csrc/transpose.cu`).
pub const TRANSPOSE_SOURCE: &str = include_str!("../../../csrc/transpose.cu");

/// Checks, once per process, that the NVIDIA driver library and NVRTC can be loaded and that
/// the driver initialises. Returns a [`System`](crate::ErrorKind::System) error naming what
/// is missing otherwise; no other function here touches cudarc before this succeeded.
pub fn ensure_available() -> Result<()> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the driver library under its usual names (running
            // its initialisers, nothing else) and closes it again.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "the NVIDIA driver library (libcuda.so.1 / libcuda.so) could not be loaded: \
                     no NVIDIA driver is installed here, or it is not on the loader path"
                        .to_string(),
                );
            }
            nvrtc_present()?;
            cudarc::driver::result::init().map_err(|e| {
                if e.0 == sys::CUresult::CUDA_ERROR_STUB_LIBRARY {
                    "cuInit failed: the libcuda.so found is the CUDA toolkit's stub, not the \
                     driver: take the toolkit's lib64/stubs folder off LD_LIBRARY_PATH"
                        .to_string()
                } else {
                    format!("cuInit failed: {e}")
                }
            })?;
            Ok(())
        })
        .clone()
        .map_err(|m| Error::system(format!("CUDA is not available: {m}")))
}

fn nvrtc_present() -> std::result::Result<(), String> {
    // SAFETY: as above, a dlopen attempt of libnvrtc under its usual names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(
            "NVRTC (libnvrtc.so / libnvrtc.so.12) could not be loaded: add the folder that holds \
             it (the CUDA toolkit's lib64) to LD_LIBRARY_PATH"
                .to_string(),
        )
    }
}

/// Checks that NVRTC alone can be loaded (compiling needs no GPU and no driver).
pub fn ensure_nvrtc() -> Result<()> {
    nvrtc_present().map_err(|m| Error::system(format!("CUDA is not available: {m}")))
}

/// The version of the installed driver's CUDA API, as `(major, minor)`.
pub fn driver_version() -> Result<(i32, i32)> {
    ensure_available()?;
    let mut v: c_int = 0;
    // SAFETY: the driver library is loaded (checked above) and `v` is a valid out-pointer.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::system(format!("cuDriverGetVersion failed: {r:?}")));
    }
    Ok((v / 1000, (v % 1000) / 10))
}

/// The version of the NVRTC library in use, as `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); both are valid out-pointers.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::system(format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// A compiled kernel module: a CUBIN for the exact architecture, or PTX for the driver to
/// finish when NVRTC does not know the device's architecture.
#[derive(Clone, Debug)]
pub enum KernelImage {
    /// Machine code for one architecture (`sm_XY`).
    Cubin(Vec<u8>),
    /// PTX text for the driver's JIT (`compute_XY`, the newest NVRTC knows below the device).
    Ptx(String),
}

impl KernelImage {
    /// Size of the image in bytes.
    pub fn len(&self) -> usize {
        match self {
            KernelImage::Cubin(b) => b.len(),
            KernelImage::Ptx(s) => s.len(),
        }
    }
    /// True when the image is empty (never, for a successful compile).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The two kernel modules compiled for one compute capability.
#[derive(Clone, Debug)]
pub struct KernelImages {
    /// `csrc/reduce.cu`
    pub reduce: KernelImage,
    /// `csrc/transpose.cu`
    pub transpose: KernelImage,
}

struct NvrtcProgram(cudarc::nvrtc::sys::nvrtcProgram);

impl Drop for NvrtcProgram {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed only here.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(self.0) };
    }
}

fn supported_archs() -> Result<Vec<i32>> {
    let mut num: c_int = 0;
    // SAFETY: NVRTC is loaded; `num` is a valid out-pointer.
    unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut num) }
        .result()
        .map_err(|e| Error::system(format!("nvrtcGetNumSupportedArchs failed: {e:?}")))?;
    let mut archs = vec![0 as c_int; num.max(0) as usize];
    // SAFETY: `archs` has room for the `num` entries NVRTC writes.
    unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| Error::system(format!("nvrtcGetSupportedArchs failed: {e:?}")))?;
    Ok(archs)
}

fn compile_one(name: &str, src: &str, arch_opt: &str, cubin: bool) -> Result<KernelImage> {
    let c_src = CString::new(src)
        .map_err(|_| Error::internal(format!("{name}: NUL byte in kernel source")))?;
    let c_name = CString::new(name).map_err(|_| Error::internal("NUL byte in kernel name"))?;
    let prog = NvrtcProgram(
        cudarc::nvrtc::result::create_program(&c_src, Some(&c_name))
            .map_err(|e| Error::system(format!("NVRTC could not create program {name}: {e:?}")))?,
    );
    let opts = [
        arch_opt.to_string(),
        format!("-DPCCL_UNROLL={UNROLL}"),
        "-std=c++17".to_string(),
    ];
    // SAFETY: `prog` is a live program; the options are plain ASCII without NUL bytes.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog.0, &opts) };
    if let Err(e) = compiled {
        // SAFETY: `prog` is live; the log is NUL-terminated by NVRTC.
        let log = unsafe { cudarc::nvrtc::result::get_program_log(prog.0) }
            .map(|l| {
                // SAFETY: NVRTC writes a NUL-terminated log into the buffer it sized.
                unsafe { CStr::from_ptr(l.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(Error::system(format!(
            "NVRTC failed to compile {name} ({arch_opt}): {e:?}\n{log}"
        )));
    }
    if cubin {
        let mut size = 0usize;
        // SAFETY: `prog` compiled successfully for an sm_ target; `size` is a valid out-pointer.
        unsafe { cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog.0, &mut size) }
            .result()
            .map_err(|e| Error::system(format!("nvrtcGetCUBINSize failed: {e:?}")))?;
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC reported.
        unsafe { cudarc::nvrtc::sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr() as *mut c_char) }
            .result()
            .map_err(|e| Error::system(format!("nvrtcGetCUBIN failed: {e:?}")))?;
        Ok(KernelImage::Cubin(buf))
    } else {
        // SAFETY: `prog` compiled successfully.
        let ptx = unsafe { cudarc::nvrtc::result::get_ptx(prog.0) }
            .map_err(|e| Error::system(format!("nvrtcGetPTX failed: {e:?}")))?;
        let bytes: Vec<u8> = ptx
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(KernelImage::Ptx(
            String::from_utf8_lossy(&bytes).into_owned(),
        ))
    }
}

/// Compiles both kernel modules with NVRTC for compute capability `(major, minor)`. Needs only
/// libnvrtc, no GPU or driver (the tests use this to check the sources on any machine).
pub fn compile_kernels(major: i32, minor: i32) -> Result<KernelImages> {
    ensure_nvrtc()?;
    let want = major * 10 + minor;
    let archs = supported_archs()?;
    let (arch_opt, cubin) = if archs.contains(&want) {
        (format!("--gpu-architecture=sm_{want}"), true)
    } else {
        let best = archs
            .iter()
            .copied()
            .filter(|&a| a <= want)
            .max()
            .ok_or_else(|| {
                Error::system(format!(
                "NVRTC supports none of the architectures up to sm_{want} (it knows {archs:?}): \
                 use an NVRTC that matches this GPU"
            ))
            })?;
        (format!("--gpu-architecture=compute_{best}"), false)
    };
    Ok(KernelImages {
        reduce: compile_one(
            "reduce.cu",
            &super::super::launch::reduce_module_source(REDUCE_SOURCE),
            &arch_opt,
            cubin,
        )?,
        transpose: compile_one("transpose.cu", TRANSPOSE_SOURCE, &arch_opt, cubin)?,
    })
}
