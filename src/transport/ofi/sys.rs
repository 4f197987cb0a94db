//! Declarations of the C layer over libfabric (`csrc/ofi_shim.c`) and the mapping of its
//! return codes to PCCL errors. The structures mirror the shim's flat ones, not libfabric's.

use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Opaque `struct fi_info`.
#[repr(C)]
pub struct FiInfo {
    _private: [u8; 0],
}

/// Opaque `struct fid_mr`.
#[repr(C)]
pub struct FidMr {
    _private: [u8; 0],
}

/// What PCCL reads of a chosen `fi_info` (`struct pccl_ofi_desc`).
#[repr(C)]
pub struct Desc {
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    pub cq_data_size: u64,
    pub max_msg_size: u64,
    pub tx_size: u64,
    pub rx_size: u64,
    pub provider: [c_char; 64],
    pub fabric: [c_char; 128],
    pub domain: [c_char; 128],
}

impl Default for Desc {
    fn default() -> Self {
        Desc {
            caps: 0,
            mode: 0,
            mr_mode: 0,
            cq_data_size: 0,
            max_msg_size: 0,
            tx_size: 0,
            rx_size: 0,
            provider: [0; 64],
            fabric: [0; 128],
            domain: [0; 128],
        }
    }
}

/// The objects of one endpoint (`struct pccl_ofi_ep`), all null when closed.
#[repr(C)]
pub struct RawEp {
    pub fabric: *mut c_void,
    pub domain: *mut c_void,
    pub av: *mut c_void,
    pub cq: *mut c_void,
    pub ep: *mut c_void,
}

impl Default for RawEp {
    fn default() -> Self {
        RawEp {
            fabric: std::ptr::null_mut(),
            domain: std::ptr::null_mut(),
            av: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            ep: std::ptr::null_mut(),
        }
    }
}

/// One completion (`struct pccl_ofi_comp`); `err != 0` for a failed operation.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Comp {
    pub ctx: usize,
    pub flags: u64,
    pub len: u64,
    pub data: u64,
    pub tag: u64,
    pub olen: u64,
    pub err: i32,
    pub prov_errno: i32,
}

extern "C" {
    pub fn pccl_ofi_getinfo(
        prov: *const c_char,
        domain: *const c_char,
        hmem: c_int,
        out: *mut *mut FiInfo,
    ) -> c_int;
    pub fn pccl_ofi_freeinfo(info: *mut FiInfo);
    pub fn pccl_ofi_describe(info: *mut FiInfo, d: *mut Desc) -> *mut FiInfo;
    pub fn pccl_ofi_open(info: *mut FiInfo, e: *mut RawEp, want_fd: c_int) -> c_int;
    pub fn pccl_ofi_wait_fd(e: *mut RawEp) -> c_int;
    pub fn pccl_ofi_trywait(e: *mut RawEp) -> c_int;
    pub fn pccl_ofi_block(fd: c_int, timeout_ms: c_int) -> c_int;
    pub fn pccl_ofi_close(e: *mut RawEp);
    pub fn pccl_ofi_close_ep(e: *mut RawEp);
    pub fn pccl_ofi_getname(e: *mut RawEp, addr: *mut c_void, len: *mut usize) -> c_int;
    pub fn pccl_ofi_av_insert(
        e: *mut RawEp,
        addrs: *const c_void,
        count: usize,
        out: *mut u64,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub fn pccl_ofi_tsend(
        e: *mut RawEp,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        dest: u64,
        tag: u64,
        with_data: c_int,
        data: u64,
        ctx: *mut c_void,
    ) -> isize;
    #[allow(clippy::too_many_arguments)]
    pub fn pccl_ofi_trecv(
        e: *mut RawEp,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        src: u64,
        tag: u64,
        ignore: u64,
        ctx: *mut c_void,
    ) -> isize;
    pub fn pccl_ofi_cancel(e: *mut RawEp, ctx: *mut c_void) -> c_int;
    pub fn pccl_ofi_poll(
        e: *mut RawEp,
        out: *mut Comp,
        count: usize,
        msg: *mut c_char,
        msg_cap: usize,
    ) -> isize;
    pub fn pccl_ofi_mr_reg(
        e: *mut RawEp,
        buf: *const c_void,
        len: usize,
        key: u64,
        mr: *mut *mut FidMr,
        desc: *mut *mut c_void,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub fn pccl_ofi_mr_regattr(
        e: *mut RawEp,
        buf: *const c_void,
        len: usize,
        iface: c_int,
        device: c_int,
        key: u64,
        mr: *mut *mut FidMr,
        desc: *mut *mut c_void,
    ) -> c_int;
    pub fn pccl_ofi_mr_close(mr: *mut FidMr) -> c_int;
    pub fn pccl_ofi_flag(which: c_int) -> u64;
    fn fi_strerror(errnum: c_int) -> *const c_char;
}

/// `FI_EAGAIN`: the queue is full, progress and try again.
pub const FI_EAGAIN: i64 = 11;
/// `FI_ETRUNC`: a message longer than the receive buffer.
pub const FI_ETRUNC: i32 = 265;

/// Capability bit `FI_HMEM`.
pub fn fi_hmem() -> u64 {
    // SAFETY: a pure function of the shim returning a constant.
    unsafe { pccl_ofi_flag(0) }
}
/// Registration mode bit `FI_MR_LOCAL` (domain `mr_mode`).
pub fn fi_mr_local() -> u64 {
    // SAFETY: as above.
    unsafe { pccl_ofi_flag(1) }
}
/// Old-style mode bit `FI_LOCAL_MR` (`fi_info.mode`).
pub fn fi_local_mr() -> u64 {
    // SAFETY: as above.
    unsafe { pccl_ofi_flag(2) }
}
/// Completion flag `FI_REMOTE_CQ_DATA`.
pub fn fi_remote_cq_data() -> u64 {
    // SAFETY: as above.
    unsafe { pccl_ofi_flag(3) }
}
/// `FI_ADDR_UNSPEC` (any source).
pub fn fi_addr_unspec() -> u64 {
    // SAFETY: as above.
    unsafe { pccl_ofi_flag(4) }
}

/// libfabric's `enum fi_hmem_iface` value of `FI_HMEM_SYSTEM` (0), `FI_HMEM_CUDA` (1) or
/// `FI_HMEM_ROCR` (2).
pub fn fi_hmem_iface(which: i32) -> i32 {
    // SAFETY: as above.
    unsafe { pccl_ofi_flag(5 + which) as i32 }
}
/// `FI_ENOSYS` and `FI_EOPNOTSUPP` (positive): what libfabric answers for an iface its build
/// lacks.
pub fn fi_unsupported() -> [i64; 2] {
    // SAFETY: as above.
    unsafe { [pccl_ofi_flag(8) as i64, pccl_ofi_flag(9) as i64] }
}

/// libfabric's description of error `code` (positive or negative).
pub fn strerror(code: i64) -> String {
    let c = code.unsigned_abs().min(i32::MAX as u64) as c_int;
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any code.
    unsafe { CStr::from_ptr(fi_strerror(c)) }
        .to_string_lossy()
        .into_owned()
}

/// A C string field of [`Desc`] as a Rust string.
pub fn field(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Maps a libfabric return code (`0` or a negative `-FI_E…`) of `what` to a result.
pub fn check(what: &str, ret: i64) -> Result<()> {
    if ret >= 0 {
        return Ok(());
    }
    Err(Error::system(format!(
        "libfabric: {what} failed: {} ({ret})",
        strerror(ret)
    )))
}
