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

mod gate;
mod gpu;
mod nvrtc;
mod pinned;
mod quant;
mod raw;

pub use gate::*;
pub use nvrtc::*;
pub use pinned::*;

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

fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::system(format!("CUDA {what} failed: {e}"))
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
