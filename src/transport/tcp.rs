//! TCP transport, bootstrapped NCCL-style from a unique id.
//!
//! Rank 0 (or whoever calls [`UniqueId::new`]) opens a rendezvous listener; its address and a
//! random job key form the id, which the application hands to every rank (torch does it
//! through its c10d store). Each rank opens its own listener, reports it to the rendezvous,
//! receives everyone's address and builds a full mesh: one connection per pair. A send is a
//! framed message written by that peer's writer thread straight from the caller's memory; a
//! receive reads the frame on the caller's thread, in pieces of `PCCL_CHUNK_SIZE`, so
//! reductions overlap the rest of the transfer. Peers on the same host move messages through
//! shared-memory rings instead (`shm`); their socket then carries only control frames.
//!
//! **Failing fast.** Every wait looks at the communicator's failure board at least every
//! [`faults::POLL`] (sockets run with short timeouts, rings wait in short naps) and ends with
//! its error; a message of an earlier collective is read and dropped whole, one of a later
//! collective is kept (its header, per peer) for the call it belongs to.
//!
//! - *Notices* ([`Transport::notify`]: refusals, aborts) are control frames: on a socket
//!   that carries data they are queued on the peer's writer (so they never cut into a
//!   frame); on a shared-memory pair's socket, which carries nothing else, they are written
//!   at once. Nothing blocks the notifier.
//! - *Reading them while the application waits on another peer*: a monitor thread per
//!   transport polls (poll(2)) every socket nobody is reading and reads frame headers off
//!   it: notices go to the board, a goodbye is remembered, a data frame's header is kept for
//!   its receive, with the payload left in the socket (no extra copy: the receive reads the
//!   payload straight into its destination). A socket the application is reading is read by
//!   the application, which handles the control frames it meets the same way.
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

use self::link::{lock, Link, Target};
use super::faults::{self, Faults};
use super::shm::{ring_path, Ring};
use super::{fnv1a, hostname, Notice, SendOp, Tag, Transport};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::thread::JoinHandle;
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

/// The transport of one rank over TCP.
pub struct TcpTransport {
    rank: usize,
    links: Vec<Option<Arc<Link>>>,
    nodes: Vec<u64>,
    /// The job key (names shared-memory files and checks handshakes).
    key: u64,
    chunk: usize,
    timeout: Duration,
    faults: Arc<Faults>,
    /// Tells the monitor thread to end.
    stop: Arc<AtomicBool>,
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
        let faults = Arc::new(Faults::default());
        let mut t = TcpTransport {
            rank,
            links: Vec::with_capacity(streams.len()),
            nodes,
            key: 0,
            chunk: chunk.max(4096),
            timeout,
            faults: faults.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            monitor: None,
            writers: Vec::new(),
        };
        // From here on, a failure drops `t`, which stops every thread started so far.
        for (peer, ((s, ring_in), ring_out)) in
            streams.into_iter().zip(inbound).zip(outbound).enumerate()
        {
            let Some(s) = s else {
                t.links.push(None);
                continue;
            };
            let link = Arc::new(Link::new(rank, peer, faults.clone(), s, ring_in, ring_out)?);
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
        t.monitor = Some(monitor::spawn(links, t.stop.clone())?);
        Ok(t)
    }

    fn link(&self, p: usize) -> Result<&Arc<Link>> {
        self.links
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::invalid(format!("rank {p} is not a peer of rank {}", self.rank)))
    }
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
            self.faults.dead(
                l.peer,
                "this rank's links were cut by fault injection (PCCL_FAULT drop)",
            );
        }
        for l in self.links.iter().flatten() {
            l.cut();
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

    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        let len = dst.len();
        self.link(peer)?.recv(tag, len, deadline, Target::Into(dst))
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
        let use_shm = self.links.iter().flatten().any(|l| l.ring_in.is_some());
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
        for h in self.writers.drain(..).chain(self.monitor.take()) {
            let _ = h.join();
        }
    }
}
