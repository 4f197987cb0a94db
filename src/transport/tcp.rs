//! TCP transport, bootstrapped NCCL-style from a unique id.
//!
//! Rank 0 (or whoever calls [`UniqueId::new`]) opens a rendezvous listener; its address and a
//! random job key form the id, which the application hands to every rank (torch does it
//! through its c10d store). Each rank opens its own listener, reports it to the rendezvous,
//! receives everyone's address and builds a full mesh: one connection per pair. A send is a
//! framed message (`tag`, `len`) written by that peer's writer thread straight from the
//! caller's memory; a receive reads the frame on the caller's thread, in pieces of
//! `PCCL_CHUNK_SIZE`, so reductions overlap the rest of the transfer.

use super::faults::{self, Faults};
use super::shm::{ring_path, Ring};
use super::{fnv1a, hostname, Notice, SendOp, Tag, Transport};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of a serialised [`UniqueId`] (NCCL's is 128 too).
pub const UNIQUE_ID_BYTES: usize = 128;

/// What ranks share to find each other: the rendezvous address and a job key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueId {
    addr: SocketAddr,
    key: u64,
}

fn io_err(what: &str, e: std::io::Error) -> Error {
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
fn listen() -> Result<(TcpListener, SocketAddr)> {
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

fn random_key() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    fnv1a(
        &[
            t.to_le_bytes().as_slice(),
            &std::process::id().to_le_bytes(),
            hostname().as_bytes(),
        ]
        .concat(),
    )
}

fn write_u64(s: &mut impl Write, v: u64) -> std::io::Result<()> {
    s.write_all(&v.to_le_bytes())
}

fn read_u64(s: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn write_str(s: &mut impl Write, v: &str) -> std::io::Result<()> {
    write_u64(s, v.len() as u64)?;
    s.write_all(v.as_bytes())
}

fn read_str(s: &mut impl Read) -> std::io::Result<String> {
    let n = read_u64(s)? as usize;
    if n > 4096 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "address too long",
        ));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    String::from_utf8(b)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "address is not UTF-8"))
}

impl UniqueId {
    /// Opens the rendezvous of a new job (served by a background thread until every rank has
    /// reported, or `timeout` passes) and returns its id. The job's size is the `nranks`
    /// every rank passes to [`TcpTransport::connect`].
    pub fn new(timeout: Duration) -> Result<Self> {
        let (listener, addr) = listen()?;
        let key = random_key();
        std::thread::Builder::new()
            .name("pccl-rendezvous".into())
            .spawn(move || {
                if let Err(e) = serve_rendezvous(listener, key, timeout) {
                    eprintln!("PCCL WARN rendezvous: {e}");
                }
            })
            .map_err(|e| Error::system(format!("cannot start the rendezvous thread: {e}")))?;
        Ok(UniqueId { addr, key })
    }

    /// The id as the fixed-size bytes the C ABI and torch pass around.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(&self.key.to_le_bytes());
        let s = self.addr.to_string();
        let n = s.len().min(UNIQUE_ID_BYTES - 9);
        b[8] = n as u8;
        b[9..9 + n].copy_from_slice(&s.as_bytes()[..n]);
        b
    }

    /// Parses [`UniqueId::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = || Error::invalid("not a PCCL unique id (was it made by pcclGetUniqueId?)");
        if b.len() < UNIQUE_ID_BYTES {
            return Err(bad());
        }
        let key = u64::from_le_bytes(b[..8].try_into().map_err(|_| bad())?);
        let n = b[8] as usize;
        let s = std::str::from_utf8(b.get(9..9 + n).ok_or_else(bad)?).map_err(|_| bad())?;
        let addr = s.parse().map_err(|_| bad())?;
        Ok(UniqueId { addr, key })
    }
}

/// Collects `(rank, address, node key)` from every rank and answers each with the table.
fn serve_rendezvous(listener: TcpListener, key: u64, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("rendezvous", e))?;
    // The job size comes from the first rank to report; every other must agree.
    let mut nranks: Option<usize> = None;
    let mut conns: Vec<Option<(TcpStream, String, u64)>> = Vec::new();
    let mut got = 0;
    while nranks.is_none_or(|n| got < n) {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| io_err("rendezvous", e))?;
                s.set_read_timeout(Some(timeout))
                    .map_err(|e| io_err("rendezvous", e))?;
                let hello = (|| -> std::io::Result<(u64, u64, u64, String, u64)> {
                    Ok((
                        read_u64(&mut s)?,
                        read_u64(&mut s)?,
                        read_u64(&mut s)?,
                        read_str(&mut s)?,
                        read_u64(&mut s)?,
                    ))
                })();
                let Ok((k, rank, n, addr, node)) = hello else {
                    continue;
                };
                let n = n as usize;
                let size = *nranks.get_or_insert(n);
                if conns.is_empty() {
                    conns = (0..size).map(|_| None).collect();
                }
                if k != key || n != size || rank as usize >= size || conns[rank as usize].is_some()
                {
                    let _ = write_u64(&mut s, 0);
                    continue;
                }
                conns[rank as usize] = Some((s, addr, node));
                got += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "only {got} of {} ranks reached the rendezvous",
                        nranks.map_or("?".to_string(), |n| n.to_string())
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io_err("rendezvous accept", e)),
        }
    }
    let table: Vec<(String, u64)> = conns
        .iter()
        .map(|c| {
            c.as_ref()
                .map(|(_, a, n)| (a.clone(), *n))
                .unwrap_or_default()
        })
        .collect();
    for (s, _, _) in conns.iter_mut().flatten() {
        let mut send = || -> std::io::Result<()> {
            write_u64(s, 1)?;
            for (a, n) in &table {
                write_str(s, a)?;
                write_u64(s, *n)?;
            }
            s.flush()
        };
        send().map_err(|e| io_err("rendezvous reply", e))?;
    }
    Ok(())
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

/// The transport of one rank over TCP.
pub struct TcpTransport {
    rank: usize,
    peers: Vec<Option<Peer>>,
    nodes: Vec<u64>,
    /// The job key (names shared-memory files and checks handshakes).
    key: u64,
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
        if rank >= nranks {
            return Err(Error::invalid(format!(
                "rank {rank} is outside a job of {nranks} ranks"
            )));
        }
        let (listener, me) = listen()?;
        let node = fnv1a(hostname().as_bytes());
        let deadline = Instant::now() + timeout;
        let mut root = connect_retry(id.addr, deadline)
            .map_err(|e| io_err("cannot reach the rendezvous", e))?;
        root.set_read_timeout(Some(timeout))
            .map_err(|e| io_err("rendezvous", e))?;
        let table = (|| -> std::io::Result<Option<Vec<(String, u64)>>> {
            write_u64(&mut root, id.key)?;
            write_u64(&mut root, rank as u64)?;
            write_u64(&mut root, nranks as u64)?;
            write_str(&mut root, &me.to_string())?;
            write_u64(&mut root, node)?;
            root.flush()?;
            if read_u64(&mut root)? != 1 {
                return Ok(None);
            }
            (0..nranks).map(|_| Ok((read_str(&mut root)?, read_u64(&mut root)?))).collect::<std::io::Result<Vec<_>>>().map(Some)
        })()
        .map_err(|e| io_err("rendezvous exchange", e))?
        .ok_or_else(|| Error::invalid("the rendezvous refused this rank: wrong unique id, rank counts that differ, or a rank used twice"))?;
        let addrs: Vec<SocketAddr> = table
            .iter()
            .map(|(a, _)| {
                a.parse()
                    .map_err(|_| Error::remote(format!("bad peer address '{a}'")))
            })
            .collect::<Result<_>>()?;
        let nodes: Vec<u64> = table.iter().map(|(_, n)| *n).collect();
        Self::build(
            use_shm,
            listener,
            &addrs,
            rank,
            id.key,
            nodes,
            chunk_bytes,
            timeout,
            deadline,
        )
    }

    /// Creates this rank's inbound rings from same-host peers, connects the mesh (whose
    /// handshake guarantees every peer created its rings first), then maps the outbound rings.
    #[allow(clippy::too_many_arguments)]
    fn build(
        use_shm: bool,
        listener: TcpListener,
        addrs: &[SocketAddr],
        rank: usize,
        key: u64,
        nodes: Vec<u64>,
        chunk: usize,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Self> {
        let local = |j: usize| use_shm && j != rank && nodes[j] == nodes[rank];
        let mut inbound: Vec<Option<Ring>> = Vec::with_capacity(nodes.len());
        for j in 0..nodes.len() {
            inbound.push(if local(j) {
                Some(Ring::create(ring_path(key, j, rank))?)
            } else {
                None
            });
        }
        let streams = mesh(listener, addrs, rank, key, deadline)?;
        let mut outbound: Vec<Option<Ring>> = Vec::with_capacity(nodes.len());
        for j in 0..nodes.len() {
            outbound.push(if local(j) {
                Some(Ring::open(ring_path(key, rank, j))?)
            } else {
                None
            });
        }
        // Nobody may return (and possibly exit, removing its ring files) before every local
        // peer has mapped them: exchange a token with each.
        let mut streams = streams;
        for j in (0..nodes.len()).filter(|&j| local(j)) {
            if let Some(st) = streams[j].as_mut() {
                write_u64(st, key)
                    .and_then(|_| st.flush())
                    .map_err(|e| io_err("shared-memory handshake", e))?;
            }
        }
        for j in (0..nodes.len()).filter(|&j| local(j)) {
            if let Some(st) = streams[j].as_mut() {
                if read_u64(st).map_err(|e| io_err("shared-memory handshake", e))? != key {
                    return Err(Error::remote(format!(
                        "rank {j} answered the shared-memory handshake wrongly"
                    )));
                }
            }
        }
        let mut t = Self::from_streams(rank, streams, inbound, outbound, nodes, chunk, timeout)?;
        t.key = key;
        Ok(t)
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
            key: 0,
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

fn connect_retry(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Connects every pair once: rank `i` dials every higher rank and accepts every lower one.
fn mesh(
    listener: TcpListener,
    addrs: &[SocketAddr],
    rank: usize,
    key: u64,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let n = addrs.len();
    let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    for (j, addr) in addrs.iter().enumerate().skip(rank + 1) {
        let mut s = connect_retry(*addr, deadline)
            .map_err(|e| io_err(&format!("cannot connect to rank {j}"), e))?;
        s.set_read_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10)),
        ))
        .map_err(|e| io_err("handshake", e))?;
        // The acceptor answers only once it is in its own mesh phase, i.e. after it created
        // its shared-memory rings.
        (|| -> std::io::Result<()> {
            write_u64(&mut s, key)?;
            write_u64(&mut s, rank as u64)?;
            s.flush()?;
            if read_u64(&mut s)? != key {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "handshake refused",
                ));
            }
            Ok(())
        })()
        .map_err(|e| io_err(&format!("handshake with rank {j}"), e))?;
        streams[j] = Some(s);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("listen", e))?;
    let mut need = rank;
    while need > 0 {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| io_err("accept", e))?;
                s.set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(10)),
                ))
                .map_err(|e| io_err("accept", e))?;
                let Ok((k, from)) = (|| -> std::io::Result<(u64, u64)> {
                    Ok((read_u64(&mut s)?, read_u64(&mut s)?))
                })() else {
                    continue;
                };
                let from = from as usize;
                if k == key
                    && from < rank
                    && streams[from].is_none()
                    && write_u64(&mut s, key).and_then(|_| s.flush()).is_ok()
                {
                    streams[from] = Some(s);
                    need -= 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "rank {rank}: {need} lower ranks never connected"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(io_err("accept", e)),
        }
    }
    Ok(streams)
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
        // A fresh mesh among the members, bootstrapped over this one: each member opens a
        // listener and sends its address to every other member.
        let me = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| Error::internal("subset without this rank"))?;
        let (listener, addr) = listen()?;
        let mine = addr.to_string().into_bytes();
        let mut lens = [0u8; 64];
        lens[..mine.len().min(64)].copy_from_slice(&mine[..mine.len().min(64)]);
        let deadline = || Instant::now() + self.timeout;
        let tag = faults::stamp(0, faults::CONTROL | (ctx as u32 & !faults::CONTROL));
        let mut sends = Vec::new();
        for &m in members.iter().filter(|&&m| m != self.rank) {
            // SAFETY: `lens` lives until the sends are waited for below.
            sends.push(unsafe { self.isend(m, tag, lens.as_ptr(), lens.len())? });
        }
        let mut addrs = Vec::with_capacity(members.len());
        for &m in members {
            if m == self.rank {
                addrs.push(addr);
                continue;
            }
            let mut b = [0u8; 64];
            self.recv_into(m, tag, &mut b, deadline())?;
            let s = std::str::from_utf8(&b)
                .map_err(|_| Error::remote("bad address"))?
                .trim_end_matches('\0');
            addrs.push(
                s.parse()
                    .map_err(|_| Error::remote(format!("bad peer address '{s}'")))?,
            );
        }
        for s in sends {
            s.wait(deadline())?;
        }
        let nodes = members.iter().map(|&m| self.nodes[m]).collect();
        // Ring files are named by the sub-job's key: unique to this job and this split.
        let key = self.key ^ ctx.rotate_left(17);
        let use_shm = self.peers.iter().flatten().any(|p| p.shm_in.is_some());
        let t = Self::build(
            use_shm,
            listener,
            &addrs,
            me,
            key,
            nodes,
            self.chunk,
            self.timeout,
            deadline(),
        )?;
        Ok(Arc::new(t))
    }
}
