//! TCP transport, bootstrapped NCCL-style from a unique id.
//!
//! Rank 0 (or whoever calls [`UniqueId::new`]) opens a rendezvous listener; its address and a
//! 256-bit secret drawn from the operating system's random source form the id, which the
//! application hands to every rank (torch does it through its c10d store). Each rank opens its
//! own listener, reports it to the rendezvous, receives everyone's address and builds a full
//! mesh: one connection per pair. A send is a framed message (`tag`, `len`) written by that
//! peer's writer thread straight from the caller's memory; a receive reads the frame on the
//! caller's thread, in pieces of the call's piece size (the tuner's, or `PCCL_CHUNK_SIZE`), so
//! reductions overlap the rest of the transfer.
//!
//! # The unique id is a secret
//!
//! A peer that knows the unique id is a member of the job, as with NCCL: it can take any rank
//! not yet taken and read what is sent to that rank. Hand the id to the ranks over a channel
//! strangers cannot read. Strangers who do not know it can reach the listeners but not the job:
//! every bootstrap connection (to the rendezvous, to each rank's mesh listener) must present
//! the secret first, is checked in constant time before anything else is read, and is dropped
//! silently otherwise or when idle past `min(PCCL_TIMEOUT, 5 s)`; the listeners serve pending
//! connections concurrently, at most 256 at once, so strangers never delay the ranks. Nothing
//! is allocated from a size a peer or a caller sent before it is checked: a job has at most
//! [`MAX_RANKS`] ranks. The bootstrap is not encrypted: someone who can read the network's
//! traffic can read the secret, as with NCCL.
//!
//! Peers on the same host talk through shared-memory rings: files created with mode 0600 and
//! a random name that the receiver sends its peer over their authenticated connection.
//! Same-host peers move messages through the rings; their socket then carries only control
//! frames. A message that fits one ring slot, with nothing queued before it, is published by
//! the sending thread itself (no writer-thread hand-off); a ring wait spins briefly, then
//! sleeps on a futex in the ring that the other side rings (see `shm`).
//!
//! **Failing fast.** Every wait looks at the communicator's failure board at least every
//! [`faults::POLL`] (sockets run with short timeouts, rings sleep at most `shm::NAP`) and ends with
//! its error; a message of an earlier collective is read and dropped whole, one of a later
//! collective is kept (its header, per peer) for the call it belongs to.
//!
//! - *Notices* ([`Transport::notify`]: refusals, aborts) are control frames: on a socket
//!   that carries data they are queued on the peer's writer (so they never cut into a
//!   frame); on a shared-memory pair's socket, which carries nothing else, they are written
//!   at once. Nothing blocks the notifier.
//! - *Reading them while the application waits on another peer*: a monitor thread per
//!   transport sweeps (poll(2)) every socket nobody is reading every [`faults::POLL`] and
//!   reads frame headers off it: notices go to the board, a goodbye is remembered, a data
//!   frame's header is kept for its receive, with the payload left in the socket (no extra
//!   copy: the receive reads the payload straight into its destination). Between sweeps it
//!   watches only the sockets whose "ready" a writer waits for (no wake-up per message);
//!   while the transport is idle it sleeps on every socket instead (no sweeps either). A
//!   socket the application is reading is read by the application, which handles the
//!   control frames it meets the same way.
//! - *Small sends skip the writer thread*: a message of at most 64 KiB with nothing queued
//!   before it is written by the poster itself, into the ring or into the socket without
//!   waiting; the writer thread finishes a frame the socket took only part of.
//! - *Death*: an end of stream (or a reset) without a goodbye records the peer dead, as soon
//!   as the monitor or a receive reaches it, so a process that ended is seen within a poll
//!   step whatever `PCCL_TIMEOUT` is; for a same-host peer the pair's idle socket tells it.
//!   A transport that is dropped says goodbye first, so a normal close is never a death.
//!   Fault injection `drop` shuts every socket down and marks every ring cut.
//! - *Sends never outlive their collective*: a waiter whose collective failed or whose
//!   deadline passed asks the writer to let go; the writer stops reading the caller's
//!   memory within one write step and finishes the frame from zeros, marked abandoned by its
//!   trailer (rings: by a marked slot), so the stream stays framed and the receiver never
//!   takes padding for data (see `writer`).
//!
//! Limits: the monitor does not watch a socket whose next data frame is already announced
//! and waits for its receive; a death behind such a frame is seen when that frame is read,
//! or through the notice of a peer that saw it.

mod link;
mod monitor;
mod wire;
mod writer;
#[cfg(test)]
mod writer_tests;
pub(crate) use self::wire::RENDEZVOUS;
pub(crate) use self::writer::packs_vectored;

use self::link::{lock, Link, Target};
use super::faults::{self, Faults};
use super::mesh::mesh;
use super::rendezvous::join;
pub use super::rendezvous::{UniqueId, MAX_ADDR, MAX_RANKS, UNIQUE_ID_BYTES};
pub use super::secret::SECRET_BYTES;
use super::secret::{random_bytes, Secret};
use super::shm::{ring_path, Ring, RingName};
use super::{fnv1a, hostname, Notice, SendOp, Tag, Transport};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(super) fn io_err(what: &str, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::timeout(format!(
            "{what}: timed out (a peer may have died; raise PCCL_TIMEOUT if it is only slow)"
        )),
        _ => Error::system(format!("{what}: {e}")),
    }
}

/// The address other hosts can reach this one at: `PCCL_SOCKET_ADDR` if set, else the
/// first address the host name resolves to, else loopback.
fn advertised_ip() -> std::net::IpAddr {
    if let Ok(a) = std::env::var("PCCL_SOCKET_ADDR") {
        if let Ok(ip) = a.trim().parse() {
            return ip;
        }
    }
    (hostname().as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.find(|a| a.is_ipv4()))
        .map(|a| a.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// A listening socket on the advertised address (any address if that fails), and the
/// address peers should dial.
pub(super) fn listen() -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind((advertised_ip(), 0))
        .or_else(|_| TcpListener::bind(("0.0.0.0", 0)))
        .map_err(|e| io_err("cannot open a listening socket", e))?;
    let mut addr = listener
        .local_addr()
        .map_err(|e| io_err("listening address", e))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(advertised_ip());
    }
    Ok((listener, addr))
}

fn write_u64(s: &mut impl Write, v: u64) -> std::io::Result<()> {
    s.write_all(&v.to_le_bytes())
}

fn read_u64(s: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// The token same-host peers exchange once they mapped each other's rings.
const SHM_MAPPED: u64 = 0x5043_434c_5348_4d31;

/// The transport of one rank over TCP.
pub struct TcpTransport {
    rank: usize,
    links: Vec<Option<Arc<Link>>>,
    nodes: Vec<u64>,
    chunk: usize,
    timeout: Duration,
    /// This rank's `PCCL_TCP_RENDEZVOUS` (each link uses the larger of its two ends').
    rendezvous: usize,
    /// Congestion control of this rank's sockets (`PCCL_TCP_CONGESTION`; host default: None).
    congestion: Option<Arc<str>>,
    faults: Arc<Faults>,
    /// Tells the monitor thread to end.
    stop: Arc<AtomicBool>,
    /// Wakes the monitor thread (which may sleep long while the transport is idle).
    bell: Arc<monitor::Bell>,
    monitor: Option<JoinHandle<()>>,
    writers: Vec<JoinHandle<()>>,
}

impl TcpTransport {
    /// Joins the job of `id` as `rank` of `nranks`. Collective: every rank must call it.
    /// Peers on the same host talk through shared memory unless `PCCL_SHM_DISABLE=1`.
    pub fn connect(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        chunk_bytes: usize,
        timeout: Duration,
    ) -> Result<Self> {
        // Pin NCCL/UCX/libfabric of this process to its NIC before anything initialises them.
        crate::topology::apply::apply();
        let use_shm = std::env::var("PCCL_SHM_DISABLE")
            .map(|v| v.trim() != "1")
            .unwrap_or(true);
        Self::connect_with(id, nranks, rank, chunk_bytes, timeout, use_shm)
    }

    /// [`TcpTransport::connect`] with the shared-memory choice made explicitly.
    pub fn connect_with(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        chunk_bytes: usize,
        timeout: Duration,
        use_shm: bool,
    ) -> Result<Self> {
        let rendezvous = crate::config::tcp_rendezvous()?;
        Self::connect_with_rendezvous(id, nranks, rank, chunk_bytes, timeout, use_shm, rendezvous)
    }

    /// [`TcpTransport::connect_with`] with this rank's rendezvous threshold given
    /// (`PCCL_TCP_RENDEZVOUS` otherwise; `usize::MAX`: never wait): each link uses the larger
    /// of its two ends' thresholds ([`TcpTransport::rendezvous_with`]). The sockets'
    /// congestion control comes from `PCCL_TCP_CONGESTION` (read before joining, so a bad
    /// value fails here, not after the other ranks have started waiting).
    pub fn connect_with_rendezvous(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        chunk_bytes: usize,
        timeout: Duration,
        use_shm: bool,
        rendezvous: usize,
    ) -> Result<Self> {
        if nranks == 0 || nranks > MAX_RANKS {
            return Err(Error::invalid(format!(
                "rank {rank}: a TCP job has 1 to {MAX_RANKS} ranks, not {nranks}"
            )));
        }
        if rank >= nranks {
            return Err(Error::invalid(format!(
                "rank {rank} is outside a job of {nranks} ranks"
            )));
        }
        let congestion = crate::config::tcp_congestion()?.map(Arc::from);
        let (listener, me) = listen()?;
        let node = fnv1a(hostname().as_bytes());
        let deadline = Instant::now() + timeout;
        let table = join(id, rank, nranks, me, node, deadline)?;
        let (addrs, nodes): (Vec<SocketAddr>, Vec<u64>) = table.into_iter().unzip();
        Self::build(
            use_shm,
            listener,
            &addrs,
            rank,
            id.secret(),
            nodes,
            Settings {
                chunk: chunk_bytes,
                rendezvous,
                congestion,
            },
            timeout,
            deadline,
        )
    }

    /// Creates this rank's inbound rings from same-host peers (files of random names, mode
    /// 0600), connects the mesh, then tells each such peer the name of the ring it writes into
    /// and maps the rings it was told of.
    #[allow(clippy::too_many_arguments)]
    fn build(
        use_shm: bool,
        listener: TcpListener,
        addrs: &[SocketAddr],
        rank: usize,
        secret: &Secret,
        nodes: Vec<u64>,
        sizes: Settings,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Self> {
        let local = |j: usize| use_shm && j != rank && nodes[j] == nodes[rank];
        let mut inbound: Vec<Option<(Ring, RingName)>> = Vec::with_capacity(nodes.len());
        for j in 0..nodes.len() {
            inbound.push(if local(j) {
                let name: RingName = random_bytes()?;
                Some((Ring::create(ring_path(&name))?, name))
            } else {
                None
            });
        }
        let mut streams = mesh(listener, addrs, rank, secret, timeout, deadline)?;
        let shm_err = |j: usize, e| {
            io_err(
                &format!("rank {rank}: shared-memory setup with rank {j}"),
                e,
            )
        };
        // Ring names travel only over the authenticated mesh.
        for j in (0..nodes.len()).filter(|&j| local(j)) {
            if let (Some(st), Some((_, name))) = (streams[j].as_mut(), inbound[j].as_ref()) {
                st.write_all(name)
                    .and_then(|_| st.flush())
                    .map_err(|e| shm_err(j, e))?;
            }
        }
        let mut outbound: Vec<Option<Ring>> = Vec::with_capacity(nodes.len());
        for (j, st) in streams.iter_mut().enumerate() {
            outbound.push(match st.as_mut() {
                Some(st) if local(j) => {
                    let mut name: RingName = Default::default();
                    st.read_exact(&mut name).map_err(|e| shm_err(j, e))?;
                    Some(Ring::open(ring_path(&name))?)
                }
                _ => None,
            });
        }
        // Nobody may return (and possibly exit, removing its ring files) before every local
        // peer has mapped them: exchange a token with each.
        for j in (0..nodes.len()).filter(|&j| local(j)) {
            if let Some(st) = streams[j].as_mut() {
                write_u64(st, SHM_MAPPED)
                    .and_then(|_| st.flush())
                    .map_err(|e| shm_err(j, e))?;
            }
        }
        for j in (0..nodes.len()).filter(|&j| local(j)) {
            if let Some(st) = streams[j].as_mut() {
                if read_u64(st).map_err(|e| shm_err(j, e))? != SHM_MAPPED {
                    return Err(Error::remote(format!(
                        "rank {j} answered rank {rank}'s shared-memory handshake wrongly"
                    )));
                }
            }
        }
        // Each link's rendezvous threshold: the larger of its two ends' settings, so both
        // decide alike about every message (all write, then all read: 8 bytes fit any
        // socket buffer).
        let mut thresholds = vec![sizes.rendezvous; nodes.len()];
        for st in streams.iter_mut().flatten() {
            write_u64(st, sizes.rendezvous as u64)
                .and_then(|_| st.flush())
                .map_err(|e| io_err(&format!("rank {rank}: rendezvous setting"), e))?;
        }
        for (j, st) in streams.iter_mut().enumerate() {
            if let Some(st) = st.as_mut() {
                let theirs = read_u64(st).map_err(|e| {
                    io_err(&format!("rank {rank}: rank {j}'s rendezvous setting"), e)
                })?;
                thresholds[j] = sizes
                    .rendezvous
                    .max(usize::try_from(theirs).unwrap_or(usize::MAX));
            }
        }
        let inbound = inbound.into_iter().map(|r| r.map(|(r, _)| r)).collect();
        Self::from_streams(
            rank,
            streams,
            inbound,
            outbound,
            nodes,
            sizes,
            &thresholds,
            timeout,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn from_streams(
        rank: usize,
        streams: Vec<Option<TcpStream>>,
        inbound: Vec<Option<Ring>>,
        outbound: Vec<Option<Ring>>,
        nodes: Vec<u64>,
        sizes: Settings,
        thresholds: &[usize],
        timeout: Duration,
    ) -> Result<Self> {
        let faults = Arc::new(Faults::default());
        let mut t = TcpTransport {
            rank,
            links: Vec::with_capacity(streams.len()),
            nodes,
            chunk: sizes.chunk.max(4096),
            rendezvous: sizes.rendezvous,
            congestion: sizes.congestion.clone(),
            timeout,
            faults: faults.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            bell: Arc::new(monitor::Bell::new()?),
            monitor: None,
            writers: Vec::new(),
        };
        let bell = t.bell.clone();
        // From here on, a failure drops `t`, which stops every thread started so far.
        for (peer, ((s, ring_in), ring_out)) in
            streams.into_iter().zip(inbound).zip(outbound).enumerate()
        {
            let Some(s) = s else {
                t.links.push(None);
                continue;
            };
            if let Some(cc) = sizes.congestion.as_deref() {
                socket2::SockRef::from(&s)
                    .set_tcp_congestion(cc.as_bytes())
                    .map_err(|e| {
                        Error::invalid(format!(
                            "rank {rank}: PCCL_TCP_CONGESTION={cc} on the socket to rank {peer}: \
                             {e} (the kernel offers net.ipv4.tcp_available_congestion_control; \
                             without CAP_NET_ADMIN only tcp_allowed_congestion_control)"
                        ))
                    })?;
            }
            let mut link = Link::new(
                rank,
                peer,
                faults.clone(),
                s,
                ring_in,
                ring_out,
                bell.clone(),
            )?;
            link.rendezvous = thresholds[peer];
            let link = Arc::new(link);
            let (tx, rx) = channel();
            let l = link.clone();
            let out = match &link.ring_out {
                Some(r) => Ok(r.clone()),
                None => Err(link.socket_clone()?),
            };
            let h = std::thread::Builder::new()
                .name(format!("pccl-tcp-writer-{peer}"))
                .spawn(move || match out {
                    Ok(ring) => writer::ring_writer(ring, l, rx),
                    Err(s) => writer::socket_writer(s, l, rx),
                })
                .map_err(|e| Error::system(format!("cannot start a writer thread: {e}")))?;
            *lock(&link.writer) = Some(tx);
            t.writers.push(h);
            t.links.push(Some(link));
        }
        let links = t.links.iter().flatten().cloned().collect();
        t.monitor = Some(monitor::spawn(links, bell, t.stop.clone())?);
        Ok(t)
    }

    /// The TCP transport of a sub-communicator ([`Transport::subset`]), as a `TcpTransport`
    /// (the libfabric transport's control plane builds its own on it).
    pub(crate) fn sub(&self, members: &[usize], ctx: u64) -> Result<TcpTransport> {
        // A fresh mesh among the members, bootstrapped over this one (whose connections are
        // authenticated): each member opens a listener and sends its address and a fresh
        // secret to every other member; the sub-mesh uses the first member's secret.
        let me = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| Error::internal("subset without this rank"))?;
        let (listener, addr) = listen()?;
        let mine = addr.to_string().into_bytes();
        let mut lens = [0u8; 64 + SECRET_BYTES];
        lens[..mine.len().min(64)].copy_from_slice(&mine[..mine.len().min(64)]);
        let fresh = Secret::random()?;
        lens[64..].copy_from_slice(fresh.as_bytes());
        let mut secret = fresh;
        let deadline = || Instant::now() + self.timeout;
        let tag = faults::stamp(0, faults::CONTROL | (ctx as u32 & !faults::CONTROL));
        let mut sends = Vec::new();
        let mut posted = Ok(());
        for &m in members.iter().filter(|&&m| m != self.rank) {
            // SAFETY: `lens` lives until every posted send is waited for below, on every path.
            match unsafe { self.isend(m, tag, lens.as_ptr(), lens.len()) } {
                Ok(op) => sends.push(op),
                Err(e) => {
                    posted = Err(e);
                    break;
                }
            }
        }
        let received = || -> Result<Vec<SocketAddr>> {
            posted?;
            let mut addrs = Vec::with_capacity(members.len());
            for &m in members {
                if m == self.rank {
                    addrs.push(addr);
                    continue;
                }
                let mut b = [0u8; 64 + SECRET_BYTES];
                self.recv_into(m, tag, &mut b, deadline())?;
                if m == members[0] {
                    let mut first = [0u8; SECRET_BYTES];
                    first.copy_from_slice(&b[64..]);
                    secret = Secret::from_bytes(first);
                }
                let s = std::str::from_utf8(&b[..64])
                    .map_err(|_| Error::remote(format!("rank {m} sent a bad address")))?
                    .trim_end_matches('\0');
                addrs.push(s.parse().map_err(|_| {
                    Error::remote(format!("rank {m} sent a bad peer address '{s}'"))
                })?);
            }
            Ok(addrs)
        };
        let received = received();
        let mut sent = Ok(());
        for s in sends {
            let r = s.wait(deadline());
            sent = sent.and(r);
        }
        let addrs = received?;
        sent?;
        let nodes = members.iter().map(|&m| self.nodes[m]).collect();
        let use_shm = self.links.iter().flatten().any(|l| l.ring_in.is_some());
        Self::build(
            use_shm,
            listener,
            &addrs,
            me,
            &secret,
            nodes,
            Settings {
                chunk: self.chunk,
                rendezvous: self.rendezvous,
                congestion: self.congestion.clone(),
            },
            self.timeout,
            deadline(),
        )
    }

    /// Bytes from which the link to `peer` holds a recursive-doubling plan's message until
    /// the peer is ready for it (the larger of the two ranks' settings); `None` for this rank
    /// itself and for a peer on the same host (shared memory has no rendezvous).
    pub fn rendezvous_with(&self, peer: usize) -> Option<usize> {
        self.links
            .get(peer)?
            .as_ref()
            .filter(|l| l.ring_in.is_none())
            .map(|l| l.rendezvous)
    }

    fn link(&self, p: usize) -> Result<&Arc<Link>> {
        self.links
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::invalid(format!("rank {p} is not a peer of rank {}", self.rank)))
    }
}

/// A transport's settings: its pipelined piece, its rendezvous threshold
/// (`PCCL_TCP_RENDEZVOUS`) and its sockets' congestion control (`PCCL_TCP_CONGESTION`).
#[derive(Clone)]
struct Settings {
    chunk: usize,
    rendezvous: usize,
    congestion: Option<Arc<str>>,
}

/// Dials `addr` from this rank's advertised address (`PCCL_SOCKET_ADDR`, the address of the
/// NIC the map gives it) when it has one, so the host's source routing sends the connection
/// out of that NIC whatever network the destination is on; from any address otherwise.
fn dial(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let from = std::env::var("PCCL_SOCKET_ADDR")
        .ok()
        .and_then(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .filter(|ip| ip.is_ipv4() == addr.is_ipv4() && !ip.is_unspecified());
    let Some(from) = from else {
        return TcpStream::connect_timeout(&addr, timeout);
    };
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    // An address that is not this host's (a stale setting) dials unbound rather than failing.
    let _ = s.bind(&SocketAddr::new(from, 0).into());
    s.connect_timeout(&addr.into(), timeout)?;
    Ok(s.into())
}

/// Dials `addr` until `deadline`. A refused connection is final: every bootstrap address
/// (the rendezvous, a rank's mesh listener) listens before anyone can know it, so a refusal
/// means the process behind it has ended or given up, and waiting cannot help.
pub(super) fn connect_retry(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    loop {
        match dial(addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(e),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.links.len()
    }
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn node_key(&self) -> u64 {
        self.nodes[self.rank]
    }

    fn faults(&self) -> &Faults {
        &self.faults
    }

    fn notify(&self, notice: &Notice) {
        let frame = match notice {
            Notice::Refused { seq, why } => {
                wire::control(wire::Kind::Refused, u64::from(*seq), why)
            }
            Notice::Aborted { why } => wire::control(wire::Kind::Aborted, 0, why),
        };
        for l in self.links.iter().flatten() {
            l.send_control(frame.clone());
        }
    }

    fn drop_links(&self) -> Result<()> {
        for l in self.links.iter().flatten() {
            self.faults.cut_off(
                l.peer,
                "this rank's links were cut by fault injection (PCCL_FAULT drop)",
            );
        }
        for l in self.links.iter().flatten() {
            l.cut();
        }
        Ok(())
    }

    fn isolate(&self, _side: u32, members: &[usize]) -> Result<()> {
        for l in self.links.iter().flatten() {
            if !members.contains(&l.peer) {
                l.silence();
            }
        }
        Ok(())
    }

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller (the memory outlives the op's wait).
        unsafe { writer::post(self.link(peer)?, tag, ptr, len) }
    }

    /// A large strided message goes from where its segments lie (the writer walks them); a
    /// small one is packed (a copy of at most 64 KiB, 512 KiB to a same-host peer, costs less
    /// than the hand-off to the writer thread that the poster's own write avoids), and so is
    /// one of runs shorter than 32 KiB on average (one write step per run).
    unsafe fn isendv(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        let link = self.link(peer)?;
        let len: usize = segs.iter().map(|s| s.1).sum();
        let runs = segs.iter().filter(|s| s.1 > 0).count();
        if runs <= 1 {
            let (ptr, n) = segs
                .iter()
                .copied()
                .find(|s| s.1 > 0)
                .unwrap_or((std::ptr::null(), 0));
            // SAFETY: forwarded from the caller (one segment: a contiguous message).
            return unsafe { self.isend_pieces(peer, tag, ptr, n, piece) };
        }
        if writer::packs(link, len, runs) {
            // SAFETY: forwarded from the caller.
            return unsafe { super::packed_isendv(self, peer, tag, segs, piece) };
        }
        // SAFETY: forwarded from the caller (every segment outlives the op's wait).
        unsafe { writer::post_parts(link, tag, segs) }
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.link(peer)?
            .recv(tag, len, deadline, Target::Sink(sink, self.chunk))
    }

    /// Reads the message straight into the segments (one scattered read per step, no copy
    /// out of a staging piece); the wire is as for any receive.
    unsafe fn recvv_into(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*mut u8, usize)],
        _piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let len = segs.iter().map(|s| s.1).sum();
        let mut parts: Vec<&mut [u8]> = segs
            .iter()
            .filter(|s| s.1 > 0)
            // SAFETY: the caller guarantees `n` writable bytes at `p` that nothing else
            // touches during the call, and segments that do not overlap.
            .map(|&(p, n)| unsafe { std::slice::from_raw_parts_mut(p, n) })
            .collect();
        self.link(peer)?
            .recv(tag, len, deadline, Target::Scatter(&mut parts))
    }

    fn expect(&self, peer: usize, tag: Tag, len: usize) {
        if let Ok(l) = self.link(peer) {
            l.expect(tag, len);
        }
    }

    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        let len = dst.len();
        self.link(peer)?.recv(tag, len, deadline, Target::Into(dst))
    }

    /// A message is one self-describing frame however the sender was told to cut it, so only
    /// the receiver's hand-over to `sink` follows `piece` (a peer with another piece size
    /// interoperates).
    fn recv_pieces(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        piece: Option<usize>,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let piece = piece.map_or(self.chunk, |p| p.max(4096));
        self.link(peer)?
            .recv(tag, len, deadline, Target::Sink(sink, piece))
    }

    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        Ok(Arc::new(self.sub(members, ctx)?))
    }
}

impl Drop for TcpTransport {
    /// Says goodbye to every peer (so closing is never taken for a death), lets the writers
    /// flush it (for a bounded time), then stops the threads and closes the connections.
    fn drop(&mut self) {
        let bye = wire::control(wire::Kind::Goodbye, 0, "");
        for l in self.links.iter().flatten() {
            l.send_control(bye.clone());
            lock(&l.writer).take();
        }
        let give_up = Instant::now() + Duration::from_secs(2);
        while self.writers.iter().any(|h| !h.is_finished()) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(1));
        }
        for l in self.links.iter().flatten() {
            l.finish();
        }
        self.stop.store(true, Ordering::Release);
        self.bell.ring();
        for h in self.writers.drain(..).chain(self.monitor.take()) {
            let _ = h.join();
        }
    }
}
