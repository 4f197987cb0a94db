//! The device interface the executors and the intra-node level are written against: one
//! [`Device`] trait implemented by the CUDA ([`super::cuda::CudaDevice`]) and HIP
//! ([`super::hip::HipDevice`]) back ends, and [`DevSpan`], a device buffer (address, length,
//! device) checked once when made, in place of bare addresses.

use super::nccl_abi::NcclApi;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::quant::Quant;
use std::ffi::c_void;

/// What [`Device::dequantize_batch`] does with the records it decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// Each record into its own block of the destination, as its element type.
    Store,
    /// Every record added to the float32 sums of the destination in record order; the first
    /// one added to what the sums hold when `add_first`, else stored (a sum's first term).
    Sum {
        /// Whether the destination already holds sums the first record adds to.
        add_first: bool,
    },
}

/// A range of device memory: address, length in bytes, and the ordinal of its device.
/// Made through [`DevSpan::new`] (which checks it) or cut from one with [`DevSpan::sub`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevSpan {
    addr: u64,
    len: usize,
    device: usize,
}

impl DevSpan {
    /// A span of `len` bytes at `addr` on device `device`; an error when the address is null
    /// with a length above zero or the range wraps around the address space.
    ///
    /// # Safety
    /// The range must be device memory of `device`, valid for as long as the span (or any
    /// span cut from it) is used.
    pub unsafe fn new(addr: u64, len: usize, device: usize) -> Result<DevSpan> {
        if len > 0 && addr == 0 {
            return Err(Error::invalid(
                "a device buffer of more than zero bytes is at address 0",
            ));
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(Error::invalid(format!(
                "a device buffer of {len} bytes at {addr:#x} wraps around the address space"
            )));
        }
        Ok(DevSpan { addr, len, device })
    }

    /// The empty span of `device`.
    pub fn empty(device: usize) -> DevSpan {
        DevSpan {
            addr: 0,
            len: 0,
            device,
        }
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a span of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ordinal of the device the memory is on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The `len` bytes at byte `off` of this span; an error when they run past its end.
    pub fn sub(&self, off: usize, len: usize) -> Result<DevSpan> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(DevSpan {
                addr: if len == 0 {
                    self.addr
                } else {
                    self.addr + off as u64
                },
                len,
                device: self.device,
            }),
            _ => Err(Error::internal(format!(
                "{len} bytes at offset {off} run past a device buffer of {} bytes",
                self.len
            ))),
        }
    }
}

/// Page-locked host memory of a device back end.
pub trait PinnedHost: Send {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The first byte.
    fn as_ptr(&self) -> *const u8;
    /// The first byte, for writing.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// The bytes.
    fn as_mut_slice(&mut self) -> &mut [u8];
}

/// One GPU handle with a stream of its own: what the device executors
/// ([`crate::exec::device`]) and the NCCL-shaped intra-node level use. Every operation is
/// ordered on the handle's stream unless it names another; the `unsafe` ones take
/// [`DevSpan`]s whose device they check against the handle's.
pub trait Device: Send + Sync + Sized + 'static {
    /// A stream of the device (owned; destroyed when dropped).
    type Stream: Send;
    /// An event of the device (shared between the caller's thread and a queued collective's
    /// handle).
    type Event: Send + Sync;
    /// Page-locked host memory.
    type Pinned: PinnedHost;
    /// Owned device memory, freed when dropped.
    type Memory: Send;
    /// A stream gate: a counter in mapped page-locked host memory that streams wait on
    /// ([`Device::gate_hold`]) until the host releases their ticket ([`GateReleaser`]). It is
    /// how a collective whose middle runs on the host stays ordered on a caller's stream
    /// without blocking the caller.
    type Gate: Send;

    /// "CUDA" or "HIP", for messages.
    const VENDOR: &'static str;
    /// Whether a transport that moves device memory ([`Transport::moves_device_memory`]:
    /// thread ranks in device mode, CUDA-aware MPI) can move this vendor's: those moves are
    /// CUDA calls today, so HIP buffers always go through pinned host staging.
    ///
    /// [`Transport::moves_device_memory`]: crate::transport::Transport::moves_device_memory
    const TRANSPORT_MOVES: bool;

    /// The device's ordinal in this process.
    fn ordinal(&self) -> usize;
    /// The device's UUID: the identity to compare across processes (ordinals are not: two
    /// processes that each see their GPU as device 0 share it only when the UUIDs match).
    fn uuid(&self) -> Result<[u8; 16]>;
    /// Makes the device current on the calling thread.
    fn bind(&self) -> Result<()>;
    /// Waits until the work queued on the handle's stream has finished.
    fn synchronize(&self) -> Result<()>;
    /// The handle's stream as the vendor's raw `cudaStream_t` / `hipStream_t`.
    fn raw_stream(&self) -> *mut c_void;
    /// The vendor's NCCL-shaped collective library (NCCL or RCCL), loaded on first use.
    fn collectives() -> Result<&'static NcclApi>;
    /// A new handle of the same device with a stream of its own.
    fn open_own(&self) -> Result<Self>;

    /// A new stream gate of the device, ticket 0 released; an error where the device cannot
    /// make a stream wait on host memory (then callers block instead).
    fn new_gate(&self) -> Result<Self::Gate>;
    /// Makes the handle's stream wait (on the device) for `gate`'s next ticket, and returns
    /// that ticket. Tickets are released in the order they were taken.
    fn gate_hold(&self, gate: &mut Self::Gate) -> Result<u32>;
    /// A handle that releases `gate`'s tickets from any thread while the gate lives.
    fn gate_releaser(gate: &Self::Gate) -> GateReleaser;

    /// `bytes` bytes of zeroed device memory (at least 16, so that the span is never null).
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Memory>;
    /// The span of an allocation.
    fn span_of(&self, mem: &Self::Memory) -> DevSpan;
    /// `bytes` bytes of page-locked host memory.
    fn pinned(&self, bytes: usize) -> Result<Self::Pinned>;

    /// A new stream on the device.
    fn new_stream(&self) -> Result<Self::Stream>;
    /// Waits until the work queued on `stream` has finished.
    fn sync_stream(&self, stream: &Self::Stream) -> Result<()>;
    /// A new event.
    fn new_event(&self) -> Result<Self::Event>;
    /// Records `ev` on `on`, or on the handle's stream for `None`.
    fn record(&self, ev: &Self::Event, on: Option<&Self::Stream>) -> Result<()>;
    /// Makes `stream` wait (on the device) for `ev`.
    fn stream_wait(&self, stream: &Self::Stream, ev: &Self::Event) -> Result<()>;
    /// Makes the handle's own stream wait (on the device) for `ev`: how a caller's stream is
    /// ordered after a collective on PCCL's stream, and PCCL's stream after the caller's.
    fn wait_on(&self, ev: &Self::Event) -> Result<()>;
    /// Whether the handle's stream is capturing a graph (`cuStreamIsCapturing`,
    /// `hipStreamIsCapturing`): work whose middle runs on the host cannot be captured.
    fn is_capturing(&self) -> Result<bool>;
    /// True when the work before `ev`'s record has finished.
    fn event_done(&self, ev: &Self::Event) -> Result<bool>;
    /// Waits for `ev`.
    fn sync_event(&self, ev: &Self::Event) -> Result<()>;

    /// Copies `src` device → host into `dst` on `on` (or the handle's stream).
    ///
    /// # Safety
    /// `dst` must hold `src.len()` writable bytes until the copy has completed.
    unsafe fn copy_dtoh(&self, on: Option<&Self::Stream>, dst: *mut u8, src: DevSpan)
        -> Result<()>;
    /// Copies `dst.len()` bytes host → device from `src`.
    ///
    /// # Safety
    /// `src` must hold `dst.len()` bytes, unchanged until the copy has completed; `dst` must be
    /// used by nothing else meanwhile.
    unsafe fn copy_htod(&self, dst: DevSpan, src: *const u8) -> Result<()>;
    /// Copies `src` into the front of `dst` (device → device; equal addresses are skipped).
    ///
    /// # Safety
    /// Both spans must stay valid until the copy has completed and must not partly overlap.
    unsafe fn copy_dtod(&self, dst: DevSpan, src: DevSpan) -> Result<()>;
    /// `dst = a op b` over the elements of `dtype` the spans hold (equal lengths). For
    /// [`ReduceOp::Avg`] this sums; finish with [`Device::divide`].
    ///
    /// # Safety
    /// The spans must stay valid until the kernel has completed; `dst` equals an input or
    /// overlaps neither.
    unsafe fn reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        dst: DevSpan,
        a: DevSpan,
        b: DevSpan,
    ) -> Result<()>;
    /// Divides every element of `dtype` in `dst` by `ranks` (the division that finishes an
    /// average: floating-point types only, a no-op for integers, as on the host). The count
    /// of elements is the span's; `ranks` is always the divisor.
    ///
    /// # Safety
    /// `dst` must stay valid until the kernel has completed.
    unsafe fn divide(&self, dtype: DType, dst: DevSpan, ranks: usize) -> Result<()>;
    /// Encodes the elements of `dtype` (float32, float64, float16, bfloat16) in `src` into
    /// the record `rec` ([`crate::quant`]'s layout, exactly [`Quant::record_bytes`] bytes),
    /// bit-identical to [`crate::quant::quantize`].
    ///
    /// # Safety
    /// The spans must stay valid until the kernel has completed and must not overlap.
    unsafe fn quantize(&self, dtype: DType, q: &Quant, src: DevSpan, rec: DevSpan) -> Result<()>;
    /// Decodes the record `rec` into `dst`: as elements of `dtype` (bit-identical to
    /// [`crate::quant::dequantize`]), or with `accumulate` added to the float32 sums in `dst`
    /// (`dtype` float32).
    ///
    /// # Safety
    /// As [`Device::quantize`].
    unsafe fn dequantize(
        &self,
        dtype: DType,
        q: &Quant,
        rec: DevSpan,
        dst: DevSpan,
        accumulate: bool,
    ) -> Result<()>;
    /// Decodes `count` records of the same element count, laid end to end in `recs` (each
    /// [`Quant::record_bytes`] long; `batch` is the count and what to do with them), in one
    /// launch: with [`Batch::Store`] record `d` into
    /// block `d` of `dst` (elements of `dtype`), with [`Batch::Sum`] into the float32 sums
    /// of `dst`, in record order. Bit-identical to `count` calls of [`Device::dequantize`].
    ///
    /// # Safety
    /// As [`Device::quantize`].
    unsafe fn dequantize_batch(
        &self,
        dtype: DType,
        q: &Quant,
        recs: DevSpan,
        dst: DevSpan,
        batch: (usize, Batch),
    ) -> Result<()>;
    /// `dst = src × mul` rounded to `dtype`, `src` float32 (equal element counts).
    ///
    /// # Safety
    /// As [`Device::quantize`].
    unsafe fn convert_f32(&self, dtype: DType, src: DevSpan, dst: DevSpan, mul: f32) -> Result<()>;
    /// Transposes an `m` x `n` grid of blocks of `block` bytes: `src` holds it as `[m][n]`,
    /// `dst` receives it as `[n][m]`.
    ///
    /// # Safety
    /// Both spans must hold `m * n * block` bytes, stay valid until the work has completed,
    /// and not overlap.
    unsafe fn transpose(
        &self,
        src: DevSpan,
        dst: DevSpan,
        m: usize,
        n: usize,
        block: usize,
    ) -> Result<()>;
}

/// Releases tickets of a stream gate ([`Device::Gate`]) by writing the host side of its
/// counter: vendor-neutral, valid while the gate lives (its owner drains every ticket it
/// took before dropping it).
#[derive(Clone, Copy)]
pub struct GateReleaser {
    host: *mut u32,
}

// SAFETY: the counter is plain page-locked memory written with volatile stores by one
// releaser at a time (the owner serialises them) and read by the device.
unsafe impl Send for GateReleaser {}

impl GateReleaser {
    /// A releaser of the counter at `host`.
    ///
    /// # Safety
    /// `host` must be the 4-byte-aligned host address of a gate's counter, valid for as long
    /// as the releaser (or a copy) is used.
    pub unsafe fn new(host: *mut u32) -> GateReleaser {
        GateReleaser { host }
    }

    /// Lets the streams waiting for `ticket` (and earlier ones) go on.
    pub fn release(&self, ticket: u32) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: the gate (and its counter) outlives every releaser (see `new`).
        unsafe { self.host.write_volatile(ticket) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Checks that every span is on device `ordinal` (the handle's).
pub(crate) fn check_device(vendor: &str, ordinal: usize, spans: &[DevSpan]) -> Result<()> {
    match spans.iter().find(|s| s.device != ordinal && !s.is_empty()) {
        Some(s) => Err(Error::invalid(format!(
            "a {vendor} buffer of device {} was passed to the handle of device {ordinal}",
            s.device
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_checked_when_made_and_cut() {
        // SAFETY: the spans are never used to touch memory.
        unsafe {
            assert!(DevSpan::new(0, 8, 0).is_err());
            assert!(DevSpan::new(u64::MAX - 3, 8, 0).is_err());
            assert!(DevSpan::new(0, 0, 0).is_ok());
            let s = DevSpan::new(0x1000, 64, 1).unwrap();
            let t = s.sub(16, 48).unwrap();
            assert_eq!((t.addr(), t.len(), t.device()), (0x1010, 48, 1));
            assert!(s.sub(16, 49).is_err());
            assert!(s.sub(usize::MAX, 2).is_err());
            assert!(check_device("CUDA", 0, &[s]).is_err());
            assert!(check_device("CUDA", 1, &[s, DevSpan::empty(0)]).is_ok());
        }
    }
}
