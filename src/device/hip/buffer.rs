//! Device memory on one HIP device.

use super::*;
/// Device memory on one HIP device, freed when dropped (see also [`HipDevice::free`]).
pub struct HipBuffer {
    pub(super) api: &'static HipApi,
    pub(super) ordinal: c_int,
    pub(super) ptr: u64,
    pub(super) len: usize,
}

// SAFETY: the buffer is device memory owned by this value; HIP allows freeing and using it
// from any thread, and access goes through `&`/`&mut` of the owner.
unsafe impl Send for HipBuffer {}
// SAFETY: shared references only hand out the address for reading.
unsafe impl Sync for HipBuffer {}

impl HipBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device address of the first byte (0 for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// The ordinal of the device the memory is on.
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }
    pub(super) fn span(&self) -> Span {
        (self.ptr, self.len)
    }
    pub(super) fn release(&mut self) -> Result<()> {
        if self.ptr == 0 {
            return Ok(());
        }
        let p = std::mem::replace(&mut self.ptr, 0);
        // SAFETY: the ordinal is the device the memory was allocated on.
        self.api.check(
            unsafe { (self.api.hipSetDevice)(self.ordinal) },
            "hipSetDevice",
        )?;
        // SAFETY: `p` came from hipMalloc and is freed once (the field is cleared first);
        // hipFree waits for work still using it.
        self.api
            .check(unsafe { (self.api.hipFree)(p as *mut c_void) }, "hipFree")
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl std::fmt::Debug for HipBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBuffer")
            .field("ordinal", &self.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}
