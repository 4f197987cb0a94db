//! NVIDIA GPU kernels: element-wise reductions and the hierarchical block transpose.
//!
//! The kernels live in `csrc/reduce.cu` and `csrc/transpose.cu`, are embedded in the library
//! and compiled at run time by NVRTC, once per device (the loaded modules are cached for the
//! life of the process). Everything goes through [`cudarc`] with dynamic loading: the crate
//! builds without CUDA, and on a machine without the NVIDIA driver or NVRTC every entry point
//! returns an [`ErrorKind::System`](crate::ErrorKind::System) error that says so (cudarc
//! itself would panic; [`CudaDevice::open`] probes for the libraries first).
//!
//! Buffers are raw bytes ([`CudaSlice<u8>`] or views of one) tagged with a [`DType`] at the
//! call, as the executor holds them. Every operation is stream-ordered on the stream the
//! [`CudaDevice`] owns; [`CudaDevice::synchronize`] waits for it, and the download helpers
//! synchronize themselves.
//!
//! Results are bit-identical to the host kernels ([`Element::reduce3`](crate::Element) and
//! [`Element::divide`](crate::Element)): integers wrap, `f32`/`f64` round to nearest, `f16`
//! and `bf16` are widened to `f32`, combined and rounded back once.

mod gpu;

use super::launch::{self, TransposePlan, UNROLL};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// Source of the reduction kernels (`csrc/reduce.cu`).
pub const REDUCE_SOURCE: &str = include_str!("../../../csrc/reduce.cu");
/// Source of the block-transpose kernels (`csrc/transpose.cu`).
pub const TRANSPOSE_SOURCE: &str = include_str!("../../../csrc/transpose.cu");

fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::system(format!("CUDA {what} failed: {e}"))
}

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
        reduce: compile_one("reduce.cu", REDUCE_SOURCE, &arch_opt, cubin)?,
        transpose: compile_one("transpose.cu", TRANSPOSE_SOURCE, &arch_opt, cubin)?,
    })
}

/// The loaded kernels of one device, looked up by name.
struct Kernels {
    functions: HashMap<String, CudaFunction>,
}

impl Kernels {
    fn get(&self, name: &str) -> Result<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| {
            Error::internal(format!("kernel {name} missing from the compiled module"))
        })
    }
}

fn load(ctx: &Arc<CudaContext>, image: KernelImage) -> Result<Arc<cudarc::driver::CudaModule>> {
    let ptx = match image {
        KernelImage::Cubin(b) => Ptx::from_binary(b),
        KernelImage::Ptx(s) => Ptx::from_src(s),
    };
    ctx.load_module(ptx)
        .map_err(cuda_err("module load (cuModuleLoadData)"))
}

/// A device's context and compiled kernels, shared by every [`CudaDevice`] opened on it.
struct DeviceShared {
    ctx: Arc<CudaContext>,
    kernels: Kernels,
    name: String,
    capability: (i32, i32),
    sms: u32,
}

fn shared_for(ordinal: usize) -> Result<Arc<DeviceShared>> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Arc<DeviceShared>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache
        .lock()
        .map_err(|_| Error::internal("CUDA module cache poisoned"))?;
    if let Some(s) = map.get(&ordinal) {
        return Ok(s.clone());
    }
    let count = CudaContext::device_count().map_err(cuda_err("cuDeviceGetCount"))?;
    if ordinal >= count.max(0) as usize {
        return Err(Error::invalid(format!(
            "CUDA device {ordinal} does not exist: this machine has {count} CUDA device(s)"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(cuda_err("context creation"))?;
    let capability = ctx
        .compute_capability()
        .map_err(cuda_err("compute capability query"))?;
    let name = ctx.name().map_err(cuda_err("device name query"))?;
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(cuda_err("multiprocessor count query"))?
        .max(1) as u32;
    let images = compile_kernels(capability.0, capability.1)?;
    let reduce = load(&ctx, images.reduce)?;
    let transpose = load(&ctx, images.transpose)?;
    let mut functions = HashMap::new();
    for name in launch::kernel_names() {
        let module = if name.starts_with("pccl_transpose") {
            &transpose
        } else {
            &reduce
        };
        let f = module
            .load_function(&name)
            .map_err(|e| Error::system(format!("CUDA kernel {name}: {e}")))?;
        functions.insert(name, f);
    }
    let shared = Arc::new(DeviceShared {
        ctx,
        kernels: Kernels { functions },
        name,
        capability,
        sms,
    });
    map.insert(ordinal, shared.clone());
    Ok(shared)
}

pub use super::launch::LaunchShape;

/// One GPU with a stream of its own, on which every operation of this handle is ordered
/// (a clone shares the stream).
#[derive(Clone)]
pub struct CudaDevice {
    shared: Arc<DeviceShared>,
    stream: Arc<CudaStream>,
    shape: LaunchShape,
}

/// A pair of timing events around work on a [`CudaDevice`]'s stream.
pub struct EventTimer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl EventTimer {
    /// Records the start event on `dev`'s stream.
    pub fn start(&self, dev: &CudaDevice) -> Result<()> {
        self.start
            .record(&dev.stream)
            .map_err(cuda_err("event record"))
    }
    /// Records the stop event on `dev`'s stream.
    pub fn stop(&self, dev: &CudaDevice) -> Result<()> {
        self.stop
            .record(&dev.stream)
            .map_err(cuda_err("event record"))
    }
    /// Waits for the stop event and returns the milliseconds between the two events.
    pub fn elapsed_ms(&self) -> Result<f64> {
        self.start
            .elapsed_ms(&self.stop)
            .map(f64::from)
            .map_err(cuda_err("event elapsed time"))
    }
}

impl CudaDevice {
    /// Number of CUDA devices, or a [`System`](crate::ErrorKind::System) error when CUDA is
    /// not available.
    pub fn count() -> Result<usize> {
        ensure_available()?;
        Ok(CudaContext::device_count()
            .map_err(cuda_err("cuDeviceGetCount"))?
            .max(0) as usize)
    }

    /// Opens device `ordinal`: probes for the driver and NVRTC, compiles the kernels the first
    /// time this device is opened in the process, and creates a stream for this handle.
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        ensure_available()?;
        let shared = shared_for(ordinal)?;
        let stream = shared
            .ctx
            .new_stream()
            .map_err(cuda_err("stream creation"))?;
        Ok(CudaDevice {
            shared,
            stream,
            shape: LaunchShape::default(),
        })
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`, ...).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.shared.capability
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.shared.sms
    }

    /// The cudarc context (shared by all handles on this device).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }

    /// The stream this handle orders its work on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The launch shape in use.
    pub fn launch_shape(&self) -> LaunchShape {
        self.shape
    }

    /// Changes the launch shape (for tuning; the default suits large buffers on recent GPUs).
    pub fn set_launch_shape(&mut self, shape: LaunchShape) -> Result<()> {
        shape.validate()?;
        self.shape = shape;
        Ok(())
    }

    /// Waits until all work queued on this handle's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("stream synchronize"))
    }

    /// Allocates `bytes` bytes of device memory, zeroed (stream-ordered).
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(cuda_err("allocation"))
    }

    /// Sets every byte of `buf` to `byte` (to poison outputs before a check, say).
    pub fn fill(&self, buf: &mut impl DevicePtrMut<u8>, byte: u8) -> Result<()> {
        let len = buf.len();
        if len == 0 {
            return Ok(());
        }
        let (p, _sync) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `p` addresses `len` bytes of device memory owned by `buf`, which stays
        // mutably borrowed until the memset is queued; the stream orders it after earlier work.
        unsafe { cudarc::driver::result::memset_d8_async(p, byte, len, self.stream.cu_stream()) }
            .map_err(cuda_err("memset"))
    }

    /// Copies host elements into a new device buffer of bytes.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<CudaSlice<u8>> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.stream
            .clone_htod(bytes)
            .map_err(cuda_err("host-to-device copy"))
    }

    /// Copies host elements into an existing device buffer, which must hold exactly as many bytes.
    pub fn upload_into<T: Element>(
        &self,
        data: &[T],
        dst: &mut impl DevicePtrMut<u8>,
    ) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if dst.len() != bytes.len() {
            return Err(Error::invalid(format!(
                "upload of {} bytes into a device buffer of {} bytes",
                bytes.len(),
                dst.len()
            )));
        }
        self.stream
            .memcpy_htod(bytes, dst)
            .map_err(cuda_err("host-to-device copy"))
    }

    /// Waits for this handle's stream, then copies a device buffer back as elements of `T`.
    pub fn download<T: Element>(&self, src: &impl DevicePtr<u8>) -> Result<Vec<T>> {
        let len = src.len();
        if len % std::mem::size_of::<T>() != 0 {
            return Err(Error::invalid(format!(
                "device buffer of {len} bytes is not a whole number of {} elements",
                T::DTYPE
            )));
        }
        let mut bytes = vec![0u8; len];
        self.stream
            .memcpy_dtoh(src, &mut bytes)
            .map_err(cuda_err("device-to-host copy"))?;
        self.synchronize()?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Device-to-device copy of all of `src` into the front of `dst` (stream-ordered).
    pub fn copy(&self, src: &impl DevicePtr<u8>, dst: &mut impl DevicePtrMut<u8>) -> Result<()> {
        if dst.len() < src.len() {
            return Err(Error::invalid(format!(
                "copy of {} bytes into a device buffer of {} bytes",
                src.len(),
                dst.len()
            )));
        }
        if src.is_empty() {
            return Ok(());
        }
        let len = src.len();
        let (s, _rs) = src.device_ptr(&self.stream);
        let (d, _rd) = dst.device_ptr_mut(&self.stream);
        // SAFETY: both pointers address at least `len` bytes owned by `src`/`dst`, which stay
        // borrowed until the copy is queued; the stream orders it after earlier work on them.
        unsafe { cudarc::driver::result::memcpy_dtod_async(d, s, len, self.stream.cu_stream()) }
            .map_err(cuda_err("device-to-device copy"))
    }

    /// Creates a pair of timing events for this device.
    pub fn timer(&self) -> Result<EventTimer> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(EventTimer {
            start: self
                .shared
                .ctx
                .new_event(flags)
                .map_err(cuda_err("event creation"))?,
            stop: self
                .shared
                .ctx
                .new_event(flags)
                .map_err(cuda_err("event creation"))?,
        })
    }

    /// Runs `work` (which queues device work on this handle's stream) between two events and
    /// returns the device time in milliseconds.
    pub fn time_ms(&self, mut work: impl FnMut(&Self) -> Result<()>) -> Result<f64> {
        let t = self.timer()?;
        t.start(self)?;
        work(self)?;
        t.stop(self)?;
        t.elapsed_ms()
    }

    /// Launch configuration for `work_items` independent pieces of work of one block each.
    fn config(&self, smem: u32, work_items: u64) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.shape.grid_blocks(work_items, self.shared.sms), 1, 1),
            block_dim: (self.shape.threads, 1, 1),
            shared_mem_bytes: smem,
        }
    }

    /// Work pieces of an element-wise kernel over `n` elements, `head` of them scalar.
    fn elementwise_work(&self, n: u64, head: u64, esize: usize) -> u64 {
        self.shape.elementwise_work(n, head, esize)
    }

    fn launch_elementwise(
        &self,
        kernel: &str,
        op: ReduceOp,
        dtype: DType,
        ptrs: [u64; 3],
        bytes: usize,
    ) -> Result<()> {
        let esize = dtype.size();
        let launch::Elementwise { n, head } = launch::check_elementwise(dtype, ptrs, bytes)?;
        let f = self.shared.kernels.get(kernel)?;
        let cfg = self.config(0, self.elementwise_work(n, head, esize));
        let mut b = self.stream.launch_builder(f);
        b.arg(&ptrs[0])
            .arg(&ptrs[1])
            .arg(&ptrs[2])
            .arg(&n)
            .arg(&head);
        // SAFETY: the kernel `pccl_reduce_<dtype>_<op>(T* dst, const T* a, const T* b, u64 n,
        // u64 head)` takes exactly these five arguments; all three pointers address `n`
        // elements of `dtype` owned by buffers the caller keeps borrowed until this returns,
        // are aligned to the element size (checked), and dst is either an input or disjoint.
        unsafe { b.launch(cfg) }.map_err(|e| {
            Error::system(format!(
                "CUDA launch of {kernel} ({op}, {dtype}) failed: {e}"
            ))
        })?;
        Ok(())
    }

    fn check_lengths(dtype: DType, lens: &[usize]) -> Result<usize> {
        launch::check_lengths(dtype, lens)
    }

    /// `dst[i] = a[i] op b[i]` over buffers of `dtype` elements of equal byte length. For
    /// [`ReduceOp::Avg`] this sums; finish with [`CudaDevice::divide`], as on the host.
    pub fn reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: &mut impl DevicePtrMut<u8>,
        a: &impl DevicePtr<u8>,
        b: &impl DevicePtr<u8>,
    ) -> Result<()> {
        dtype.check_op(op)?;
        let bytes = Self::check_lengths(dtype, &[dst.len(), a.len(), b.len()])?;
        if bytes == 0 {
            return Ok(());
        }
        let kernel = reduce_kernel(op, dtype);
        let (pa, _ra) = a.device_ptr(&self.stream);
        let (pb, _rb) = b.device_ptr(&self.stream);
        let (pd, _rd) = dst.device_ptr_mut(&self.stream);
        self.launch_elementwise(&kernel, op, dtype, [pd, pa, pb], bytes)
    }

    /// `dst[i] = dst[i] op src[i]` (in place), the device form of [`Element::reduce_into`].
    pub fn reduce_into(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: &mut impl DevicePtrMut<u8>,
        src: &impl DevicePtr<u8>,
    ) -> Result<()> {
        dtype.check_op(op)?;
        let bytes = Self::check_lengths(dtype, &[dst.len(), src.len()])?;
        if bytes == 0 {
            return Ok(());
        }
        let kernel = reduce_kernel(op, dtype);
        let (ps, _rs) = src.device_ptr(&self.stream);
        let (pd, _rd) = dst.device_ptr_mut(&self.stream);
        self.launch_elementwise(&kernel, op, dtype, [pd, pd, ps], bytes)
    }

    /// `dst[i] /= n` for floating-point `dtype` (the division that finishes an average), in
    /// the precision the host uses; a no-op for integer types, as on the host.
    pub fn divide(&self, dtype: DType, dst: &mut impl DevicePtrMut<u8>, n: usize) -> Result<()> {
        let bytes = dst.len();
        let (pd, _rd) = dst.device_ptr_mut(&self.stream);
        // SAFETY: `pd` addresses the `bytes` bytes of `dst`, mutably borrowed until this
        // returns.
        unsafe { self.divide_raw(dtype, pd, bytes, n) }
    }

    /// Transposes an `m` x `n` grid of blocks of `block_bytes` bytes: `src` holds it as
    /// `[m][n]` (block `(i, j)` at byte `(i*n + j) * block_bytes`), `dst` receives it as
    /// `[n][m]`. Only the first `m * n * block_bytes` bytes of each buffer are touched; they
    /// must not overlap.
    pub fn transpose_blocks(
        &self,
        src: &impl DevicePtr<u8>,
        dst: &mut impl DevicePtrMut<u8>,
        m: usize,
        n: usize,
        block_bytes: usize,
    ) -> Result<()> {
        let total = launch::transpose_total(src.len(), dst.len(), m, n, block_bytes)?;
        if total == 0 {
            return Ok(());
        }
        let (ps, _rs) = src.device_ptr(&self.stream);
        let (pd, _rd) = dst.device_ptr_mut(&self.stream);
        // SAFETY: both buffers hold at least `total` bytes (checked) and stay borrowed until
        // this returns.
        unsafe { self.transpose_raw(ps, pd, m, n, block_bytes) }
    }

    /// [`CudaDevice::transpose_blocks`] on raw device addresses, queued on this handle's
    /// stream.
    ///
    /// # Safety
    /// `ps` and `pd` must each address `m * n * block_bytes` bytes of device memory of this
    /// context, untouched by others until the stream has run the transpose.
    pub unsafe fn transpose_raw(
        &self,
        ps: u64,
        pd: u64,
        m: usize,
        n: usize,
        block_bytes: usize,
    ) -> Result<()> {
        let total = launch::transpose_total(usize::MAX, usize::MAX, m, n, block_bytes)?;
        if total == 0 {
            return Ok(());
        }
        let plan = launch::plan_transpose(ps, pd, m, n, block_bytes, total, self.shape.threads)?;
        let (mm, nn) = (m as u64, n as u64);
        if plan == TransposePlan::Copy {
            // The layout does not change: a plain copy.
            // SAFETY: both pointers address at least `total` bytes of the borrowed buffers,
            // which do not overlap (checked).
            return unsafe {
                cudarc::driver::result::memcpy_dtod_async(pd, ps, total, self.stream.cu_stream())
            }
            .map_err(cuda_err("device-to-device copy"));
        }
        let kernel = plan.kernel().unwrap_or_default();
        if let TransposePlan::Runs { work, k, .. } = plan {
            let f = self.shared.kernels.get(&kernel)?;
            let cfg = self.config(0, work);
            let mut b = self.stream.launch_builder(f);
            b.arg(&ps).arg(&pd).arg(&mm).arg(&nn).arg(&k);
            // SAFETY: `pccl_transpose_copy_<unit>(const U* src, U* dst, u64 M, u64 N, u64 k)`
            // takes these five arguments; both pointers are aligned to `unit` and address
            // `m*n*k` units of disjoint buffers that stay borrowed until this returns.
            unsafe { b.launch(cfg) }
                .map_err(|e| Error::system(format!("CUDA launch of {kernel} failed: {e}")))?;
        } else if let TransposePlan::Tiles {
            k,
            tm: tm32,
            tn: tn32,
            tiles,
            smem,
            ..
        } = plan
        {
            let f = self.shared.kernels.get(&kernel)?;
            let cfg = self.config(smem, tiles);
            let k32 = k as u32;
            let mut b = self.stream.launch_builder(f);
            b.arg(&ps)
                .arg(&pd)
                .arg(&mm)
                .arg(&nn)
                .arg(&k32)
                .arg(&tm32)
                .arg(&tn32);
            // SAFETY: `pccl_transpose_tile_<unit>(const U* src, U* dst, u64 M, u64 N, u32 k,
            // u32 TM, u32 TN)` takes these seven arguments and `smem` bytes of dynamic shared
            // memory (TM*(TN*k+1) units: at most 16 KiB plus one unit per row, under the
            // 48 KiB default); the pointers are aligned to `unit` and address `m*n*k` units of
            // disjoint buffers.
            unsafe { b.launch(cfg) }
                .map_err(|e| Error::system(format!("CUDA launch of {kernel} failed: {e}")))?;
        }
        Ok(())
    }

    /// The inverse of [`CudaDevice::transpose_blocks`]: `src` holds the grid as `[n][m]`,
    /// `dst` receives it as `[m][n]`.
    pub fn untranspose_blocks(
        &self,
        src: &impl DevicePtr<u8>,
        dst: &mut impl DevicePtrMut<u8>,
        m: usize,
        n: usize,
        block_bytes: usize,
    ) -> Result<()> {
        self.transpose_blocks(src, dst, n, m, block_bytes)
    }
}

use launch::reduce_kernel;

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.shared.ctx.ordinal())
            .field("name", &self.shared.name)
            .field("capability", &self.shared.capability)
            .field("shape", &self.shape)
            .finish()
    }
}

/// Page-locked (pinned) host memory of one device's context: the staging area of the
/// host-staged device collectives (`exec::device`). Copies between it and the device run
/// asynchronously at full PCIe speed.
pub struct PinnedBuffer {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes through `&`/`&mut`.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above; shared access only reads through raw pointers the owner hands out.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes (at least one) of page-locked host memory in `dev`'s context.
    pub fn new(dev: &CudaDevice, len: usize) -> Result<PinnedBuffer> {
        let ctx = dev.shared.ctx.clone();
        ctx.bind_to_thread().map_err(cuda_err("context bind"))?;
        // SAFETY: cuMemHostAlloc with a valid size; the pointer is freed once, in Drop.
        let ptr = unsafe { cudarc::driver::result::malloc_host(len.max(1), 0) }
            .map_err(cuda_err("pinned host allocation (cuMemHostAlloc)"))?;
        Ok(PinnedBuffer {
            ctx,
            ptr: ptr as *mut u8,
            len,
        })
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    /// Start of the buffer, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    /// The bytes, for writing (callers make sure no device copy uses them meanwhile).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` addresses `len` bytes owned by this value, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed only here; cuMemFreeHost waits
        // for device work that still uses it.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// A counter in mapped, page-locked host memory that streams wait on: work queued after
/// [`StreamGate::hold`] on a stream runs only once the host has [`StreamGate::release`]d that
/// ticket. This is how a collective whose middle runs on the host (the transport) stays
/// ordered on the caller's stream without blocking the caller. Tickets are released in the
/// order they were taken; the comparison is wrap-safe (`(i32)(value - ticket) >= 0`).
pub struct StreamGate {
    host: *mut u32,
    dev: u64,
    next: u32,
}

// SAFETY: the counter is plain page-locked memory written with volatile stores by one
// releaser at a time (the owner serialises them) and read by the GPU.
unsafe impl Send for StreamGate {}

impl StreamGate {
    /// A gate of `dev`'s device (its context current), starting at ticket 0 released.
    pub fn new(dev: &CudaDevice) -> Result<StreamGate> {
        dev.bind()?;
        // SAFETY: allocates 64 bytes of mapped, portable page-locked memory; freed in Drop.
        let host = unsafe {
            cudarc::driver::result::malloc_host(
                64,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }
        .map_err(cuda_err("cuMemHostAlloc of the stream gate"))? as *mut u32;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP just above; `dptr` is an out-pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast(), 0) };
        // SAFETY: `host` holds at least 4 bytes.
        unsafe { host.write_volatile(0) };
        let gate = StreamGate {
            host,
            dev: dptr,
            next: 0,
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::system(format!(
                "cuMemHostGetDevicePointer failed for the stream gate: {r:?}"
            )));
        }
        Ok(gate)
    }

    /// Makes `stream` wait (on the device) for the next ticket, and returns it.
    pub fn hold(&mut self, stream: &CudaStream) -> Result<u32> {
        let ticket = self.next.wrapping_add(1);
        // SAFETY: `self.dev` is the device address of the live mapped counter; the stream
        // belongs to the context current on this thread (the caller bound it).
        let r = unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                self.dev,
                ticket,
                sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::system(format!(
                "cuStreamWaitValue32 failed: {r:?} (stream memory operations unsupported?)"
            )));
        }
        self.next = ticket;
        Ok(ticket)
    }

    /// A handle that releases tickets of this gate from another thread.
    pub fn releaser(&self) -> GateReleaser {
        GateReleaser { host: self.host }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once. Streams still waiting on
        // it must have been released first (the owner drains its queue before dropping).
        let _ = unsafe { cudarc::driver::result::free_host(self.host.cast()) };
    }
}

/// Releases tickets of a [`StreamGate`]; valid while the gate lives.
#[derive(Clone, Copy)]
pub struct GateReleaser {
    host: *mut u32,
}

// SAFETY: see StreamGate; the owner keeps the gate alive until every releaser ran.
unsafe impl Send for GateReleaser {}

impl GateReleaser {
    /// Lets the streams waiting for `ticket` (and earlier ones) go on.
    pub fn release(&self, ticket: u32) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: the gate (and its counter) outlives every releaser (see above).
        unsafe { self.host.write_volatile(ticket) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Raw, stream-ordered operations on device addresses, for the device executor (which holds
/// buffers as addresses, as the host executor holds pointers).
impl CudaDevice {
    /// The device's ordinal (as `cuDeviceGet` numbers it).
    pub fn ordinal(&self) -> usize {
        self.shared.ctx.ordinal()
    }

    /// A handle on device `ordinal` whose operations are queued on `stream`, a stream of the
    /// device's primary context owned by the caller (a C ABI or torch caller's stream).
    ///
    /// # Safety
    /// `stream` must be a valid stream of the primary context of device `ordinal` (or one of
    /// the special handles `cudaStreamLegacy` = 1 and `cudaStreamPerThread` = 2), and must
    /// outlive the returned handle.
    pub unsafe fn with_stream(ordinal: usize, stream: *mut std::ffi::c_void) -> Result<CudaDevice> {
        ensure_available()?;
        let shared = shared_for(ordinal)?;
        let stream = shared.ctx.wrap_borrowed_stream(stream as sys::CUstream);
        Ok(CudaDevice {
            shared,
            stream,
            shape: LaunchShape::default(),
        })
    }

    /// The ordinal of the GPU that device address `ptr` belongs to, or an InvalidArgument
    /// error when `ptr` is not device memory CUDA knows (a host pointer, say).
    pub fn ordinal_of(ptr: u64) -> Result<usize> {
        ensure_available()?;
        let mut ord: c_int = -1;
        // SAFETY: the driver is loaded (checked above); `ord` is a valid out-pointer for the
        // int this attribute returns.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ord as *mut c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || ord < 0 {
            return Err(Error::invalid(format!(
                "buffer {ptr:#x} is not CUDA device memory ({r:?}); with a stream, buffers must \
                 be device memory (cudaMalloc), with a NULL stream host memory"
            )));
        }
        Ok(ord as usize)
    }

    /// Makes this device's context current on the calling thread (raw driver calls need it).
    pub fn bind(&self) -> Result<()> {
        self.shared
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("context bind"))
    }

    /// A new stream on this device (for work that should overlap this handle's stream).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.shared
            .ctx
            .new_stream()
            .map_err(cuda_err("stream creation"))
    }

    /// A new event without timing (to order streams and to let the host wait for work).
    pub fn new_event(&self) -> Result<CudaEvent> {
        self.shared
            .ctx
            .new_event(None)
            .map_err(cuda_err("event creation"))
    }

    /// Queues a copy of `len` bytes from device address `src` to host memory `dst` on `stream`.
    ///
    /// # Safety
    /// `src` must address `len` readable device bytes and `dst` `len` writable host bytes
    /// (page-locked for the copy to be asynchronous), both valid until the copy completes.
    pub unsafe fn copy_dtoh_raw(
        &self,
        stream: &CudaStream,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let d = std::slice::from_raw_parts_mut(dst, len);
        cudarc::driver::result::memcpy_dtoh_async(d, src, stream.cu_stream())
            .map_err(cuda_err("device-to-host copy"))
    }

    /// Queues a copy of `len` bytes from host memory `src` to device address `dst` on `stream`.
    ///
    /// # Safety
    /// As [`CudaDevice::copy_dtoh_raw`], the other way round.
    pub unsafe fn copy_htod_raw(
        &self,
        stream: &CudaStream,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let s = std::slice::from_raw_parts(src, len);
        cudarc::driver::result::memcpy_htod_async(dst, s, stream.cu_stream())
            .map_err(cuda_err("host-to-device copy"))
    }

    /// Queues a device-to-device copy of `len` bytes on this handle's stream.
    ///
    /// # Safety
    /// Both addresses must hold `len` valid bytes until the copy completes; they must not
    /// overlap.
    pub unsafe fn copy_dtod_raw(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        if len == 0 || dst == src {
            return Ok(());
        }
        cudarc::driver::result::memcpy_dtod_async(dst, src, len, self.stream.cu_stream())
            .map_err(cuda_err("device-to-device copy"))
    }

    /// `dst = a op b` over `bytes` bytes of `dtype` at device addresses, on this handle's
    /// stream ([`CudaDevice::reduce`] on raw addresses).
    ///
    /// # Safety
    /// The three addresses must hold `bytes` valid bytes until the kernel completes; `dst`
    /// equals an input or overlaps neither.
    pub unsafe fn reduce_raw(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: u64,
        a: u64,
        b: u64,
        bytes: usize,
    ) -> Result<()> {
        dtype.check_op(op)?;
        if bytes % dtype.size() != 0 {
            return Err(Error::invalid(format!(
                "reduction of {bytes} bytes is not a whole number of {dtype} elements"
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.launch_elementwise(&reduce_kernel(op, dtype), op, dtype, [dst, a, b], bytes)
    }

    /// `dst /= n` over `bytes` bytes of `dtype` at a device address ([`CudaDevice::divide`]
    /// on a raw address).
    ///
    /// # Safety
    /// `dst` must hold `bytes` valid bytes until the kernel completes.
    pub unsafe fn divide_raw(&self, dtype: DType, dst: u64, bytes: usize, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::invalid("divide by zero ranks"));
        }
        let bytes = Self::check_lengths(dtype, &[bytes])?;
        if !dtype.is_float() || bytes == 0 {
            return Ok(());
        }
        let esize = dtype.size();
        let launch::Elementwise { n: count, head } = launch::check_divide(dtype, dst, bytes)?;
        let kernel = launch::divide_kernel(dtype);
        let f = self.shared.kernels.get(&kernel)?;
        let cfg = self.config(0, self.elementwise_work(count, head, esize));
        let d32 = n as f32;
        let d64 = n as f64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&dst).arg(&count).arg(&head);
        if dtype == DType::F64 {
            b.arg(&d64);
        } else {
            b.arg(&d32);
        }
        // SAFETY: as in `divide`: the kernel takes these four arguments; `dst` addresses
        // `count` aligned elements the caller keeps valid.
        unsafe { b.launch(cfg) }
            .map_err(|e| Error::system(format!("CUDA launch of {kernel} failed: {e}")))?;
        Ok(())
    }
}
