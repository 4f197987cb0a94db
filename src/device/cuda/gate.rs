//! The stream gate: streams waiting on a host-released counter ([`StreamGate`]).

use super::*;
pub use crate::device::api::GateReleaser;

/// A counter in mapped, page-locked host memory that streams wait on: work queued after
/// [`StreamGate::hold`] on a stream runs only once the host has [`GateReleaser::release`]d that
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
        // SAFETY: `host` is the gate's counter, freed only when the gate drops (after its
        // owner drained every ticket).
        unsafe { GateReleaser::new(self.host) }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once. Streams still waiting on
        // it must have been released first (the owner drains its queue before dropping).
        let _ = unsafe { cudarc::driver::result::free_host(self.host.cast()) };
    }
}
