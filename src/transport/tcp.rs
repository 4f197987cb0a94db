//! TCP transport, bootstrapped NCCL-style from a unique id.
//!
//! Rank 0 (or whoever calls [`UniqueId::new`]) opens a rendezvous listener; its address and a
//! 256-bit secret drawn from the operating system's random source form the id, which the
//! application hands to every rank (torch does it through its c10d store). Each rank opens its
//! own listener, reports it to the rendezvous, receives everyone's address and builds a full
//! mesh: one connection per pair. A send is a framed message (`tag`, `len`) written by that
//! peer's writer thread straight from the caller's memory; a receive reads the frame on the
//! caller's thread, in pieces of `PCCL_CHUNK_SIZE`, so reductions overlap the rest of the
//! transfer.
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
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
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

#[derive(Default)]
struct Done {
    state: Mutex<Option<std::result::Result<(), String>>>,
    cv: Condvar,
}

struct WriteJob {
    tag: Tag,
    ptr: usize,
    len: usize,
    done: Arc<Done>,
}

struct Peer {
    writer: Sender<WriteJob>,
    reader: Mutex<TcpStream>,
    /// Inbound shared-memory ring, for a peer on this host.
    shm_in: Option<Mutex<Ring>>,
}

/// The token same-host peers exchange once they mapped each other's rings.
const SHM_MAPPED: u64 = 0x5043_434c_5348_4d31;

/// The transport of one rank over TCP.
pub struct TcpTransport {
    rank: usize,
    peers: Vec<Option<Peer>>,
    nodes: Vec<u64>,
    chunk: usize,
    timeout: Duration,
    faults: Faults,
}

struct TcpSend {
    done: Arc<Done>,
    peer: usize,
}

impl SendOp for TcpSend {
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()> {
        let mut st = self.done.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = st.take() {
                return r.map_err(|m| Error::system(format!("sending to rank {}: {m}", self.peer)));
            }
            let now = Instant::now();
            if now >= deadline {
                // The writer may still be reading our buffer: it is bounded by the socket's
                // write timeout, so wait for it rather than release memory it uses.
                st = self.done.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            st = self
                .done
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Where a peer's writer thread puts messages.
enum Outbound {
    Socket(TcpStream),
    Shm(Ring, Duration),
}

fn writer_loop(out: Outbound, rx: std::sync::mpsc::Receiver<WriteJob>) {
    let mut s = match out {
        Outbound::Socket(s) => s,
        Outbound::Shm(ring, timeout) => {
            while let Ok(job) = rx.recv() {
                let bytes: &[u8] = if job.len == 0 {
                    &[]
                } else {
                    // SAFETY: the sender keeps these bytes valid until `done` is set below.
                    unsafe { std::slice::from_raw_parts(job.ptr as *const u8, job.len) }
                };
                let r = ring.push(u64::from(job.tag), bytes, Instant::now() + timeout);
                *job.done.state.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(r.map_err(|e| e.message().to_string()));
                job.done.cv.notify_all();
            }
            return;
        }
    };
    while let Ok(job) = rx.recv() {
        let r = (|| -> std::io::Result<()> {
            let mut head = [0u8; 16];
            head[..8].copy_from_slice(&u64::from(job.tag).to_le_bytes());
            head[8..].copy_from_slice(&(job.len as u64).to_le_bytes());
            s.write_all(&head)?;
            if job.len > 0 {
                // SAFETY: the sender keeps these bytes valid until `done` is set below
                // (the `isend` contract; `TcpSend::wait` never returns before that).
                let bytes = unsafe { std::slice::from_raw_parts(job.ptr as *const u8, job.len) };
                s.write_all(bytes)?;
            }
            Ok(())
        })();
        *job.done.state.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(r.map_err(|e| e.to_string()));
        job.done.cv.notify_all();
    }
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
            chunk_bytes,
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
        chunk: usize,
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
        let inbound = inbound.into_iter().map(|r| r.map(|(r, _)| r)).collect();
        Self::from_streams(rank, streams, inbound, outbound, nodes, chunk, timeout)
    }

    fn from_streams(
        rank: usize,
        streams: Vec<Option<TcpStream>>,
        inbound: Vec<Option<Ring>>,
        outbound: Vec<Option<Ring>>,
        nodes: Vec<u64>,
        chunk: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let mut peers = Vec::with_capacity(streams.len());
        for ((s, ring_in), ring_out) in streams.into_iter().zip(inbound).zip(outbound) {
            let Some(s) = s else {
                peers.push(None);
                continue;
            };
            s.set_nodelay(true)
                .map_err(|e| io_err("socket option", e))?;
            s.set_read_timeout(Some(timeout))
                .map_err(|e| io_err("socket option", e))?;
            s.set_write_timeout(Some(timeout))
                .map_err(|e| io_err("socket option", e))?;
            let out = match ring_out {
                Some(r) => Outbound::Shm(r, timeout),
                None => Outbound::Socket(s.try_clone().map_err(|e| io_err("socket clone", e))?),
            };
            let (tx, rx) = channel();
            std::thread::Builder::new()
                .name("pccl-tcp-writer".into())
                .spawn(move || writer_loop(out, rx))
                .map_err(|e| Error::system(format!("cannot start a writer thread: {e}")))?;
            peers.push(Some(Peer {
                writer: tx,
                reader: Mutex::new(s),
                shm_in: ring_in.map(Mutex::new),
            }));
        }
        Ok(TcpTransport {
            rank,
            peers,
            nodes,
            chunk: chunk.max(4096),
            timeout,
            faults: Faults::default(),
        })
    }

    fn recv_shm(
        &self,
        ring: &Mutex<Ring>,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        match ring.pop(u64::from(tag), len, deadline, sink)? {
            Ok(()) => Ok(()),
            Err((got_tag, got_len)) => Err(mismatch(self.rank, peer, tag, len, got_tag, got_len)),
        }
    }

    /// Locks `peer`'s socket and reads a frame header, which must announce `tag` and `len`.
    fn read_header<'a>(
        &self,
        p: &'a Peer,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
    ) -> Result<(std::sync::MutexGuard<'a, TcpStream>, String)> {
        let mut s = p.reader.lock().unwrap_or_else(|e| e.into_inner());
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        s.set_read_timeout(Some(wait.min(self.timeout)))
            .map_err(|e| io_err("socket option", e))?;
        let what = format!("rank {} receiving from rank {peer}", self.rank);
        let got_tag = read_u64(&mut *s).map_err(|e| io_err(&what, e))?;
        let got_len = read_u64(&mut *s).map_err(|e| io_err(&what, e))? as usize;
        if got_tag != u64::from(tag) || got_len != len {
            return Err(mismatch(self.rank, peer, tag, len, got_tag, got_len as u64));
        }
        Ok((s, what))
    }

    fn peer(&self, p: usize) -> Result<&Peer> {
        self.peers
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::invalid(format!("rank {p} is not a peer of rank {}", self.rank)))
    }
}

/// The error of a frame that is not the one this rank expected.
fn mismatch(rank: usize, peer: usize, tag: Tag, len: usize, got_tag: u64, got_len: u64) -> Error {
    Error::remote(format!(
        "rank {rank} expected collective #{tag} of {len} bytes from rank {peer} but got #{got_tag} of \
         {got_len} bytes: do all ranks call the same collectives with the same counts?"
    ))
}

pub(super) fn connect_retry(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
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
        self.peers.len()
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

    fn notify(&self, _notice: &Notice) {}

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        let p = self.peer(peer)?;
        let done = Arc::new(Done::default());
        p.writer
            .send(WriteJob {
                tag,
                ptr: ptr as usize,
                len,
                done: done.clone(),
            })
            .map_err(|_| Error::system(format!("the connection to rank {peer} is closed")))?;
        Ok(Box::new(TcpSend { done, peer }))
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let p = self.peer(peer)?;
        if let Some(ring) = &p.shm_in {
            return self.recv_shm(ring, peer, tag, len, deadline, sink);
        }
        let (mut s, what) = self.read_header(p, peer, tag, len, deadline)?;
        // u64 words keep every dtype aligned for the reduction kernels.
        let mut buf = vec![0u64; self.chunk.min(len).div_ceil(8).max(1)];
        let mut off = 0;
        while off < len {
            let n = self.chunk.min(len - off);
            let bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut buf)[..n];
            s.read_exact(bytes).map_err(|e| io_err(&what, e))?;
            sink(off, bytes);
            off += n;
        }
        Ok(())
    }

    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        let len = dst.len();
        let mut pos = 0;
        let p = self.peer(peer)?;
        if let Some(ring) = &p.shm_in {
            return self.recv_shm(ring, peer, tag, len, deadline, &mut |off, b| {
                dst[off..off + b.len()].copy_from_slice(b)
            });
        }
        let (mut s, what) = self.read_header(p, peer, tag, len, deadline)?;
        while pos < len {
            let n = s.read(&mut dst[pos..]).map_err(|e| io_err(&what, e))?;
            if n == 0 {
                return Err(Error::remote(format!("rank {peer} closed the connection")));
            }
            pos += n;
        }
        Ok(())
    }

    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
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
        let use_shm = self.peers.iter().flatten().any(|p| p.shm_in.is_some());
        let t = Self::build(
            use_shm,
            listener,
            &addrs,
            me,
            &secret,
            nodes,
            self.chunk,
            self.timeout,
            deadline(),
        )?;
        Ok(Arc::new(t))
    }
}
