//! libfabric transport (feature `ofi`, `PCCL_TRANSPORT=ofi`): reliable-datagram endpoints
//! (`FI_EP_RDM`) with tagged messages, on whatever provider libfabric offers (`FI_PROVIDER`
//! selects: `tcp;ofi_rxm` and `shm` here, `cxi` on Slingshot, `verbs;ofi_rxm` on InfiniBand,
//! `efa` on AWS).
//!
//! **Two planes.** Data moves through libfabric; the control plane is the TCP transport's
//! authenticated mesh (bootstrapped from the same unique id), or under mpiexec the MPI world
//! (`OfiTransport::on_mpi_world`); it carries the endpoint
//! address exchange, notices (refusals, aborts) and liveness: a peer whose process ended is
//! seen there within a poll step, whatever the provider reports. Waits on data look at the
//! board that the control plane fills.
//!
//! **Stamps as tags.** A message's 64-bit stamp is its libfabric tag; receives match the
//! sequence number and flags and check the fingerprint and length on arrival (`link.rs`).
//! Messages of a collective that failed on this rank are drained by receives kept posted for
//! its sequence number (`fabric::State::add_junk`).
//!
//! **Memory.** Buffers are registered where the provider asks (`FI_MR_LOCAL`), through a cache
//! keyed by address, length and memory kind (`mr.rs`).
//!
//! **Device memory (`FI_HMEM`).** Where the provider has `FI_HMEM` and a registration probe
//! of the iface in use succeeds on every rank ([`Hmem`]: `PCCL_OFI_HMEM=auto|0|1`), device
//! buffers are registered with `fi_mr_regattr` (iface and device ordinal) and handed to the
//! provider as they are: [`Transport::moves_device_memory`] is true and device collectives
//! skip pinned host staging, as on CUDA-aware MPI. Otherwise it is false and they stage
//! (never an error at collective time; `PCCL_OFI_HMEM=1` makes it one at init).
//!
//! The domain opened is `PCCL_OFI_DOMAIN` (or `FI_DOMAIN`), else the NIC map's choice (a hook
//! in `fabric::open_endpoint`), else the provider's first.

mod fabric;
mod link;
mod mr;
mod sys;

pub use fabric::{domain_choice, offers, providers, Caps, Offer};
pub use mr::Iface as HmemIface;

use self::fabric::Endpoint;
use self::link::{OfiSend, Target};
use self::mr::Mem;
use super::faults::{self, Faults};
use super::staging::Staging;
use super::tcp::{TcpTransport, UniqueId};
use super::{Notice, SendOp, Tag, Transport};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bootstrap record: magic, piece size, address length, address, provider/fabric.
const RECORD: usize = 512;
const MAGIC: u64 = 0x5043_434c_4f46_4931;
const NAME_MAX: usize = 256;
/// Smallest piece (so tiny `PCCL_CHUNK_SIZE` values do not flood the queues).
const MIN_PIECE: usize = 64 << 10;

/// What the endpoint's operations share.
pub(crate) struct Shared {
    ep: Endpoint,
    /// The control plane: the TCP mesh of a unique-id job, or the MPI world under mpiexec.
    ctl: Arc<dyn Transport>,
    addrs: Vec<u64>,
    rank: usize,
    piece: usize,
    timeout: Duration,
    /// What was asked of `FI_HMEM` (kept for sub-communicators).
    hmem_asked: Hmem,
    /// The iface device buffers are registered with, when every rank can (else device
    /// collectives stage through host memory).
    hmem: Option<HmemIface>,
    /// Receive bounce buffers kept by this transport, so that their registrations (cached by
    /// address) are made once: buffers from the shared staging pool would come back at other
    /// addresses (measured: 4 new registrations per all-reduce with `PCCL_OFI_MR=1`).
    bounce: Mutex<Vec<Staging>>,
}

/// Bounce buffers a transport keeps idle.
const BOUNCE_KEPT: usize = 4;

impl Shared {
    /// A bounce buffer of exactly `len` bytes: one this transport used before, else one from
    /// the staging pool.
    fn take_bounce(&self, len: usize) -> Staging {
        let mut kept = self.bounce.lock().unwrap_or_else(|e| e.into_inner());
        match kept.iter().position(|b| b.bytes().len() == len) {
            Some(i) => kept.swap_remove(i),
            None => Staging::take(len),
        }
    }

    /// Keeps `b` for the next receive (beyond [`BOUNCE_KEPT`], it goes back to the pool).
    fn give_bounce(&self, b: Staging) {
        let mut kept = self.bounce.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < BOUNCE_KEPT {
            kept.push(b);
        }
    }
}

/// Whether device buffers go to the provider (`PCCL_OFI_HMEM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HmemMode {
    /// Where the provider has `FI_HMEM` and the iface's probe succeeds on every rank.
    Auto,
    /// Never: device collectives stage through host memory.
    Off,
    /// Always: the transport fails at init when it cannot.
    On,
}

/// The `FI_HMEM` choice of a transport: the mode and the iface of the device memory in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hmem {
    /// `PCCL_OFI_HMEM`: `auto` (default), `0`, `1`.
    pub mode: HmemMode,
    /// The iface device buffers are registered with: `FI_HMEM_CUDA` (the device backend
    /// that hands device memory to transports). The hidden test hook
    /// `PCCL_OFI_HMEM_IFACE=system|cuda|rocr` overrides it: `system` passes host buffers
    /// through the whole device path on any `FI_HMEM` provider (`shm` here).
    pub iface: HmemIface,
}

impl Default for Hmem {
    fn default() -> Self {
        Hmem {
            mode: HmemMode::Auto,
            iface: HmemIface::Cuda,
        }
    }
}

impl Hmem {
    /// `PCCL_OFI_HMEM` and `PCCL_OFI_HMEM_IFACE`; an unknown value is an error naming it.
    pub fn from_env() -> Result<Self> {
        let var = |n: &str| {
            std::env::var(n)
                .ok()
                .map(|v| v.trim().to_ascii_lowercase())
                .filter(|v| !v.is_empty())
        };
        let mode = match var("PCCL_OFI_HMEM").as_deref() {
            None | Some("auto") => HmemMode::Auto,
            Some("0") => HmemMode::Off,
            Some("1") => HmemMode::On,
            Some(v) => {
                return Err(Error::invalid(format!(
                    "PCCL_OFI_HMEM={v}: expected auto (device buffers to libfabric where the \
                     provider can), 0 (always stage through host memory) or 1 (fail if the \
                     provider cannot)"
                )))
            }
        };
        let iface = match var("PCCL_OFI_HMEM_IFACE").as_deref() {
            None | Some("cuda") => HmemIface::Cuda,
            Some("system") => HmemIface::System,
            Some("rocr") => HmemIface::Rocr,
            Some(v) => {
                return Err(Error::invalid(format!(
                    "PCCL_OFI_HMEM_IFACE={v}: expected cuda, rocr or system (a test hook)"
                )))
            }
        };
        Ok(Hmem { mode, iface })
    }

    /// The iface this rank can use on `ep` (`None`: stage) and why, or an error for
    /// [`HmemMode::On`] when it cannot.
    fn decide(self, ep: &Endpoint) -> Result<(Option<HmemIface>, String)> {
        let prov = &ep.caps.provider;
        let refused = match (self.mode, ep.caps.hmem) {
            (HmemMode::Off, _) => return Ok((None, "off (PCCL_OFI_HMEM=0)".into())),
            (_, false) => format!("provider {prov} does not offer FI_HMEM"),
            (_, true) => match ep.lock().probe_hmem(self.iface) {
                Ok(()) => {
                    return Ok((
                        Some(self.iface),
                        format!(
                            "on: provider {prov} has FI_HMEM and registers {} memory",
                            self.iface.name()
                        ),
                    ))
                }
                Err(why) => format!(
                    "provider {prov} has FI_HMEM but cannot register {} memory ({why})",
                    self.iface.name()
                ),
            },
        };
        if self.mode == HmemMode::On {
            return Err(Error::invalid(format!(
                "PCCL_OFI_HMEM=1 but {refused}: device buffers cannot go to libfabric (use a \
                 libfabric built with {} support, or PCCL_OFI_HMEM=auto to stage through host \
                 memory)",
                self.iface.name()
            )));
        }
        Ok((
            None,
            format!("off: {refused}; device collectives stage through host memory"),
        ))
    }
}

/// The transport of one rank over libfabric.
pub struct OfiTransport {
    sh: Arc<Shared>,
    stop: Arc<AtomicBool>,
    service: Option<JoinHandle<()>>,
}

impl OfiTransport {
    /// Joins the job of `id` as `rank` of `nranks` (collective). `chunk_bytes` (rank 0's wins)
    /// is the piece size of large messages.
    pub fn connect(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        chunk_bytes: usize,
        timeout: Duration,
    ) -> Result<Self> {
        Self::connect_with_hmem(id, nranks, rank, chunk_bytes, timeout, Hmem::from_env()?)
    }

    /// [`OfiTransport::connect`] with the `FI_HMEM` choice given instead of read from
    /// `PCCL_OFI_HMEM` / `PCCL_OFI_HMEM_IFACE`.
    pub fn connect_with_hmem(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        chunk_bytes: usize,
        timeout: Duration,
        hmem: Hmem,
    ) -> Result<Self> {
        let ctl = TcpTransport::connect_with(id, nranks, rank, chunk_bytes, timeout, false)?;
        Self::over(Arc::new(ctl), chunk_bytes, timeout, hmem)
    }

    /// Joins the MPI world (collective over `MPI_COMM_WORLD`, initialising MPI if needed):
    /// the endpoint addresses are exchanged through MPI (an all-to-all of the bootstrap
    /// records over a duplicate of the world), which then stays the control plane (notices,
    /// sub-communicators). No unique id is needed; the ranks are the world's.
    #[cfg(feature = "mpi")]
    pub fn on_mpi_world(chunk_bytes: usize, timeout: Duration) -> Result<Self> {
        let hmem = Hmem::from_env()?;
        let ctl = super::mpi::MpiTransport::world(chunk_bytes)?;
        Self::over(Arc::new(ctl), chunk_bytes, timeout, hmem)
    }

    /// Opens this rank's endpoint and exchanges addresses over the control plane `ctl`; device
    /// buffers go to the provider only if every rank can hand them over (`hmem`).
    fn over(ctl: Arc<dyn Transport>, chunk: usize, timeout: Duration, hmem: Hmem) -> Result<Self> {
        let ep = fabric::open_endpoint()?;
        let (rank, p) = (ctl.rank(), ctl.size());
        let (mut use_hmem, mut hmem_why) = hmem.decide(&ep)?;
        if ep.name.len() > NAME_MAX {
            return Err(Error::system(format!(
                "libfabric: the {} address is {} bytes, more than PCCL handles ({NAME_MAX})",
                ep.caps.provider,
                ep.name.len()
            )));
        }
        let mut mine = [0u8; RECORD];
        mine[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        mine[8..16].copy_from_slice(&(chunk.max(MIN_PIECE) as u64).to_le_bytes());
        // The address length, and in bit HMEM_BIT whether this rank can use FI_HMEM.
        let word16 = ep.name.len() as u64 | (u64::from(use_hmem.is_some()) << HMEM_BIT);
        mine[16..24].copy_from_slice(&word16.to_le_bytes());
        mine[24..24 + ep.name.len()].copy_from_slice(&ep.name);
        let label = format!("{} / {}", ep.caps.provider, ep.caps.fabric);
        let lb = label.as_bytes();
        let lcap = RECORD - 24 - NAME_MAX;
        mine[24 + NAME_MAX..24 + NAME_MAX + lb.len().min(lcap)]
            .copy_from_slice(&lb[..lb.len().min(lcap)]);
        let tag = faults::stamp(0, faults::CONTROL | 0x0f1f_0001);
        let deadline = Instant::now() + timeout;
        let mut sends = Vec::new();
        let mut result = Ok(());
        for j in (0..p).filter(|&j| j != rank) {
            // SAFETY: `mine` outlives every send: all are waited for below, on every path.
            match unsafe { ctl.isend(j, tag, mine.as_ptr(), RECORD) } {
                Ok(s) => sends.push(s),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut names = vec![Vec::new(); p];
        let mut piece = chunk.max(MIN_PIECE);
        if result.is_ok() {
            for (j, name) in names.iter_mut().enumerate() {
                if j == rank {
                    *name = ep.name.clone();
                    continue;
                }
                let mut rec = [0u8; RECORD];
                if let Err(e) = ctl.recv_into(j, tag, &mut rec, deadline) {
                    result = Err(e);
                    break;
                }
                let word = |i: usize| u64::from_le_bytes(rec[i..i + 8].try_into().unwrap());
                let theirs = String::from_utf8_lossy(&rec[24 + NAME_MAX..])
                    .trim_end_matches('\0')
                    .to_string();
                // The provider must match; the fabric may not: each rail of a multi-rail
                // IP network is a subnet of its own (tcp's fabric), joined by routing.
                let provider = |l: &str| l.split(" / ").next().unwrap_or("").to_string();
                if word(0) != MAGIC || provider(&theirs) != provider(&label) {
                    result = Err(Error::invalid(format!(
                        "rank {j} opened libfabric {theirs}, rank {rank} opened {label}: every \
                         rank must use the same provider (set FI_PROVIDER the same everywhere)"
                    )));
                    break;
                }
                let len = ((word(16) & 0xffff_ffff) as usize).min(NAME_MAX);
                *name = rec[24..24 + len].to_vec();
                if use_hmem.is_some() && word(16) >> HMEM_BIT & 1 == 0 {
                    // Every rank must agree: a direct device send meets a direct receive.
                    use_hmem = None;
                    hmem_why = format!(
                        "off: rank {j} cannot hand device buffers to libfabric (its \
                         PCCL_OFI_HMEM or provider); device collectives stage through host \
                         memory"
                    );
                }
                if j == 0 {
                    piece = (word(8) as usize).max(MIN_PIECE);
                }
            }
        }
        for s in sends {
            let r = s.wait(deadline);
            result = result.and(r);
        }
        result?;
        let addrs = ep.lock().insert(&names)?;
        // No data may reach a rank before it knows the sender's address (providers drop or
        // cannot attribute such messages, rxm refuses the connection): a barrier.
        ready(
            ctl.as_ref(),
            faults::stamp(0, faults::CONTROL | 0x0f1f_0002),
            deadline,
        )?;
        if debug_info() {
            eprintln!(
                "pccl: rank {rank}: ofi transport on provider {} (fabric {}, domain {}); device \
                 buffers (FI_HMEM) {hmem_why}; registration {}; pieces of {} bytes; idle waits \
                 {}; rxm eager limit {}",
                ep.caps.provider,
                ep.caps.fabric,
                ep.caps.domain,
                if ep.caps.register {
                    "on (cached)"
                } else {
                    "not needed"
                },
                piece,
                if ep.caps.wait_fd {
                    "block on the completion queue's descriptor"
                } else {
                    "poll"
                },
                std::env::var("FI_OFI_RXM_EAGER_LIMIT").unwrap_or_else(|_| "(default)".into())
            );
        }
        let sh = Arc::new(Shared {
            ep,
            ctl,
            addrs,
            rank,
            piece,
            timeout,
            hmem_asked: hmem,
            hmem: use_hmem,
            bounce: Mutex::new(Vec::new()),
        });
        connect_all(&sh, deadline)?;
        let stop = Arc::new(AtomicBool::new(false));
        let service = spawn_service(Arc::downgrade(&sh), stop.clone())?;
        Ok(OfiTransport {
            sh,
            stop,
            service: Some(service),
        })
    }

    /// What the provider offers (name, domain, `FI_HMEM`, registration).
    pub fn caps(&self) -> &Caps {
        &self.sh.ep.caps
    }

    /// Memory registrations made so far (`fi_mr_reg` calls): repeated collectives on the same
    /// buffers do not add any (0 where the provider needs none).
    pub fn registrations(&self) -> u64 {
        self.sh.ep.registrations.load(Ordering::Relaxed)
    }

    /// The piece size all ranks agreed on.
    pub fn piece_bytes(&self) -> usize {
        self.sh.piece
    }

    /// The iface device buffers are registered with (`None`: device collectives stage
    /// through host memory).
    pub fn hmem_iface(&self) -> Option<HmemIface> {
        self.sh.hmem
    }

    /// The memory kind of device address `ptr`, or a usage error where device buffers do not
    /// go to the provider.
    fn device_mem(&self, ptr: u64) -> Result<Mem> {
        let Some(iface) = self.sh.hmem else {
            return Err(Error::usage(format!(
                "the ofi transport of rank {} does not hand device memory to provider {} \
                 (PCCL_DEBUG=INFO says why): device collectives on it go through pinned host \
                 staging",
                self.sh.rank, self.sh.ep.caps.provider
            )));
        };
        let ordinal = match iface {
            #[cfg(feature = "cuda")]
            HmemIface::Cuda => crate::device::cuda::CudaDevice::ordinal_of(ptr)? as i32,
            _ => {
                let _ = ptr;
                0
            }
        };
        Ok(Mem::Device(iface, ordinal))
    }
}

/// Bit of the bootstrap record's address-length word that says the rank can use `FI_HMEM`.
const HMEM_BIT: u32 = 32;

/// Every rank sends every other a token over libfabric and waits for all of theirs, so the
/// provider's connections (rxm connects on first use) exist before any collective. Without
/// it, with 1.17's rxm, the first messages between two ranks, when they belonged to a
/// collective that failed before the receiver posted anything, were sometimes never taken
/// by its drain receive (their sender then waited 2 s). It also takes connection set-up
/// out of the first collective's time.
fn connect_all(sh: &Arc<Shared>, deadline: Instant) -> Result<()> {
    let tag = faults::stamp(0, faults::CONTROL | 0x0f1f_0004);
    let (rank, p) = (sh.rank, sh.addrs.len());
    let token = MAGIC.to_le_bytes();
    let mut sends = Vec::new();
    let mut result = Ok(());
    for j in (0..p).filter(|&j| j != rank) {
        // SAFETY: `token` outlives every send: all are waited for (or dropped, which lets go
        // of them) before this function returns.
        match unsafe { OfiSend::post(sh.clone(), j, tag, token.as_ptr(), token.len(), Mem::Host) } {
            Ok(s) => sends.push(s),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_ok() {
        for j in (0..p).filter(|&j| j != rank) {
            let mut b = [0u8; 8];
            if let Err(e) = link::recv(sh, j, tag, b.len(), deadline, Target::Into(&mut b)) {
                result = Err(e);
                break;
            }
        }
    }
    for s in sends {
        let r = Box::new(s).wait(deadline);
        result = result.and(r);
    }
    result
}

/// Every rank sends every other a token over the control plane and waits for all of theirs.
fn ready(ctl: &dyn Transport, tag: Tag, deadline: Instant) -> Result<()> {
    let (rank, p) = (ctl.rank(), ctl.size());
    let token = MAGIC.to_le_bytes();
    let mut sends = Vec::new();
    let mut result = Ok(());
    for j in (0..p).filter(|&j| j != rank) {
        // SAFETY: `token` outlives every send: all are waited for below.
        match unsafe { ctl.isend(j, tag, token.as_ptr(), token.len()) } {
            Ok(s) => sends.push(s),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_ok() {
        for j in (0..p).filter(|&j| j != rank) {
            let mut b = [0u8; 8];
            if let Err(e) = ctl.recv_into(j, tag, &mut b, deadline) {
                result = Err(e);
                break;
            }
        }
    }
    for s in sends {
        let r = s.wait(deadline);
        result = result.and(r);
    }
    result
}

pub(crate) fn debug_info() -> bool {
    matches!(
        std::env::var("PCCL_DEBUG")
            .unwrap_or_default()
            .to_ascii_uppercase()
            .as_str(),
        "INFO" | "TRACE"
    )
}

/// Drives the provider every 2 ms while nobody else does (a rank outside PCCL still serves
/// its peers' messages and drains a failed collective's leftovers).
fn spawn_service(sh: Weak<Shared>, stop: Arc<AtomicBool>) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pccl-ofi-progress".into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let Some(sh) = sh.upgrade() else { return };
                if let Some(mut st) = sh.ep.try_lock() {
                    st.progress();
                    st.drain_refused(sh.ctl.faults(), sh.piece);
                }
                drop(sh);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
        .map_err(|e| Error::system(format!("cannot start the libfabric progress thread: {e}")))
}

impl Drop for OfiTransport {
    fn drop(&mut self) {
        // Goodbye barrier: a provider may still touch a peer's endpoint (shm maps the peer's
        // queues) until that peer stops sending, so no rank closes its endpoint while its
        // peers may still be in their last collective. Skipped when a peer is dead or the
        // rank aborted; bounded at 2 s either way.
        if self.sh.ctl.faults().dead_ranks().is_empty() && self.sh.ctl.faults().aborted().is_none()
        {
            let _ = ready(
                self.sh.ctl.as_ref(),
                faults::stamp(0, faults::CONTROL | 0x0f1f_0003),
                Instant::now() + Duration::from_secs(2),
            );
        }
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.service.take() {
            let _ = h.join();
        }
    }
}

impl Transport for OfiTransport {
    fn rank(&self) -> usize {
        self.sh.rank
    }
    fn size(&self) -> usize {
        self.sh.addrs.len()
    }
    fn name(&self) -> &'static str {
        "ofi"
    }
    fn node_key(&self) -> u64 {
        self.sh.ctl.node_key()
    }
    fn faults(&self) -> &Faults {
        self.sh.ctl.faults()
    }
    fn notify(&self, notice: &Notice) {
        self.sh.ctl.notify(notice);
    }

    fn abandon(&self, tag: Tag, why: &str) {
        if !faults::is_control(tag) && !faults::is_p2p(tag) {
            self.sh
                .ep
                .lock()
                .add_junk(faults::seq_of(tag), self.sh.piece);
        }
        self.sh.ctl.abandon(tag, why);
    }

    fn drop_links(&self) -> Result<()> {
        self.sh.ctl.drop_links()?;
        self.sh
            .ep
            .lock()
            .close_with("this rank's links were cut by fault injection (PCCL_FAULT drop)".into());
        Ok(())
    }

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.peer(peer)?;
        // SAFETY: forwarded from the caller (the memory outlives the op's wait).
        Ok(Box::new(unsafe {
            OfiSend::post(self.sh.clone(), peer, tag, ptr, len, Mem::Host)?
        }))
    }

    unsafe fn isendv(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        let _ = piece; // pieces are the endpoint's, agreed at bootstrap
        self.peer(peer)?;
        // SAFETY: forwarded from the caller (every segment outlives the op's wait).
        Ok(Box::new(unsafe {
            OfiSend::post_segs(self.sh.clone(), peer, tag, segs)?
        }))
    }

    unsafe fn recvv_into(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*mut u8, usize)],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let _ = piece;
        self.peer(peer)?;
        let len = segs.iter().map(|s| s.1).sum();
        link::recv(&self.sh, peer, tag, len, deadline, Target::Scatter(segs))
    }

    fn moves_device_memory(&self) -> bool {
        self.sh.hmem.is_some()
    }

    unsafe fn isend_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.peer(peer)?;
        let mem = self.device_mem(ptr)?;
        // SAFETY: forwarded from the caller; the device address is only handed to the
        // provider (with its FI_HMEM registration), never dereferenced here.
        Ok(Box::new(unsafe {
            OfiSend::post(
                self.sh.clone(),
                peer,
                tag,
                ptr as usize as *const u8,
                len,
                mem,
            )?
        }))
    }

    unsafe fn recv_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<()> {
        self.peer(peer)?;
        let mem = self.device_mem(ptr)?;
        link::recv(&self.sh, peer, tag, len, deadline, Target::Device(ptr, mem))
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.peer(peer)?;
        link::recv(&self.sh, peer, tag, len, deadline, Target::Sink(sink))
    }

    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        self.peer(peer)?;
        let len = dst.len();
        link::recv(&self.sh, peer, tag, len, deadline, Target::Into(dst))
    }

    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        let ctl = self.sh.ctl.subset(members, ctx)?;
        Ok(Arc::new(Self::over(
            ctl,
            self.sh.piece,
            self.sh.timeout,
            self.sh.hmem_asked,
        )?))
    }
}

impl OfiTransport {
    fn peer(&self, p: usize) -> Result<()> {
        if p >= self.size() || p == self.sh.rank {
            return Err(Error::invalid(format!(
                "rank {p} is not a peer of rank {} (ofi transport of {} ranks)",
                self.sh.rank,
                self.size()
            )));
        }
        Ok(())
    }
}
