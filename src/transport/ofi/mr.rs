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
//!
//! **Device memory** (`FI_HMEM`, [`Mem::Device`]) is always registered, with `fi_mr_regattr`
//! naming its iface and device ordinal (the descriptor is how the provider learns that an
//! address is device memory), and cached like host memory, keyed also by the iface.

use super::sys::{self, FidMr, RawEp};
use crate::error::Result;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A memory interface of libfabric's `FI_HMEM` (`enum fi_hmem_iface`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Iface {
    /// `FI_HMEM_SYSTEM`: host memory through the hmem path (the test hook
    /// `PCCL_OFI_HMEM_IFACE=system`: host buffers handed over as if they were device memory).
    System,
    /// `FI_HMEM_CUDA`: CUDA device memory.
    Cuda,
    /// `FI_HMEM_ROCR`: ROCm (HIP) device memory.
    Rocr,
}

impl Iface {
    /// libfabric's name of the iface.
    pub fn name(self) -> &'static str {
        match self {
            Iface::System => "FI_HMEM_SYSTEM",
            Iface::Cuda => "FI_HMEM_CUDA",
            Iface::Rocr => "FI_HMEM_ROCR",
        }
    }

    fn raw(self) -> i32 {
        sys::fi_hmem_iface(match self {
            Iface::System => 0,
            Iface::Cuda => 1,
            Iface::Rocr => 2,
        })
    }
}

/// What kind of memory an operation's buffer is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Mem {
    /// Host memory (registered only where the provider asks).
    Host,
    /// Device memory of an iface, on a device ordinal (always registered).
    Device(Iface, i32),
}

/// Registers `len` bytes at `ptr` as memory `mem` with `key`; returns the registration and its
/// descriptor, or libfabric's (negative) return code.
fn register(
    raw: &mut RawEp,
    ptr: usize,
    len: usize,
    mem: Mem,
    key: u64,
) -> std::result::Result<(*mut FidMr, *mut c_void), i32> {
    let mut mr = std::ptr::null_mut();
    let mut desc = std::ptr::null_mut();
    // SAFETY: `raw` is an open endpoint (the caller holds its lock); libfabric records the
    // range [ptr, ptr+len), which the caller's operation will use, and writes `mr`/`desc`.
    let ret = unsafe {
        match mem {
            Mem::Host => {
                sys::pccl_ofi_mr_reg(raw, ptr as *const c_void, len, key, &mut mr, &mut desc)
            }
            Mem::Device(iface, dev) => sys::pccl_ofi_mr_regattr(
                raw,
                ptr as *const c_void,
                len,
                iface.raw(),
                dev,
                key,
                &mut mr,
                &mut desc,
            ),
        }
    };
    if ret != 0 {
        return Err(ret);
    }
    Ok((mr, desc))
}

/// Whether the domain of `raw` registers memory of `iface`: a registration of a small host
/// buffer with that iface, closed at once. `Err` carries libfabric's words: -FI_ENOSYS or
/// -FI_EOPNOTSUPP where its build lacks the iface (Debian's lacks CUDA and ROCr). libfabric
/// checks that the iface is initialised before it looks at the address, so a host buffer
/// answers for every iface; whether a provider then moves real device memory is verified
/// only on a GPU node (docs/OFI.md, "Device buffers").
pub fn probe(raw: &mut RawEp, iface: Iface, key: u64) -> std::result::Result<(), String> {
    let buf = [0u64; 512];
    match register(
        raw,
        buf.as_ptr() as usize,
        std::mem::size_of_val(&buf),
        Mem::Device(iface, 0),
        key,
    ) {
        Ok((mr, _)) => {
            // SAFETY: `mr` came from the registration above and no operation uses it.
            unsafe { sys::pccl_ofi_mr_close(mr) };
            Ok(())
        }
        Err(ret) => {
            let code = i64::from(ret).abs();
            let why = if sys::fi_unsupported().contains(&code) {
                "this libfabric was built without it"
            } else {
                "the registration failed"
            };
            Err(format!(
                "{why}: fi_mr_regattr with iface {} returned {} ({ret})",
                iface.name(),
                sys::strerror(i64::from(ret))
            ))
        }
    }
}

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
    map: HashMap<(usize, usize, Mem), Entry>,
    /// Registrations made (`fi_mr_reg` calls that succeeded), for tests and diagnostics.
    pub made: Arc<AtomicU64>,
    /// Keys handed out.
    keys: u64,
}

impl MrCache {
    /// A cache that registers only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        MrCache {
            enabled,
            map: HashMap::new(),
            made: Arc::new(AtomicU64::new(0)),
            keys: 0,
        }
    }

    /// The descriptor to pass with an operation on `len` bytes at `ptr` of memory `mem`
    /// (null when the provider needs none: host memory on a provider that does not ask),
    /// registering the range on first use. `idle`: no operation is in flight, so unused
    /// entries may be closed when the cache is full.
    pub fn desc(
        &mut self,
        raw: &mut RawEp,
        ptr: usize,
        len: usize,
        mem: Mem,
        idle: bool,
    ) -> Result<*mut c_void> {
        if (mem == Mem::Host && !self.enabled) || len == 0 {
            return Ok(std::ptr::null_mut());
        }
        if let Some(e) = self.map.get(&(ptr, len, mem)) {
            return Ok(e.desc);
        }
        if idle && self.map.len() >= CAPACITY {
            self.clear();
        }
        // Keys must be unique in the domain where the provider does not choose them.
        let key = self.next_key();
        let (mr, desc) = register(raw, ptr, len, mem, key).map_err(|ret| {
            let what = match mem {
                Mem::Host => "fi_mr_reg (memory registration)".to_string(),
                Mem::Device(iface, dev) => format!(
                    "fi_mr_regattr (registration of device memory, iface {}, device {dev})",
                    iface.name()
                ),
            };
            sys::check(&what, i64::from(ret)).unwrap_err()
        })?;
        self.made.fetch_add(1, Ordering::Relaxed);
        self.map.insert((ptr, len, mem), Entry { mr, desc });
        Ok(desc)
    }

    /// A key no registration of this cache used (probes take one too).
    pub fn next_key(&mut self) -> u64 {
        self.keys += 1;
        self.keys
    }

    /// Closes every registration (no operation may be in flight).
    pub fn clear(&mut self) {
        for (_, e) in self.map.drain() {
            // SAFETY: `e.mr` came from fi_mr_reg and no operation uses it any more.
            unsafe { sys::pccl_ofi_mr_close(e.mr) };
        }
    }
}
