//! MPI transport (rsmpi's `mpi` crate over MPICH or Open MPI): non-blocking point-to-point,
//! large messages in pieces of `PCCL_CHUNK_SIZE` (so reductions overlap the next piece, and
//! no MPI count reaches 2^31), every wait bounded by the collective's deadline.
//!
//! Every MPI call is short (no blocking call, waits poll `MPI_Test`), so when MPI gives less
//! than `MPI_THREAD_MULTIPLE` a process-wide lock around each call is enough for several
//! communicators to progress from several threads.
//!
//! **Under faults** (see [`link`] for the wire format and the waits): every message carries
//! its full stamp in a header, so ranks running different calls fail with a remote error
//! naming both calls instead of pairing silently; refusals and aborts reach every rank as
//! notices that every wait polls; no request is released while MPI may use its buffer.
//!
//! * **Exit after an error.** `MPI_Finalize` is collective in MPICH: it waits for every rank,
//!   which after a failure may never come. When PCCL started MPI ([`init`]), [`finalize`]
//!   (and the exit handler that calls it) **skips `MPI_Finalize`** while [`unsettled`] says a
//!   collective failed without a later one succeeding, or a request PCCL gave up on may still
//!   be in flight; it prints why on stderr. The process then exits with its own status at
//!   once, and the launcher (hydra) ends the job's other processes.
//! * **A send that MPI cannot take back.** MPICH (its UCX device) cannot cancel a send that
//!   the peer never matched, and such a send ends only when the peer receives it (every PCCL
//!   wait of the peer drains a failed collective's messages). If a send on the caller's
//!   buffer still has not ended [`link::CONFIRM`] after PCCL gave up on it (the peer stalled
//!   outside PCCL, say), control cannot return with MPI still reading the buffer: PCCL ends
//!   the job with `MPI_Abort`, printing which rank never took the message.
//! * **Death.** A rank that dies (`PCCL_FAULT` kind `kill`, a crash) ends the whole job: hydra
//!   kills every other process of it, so no survivor hangs; nothing is left to shrink.
//! * **Service thread.** When PCCL started MPI, a thread takes notices and drains a failed
//!   collective's leftovers every 2 ms on every live transport, so a rank that is outside PCCL
//!   (computing, stalled, or leaving after an error) still frees its peers' blocked sends. An
//!   application that initialised MPI itself gets this only while a PCCL wait runs.
//! * **Links** cannot be dropped on MPI (`PCCL_FAULT` kind `drop` is refused).
//!
//! CUDA-awareness: an MPI that moves device memory itself (detected once per process through
//! `MPIX_Query_cuda_support`, which MPICH >= 4 and Open MPI export; `PCCL_MPI_CUDA_AWARE=0|1`
//! overrides) gets device pointers straight from device collectives
//! ([`Transport::moves_device_memory`]); any other MPI gets pinned host staging.

pub mod link;

use super::faults::Faults;
use super::{fnv1a, hostname, Notice, SendOp, Tag, Transport};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
pub use link::unsettled;
use link::{Core, Direct, MpiSend, Scattered, Staged};
use mpi::ffi;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Tags of sub-communicator creation (MPI guarantees `MPI_TAG_UB >= 32767`).
const TAG_SPACE: u32 = 32767;

static SERIALIZE: OnceLock<bool> = OnceLock::new();
static MPI_LOCK: Mutex<()> = Mutex::new(());
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

/// Whether this process's MPI moves device memory: detected once, after MPI_Init (an
/// unparsable `PCCL_MPI_CUDA_AWARE` is kept as its error message).
static CUDA_AWARE: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
/// Set once the `PCCL_DEBUG=INFO` line about CUDA-awareness has been printed.
static CUDA_AWARE_TOLD: AtomicBool = AtomicBool::new(false);

/// Parses `PCCL_MPI_CUDA_AWARE` (given its value, `None` when unset): `Ok(None)` to detect,
/// `Ok(Some(true))` for `1` (the user asserts MPI is CUDA-aware: device pointers go to MPI),
/// `Ok(Some(false))` for `0` (always stage through host memory).
pub fn parse_cuda_aware_override(v: Option<&str>) -> Result<Option<bool>> {
    match v.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "auto" => Ok(None),
            "1" | "on" | "yes" | "true" => Ok(Some(true)),
            "0" | "off" | "no" | "false" => Ok(Some(false)),
            _ => Err(Error::invalid(format!(
                "PCCL_MPI_CUDA_AWARE={v}: expected 1 (MPI is CUDA-aware), 0 (it is not) or auto \
                 (detect)"
            ))),
        },
    }
}

/// Asks the MPI library whether it is CUDA-aware: `MPIX_Query_cuda_support()` when the
/// library exports it (MPICH >= 4, Open MPI), else not. MPI must be initialised.
fn query_cuda_support() -> (bool, &'static str) {
    // SAFETY: dlsym with RTLD_DEFAULT searches the loaded objects for a NUL-terminated name.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"MPIX_Query_cuda_support".as_ptr()) };
    if sym.is_null() {
        return (false, "the MPI library has no MPIX_Query_cuda_support");
    }
    // SAFETY: MPICH and Open MPI declare it `int MPIX_Query_cuda_support(void)`, callable
    // after MPI_Init (our callers run after `init` or checked that MPI is initialised).
    let f: unsafe extern "C" fn() -> libc::c_int = unsafe { std::mem::transmute(sym) };
    // SAFETY: as above: a no-argument query of an initialised MPI.
    if call(|| unsafe { f() }) == 1 {
        (true, "MPIX_Query_cuda_support() = 1")
    } else {
        (false, "MPIX_Query_cuda_support() = 0")
    }
}

/// Whether MPI is CUDA-aware (after `PCCL_MPI_CUDA_AWARE`), decided once per process; MPI must
/// be initialised. `PCCL_DEBUG=INFO` (or `TRACE`) prints the decision once, on `rank` 0.
fn cuda_aware(rank: usize) -> Result<bool> {
    let r = CUDA_AWARE.get_or_init(|| {
        let over = parse_cuda_aware_override(std::env::var("PCCL_MPI_CUDA_AWARE").ok().as_deref())
            .map_err(|e| e.message().to_string())?;
        let (aware, why) = match over {
            Some(a) => (a, "PCCL_MPI_CUDA_AWARE"),
            None => query_cuda_support(),
        };
        let verbose = std::env::var("PCCL_DEBUG").is_ok_and(|v| {
            let v = v.trim().to_ascii_uppercase();
            v == "INFO" || v == "TRACE"
        });
        if verbose && rank == 0 && !CUDA_AWARE_TOLD.swap(true, Ordering::Relaxed) {
            if aware {
                eprintln!(
                    "PCCL INFO MPI is CUDA-aware ({why}): device collectives hand device pointers \
                     to MPI (PCCL_DEVICE_DIRECT=0 stages through pinned host memory instead)"
                );
            } else {
                eprintln!(
                    "PCCL INFO MPI is not CUDA-aware ({why}): device collectives stage through \
                     pinned host memory (PCCL_MPI_CUDA_AWARE=1 asserts it is)"
                );
            }
        }
        Ok(aware)
    });
    r.clone().map_err(Error::invalid)
}

/// Runs one MPI call under the process lock when MPI is not fully thread-safe.
fn call<R>(f: impl FnOnce() -> R) -> R {
    if *SERIALIZE.get().unwrap_or(&true) {
        let _g = MPI_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        f()
    } else {
        f()
    }
}

fn check(rc: i32, what: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let mut buf = vec![0u8; 1024];
        let mut len = 0i32;
        // SAFETY: `buf` has room for MPI_MAX_ERROR_STRING (<= 1024 in MPICH and Open MPI).
        unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr() as *mut _, &mut len) };
        buf.truncate(len.max(0) as usize);
        Err(Error::system(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&buf)
        )))
    }
}

/// Initialises MPI (`MPI_THREAD_MULTIPLE` requested) unless the application already did.
/// [`finalize`] ends it; an application that initialised MPI itself finalises it itself.
pub fn init() -> Result<()> {
    let mut u = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner());
    if !mpi::environment::is_initialized() {
        // The NIC map reaches Cray MPICH / UCX only through variables read at MPI_Init.
        crate::topology::apply::apply();
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| Error::system("MPI_Init_thread failed"))?;
        let _ = SERIALIZE.set(level != mpi::Threading::Multiple);
        *u = Some(universe);
        // A process that started MPI must finalise it, or the launcher (hydra) reports a bad
        // termination and kills its peers: do it at exit if the program does not.
        // SAFETY: registering a plain `extern "C" fn()` with the C runtime.
        unsafe { libc::atexit(finalize_at_exit) };
        link::start_service();
    } else {
        let _ = SERIALIZE.set(mpi::environment::threading_support() != mpi::Threading::Multiple);
    }
    Ok(())
}

/// Finalises MPI if [`init`] started it. Call after every communicator is dropped (it also
/// runs at process exit when the program did not call it). While [`unsettled`] gives a
/// reason (a collective failed and none succeeded since, or a request is still in flight),
/// it skips `MPI_Finalize`, which would wait for ranks that may never finalise, and says so
/// on stderr: the process exits at once, and the launcher ends the job's other processes.
pub fn finalize() {
    let u = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if u.is_some() {
        link::stop_service();
    }
    if let (true, Some(why)) = (u.is_some(), unsettled()) {
        eprintln!(
            "PCCL WARN not calling MPI_Finalize, which would wait for every rank: {why}; the \
             launcher ends the other processes of the job"
        );
        std::mem::forget(u);
        return;
    }
    if u.is_some() && !is_finalized() {
        drop(u);
    } else if let Some(u) = u {
        // Already finalised by someone else: dropping the universe would finalise twice.
        std::mem::forget(u);
    }
}

extern "C" fn finalize_at_exit() {
    // Nothing may unwind out of an atexit handler.
    let _ = std::panic::catch_unwind(finalize);
}

/// True when this process was started by an MPI launcher (mpiexec/srun set these).
pub fn launched_by_mpiexec() -> bool {
    [
        "PMI_RANK",
        "PMI_SIZE",
        "PMIX_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "MPI_LOCALNRANKS",
        "HYDRA_CONTROL_FD",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// A transport over an MPI communicator (a private duplicate with errors returned).
pub struct MpiTransport {
    core: Arc<Core>,
    node: u64,
    /// MPI moves device memory (CUDA-aware).
    device: bool,
}

fn is_finalized() -> bool {
    let mut f = 0;
    // SAFETY: MPI_Finalized may be called at any time.
    unsafe { ffi::MPI_Finalized(&mut f) };
    f != 0
}

impl MpiTransport {
    /// A transport over a duplicate of `MPI_COMM_WORLD` (initialising MPI if needed).
    pub fn world(chunk_bytes: usize) -> Result<MpiTransport> {
        init()?;
        // SAFETY: reading the world handle exported by the MPI shim.
        Self::dup(unsafe { ffi::RSMPI_COMM_WORLD }, chunk_bytes)
    }

    /// The transport of a Fortran communicator handle (`MPI_Comm_c2f`), the one ABI
    /// MPICH and Open MPI share.
    /// Pieces are `PCCL_CHUNK_SIZE` bytes.
    pub fn from_fint(fcomm: i32) -> Result<Arc<dyn Transport>> {
        let chunk_bytes = crate::config::Config::from_env()?.chunk_bytes;
        if !mpi::environment::is_initialized() {
            return Err(Error::usage(
                "MPI is not initialised: call MPI_Init before pcclCommInitMPI",
            ));
        }
        let _ = SERIALIZE.set(mpi::environment::threading_support() != mpi::Threading::Multiple);
        // SAFETY: converting a handle the application gave us; MPI validates it.
        let comm = unsafe { ffi::RSMPI_Comm_f2c(fcomm) };
        Ok(Arc::new(Self::dup(comm, chunk_bytes)?))
    }

    fn dup(parent: ffi::MPI_Comm, chunk_bytes: usize) -> Result<Self> {
        // SAFETY: an uninitialised handle is written by MPI_Comm_dup before any use.
        let mut comm: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        // SAFETY: `parent` is a valid communicator (MPI reports otherwise).
        check(
            call(|| unsafe { ffi::MPI_Comm_dup(parent, &mut comm) }),
            "MPI_Comm_dup",
        )?;
        Self::adopt(comm, chunk_bytes)
    }

    fn adopt(mut comm: ffi::MPI_Comm, chunk_bytes: usize) -> Result<Self> {
        let (mut rank, mut size) = (0i32, 0i32);
        // SAFETY: `comm` is a valid communicator we own.
        unsafe {
            check(
                call(|| ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN)),
                "MPI_Comm_set_errhandler",
            )?;
            check(
                call(|| ffi::MPI_Comm_rank(comm, &mut rank)),
                "MPI_Comm_rank",
            )?;
            check(
                call(|| ffi::MPI_Comm_size(comm, &mut size)),
                "MPI_Comm_size",
            )?;
        }
        let core = Core::new(comm, rank as usize, size as usize, chunk_bytes);
        let (node, device) = match core {
            Ok(_) => (Self::node_key(comm), cuda_aware(rank as usize)),
            Err(e) => {
                // SAFETY: `comm` is ours and nothing else holds it.
                call(|| unsafe { ffi::MPI_Comm_free(&mut comm) });
                return Err(e);
            }
        };
        // From here `core` owns (and frees) the communicator.
        let core = Arc::new(core?);
        link::register(&core);
        Ok(MpiTransport {
            core,
            node: node?,
            device: device?,
        })
    }

    /// The node key: the hostname hash of the lowest rank in this rank's shared-memory
    /// communicator (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`).
    fn node_key(comm: ffi::MPI_Comm) -> Result<u64> {
        // SAFETY: handles are written by MPI before use; buffers outlive the calls.
        unsafe {
            let mut shm: ffi::MPI_Comm = std::mem::zeroed();
            check(
                call(|| {
                    ffi::MPI_Comm_split_type(
                        comm,
                        ffi::RSMPI_COMM_TYPE_SHARED,
                        0,
                        ffi::RSMPI_INFO_NULL,
                        &mut shm,
                    )
                }),
                "MPI_Comm_split_type",
            )?;
            let mut key = fnv1a(hostname().as_bytes());
            let rc = call(|| {
                ffi::MPI_Bcast(
                    &mut key as *mut u64 as *mut _,
                    1,
                    ffi::RSMPI_UINT64_T,
                    0,
                    shm,
                )
            });
            call(|| ffi::MPI_Comm_free(&mut shm));
            check(rc, "MPI_Bcast")?;
            Ok(key)
        }
    }

    /// Runs MPI's own collective on the same buffers (for side-by-side benchmarks).
    ///
    /// # Safety
    /// Buffers as for [`crate::Communicator::raw_collective`] with `count` elements of `dtype`.
    pub unsafe fn native_collective(
        &self,
        coll: crate::RawCollective,
        dtype: DType,
        send: *const u8,
        recv: *mut u8,
        count: usize,
    ) -> Result<()> {
        let dt = match dtype {
            DType::I8 => ffi::RSMPI_INT8_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::U32 => ffi::RSMPI_UINT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U64 => ffi::RSMPI_UINT64_T,
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::F16 | DType::BF16 => {
                return Err(Error::invalid(format!(
                    "MPI has no standard {dtype} type to compare with"
                )))
            }
        };
        let mpi_op = |op: ReduceOp| match op {
            ReduceOp::Sum => Ok(ffi::RSMPI_SUM),
            ReduceOp::Prod => Ok(ffi::RSMPI_PROD),
            ReduceOp::Min => Ok(ffi::RSMPI_MIN),
            ReduceOp::Max => Ok(ffi::RSMPI_MAX),
            ReduceOp::Avg => Err(Error::invalid("MPI has no average operator")),
        };
        let n =
            i32::try_from(count).map_err(|_| Error::invalid("MPI counts must be below 2^31"))?;
        let rc = match coll {
            crate::RawCollective::AllGather => call(|| {
                ffi::MPI_Allgather(
                    send as *const _,
                    n,
                    dt,
                    recv as *mut _,
                    n,
                    dt,
                    self.core.comm,
                )
            }),
            crate::RawCollective::ReduceScatter(op) => {
                let o = mpi_op(op)?;
                call(|| {
                    ffi::MPI_Reduce_scatter_block(
                        send as *const _,
                        recv as *mut _,
                        n,
                        dt,
                        o,
                        self.core.comm,
                    )
                })
            }
            crate::RawCollective::AllReduce(op) => {
                let o = mpi_op(op)?;
                call(|| {
                    ffi::MPI_Allreduce(send as *const _, recv as *mut _, n, dt, o, self.core.comm)
                })
            }
            crate::RawCollective::Broadcast(root) => {
                call(|| ffi::MPI_Bcast(recv as *mut _, n, dt, root as i32, self.core.comm))
            }
        };
        check(rc, "native MPI collective")
    }
}

impl SendOp for MpiSend {
    fn wait(mut self: Box<Self>, deadline: Instant) -> Result<()> {
        self.finish(deadline)
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.core.rank
    }
    fn size(&self) -> usize {
        self.core.size
    }
    fn name(&self) -> &'static str {
        "mpi"
    }
    fn node_key(&self) -> u64 {
        self.node
    }

    fn faults(&self) -> &Faults {
        &self.core.faults
    }

    fn notify(&self, notice: &Notice) {
        self.core.notify(notice);
    }

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.isend_raw(peer, tag, ptr, len, self.core.chunk)
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.recv_pieces(peer, tag, len, None, deadline, sink)
    }

    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        self.recv_into_pieces(peer, tag, dst, None, deadline)
    }

    unsafe fn isend_pieces(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.isend_raw(peer, tag, ptr, len, self.core.cut(piece)) }
    }

    fn recv_pieces(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        piece: Option<usize>,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let chunk = self.core.cut(piece);
        let mut dest = Staged::new(len, chunk, sink);
        self.core.recv(peer, tag, len, chunk, deadline, &mut dest)
    }

    fn recv_into_pieces(
        &self,
        peer: usize,
        tag: Tag,
        dst: &mut [u8],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let chunk = self.core.cut(piece);
        // SAFETY: `dst` is `dst.len()` writable bytes for the whole call.
        unsafe { self.recv_raw(peer, tag, dst.as_mut_ptr(), dst.len(), chunk, deadline) }
    }

    unsafe fn isendv(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller.
        Ok(Box::new(unsafe {
            self.core.isend_segs(peer, tag, segs, self.core.cut(piece))
        }?))
    }

    unsafe fn recvv_into(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*mut u8, usize)],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let chunk = self.core.cut(piece);
        let segs = segs.iter().map(|&(p, n)| (p as usize, n)).collect();
        let mut dest = Scattered::new(segs, chunk);
        self.core
            .recv(peer, tag, dest.total(), chunk, deadline, &mut dest)
    }

    fn moves_device_memory(&self) -> bool {
        self.device
    }

    unsafe fn isend_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.device_mode()?;
        // The device address is only passed on to (CUDA-aware) MPI, never dereferenced here.
        self.isend_raw(peer, tag, ptr as usize as *const u8, len, self.core.chunk)
    }

    unsafe fn recv_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<()> {
        self.device_mode()?;
        // As in `isend_device`: an address for MPI only.
        self.recv_raw(
            peer,
            tag,
            ptr as usize as *mut u8,
            len,
            self.core.chunk,
            deadline,
        )
    }

    /// A sub-communicator through `MPI_Comm_create_group`, which only the members call: it
    /// works to shrink away ranks that are alive but out (they aborted, or refused to go on),
    /// since the excluded ranks need not take part. Without ULFM (MPI fault tolerance, which
    /// MPICH's default builds lack) nothing survives a dead rank to shrink: the launcher ends
    /// the whole job when a process dies, and a communicator cannot be revoked or agreed on
    /// among survivors; the new communicator starts with an empty failure board.
    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        let ranks: Vec<i32> = members.iter().map(|&m| m as i32).collect();
        // SAFETY: handles are written by MPI before use; `ranks` outlives the calls.
        unsafe {
            let mut group: ffi::MPI_Group = std::mem::zeroed();
            let mut sub: ffi::MPI_Group = std::mem::zeroed();
            let mut comm: ffi::MPI_Comm = std::mem::zeroed();
            check(
                call(|| ffi::MPI_Comm_group(self.core.comm, &mut group)),
                "MPI_Comm_group",
            )?;
            check(
                call(|| ffi::MPI_Group_incl(group, ranks.len() as i32, ranks.as_ptr(), &mut sub)),
                "MPI_Group_incl",
            )?;
            let tag = (ctx % u64::from(TAG_SPACE)) as i32;
            let rc = call(|| ffi::MPI_Comm_create_group(self.core.comm, sub, tag, &mut comm));
            call(|| {
                ffi::MPI_Group_free(&mut sub);
                ffi::MPI_Group_free(&mut group);
            });
            check(rc, "MPI_Comm_create_group")?;
            Ok(Arc::new(Self::adopt(comm, self.core.chunk)?))
        }
    }
}

impl MpiTransport {
    /// Posts a `len`-byte message at `ptr` (host memory, or device memory for a CUDA-aware
    /// MPI): the address is only handed to MPI.
    ///
    /// # Safety
    /// As [`Transport::isend`] (or [`Transport::isend_device`] for device memory).
    unsafe fn isend_raw(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        chunk: usize,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller.
        Ok(Box::new(unsafe {
            self.core.isend(peer, tag, ptr, len, chunk)
        }?))
    }

    /// Receives a `len`-byte message from `peer` into `base` (host memory, or device memory for
    /// a CUDA-aware MPI), every piece posted at once.
    ///
    /// # Safety
    /// `base` must address `len` writable bytes that nothing else touches during the call.
    unsafe fn recv_raw(
        &self,
        peer: usize,
        tag: Tag,
        base: *mut u8,
        len: usize,
        chunk: usize,
        deadline: Instant,
    ) -> Result<()> {
        let mut dest = Direct { base, len, chunk };
        self.core.recv(peer, tag, len, chunk, deadline, &mut dest)
    }

    fn device_mode(&self) -> Result<()> {
        if self.device {
            Ok(())
        } else {
            Err(Error::usage(
                "this MPI is not CUDA-aware (MPIX_Query_cuda_support): device memory goes through \
                 pinned host staging; set PCCL_MPI_CUDA_AWARE=1 if it is CUDA-aware after all",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cuda_aware_override as parse;

    #[test]
    fn cuda_aware_override_parses() {
        assert_eq!(parse(None).unwrap(), None);
        assert_eq!(parse(Some("")).unwrap(), None);
        assert_eq!(parse(Some(" auto ")).unwrap(), None);
        for v in ["1", "on", "YES", "true"] {
            assert_eq!(parse(Some(v)).unwrap(), Some(true), "{v}");
        }
        for v in ["0", "off", "No", " false"] {
            assert_eq!(parse(Some(v)).unwrap(), Some(false), "{v}");
        }
        let e = parse(Some("maybe")).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.message().contains("PCCL_MPI_CUDA_AWARE=maybe"), "{e}");
    }
}
