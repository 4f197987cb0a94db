//! [`HipDevice`] as a [`Device`]: streams, events and page-locked memory of HIP, and the
//! kernels on [`DevSpan`]s.

use super::*;
use crate::device::api::{check_device, Batch, DevSpan, Device, GateReleaser, PinnedHost};
use crate::device::nccl_abi::{self, NcclApi};
use crate::quant::Quant;

impl HipDevice {
    /// The ordinal of the device a caller's stream belongs to (`hipStreamGetDevice`).
    ///
    /// # Safety
    /// `stream` must be a valid HIP stream (not the null stream: its device is the current one).
    pub unsafe fn ordinal_of_stream(stream: *mut c_void) -> Result<usize> {
        let api = hip_api()?;
        let f = api.hipStreamGetDevice.ok_or_else(|| {
            Error::system(format!(
                "{} has no hipStreamGetDevice (a newer ROCm is needed to run collectives on a \
                 caller's stream)",
                api.path
            ))
        })?;
        let mut dev: HipDeviceId = 0;
        // SAFETY: `dev` is a valid out-pointer; the stream is valid (caller's promise).
        api.check(unsafe { f(stream, &mut dev) }, "hipStreamGetDevice")?;
        usize::try_from(dev).map_err(|_| Error::system(format!("hipStreamGetDevice gave {dev}")))
    }

    /// Waits until the work queued on a caller's stream has finished.
    ///
    /// # Safety
    /// `stream` must be a valid HIP stream.
    pub unsafe fn sync_raw_stream(stream: *mut c_void) -> Result<()> {
        let api = hip_api()?;
        // SAFETY: the stream is valid (caller's promise).
        api.check(
            unsafe { (api.hipStreamSynchronize)(stream) },
            "hipStreamSynchronize",
        )
    }
}

/// A HIP stream created by [`Device::new_stream`], destroyed when dropped.
pub struct HipOwnedStream {
    api: &'static HipApi,
    raw: HipStream,
}

// SAFETY: HIP streams may be used and destroyed from any thread.
unsafe impl Send for HipOwnedStream {}

impl Drop for HipOwnedStream {
    fn drop(&mut self) {
        // SAFETY: the stream was created by hipStreamCreate and is destroyed only here.
        let _ = unsafe { (self.api.hipStreamDestroy)(self.raw) };
    }
}

/// A HIP event, destroyed when dropped.
pub struct HipOwnedEvent {
    api: &'static HipApi,
    raw: HipEvent,
}

// SAFETY: HIP events may be used and destroyed from any thread.
unsafe impl Send for HipOwnedEvent {}
// SAFETY: HIP's event calls (record, query, wait) are thread-safe on a shared event.
unsafe impl Sync for HipOwnedEvent {}

impl Drop for HipOwnedEvent {
    fn drop(&mut self) {
        // SAFETY: the event was created by hipEventCreate and is destroyed only here.
        let _ = unsafe { (self.api.hipEventDestroy)(self.raw) };
    }
}

/// Page-locked host memory from `hipHostMalloc`, freed when dropped.
pub struct HipPinned {
    api: &'static HipApi,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is owned by this value; access goes through `&`/`&mut` of the owner.
unsafe impl Send for HipPinned {}

impl Drop for HipPinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from hipHostMalloc and is freed once.
        let _ = unsafe { (self.api.hipHostFree)(self.ptr.cast()) };
    }
}

impl PinnedHost for HipPinned {
    fn len(&self) -> usize {
        self.len
    }
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` addresses `len` bytes owned by `self`, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl HipDevice {
    fn stream_of(&self, on: Option<&HipOwnedStream>) -> HipStream {
        on.map_or(self.stream, |s| s.raw)
    }

    fn check_spans(&self, spans: &[DevSpan]) -> Result<()> {
        check_device("HIP", self.ordinal(), spans)
    }
}

impl Device for HipDevice {
    type Stream = HipOwnedStream;
    type Event = HipOwnedEvent;
    type Pinned = HipPinned;
    type Memory = HipBuffer;
    type Gate = HipGate;
    const VENDOR: &'static str = "HIP";
    const TRANSPORT_MOVES: bool = false;

    fn ordinal(&self) -> usize {
        HipDevice::ordinal(self)
    }

    fn uuid(&self) -> Result<[u8; 16]> {
        let api = self.api();
        let f = api.hipDeviceGetUuid.ok_or_else(|| {
            Error::system(format!(
                "{} has no hipDeviceGetUuid (ROCm 5.2 or newer is needed to tell GPUs apart)",
                api.path
            ))
        })?;
        let mut dev: HipDeviceId = 0;
        // SAFETY: `dev` is a valid out-pointer; the ordinal is a valid device.
        api.check(
            unsafe { (api.hipDeviceGet)(&mut dev, self.shared.ordinal) },
            "hipDeviceGet",
        )?;
        let mut uuid = [0u8; 16];
        // SAFETY: `uuid` is a valid out-pointer to the 16 bytes of a hipUUID.
        api.check(unsafe { f(&mut uuid, dev) }, "hipDeviceGetUuid")?;
        Ok(uuid)
    }

    fn bind(&self) -> Result<()> {
        HipDevice::bind(self)
    }

    fn synchronize(&self) -> Result<()> {
        HipDevice::synchronize(self)
    }

    fn raw_stream(&self) -> *mut c_void {
        self.stream
    }

    fn collectives() -> Result<&'static NcclApi> {
        nccl_abi::rccl()
    }

    fn open_own(&self) -> Result<HipDevice> {
        HipDevice::open(self.ordinal())
    }

    fn new_gate(&self) -> Result<HipGate> {
        HipGate::new(self)
    }

    fn gate_hold(&self, gate: &mut HipGate) -> Result<u32> {
        self.bind()?;
        // SAFETY: the handle's stream is a valid stream of the gate's device (gates are kept
        // per device ordinal).
        unsafe { gate.hold(self.stream) }
    }

    fn gate_releaser(gate: &HipGate) -> GateReleaser {
        gate.releaser()
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<HipBuffer> {
        HipDevice::alloc_zeroed(self, bytes.max(16))
    }

    fn span_of(&self, mem: &HipBuffer) -> DevSpan {
        // SAFETY: the buffer owns `len` bytes at `ptr` on its device (hipMalloc never returns
        // a range that wraps); the span is used while the buffer lives.
        unsafe { DevSpan::new(mem.ptr, mem.len, mem.ordinal()) }
            .unwrap_or_else(|_| DevSpan::empty(mem.ordinal()))
    }

    fn pinned(&self, bytes: usize) -> Result<HipPinned> {
        self.bind()?;
        let api = self.api();
        let mut p: *mut c_void = null_mut();
        // SAFETY: `p` is a valid out-pointer; the memory is freed by HipPinned.
        api.check(
            unsafe { (api.hipHostMalloc)(&mut p, bytes.max(1), 0) },
            "hipHostMalloc",
        )?;
        Ok(HipPinned {
            api,
            ptr: p.cast(),
            len: bytes,
        })
    }

    fn new_stream(&self) -> Result<HipOwnedStream> {
        self.bind()?;
        let api = self.api();
        let mut raw: HipStream = null_mut();
        // SAFETY: `raw` is a valid out-pointer; the stream is destroyed by HipOwnedStream.
        api.check(
            unsafe { (api.hipStreamCreate)(&mut raw) },
            "hipStreamCreate",
        )?;
        Ok(HipOwnedStream { api, raw })
    }

    fn sync_stream(&self, stream: &HipOwnedStream) -> Result<()> {
        let api = self.api();
        // SAFETY: the stream is live (owned by `stream`).
        api.check(
            unsafe { (api.hipStreamSynchronize)(stream.raw) },
            "hipStreamSynchronize",
        )
    }

    fn new_event(&self) -> Result<HipOwnedEvent> {
        self.bind()?;
        let api = self.api();
        let mut raw: HipEvent = null_mut();
        // SAFETY: `raw` is a valid out-pointer; the event is destroyed by HipOwnedEvent.
        api.check(unsafe { (api.hipEventCreate)(&mut raw) }, "hipEventCreate")?;
        Ok(HipOwnedEvent { api, raw })
    }

    fn record(&self, ev: &HipOwnedEvent, on: Option<&HipOwnedStream>) -> Result<()> {
        let api = self.api();
        // SAFETY: the event and the stream are live.
        api.check(
            unsafe { (api.hipEventRecord)(ev.raw, self.stream_of(on)) },
            "hipEventRecord",
        )
    }

    fn stream_wait(&self, stream: &HipOwnedStream, ev: &HipOwnedEvent) -> Result<()> {
        let api = self.api();
        // SAFETY: the event and the stream are live; flags must be 0.
        api.check(
            unsafe { (api.hipStreamWaitEvent)(stream.raw, ev.raw, 0) },
            "hipStreamWaitEvent",
        )
    }

    fn wait_on(&self, ev: &HipOwnedEvent) -> Result<()> {
        let api = self.api();
        // SAFETY: the event is live and the handle's stream valid; flags must be 0.
        api.check(
            unsafe { (api.hipStreamWaitEvent)(self.stream, ev.raw, 0) },
            "hipStreamWaitEvent",
        )
    }

    fn is_capturing(&self) -> Result<bool> {
        let api = self.api();
        let Some(query) = api.hipStreamIsCapturing else {
            // A runtime without graphs captures nothing.
            return Ok(false);
        };
        let mut status: c_int = 0;
        // SAFETY: the handle's stream is valid and `status` a valid out-pointer.
        api.check(
            unsafe { query(self.stream, &mut status) },
            "hipStreamIsCapturing",
        )?;
        // hipStreamCaptureStatusNone is 0.
        Ok(status != 0)
    }

    fn event_done(&self, ev: &HipOwnedEvent) -> Result<bool> {
        let api = self.api();
        // SAFETY: the event is live.
        match unsafe { (api.hipEventQuery)(ev.raw) } {
            HIP_SUCCESS => Ok(true),
            HIP_ERROR_NOT_READY => Ok(false),
            r => api.check(r, "hipEventQuery").map(|()| false),
        }
    }

    fn sync_event(&self, ev: &HipOwnedEvent) -> Result<()> {
        let api = self.api();
        // SAFETY: the event is live.
        api.check(
            unsafe { (api.hipEventSynchronize)(ev.raw) },
            "hipEventSynchronize",
        )
    }

    unsafe fn copy_dtoh(
        &self,
        on: Option<&HipOwnedStream>,
        dst: *mut u8,
        src: DevSpan,
    ) -> Result<()> {
        self.check_spans(&[src])?;
        if src.is_empty() {
            return Ok(());
        }
        let api = self.api();
        api.check(
            (api.hipMemcpyAsync)(
                dst.cast(),
                src.addr() as *const c_void,
                src.len(),
                HIP_MEMCPY_DEVICE_TO_HOST,
                self.stream_of(on),
            ),
            "device-to-host hipMemcpyAsync",
        )
    }

    unsafe fn copy_htod(&self, dst: DevSpan, src: *const u8) -> Result<()> {
        self.check_spans(&[dst])?;
        if dst.is_empty() {
            return Ok(());
        }
        let api = self.api();
        api.check(
            (api.hipMemcpyAsync)(
                dst.addr() as *mut c_void,
                src.cast(),
                dst.len(),
                HIP_MEMCPY_HOST_TO_DEVICE,
                self.stream,
            ),
            "host-to-device hipMemcpyAsync",
        )
    }

    unsafe fn copy_dtod(&self, dst: DevSpan, src: DevSpan) -> Result<()> {
        self.check_spans(&[dst, src])?;
        if src.len() > dst.len() {
            return Err(Error::internal(format!(
                "device copy of {} bytes into {} bytes",
                src.len(),
                dst.len()
            )));
        }
        self.copy_dtod_raw(dst.addr(), src.addr(), src.len())
    }

    unsafe fn reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: DevSpan,
        a: DevSpan,
        b: DevSpan,
    ) -> Result<()> {
        self.check_spans(&[dst, a, b])?;
        launch::check_lengths(dtype, &[dst.len(), a.len(), b.len()])?;
        self.reduce_raw(op, dtype, dst.addr(), a.addr(), b.addr(), dst.len())
    }

    unsafe fn divide(&self, dtype: DType, dst: DevSpan, ranks: usize) -> Result<()> {
        self.check_spans(&[dst])?;
        self.divide_raw(dtype, dst.addr(), dst.len(), ranks)
    }

    unsafe fn quantize(&self, dtype: DType, q: &Quant, src: DevSpan, rec: DevSpan) -> Result<()> {
        self.quant_spans(dtype, q, None, src, rec)
    }

    unsafe fn dequantize(
        &self,
        dtype: DType,
        q: &Quant,
        rec: DevSpan,
        dst: DevSpan,
        accumulate: bool,
    ) -> Result<()> {
        self.quant_spans(dtype, q, Some(accumulate), dst, rec)
    }

    unsafe fn dequantize_batch(
        &self,
        dtype: DType,
        q: &Quant,
        recs: DevSpan,
        dst: DevSpan,
        (count, how): (usize, Batch),
    ) -> Result<()> {
        self.batch_spans((dtype, q), (count, how), dst, recs)
    }

    unsafe fn convert_f32(&self, dtype: DType, src: DevSpan, dst: DevSpan, mul: f32) -> Result<()> {
        self.convert_spans(dtype, src, dst, mul)
    }

    unsafe fn transpose(
        &self,
        src: DevSpan,
        dst: DevSpan,
        m: usize,
        n: usize,
        block: usize,
    ) -> Result<()> {
        self.check_spans(&[src, dst])?;
        let Some((total, plan)) = plan_transpose_spans(
            (src.addr(), src.len()),
            (dst.addr(), dst.len()),
            m,
            n,
            block,
            self.shape.threads,
        )?
        else {
            return Ok(());
        };
        self.launch_transpose(src.addr(), dst.addr(), m, n, total, plan)
    }
}
