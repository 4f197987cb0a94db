//! Raw, stream-ordered operations of [`CudaDevice`] on device addresses.

use super::*;

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
