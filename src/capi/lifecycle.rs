//! Library queries (version, features, error strings) and the communicators' life cycle:
//! thread worlds, initialisation (threads, MPI, a unique id), destroy, abort, shrink, split,
//! rank and size queries, timeouts and the device runtime.

use super::handles::{self, lock};
use super::{
    clear, code_of, device, entry, int_of, not_null, nranks_of, pcclComm_t, pcclDeviceRuntime_t,
    pcclInternalError, pcclInvalidArgument, pcclInvalidUsage, pcclRemoteError, pcclResult_t,
    pcclSuccess, pcclSystemError, pcclThreadWorld_t, pcclTimeout, pcclUnhandledDeviceError,
    pcclUniqueId, put, show, OnComm, LAST_ERROR, PCCL_UNIQUE_ID_BYTES, PCCL_VERSION_CODE,
};
use crate::error::{Error, Result};
use crate::transport::Transport;
use crate::{Communicator, ThreadWorld};
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

// ---- library and errors --------------------------------------------------------------------

/// Stores the version of this library, `major * 10000 + minor * 100 + patch`
/// (`PCCL_VERSION_CODE`), in `*version`.
///
/// # Safety
/// `version` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclGetVersion(version: *mut c_int) -> pcclResult_t {
    entry("pcclGetVersion", || {
        not_null(version, "version")?;
        // SAFETY: `version` is non-NULL and the caller promises it points to an int.
        unsafe { put(version, PCCL_VERSION_CODE) };
        Ok(())
    })
}

/// The optional parts this library was built with, comma-separated (`"mpi,cuda,rocm,hwloc,ofi"`
/// when all are; an empty string when none): a static string, never NULL.
#[no_mangle]
pub extern "C" fn pcclGetFeatures() -> *const c_char {
    static FEATURES: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    FEATURES
        .get_or_init(|| {
            // Feature names hold no NUL byte.
            std::ffi::CString::new(crate::features().join(",")).unwrap_or_default()
        })
        .as_ptr()
}

/// A short, static description of a result code (also for unknown codes).
#[no_mangle]
pub extern "C" fn pcclGetErrorString(result: pcclResult_t) -> *const c_char {
    let s: &'static CStr = match result {
        pcclSuccess => c"no error",
        pcclUnhandledDeviceError => c"unhandled device (CUDA/HIP) error",
        pcclSystemError => c"unhandled system error (see pcclGetLastError)",
        pcclInternalError => c"internal error - please report this issue",
        pcclInvalidArgument => c"invalid argument (see pcclGetLastError)",
        pcclInvalidUsage => c"invalid usage (see pcclGetLastError)",
        pcclRemoteError => c"remote process exited or there was a network error",
        pcclTimeout => c"timeout: a peer did not answer within PCCL_TIMEOUT",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The message of the last failed call on `comm`, or of the calling thread's last failed
/// call when `comm` is NULL; "" when there was none. The string stays valid until the next
/// `pcclGetLastError` on the same thread. A handle that is not a live communicator gets a
/// message saying so.
#[no_mangle]
pub extern "C" fn pcclGetLastError(comm: pcclComm_t) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if comm.is_null() {
            let msg = LAST_ERROR
                .try_with(|l| l.borrow().clone())
                .unwrap_or_default();
            return show(&msg);
        }
        match handles::comm(comm as usize, "comm", false) {
            Ok(c) => {
                let msg = lock(&c.last_error).clone();
                show(&msg)
            }
            Err(e) => show(&format!("pcclGetLastError: {}", e.message())),
        }
    }));
    r.unwrap_or(c"pcclGetLastError: internal error (a panic inside PCCL)".as_ptr())
}

// ---- communicators -------------------------------------------------------------------------

/// Creates a world of `nranks` in-process ranks, to be joined by `nranks` threads with
/// `pcclCommInitThreads`. Free it with `pcclThreadWorldDestroy` (communicators built
/// from it stay valid). `nranks` must be in `1..=PCCL_MAX_RANKS`, else the call returns
/// `pcclInvalidArgument` and leaves `*world = NULL`.
///
/// # Safety
/// `world` must be NULL (an error) or point to a writable `pcclThreadWorld_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclThreadWorldCreate(
    nranks: c_int,
    world: *mut pcclThreadWorld_t,
) -> pcclResult_t {
    entry("pcclThreadWorldCreate", || {
        not_null(world, "world")?;
        // SAFETY: `world` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(world) };
        let n = nranks_of(nranks)?;
        let h = handles::add_world(ThreadWorld::new(n))?;
        // SAFETY: as above.
        unsafe { put(world, h as pcclThreadWorld_t) };
        Ok(())
    })
}

/// Releases a thread world. Communicators already built from it keep working; ranks not yet
/// initialised can no longer join. NULL is a no-op.
#[no_mangle]
pub extern "C" fn pcclThreadWorldDestroy(world: pcclThreadWorld_t) -> pcclResult_t {
    entry("pcclThreadWorldDestroy", || {
        if !world.is_null() {
            handles::world(world as usize, "world", true)?;
        }
        Ok(())
    })
}

/// Builds the communicator of rank `rank` of `world`. Collective: every rank of the world
/// must call it, each from its own thread, and it returns once all have. Reads the `PCCL_*`
/// environment variables (`PCCL_RANKS_PER_NODE` makes the ranks pretend to be nodes).
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitThreads(
    comm: *mut pcclComm_t,
    world: pcclThreadWorld_t,
    rank: c_int,
) -> pcclResult_t {
    entry("pcclCommInitThreads", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let w = handles::world(world as usize, "world", false)?;
        let size = w.world.size();
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < size)
            .ok_or_else(|| {
                Error::invalid(format!("rank {rank} is not a rank of this world of {size}"))
            })?;
        if !lock(&w.claimed).insert(r) {
            return Err(Error::usage(format!(
                "rank {r} of this world already has (or is building) a communicator"
            ))
            .into());
        }
        let built = w
            .world
            .transport(r)
            .and_then(Communicator::new)
            .and_then(handles::add_comm);
        match built {
            Ok(h) => {
                // SAFETY: as above.
                unsafe { put(comm, h as pcclComm_t) };
                Ok(())
            }
            Err(e) => {
                lock(&w.claimed).remove(&r);
                Err(e.into())
            }
        }
    })
}

#[cfg(feature = "mpi")]
fn mpi_transport(fcomm: c_int) -> Result<Arc<dyn Transport>> {
    crate::transport::mpi::MpiTransport::from_fint(fcomm)
}

#[cfg(not(feature = "mpi"))]
fn mpi_transport(_fcomm: c_int) -> Result<Arc<dyn Transport>> {
    Err(Error::usage(
        "this libpccl was built without MPI support; rebuild it with `cargo build --features mpi`",
    ))
}

/// Builds a communicator over the ranks of an MPI communicator, given as its Fortran handle
/// (`MPI_Comm_c2f(comm)`, an `MPI_Fint`), so that this header needs no `mpi.h`. Collective
/// over the ranks of that communicator. Returns `pcclInvalidUsage` when the library was built
/// without MPI.
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitMPI(comm: *mut pcclComm_t, fcomm: c_int) -> pcclResult_t {
    entry("pcclCommInitMPI", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let h = mpi_transport(fcomm)
            .and_then(Communicator::new)
            .and_then(handles::add_comm)?;
        // SAFETY: as above.
        unsafe { put(comm, h as pcclComm_t) };
        Ok(())
    })
}

/// Opens the rendezvous of a new job on this host and writes its id to `*uniqueId`
/// (`ncclGetUniqueId`). Call it on one rank and give the id to every rank; the rendezvous is
/// served by a background thread until all ranks have joined (the job size is the `nranks`
/// they pass to `pcclCommInitRank`), or `PCCL_TIMEOUT` passes.
///
/// # Safety
/// `uniqueId` must be NULL (an error) or point to a writable `pcclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn pcclGetUniqueId(unique_id: *mut pcclUniqueId) -> pcclResult_t {
    entry("pcclGetUniqueId", || {
        not_null(unique_id, "uniqueId")?;
        let cfg = crate::config::Config::from_env()?;
        let id = crate::transport::tcp::UniqueId::new(cfg.timeout)?;
        let mut out = pcclUniqueId {
            internal: [0; PCCL_UNIQUE_ID_BYTES],
        };
        for (o, b) in out.internal.iter_mut().zip(id.to_bytes()) {
            *o = b as c_char;
        }
        // SAFETY: `unique_id` is non-NULL and writable (caller's promise).
        unsafe { put(unique_id, out) };
        Ok(())
    })
}

/// Joins the job of `uniqueId` as `rank` of `nranks` (`ncclCommInitRank`): ranks on the same
/// host talk through shared memory, others through TCP (`PCCL_TRANSPORT=ofi`: libfabric).
/// Collective over all `nranks` ranks.
/// `nranks` must be in `1..=PCCL_MAX_RANKS` and `rank` in `0..nranks`, and `uniqueId` one
/// that `pcclGetUniqueId` made, else the call returns `pcclInvalidArgument` at once, without
/// contacting anyone, and leaves `*comm = NULL`.
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitRank(
    comm: *mut pcclComm_t,
    nranks: c_int,
    unique_id: pcclUniqueId,
    rank: c_int,
) -> pcclResult_t {
    entry("pcclCommInitRank", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let n = nranks_of(nranks)?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < n)
            .ok_or_else(|| {
                Error::invalid(format!("rank {rank} of {nranks}: need 0 <= rank < nranks"))
            })?;
        let bytes = unique_id.internal.map(|c| c as u8);
        let id = crate::transport::tcp::UniqueId::from_bytes(&bytes)?;
        // PCCL_TRANSPORT: tcp (auto) or ofi. A bad variable here withdraws this rank, so the
        // others fail at once naming it (as `join` does for its own failures).
        let (cfg, kind) = crate::config::Config::from_env()
            .and_then(|cfg| Ok((cfg, crate::transport::select::from_env()?)))
            .inspect_err(|e| id.withdraw(r, n, e.message()))?;
        let t = crate::transport::select::join(kind, &id, n, r, cfg.chunk_bytes, cfg.timeout)?;
        let h = Communicator::with_config(t, cfg).and_then(handles::add_comm)?;
        // SAFETY: as above.
        unsafe { put(comm, h as pcclComm_t) };
        Ok(())
    })
}

/// Builds a communicator over `MPI_COMM_WORLD`, initialising MPI (thread level MULTIPLE) if
/// the application has not (for callers without `mpi.h`, such as Python). Returns
/// `pcclInvalidUsage` when the library was built without MPI.
///
/// # Safety
/// `comm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommInitMPIWorld(comm: *mut pcclComm_t) -> pcclResult_t {
    entry("pcclCommInitMPIWorld", || {
        not_null(comm, "comm")?;
        // SAFETY: `comm` is non-NULL and points to a writable handle (caller's promise).
        unsafe { clear(comm) };
        let h = mpi_world()
            .and_then(Communicator::new)
            .and_then(handles::add_comm)?;
        // SAFETY: as above.
        unsafe { put(comm, h as pcclComm_t) };
        Ok(())
    })
}

#[cfg(feature = "mpi")]
fn mpi_world() -> Result<Arc<dyn Transport>> {
    let cfg = crate::config::Config::from_env()?;
    // PCCL_TRANSPORT=ofi: libfabric, bootstrapped through the MPI world.
    let kind = crate::transport::select::from_env()?;
    crate::transport::select::world(kind, cfg.chunk_bytes, cfg.timeout)
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Result<Arc<dyn Transport>> {
    Err(Error::usage(
        "this libpccl was built without MPI support; rebuild it with `cargo build --features mpi`",
    ))
}

/// Frees a communicator. Requests still in flight on it keep it alive until they are waited
/// for. Any later use of the handle returns `pcclInvalidUsage`. NULL is a no-op.
#[no_mangle]
pub extern "C" fn pcclCommDestroy(comm: pcclComm_t) -> pcclResult_t {
    entry("pcclCommDestroy", || {
        if !comm.is_null() {
            handles::comm(comm as usize, "comm", true)?;
        }
        Ok(())
    })
}

/// Aborts and frees a communicator, from any thread: every call blocked on it (on any
/// thread) and every request in flight on it ends within a second with `pcclInvalidUsage`
/// ("aborted"), and the other ranks are told, so their calls on it fail with
/// `pcclRemoteError` naming this rank instead of timing out. Any later use of the handle
/// returns `pcclInvalidUsage`. NULL is a no-op.
#[no_mangle]
pub extern "C" fn pcclCommAbort(comm: pcclComm_t) -> pcclResult_t {
    entry("pcclCommAbort", || {
        if !comm.is_null() {
            let c = handles::comm(comm as usize, "comm", true)?;
            c.comm.abort();
        }
        Ok(())
    })
}

/// Makes `*newcomm`, a communicator of the ranks of `comm` not listed in `excluded`
/// (`nexcluded` ranks of `comm`; ranks renumbered in order, the hierarchy recomputed),
/// without the excluded ranks taking part: after a rank died, the survivors go on with
/// it. Every surviving rank calls it with the same list (checked: a disagreement is
/// `pcclInvalidArgument` on every survivor). `comm` stays valid (destroy it afterwards).
/// Works on thread-ranks and on the TCP transport (`pcclCommInitRank`); under MPI it needs
/// every rank of `comm` alive (see the README).
///
/// # Safety
/// `excluded` must be NULL with `nexcluded == 0`, or point to `nexcluded` readable ints;
/// `newcomm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommShrink(
    comm: pcclComm_t,
    excluded: *const c_int,
    nexcluded: c_int,
    newcomm: *mut pcclComm_t,
) -> pcclResult_t {
    entry("pcclCommShrink", || {
        // SAFETY: `newcomm` is NULL or points to a writable handle (caller's promise).
        unsafe { clear(newcomm) };
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(newcomm, "newcomm").on(&c)?;
        let p = c.comm.size();
        let n = usize::try_from(nexcluded)
            .ok()
            .filter(|&n| n <= p)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "nexcluded {nexcluded} must be between 0 and the communicator's {p} ranks"
                ))
            })
            .on(&c)?;
        if n > 0 {
            not_null(excluded, "excluded").on(&c)?;
        }
        let list: &[c_int] = if n == 0 {
            &[]
        } else {
            // SAFETY: non-NULL and readable for `n` ints (caller's promise); `n` is at most
            // the communicator's size, checked above.
            unsafe { std::slice::from_raw_parts(excluded, n) }
        };
        let ranks = list
            .iter()
            .map(|&r| {
                usize::try_from(r)
                    .map_err(|_| Error::invalid(format!("excluded rank {r} is negative")))
            })
            .collect::<Result<Vec<usize>>>()
            .on(&c)?;
        let sub = c.comm.shrink(&ranks).on(&c)?;
        let h = handles::add_comm(sub).on(&c)?;
        // SAFETY: as above.
        unsafe { put(newcomm, h as pcclComm_t) };
        Ok(())
    })
}

/// Makes `*newcomm`, a communicator of the ranks of `comm` that can still reach each other,
/// agreed among them (`Communicator::shrink_to_survivors`): after a failure, when the
/// survivors do not know whom to exclude (a partition, a stalled rank, a cut link). Every
/// rank still running calls it. Only a strict majority of the ranks not known to be dead
/// goes on: a rank on the minority side of a partition, or one the others counted out, gets
/// `pcclRemoteError` (and `*newcomm` stays NULL). Each round in which a rank does not answer
/// costs up to `PCCL_TIMEOUT`. `comm` stays valid (destroy it afterwards).
///
/// # Safety
/// `newcomm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommShrinkSurvivors(
    comm: pcclComm_t,
    newcomm: *mut pcclComm_t,
) -> pcclResult_t {
    entry("pcclCommShrinkSurvivors", || {
        // SAFETY: `newcomm` is NULL or points to a writable handle (caller's promise).
        unsafe { clear(newcomm) };
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(newcomm, "newcomm").on(&c)?;
        let sub = c.comm.shrink_to_survivors().on(&c)?;
        let h = handles::add_comm(sub).on(&c)?;
        // SAFETY: as above.
        unsafe { put(newcomm, h as pcclComm_t) };
        Ok(())
    })
}

/// Stores the number of ranks of `comm` in `*count`.
///
/// # Safety
/// `count` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommCount(comm: pcclComm_t, count: *mut c_int) -> pcclResult_t {
    entry("pcclCommCount", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(count, "count").on(&c)?;
        let n = int_of(c.comm.size(), "size").on(&c)?;
        // SAFETY: `count` is non-NULL and points to a writable int (caller's promise).
        unsafe { put(count, n) };
        Ok(())
    })
}

/// Stores the rank of the caller in `comm` in `*rank`.
///
/// # Safety
/// `rank` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommUserRank(comm: pcclComm_t, rank: *mut c_int) -> pcclResult_t {
    entry("pcclCommUserRank", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(rank, "rank").on(&c)?;
        let r = int_of(c.comm.rank(), "rank").on(&c)?;
        // SAFETY: `rank` is non-NULL and points to a writable int (caller's promise).
        unsafe { put(rank, r) };
        Ok(())
    })
}

/// Sets how long every later call on `comm` (collectives, rooted calls, all-to-all,
/// point-to-point, device calls, and non-blocking requests not started yet) may wait on its
/// peers before failing with `pcclTimeout`, in milliseconds (> 0). Starts as `PCCL_TIMEOUT`;
/// local to this rank; communicators split from `comm` later inherit it.
#[no_mangle]
pub extern "C" fn pcclCommSetTimeout(comm: pcclComm_t, timeout_ms: u64) -> pcclResult_t {
    entry("pcclCommSetTimeout", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        c.comm
            .set_timeout(std::time::Duration::from_millis(timeout_ms))
            .on(&c)
    })
}

/// Sets which GPU runtime the streams of `comm`'s device calls belong to: `pcclRuntimeCuda`,
/// `pcclRuntimeHip` or `pcclRuntimeAuto` (the default: `PCCL_DEVICE_RUNTIME`, else CUDA
/// where libcuda loads, else HIP). `pcclInvalidUsage` when this library was built without
/// that runtime's feature (`cuda`, `rocm`). Local to this rank.
#[no_mangle]
pub extern "C" fn pcclCommSetDeviceRuntime(
    comm: pcclComm_t,
    runtime: pcclDeviceRuntime_t,
) -> pcclResult_t {
    entry("pcclCommSetDeviceRuntime", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        device::check_runtime(runtime).on(&c)?;
        c.runtime
            .store(runtime, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
}

/// Stores `comm`'s timeout (see `pcclCommSetTimeout`) in `*timeout_ms`, in milliseconds.
///
/// # Safety
/// `timeout_ms` must be NULL (an error) or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommGetTimeout(
    comm: pcclComm_t,
    timeout_ms: *mut u64,
) -> pcclResult_t {
    entry("pcclCommGetTimeout", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(timeout_ms, "timeout_ms").on(&c)?;
        let ms = u64::try_from(c.comm.timeout().as_millis()).unwrap_or(u64::MAX);
        // SAFETY: `timeout_ms` is non-NULL and points to a writable u64 (caller's promise).
        unsafe { put(timeout_ms, ms) };
        Ok(())
    })
}

/// Stores in `*async_error` the error a collective queued on a device stream met while
/// running (`pcclSuccess` when none), as `ncclCommGetAsyncError` does; when there is one,
/// `pcclGetLastError(comm)` says what failed (the collective, its number, the rank). The
/// stream of a failed collective stays held (work queued behind it does not run on a wrong
/// result) until `pcclCommAbort` or `pcclCommDestroy`; every later device call fails.
///
/// # Safety
/// `async_error` must be NULL (an error) or point to a writable `pcclResult_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommGetAsyncError(
    comm: pcclComm_t,
    async_error: *mut pcclResult_t,
) -> pcclResult_t {
    entry("pcclCommGetAsyncError", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(async_error, "async_error").on(&c)?;
        let code = match c.comm.async_error() {
            Some(e) => {
                let msg = format!("a queued device collective failed: {}", e.message());
                msg.clone_into(&mut lock(&c.last_error));
                code_of(e.kind())
            }
            None => pcclSuccess,
        };
        // SAFETY: `async_error` is non-NULL and writable (caller's promise).
        unsafe { put(async_error, code) };
        Ok(())
    })
}

/// Splits `comm` as `MPI_Comm_split`: ranks passing the same non-negative `color` form a new
/// communicator, ordered by `key` then by rank in `comm`; a rank passing a negative color
/// (`PCCL_SPLIT_NOCOLOR`) joins none and gets `*newcomm = NULL`. Collective over `comm`.
///
/// # Safety
/// `newcomm` must be NULL (an error) or point to a writable `pcclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclCommSplit(
    comm: pcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut pcclComm_t,
) -> pcclResult_t {
    entry("pcclCommSplit", || {
        // SAFETY: `newcomm` is NULL or points to a writable handle (caller's promise).
        unsafe { clear(newcomm) };
        let c = handles::comm(comm as usize, "comm", false)?;
        not_null(newcomm, "newcomm").on(&c)?;
        let color = u32::try_from(color).ok();
        if let Some(sub) = c.comm.split(color, key).on(&c)? {
            let h = handles::add_comm(sub).on(&c)?;
            // SAFETY: as above.
            unsafe { put(newcomm, h as pcclComm_t) };
        }
        Ok(())
    })
}
