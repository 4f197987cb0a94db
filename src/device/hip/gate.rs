//! The HIP stream gate ([`HipGate`]): the HIP side of [`Device::Gate`](crate::device::api::Device::Gate).

use super::*;
use crate::device::api::GateReleaser;

/// A counter in mapped page-locked host memory (`hipHostMalloc(Mapped | Portable)`) that
/// streams wait on with `hipStreamWaitValue32(GTE)`; released from the host by a
/// [`GateReleaser`]. The comparison is wrap-safe, as CUDA's `CU_STREAM_WAIT_VALUE_GEQ`.
pub struct HipGate {
    api: &'static HipApi,
    host: *mut u32,
    dev: *mut c_void,
    next: u32,
}

// SAFETY: the counter is plain page-locked memory written with volatile stores by one
// releaser at a time (the owner serialises them) and read by the GPU.
unsafe impl Send for HipGate {}

impl HipGate {
    /// A gate of `dev`'s device, starting at ticket 0 released; an error when the runtime
    /// lacks `hipStreamWaitValue32` or `hipHostGetDevicePointer`.
    pub fn new(dev: &HipDevice) -> Result<HipGate> {
        let api = dev.api();
        let (Some(_), Some(get_dptr)) = (api.hipStreamWaitValue32, api.hipHostGetDevicePointer)
        else {
            return Err(Error::system(format!(
                "{} has no hipStreamWaitValue32 / hipHostGetDevicePointer (stream memory \
                 operations): device collectives block the caller",
                api.path
            )));
        };
        dev.bind()?;
        let mut host: *mut c_void = null_mut();
        // SAFETY: `host` is a valid out-pointer; 64 bytes freed in Drop.
        api.check(
            unsafe {
                (api.hipHostMalloc)(
                    &mut host,
                    64,
                    HIP_HOST_MALLOC_MAPPED | HIP_HOST_MALLOC_PORTABLE,
                )
            },
            "hipHostMalloc of the stream gate",
        )?;
        // SAFETY: `host` holds at least 4 bytes, 4-aligned.
        unsafe { (host as *mut u32).write_volatile(0) };
        let mut gate = HipGate {
            api,
            host: host.cast(),
            dev: null_mut(),
            next: 0,
        };
        // SAFETY: `host` was allocated mapped just above; `gate.dev` is an out-pointer.
        api.check(
            unsafe { get_dptr(&mut gate.dev, host, 0) },
            "hipHostGetDevicePointer of the stream gate",
        )?;
        Ok(gate)
    }

    /// Makes `stream` wait (on the device) for the next ticket, and returns it.
    ///
    /// # Safety
    /// `stream` must be a valid HIP stream of the gate's device.
    pub unsafe fn hold(&mut self, stream: HipStream) -> Result<u32> {
        let wait = self
            .api
            .hipStreamWaitValue32
            .ok_or_else(|| Error::internal("hipStreamWaitValue32 missing"))?;
        let ticket = self.next.wrapping_add(1);
        // SAFETY: `self.dev` is the device address of the live mapped counter; the stream is
        // valid (caller's promise).
        self.api.check(
            unsafe {
                wait(
                    stream,
                    self.dev,
                    ticket,
                    HIP_STREAM_WAIT_VALUE_GTE,
                    u32::MAX,
                )
            },
            "hipStreamWaitValue32 (stream memory operations unsupported?)",
        )?;
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

impl Drop for HipGate {
    fn drop(&mut self) {
        // SAFETY: allocated by hipHostMalloc in `new`, freed once; streams waiting on it were
        // released first (the owner drains its queue before dropping).
        let _ = unsafe { (self.api.hipHostFree)(self.host.cast()) };
    }
}
