//! Memory registration cache: providers whose domains ask for `FI_MR_LOCAL` (or when
//! `PCCL_OFI_MR=1` forces it) need a registration (`fi_mr_reg`) of every buffer they send
//! from or receive into. Registering is costly on real NICs (pinning pages), so registrations
//! are kept, keyed by `(address, length)`: repeated collectives on the same buffers register
//! once. Entries are dropped only when the cache is full and no operation is in flight
//! (a registration is never closed under an operation that uses it).
//!
//! The cache assumes a registered buffer stays mapped while the transport lives (as NCCL's
//! user-buffer registration does): memory freed and mapped again at the same address must
//! not be handed to the transport without a new transport, on providers whose registrations
//! pin pages (verbs, cxi). tcp and shm only record the range.

use super::sys::{self, FidMr, RawEp};
use crate::error::Result;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Registrations kept before unused ones are dropped.
const CAPACITY: usize = 1024;

struct Entry {
    mr: *mut FidMr,
    desc: *mut c_void,
}

/// The cache of one endpoint (used under the endpoint's lock).
pub struct MrCache {
    /// Whether buffers are registered at all.
    pub enabled: bool,
    map: HashMap<(usize, usize), Entry>,
    /// Registrations made (`fi_mr_reg` calls that succeeded), for tests and diagnostics.
    pub made: Arc<AtomicU64>,
}

impl MrCache {
    /// A cache that registers only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        MrCache {
            enabled,
            map: HashMap::new(),
            made: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The descriptor to pass with an operation on `len` bytes at `ptr` (null when the
    /// provider needs none), registering the range on first use. `idle`: no operation is in
    /// flight, so unused entries may be closed when the cache is full.
    pub fn desc(
        &mut self,
        raw: &mut RawEp,
        ptr: usize,
        len: usize,
        idle: bool,
    ) -> Result<*mut c_void> {
        if !self.enabled || len == 0 {
            return Ok(std::ptr::null_mut());
        }
        if let Some(e) = self.map.get(&(ptr, len)) {
            return Ok(e.desc);
        }
        if idle && self.map.len() >= CAPACITY {
            self.clear();
        }
        let mut mr = std::ptr::null_mut();
        let mut desc = std::ptr::null_mut();
        // Keys must be unique in the domain where the provider does not choose them.
        let key = self.made.load(Ordering::Relaxed) + 1;
        // SAFETY: `raw` is an open endpoint (the caller holds its lock); libfabric records the
        // range [ptr, ptr+len), which the caller's operation will use, and writes `mr`/`desc`.
        let ret = unsafe {
            sys::pccl_ofi_mr_reg(raw, ptr as *const c_void, len, key, &mut mr, &mut desc)
        };
        sys::check("fi_mr_reg (memory registration)", i64::from(ret))?;
        self.made.fetch_add(1, Ordering::Relaxed);
        self.map.insert((ptr, len), Entry { mr, desc });
        Ok(desc)
    }

    /// Closes every registration (no operation may be in flight).
    pub fn clear(&mut self) {
        for (_, e) in self.map.drain() {
            // SAFETY: `e.mr` came from fi_mr_reg and no operation uses it any more.
            unsafe { sys::pccl_ofi_mr_close(e.mr) };
        }
    }
}
