//! The full mesh of a TCP job: one authenticated connection per pair of ranks.
//!
//! Rank `i` dials every higher rank and accepts every lower one. A dialer's first frame is the
//! job secret, a frame kind and `(from, to)`; the acceptor checks the secret before reading
//! anything else (see [`super::gate`]) and answers [`ACK`]. The acceptor runs on its own
//! thread for the whole mesh phase, so lower ranks are let in while this rank dials, and a
//! stranger on the listener never delays them. The acceptor answers only once this rank's
//! shared-memory rings exist (the caller creates them before calling [`mesh`]).
//!
//! A peer that dies or gives up during the mesh is found, not waited out: its listener exists
//! from before the rendezvous until its own mesh is complete, and its mesh cannot complete
//! before it has dialled every higher rank. So a refused dial ends the dialler's mesh at once,
//! and the acceptor probes the lower ranks it still waits for (a bare connection, closed at
//! once, every [`PROBE_EVERY`]): one that refuses has ended without dialling, and the mesh
//! fails naming it. Ranks that fail close their own listeners, so the failure spreads to
//! every rank within a few probes.

use super::gate::{closed, frame, Gate};
use super::secret::Secret;
use super::tcp::{connect_retry, io_err};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Kind of a dialer's first frame.
const KIND: [u8; 8] = *b"PCCLMSH1";
/// Body of that frame: the dialer's rank and the rank it means to reach (u64 each).
const BODY: usize = 16;
/// The acceptor's answer.
const ACK: u64 = 0x5043_434c_4d53_4841;
/// How often the acceptor probes the lower ranks it still waits for.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Lower ranks probed per round (in turn), so a large job's start is not a flood of probes.
const PROBES_PER_ROUND: usize = 8;

/// Connects every pair once and returns the stream to each peer (`None` at `rank`). Each
/// stream's read timeout is set to what is left until `deadline`.
pub(crate) fn mesh(
    listener: TcpListener,
    addrs: &[SocketAddr],
    rank: usize,
    secret: &Secret,
    timeout: Duration,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let stop = AtomicBool::new(false);
    let (lower, higher) = std::thread::scope(|sc| -> Result<_> {
        let acceptor = if rank > 0 {
            let (listener, stop) = (&listener, &stop);
            Some(
                std::thread::Builder::new()
                    .name("pccl-mesh-accept".into())
                    .spawn_scoped(sc, move || {
                        accept_lower(listener, addrs, rank, secret, timeout, deadline, stop)
                    })
                    .map_err(|e| {
                        Error::system(format!("rank {rank}: cannot start the mesh thread: {e}"))
                    })?,
            )
        } else {
            None
        };
        let higher = dial_higher(addrs, rank, secret, deadline);
        if higher.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let lower = match acceptor {
            Some(h) => h.join().map_err(|_| {
                Error::internal(format!("rank {rank}: the mesh accepting thread panicked"))
            })?,
            None => Ok(Vec::new()),
        };
        Ok((lower, higher))
    })?;
    let (lower, higher) = (lower?, higher?);
    let mut streams: Vec<Option<TcpStream>> = lower.into_iter().chain([None]).collect();
    streams.extend(higher.into_iter().map(Some));
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    for s in streams.iter().flatten() {
        s.set_read_timeout(Some(left))
            .map_err(|e| io_err(&format!("rank {rank}: socket option"), e))?;
    }
    Ok(streams)
}

/// Dials every rank above `rank`, in order, and returns their streams.
fn dial_higher(
    addrs: &[SocketAddr],
    rank: usize,
    secret: &Secret,
    deadline: Instant,
) -> Result<Vec<TcpStream>> {
    let mut out = Vec::with_capacity(addrs.len().saturating_sub(rank + 1));
    for (j, addr) in addrs.iter().enumerate().skip(rank + 1) {
        let mut body = [0u8; BODY];
        body[..8].copy_from_slice(&(rank as u64).to_le_bytes());
        body[8..].copy_from_slice(&(j as u64).to_le_bytes());
        let hello = frame(secret, &KIND, &body);
        let what = format!("rank {rank} connecting to rank {j} at {addr}");
        loop {
            let mut s = connect_retry(*addr, deadline).map_err(|e| {
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    Error::remote(format!(
                        "{what}: rank {j} refused the connection, so it ended or gave up \
                         joining (its own error says why)"
                    ))
                } else {
                    io_err(&what, e)
                }
            })?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            s.set_read_timeout(Some(left))
                .and_then(|_| s.set_write_timeout(Some(left)))
                .map_err(|e| io_err(&what, e))?;
            let mut ack = [0u8; 8];
            match s
                .write_all(&hello)
                .and_then(|_| s.flush())
                .and_then(|_| s.read_exact(&mut ack))
            {
                Ok(()) if u64::from_le_bytes(ack) == ACK => {
                    out.push(s);
                    break;
                }
                Ok(()) => {
                    return Err(Error::remote(format!(
                        "{what}: the peer answered the handshake with something that is not \
                         PCCL's"
                    )))
                }
                Err(e) if closed(&e) && Instant::now() < deadline => {
                    // Dropped unanswered (a flooded listener): dial again.
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(io_err(&what, e)),
            }
        }
    }
    Ok(out)
}

/// Lets in every rank below `rank` (and nobody else); returns their streams in rank order.
fn accept_lower(
    listener: &TcpListener,
    addrs: &[SocketAddr],
    rank: usize,
    secret: &Secret,
    timeout: Duration,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Vec<Option<TcpStream>>> {
    let mut gate = Gate::new(listener, secret, &KIND, BODY, timeout)?;
    let mut streams: Vec<Option<TcpStream>> = (0..rank).map(|_| None).collect();
    let mut need = rank;
    let mut next_probe = Instant::now() + PROBE_EVERY;
    let mut turn = 0;
    while need > 0 {
        if stop.load(Ordering::Relaxed) {
            return Ok(streams);
        }
        if Instant::now() >= next_probe {
            let missing: Vec<usize> = (0..rank).filter(|&j| streams[j].is_none()).collect();
            for k in 0..PROBES_PER_ROUND.min(missing.len()) {
                let j = missing[(turn + k) % missing.len()];
                if refuses(addrs[j]) {
                    return Err(Error::remote(format!(
                        "rank {rank}: rank {j} ended or gave up joining before it connected to \
                         this rank (its listener at {} refuses connections; its own error says \
                         why)",
                        addrs[j]
                    )));
                }
            }
            turn += PROBES_PER_ROUND;
            next_probe = Instant::now() + PROBE_EVERY;
        }
        if Instant::now() >= deadline {
            let missing: Vec<String> = (0..rank)
                .filter(|&j| streams[j].is_none())
                .take(8)
                .map(|j| j.to_string())
                .collect();
            return Err(Error::timeout(format!(
                "rank {rank}: {need} lower ranks never connected to its mesh listener within \
                 PCCL_TIMEOUT (ranks {}{}); did they die or fail to join?",
                missing.join(", "),
                if need > 8 { ", ..." } else { "" }
            )));
        }
        for (mut s, body) in gate.poll() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&body[..8]);
            let from = u64::from_le_bytes(w);
            w.copy_from_slice(&body[8..16]);
            let to = u64::from_le_bytes(w);
            // A member that is confused (wrong rank, stale address, second connection) is
            // dropped like a stranger; it fails on its own deadline.
            let Some(from) = usize::try_from(from).ok().filter(|&f| f < rank) else {
                continue;
            };
            if to != rank as u64 || streams[from].is_some() {
                continue;
            }
            let answered = s
                .set_write_timeout(Some(Duration::from_secs(1)))
                .and_then(|_| s.write_all(&ACK.to_le_bytes()))
                .and_then(|_| s.flush());
            if answered.is_ok() {
                streams[from] = Some(s);
                need -= 1;
            }
        }
        gate.pause();
    }
    Ok(streams)
}

/// Whether `addr` refuses a connection (its listener is gone). A connection that opens is
/// closed at once: the peer's gate drops it like any stranger's. A timeout is no answer.
fn refuses(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}
