//! [`CudaDevice`] as a [`Device`]: cudarc streams, events, page-locked memory and the NVRTC
//! kernels on [`DevSpan`]s.

use super::{CudaDevice, PinnedBuffer, StreamGate};
use crate::device::api::{check_device, Batch, DevSpan, Device, GateReleaser, PinnedHost};
use crate::device::nccl_abi::{self, NcclApi};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::quant::Quant;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};
use std::ffi::c_void;
use std::sync::Arc;

fn cuda_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::system(format!("CUDA {what} failed: {e}"))
}

impl PinnedHost for PinnedBuffer {
    fn len(&self) -> usize {
        PinnedBuffer::len(self)
    }
    fn as_ptr(&self) -> *const u8 {
        PinnedBuffer::as_ptr(self)
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        PinnedBuffer::as_mut_ptr(self)
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        PinnedBuffer::as_mut_slice(self)
    }
}

impl CudaDevice {
    fn check_spans(&self, spans: &[DevSpan]) -> Result<()> {
        check_device("CUDA", self.ordinal(), spans)
    }
}

impl Device for CudaDevice {
    type Stream = Arc<CudaStream>;
    type Event = CudaEvent;
    type Pinned = PinnedBuffer;
    type Memory = CudaSlice<u8>;
    type Gate = StreamGate;
    const VENDOR: &'static str = "CUDA";
    const TRANSPORT_MOVES: bool = true;

    fn ordinal(&self) -> usize {
        CudaDevice::ordinal(self)
    }

    fn uuid(&self) -> Result<[u8; 16]> {
        let u = self.context().uuid().map_err(cuda_err("cuDeviceGetUuid"))?;
        Ok(u.bytes.map(|b| b as u8))
    }

    fn bind(&self) -> Result<()> {
        CudaDevice::bind(self)
    }

    fn synchronize(&self) -> Result<()> {
        CudaDevice::synchronize(self)
    }

    fn raw_stream(&self) -> *mut c_void {
        self.stream().cu_stream() as *mut c_void
    }

    fn collectives() -> Result<&'static NcclApi> {
        nccl_abi::nccl()
    }

    fn open_own(&self) -> Result<CudaDevice> {
        CudaDevice::open(self.ordinal())
    }

    fn new_gate(&self) -> Result<StreamGate> {
        StreamGate::new(self)
    }

    fn gate_hold(&self, gate: &mut StreamGate) -> Result<u32> {
        gate.hold(self.stream())
    }

    fn gate_releaser(gate: &StreamGate) -> GateReleaser {
        gate.releaser()
    }

    fn alloc_zeroed(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        CudaDevice::alloc_zeroed(self, bytes.max(16))
    }

    fn span_of(&self, mem: &CudaSlice<u8>) -> DevSpan {
        let (ptr, _sync) = mem.device_ptr(self.stream());
        // SAFETY: the slice owns `len` bytes at `ptr` on this device; the span is used
        // while the slice lives.
        unsafe { DevSpan::new(ptr, mem.len(), self.ordinal()) }
            .unwrap_or_else(|_| DevSpan::empty(self.ordinal()))
    }

    fn pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        PinnedBuffer::new(self, bytes)
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>> {
        CudaDevice::new_stream(self)
    }

    fn sync_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.synchronize().map_err(cuda_err("stream synchronize"))
    }

    fn new_event(&self) -> Result<CudaEvent> {
        CudaDevice::new_event(self)
    }

    fn record(&self, ev: &CudaEvent, on: Option<&Arc<CudaStream>>) -> Result<()> {
        ev.record(on.unwrap_or(self.stream()))
            .map_err(cuda_err("event record"))
    }

    fn stream_wait(&self, stream: &Arc<CudaStream>, ev: &CudaEvent) -> Result<()> {
        stream.wait(ev).map_err(cuda_err("stream wait"))
    }

    fn wait_on(&self, ev: &CudaEvent) -> Result<()> {
        self.stream().wait(ev).map_err(cuda_err("stream wait"))
    }

    fn is_capturing(&self) -> Result<bool> {
        let status = self
            .stream()
            .capture_status()
            .map_err(cuda_err("stream capture status"))?;
        Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn event_done(&self, ev: &CudaEvent) -> Result<bool> {
        ev.try_is_complete().map_err(cuda_err("event query"))
    }

    fn sync_event(&self, ev: &CudaEvent) -> Result<()> {
        ev.synchronize().map_err(cuda_err("event synchronize"))
    }

    unsafe fn copy_dtoh(
        &self,
        on: Option<&Arc<CudaStream>>,
        dst: *mut u8,
        src: DevSpan,
    ) -> Result<()> {
        self.check_spans(&[src])?;
        self.copy_dtoh_raw(on.unwrap_or(self.stream()), dst, src.addr(), src.len())
    }

    unsafe fn copy_htod(&self, dst: DevSpan, src: *const u8) -> Result<()> {
        self.check_spans(&[dst])?;
        self.copy_htod_raw(self.stream(), dst.addr(), src, dst.len())
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
        if a.len() != dst.len() || b.len() != dst.len() {
            return Err(Error::internal("reduction operands of different lengths"));
        }
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
        let need = m
            .checked_mul(n)
            .and_then(|x| x.checked_mul(block))
            .ok_or_else(|| Error::invalid("transpose size overflows"))?;
        if src.len() < need || dst.len() < need {
            return Err(Error::internal(format!(
                "transpose of {need} bytes between device buffers of {} and {} bytes",
                src.len(),
                dst.len()
            )));
        }
        self.transpose_raw(src.addr(), dst.addr(), m, n, block)
    }
}
