//! [`HipDevice`]: one AMD GPU with a stream of its own.

use super::*;
pub struct HipDevice {
    /// One AMD GPU with a stream of its own, on which every operation of this handle is ordered.
    pub(super) shared: Arc<DeviceShared>,
    pub(super) stream: HipStream,
    pub(super) shape: LaunchShape,
    /// Whether `stream` belongs to the caller ([`HipDevice::with_stream`]): not destroyed.
    pub(super) borrowed: bool,
}

// SAFETY: the stream handle is owned by this value and HIP streams may be used from any
// thread; the shared part is immutable.
unsafe impl Send for HipDevice {}
// SAFETY: every method through `&self` only enqueues on the stream, which the HIP runtime
// serialises internally.
unsafe impl Sync for HipDevice {}

impl Drop for HipDevice {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
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
            borrowed: false,
        })
    }

    /// A handle of device `ordinal` whose operations are ordered on a caller's `stream`
    /// (not destroyed when the handle drops).
    ///
    /// # Safety
    /// `stream` must be a valid HIP stream of device `ordinal` that outlives the handle.
    pub unsafe fn with_stream(ordinal: usize, stream: *mut c_void) -> Result<HipDevice> {
        let shared = shared_for(ordinal)?;
        Ok(HipDevice {
            shared,
            stream,
            shape: LaunchShape::default(),
            borrowed: true,
        })
    }

    pub(super) fn api(&self) -> &'static HipApi {
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
    pub(super) unsafe fn launch(
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
    pub(super) unsafe fn launch_transpose(
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
