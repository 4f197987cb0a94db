//! Page-locked host memory of a device context ([`PinnedBuffer`]).

use super::*;

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
