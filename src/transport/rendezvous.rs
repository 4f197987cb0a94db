//! The unique id of a TCP job and the rendezvous it names.
//!
//! [`UniqueId::new`] opens a rendezvous listener and draws a 256-bit secret from the operating
//! system's random source; the id carries both. **The id is a secret**: whoever knows it is a
//! member of the job (as with NCCL's `ncclUniqueId`): it can join as any rank not yet taken and
//! read what ranks send it. Hand it to the ranks over a channel strangers cannot read.
//!
//! Every rank reports `(rank, nranks, node key, mesh address)` to the rendezvous in one frame
//! that opens with the secret (see [`super::gate`]), and receives everyone's address once all
//! `nranks` have reported. A connection that does not present the secret is dropped before
//! anything else of it is read; strangers are served concurrently with the ranks and never
//! delay them. Sizes are checked before anything is allocated: a job has at most
//! [`MAX_RANKS`] ranks, addresses at most [`MAX_ADDR`] bytes. The first authenticated,
//! well-formed report fixes the job's size; a rank that claims another size, a rank number
//! outside the job or one already taken is refused (an error returned to that rank only), and
//! the others carry on.

use super::gate::{closed, frame, Gate};
use super::secret::{Secret, SECRET_BYTES};
use super::tcp::{connect_retry, io_err, listen};
use crate::error::{Error, Result};
use std::collections::btree_map::{BTreeMap, Entry};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Bytes of a serialised [`UniqueId`] (NCCL's is 128 too).
pub const UNIQUE_ID_BYTES: usize = 128;

/// Most ranks a TCP job may have (4,194,304). Larger counts are refused as invalid arguments
/// before anything is allocated for them.
pub const MAX_RANKS: usize = 1 << 22;

/// Longest socket address (as text) a rank may report; an IPv6 address with a scope id and a
/// port takes at most 58.
pub const MAX_ADDR: usize = 64;

/// Layout of a serialised id: magic, version, address length, secret, address, checksum.
const ID_MAGIC: [u8; 4] = *b"PCCL";
const ID_VERSION: u8 = 1;
const ID_SECRET: usize = 6;
const ID_ADDR: usize = ID_SECRET + SECRET_BYTES;
const ID_SUM: usize = UNIQUE_ID_BYTES - 8;

/// Kind of the frame a rank sends the rendezvous.
const HELLO_KIND: [u8; 8] = *b"PCCLRDV1";
/// Body of that frame: rank, nranks, node key (u64 each), address length (u8), address.
const HELLO_BODY: usize = 3 * 8 + 1 + MAX_ADDR;

/// Answers of the rendezvous (first word of its reply; the second is its job size or 0).
const JOINED: u64 = 1;
const WRONG_SIZE: u64 = 2;
const RANK_TAKEN: u64 = 3;
const BAD_REPORT: u64 = 4;

/// What ranks share to find each other: the rendezvous address and the job's secret.
///
/// Serialised ([`UniqueId::to_bytes`]) as 128 bytes: `b"PCCL"`, a version byte (1), the
/// address's length, the 32-byte secret (bytes 6..38), the address as text (at most 82 bytes),
/// zero padding, and an 8-byte checksum of all that, so a mangled id is refused.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    addr: SocketAddr,
    secret: Secret,
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UniqueId")
            .field("addr", &self.addr)
            .field("secret", &self.secret)
            .finish()
    }
}

fn checksum(b: &[u8]) -> u64 {
    super::fnv1a(b)
}

impl UniqueId {
    /// Opens the rendezvous of a new job (served by a background thread until every rank has
    /// reported, or `timeout` passes) and returns its id. The job's size is the `nranks`
    /// every rank passes to [`super::tcp::TcpTransport::connect`]. The id is a secret: a peer
    /// that knows it is a member of the job.
    pub fn new(timeout: Duration) -> Result<Self> {
        // The rendezvous listens on the advertised address, which the NIC map may choose.
        crate::topology::apply::apply();
        let (listener, addr) = listen()?;
        let secret = Secret::random()?;
        let id = UniqueId { addr, secret };
        if id.addr.to_string().len() > ID_SUM - ID_ADDR {
            return Err(Error::system(format!(
                "the rendezvous address {addr} is too long for a unique id (set PCCL_SOCKET_ADDR \
                 to a shorter one)"
            )));
        }
        let secret = id.secret.clone();
        std::thread::Builder::new()
            .name("pccl-rendezvous".into())
            .spawn(move || {
                if let Err(e) = serve(&listener, &secret, timeout) {
                    eprintln!("PCCL WARN rendezvous: {e}");
                }
            })
            .map_err(|e| Error::system(format!("cannot start the rendezvous thread: {e}")))?;
        Ok(id)
    }

    /// The id as the fixed-size bytes the C ABI and torch pass around.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        let s = self.addr.to_string();
        // `new` and `from_bytes` guarantee the address fits.
        let n = s.len().min(ID_SUM - ID_ADDR);
        b[..4].copy_from_slice(&ID_MAGIC);
        b[4] = ID_VERSION;
        b[5] = n as u8;
        b[ID_SECRET..ID_ADDR].copy_from_slice(self.secret.as_bytes());
        b[ID_ADDR..ID_ADDR + n].copy_from_slice(&s.as_bytes()[..n]);
        let sum = checksum(&b[..ID_SUM]);
        b[ID_SUM..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses [`UniqueId::to_bytes`]; a truncated, altered or foreign id is an invalid
    /// argument.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "not a PCCL unique id ({why}): pass the 128 bytes pcclGetUniqueId / \
                 UniqueId::to_bytes made, unchanged"
            ))
        };
        let b = b.get(..UNIQUE_ID_BYTES).ok_or_else(|| bad("too short"))?;
        if b[..4] != ID_MAGIC || b[4] != ID_VERSION {
            return Err(bad("wrong magic or version"));
        }
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&b[ID_SUM..]);
        if u64::from_le_bytes(sum) != checksum(&b[..ID_SUM]) {
            return Err(bad("checksum mismatch: the id was altered"));
        }
        let n = usize::from(b[5]);
        if n > ID_SUM - ID_ADDR || b[ID_ADDR + n..ID_SUM].iter().any(|&x| x != 0) {
            return Err(bad("bad address length"));
        }
        let addr = std::str::from_utf8(&b[ID_ADDR..ID_ADDR + n])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad rendezvous address"))?;
        let mut secret = [0u8; SECRET_BYTES];
        secret.copy_from_slice(&b[ID_SECRET..ID_ADDR]);
        Ok(UniqueId {
            addr,
            secret: Secret::from_bytes(secret),
        })
    }

    /// The job's secret.
    pub(crate) fn secret(&self) -> &Secret {
        &self.secret
    }
}

/// A rank's report to the rendezvous.
struct Report {
    rank: usize,
    nranks: usize,
    node: u64,
    addr: String,
}

fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[8 * i..8 * i + 8]);
    u64::from_le_bytes(w)
}

/// Parses (and checks) the body of an authenticated hello.
fn parse_report(b: &[u8]) -> Option<Report> {
    if b.len() != HELLO_BODY {
        return None;
    }
    let (rank, nranks, node) = (word(b, 0), word(b, 1), word(b, 2));
    let n = usize::from(b[24]);
    if nranks == 0 || nranks > MAX_RANKS as u64 || rank >= nranks || n > MAX_ADDR {
        return None;
    }
    let addr = std::str::from_utf8(&b[25..25 + n]).ok()?;
    addr.parse::<SocketAddr>().ok()?;
    Some(Report {
        rank: rank as usize,
        nranks: nranks as usize,
        node,
        addr: addr.to_string(),
    })
}

/// Answers `s` with `status` and `value` (a refusal: the rank reads it and gives up).
fn answer(mut s: TcpStream, status: u64, value: u64) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&status.to_le_bytes());
    b[8..].copy_from_slice(&value.to_le_bytes());
    let _ = s.write_all(&b).and_then(|_| s.flush());
}

/// Serves the rendezvous: collects every rank's report, then answers each with the table of
/// everyone's node key and address.
fn serve(listener: &TcpListener, secret: &Secret, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut gate = Gate::new(listener, secret, &HELLO_KIND, HELLO_BODY, timeout)?;
    let mut size: Option<usize> = None;
    // Grows with the reports that arrive, not with the size they claim.
    let mut joined: BTreeMap<usize, (TcpStream, Report)> = BTreeMap::new();
    while size != Some(joined.len()) {
        if Instant::now() >= deadline {
            let missing: Vec<String> = (0..size.unwrap_or(0))
                .filter(|r| !joined.contains_key(r))
                .take(8)
                .map(|r| r.to_string())
                .collect();
            return Err(Error::timeout(format!(
                "only {} of {} ranks reached the rendezvous within PCCL_TIMEOUT (missing ranks: \
                 {}{})",
                joined.len(),
                size.map_or("?".to_string(), |n| n.to_string()),
                missing.join(", "),
                if missing.len() == 8 { ", ..." } else { "" }
            )));
        }
        for (s, body) in gate.poll() {
            let Some(r) = parse_report(&body) else {
                answer(s, BAD_REPORT, size.unwrap_or(0) as u64);
                continue;
            };
            let n = *size.get_or_insert(r.nranks);
            if r.nranks != n {
                answer(s, WRONG_SIZE, n as u64);
                continue;
            }
            match joined.entry(r.rank) {
                Entry::Occupied(_) => answer(s, RANK_TAKEN, n as u64),
                Entry::Vacant(v) => {
                    v.insert((s, r));
                }
            }
        }
        gate.pause();
    }
    let n = joined.len();
    let mut table = Vec::with_capacity(16 + n * (9 + 24));
    table.extend_from_slice(&JOINED.to_le_bytes());
    table.extend_from_slice(&(n as u64).to_le_bytes());
    for (_, r) in joined.values() {
        table.extend_from_slice(&r.node.to_le_bytes());
        table.push(r.addr.len() as u8);
        table.extend_from_slice(r.addr.as_bytes());
    }
    for (rank, (s, _)) in joined.iter_mut() {
        let send = s
            .set_write_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_secs(1)),
            ))
            .and_then(|_| s.write_all(&table))
            .and_then(|_| s.flush());
        if let Err(e) = send {
            eprintln!("PCCL WARN rendezvous: cannot send the table to rank {rank}: {e}");
        }
    }
    Ok(())
}

/// Reports `rank` of `nranks` (listening at `me`, on node `node`) to the rendezvous of `id`
/// and returns every rank's `(address, node key)`. `nranks` must already be checked against
/// [`MAX_RANKS`].
pub(crate) fn join(
    id: &UniqueId,
    rank: usize,
    nranks: usize,
    me: SocketAddr,
    node: u64,
    deadline: Instant,
) -> Result<Vec<(SocketAddr, u64)>> {
    let me_s = me.to_string();
    if me_s.len() > MAX_ADDR {
        return Err(Error::system(format!(
            "rank {rank}: its listening address {me_s} is longer than {MAX_ADDR} bytes (set \
             PCCL_SOCKET_ADDR to a shorter one)"
        )));
    }
    let mut body = [0u8; HELLO_BODY];
    body[..8].copy_from_slice(&(rank as u64).to_le_bytes());
    body[8..16].copy_from_slice(&(nranks as u64).to_le_bytes());
    body[16..24].copy_from_slice(&node.to_le_bytes());
    body[24] = me_s.len() as u8;
    body[25..25 + me_s.len()].copy_from_slice(me_s.as_bytes());
    let hello = frame(&id.secret, &HELLO_KIND, &body);
    let what = format!("rank {rank} at the rendezvous {}", id.addr);
    loop {
        let mut s = connect_retry(id.addr, deadline)
            .map_err(|e| io_err(&format!("{what}: cannot connect"), e))?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        s.set_read_timeout(Some(left))
            .and_then(|_| s.set_write_timeout(Some(left)))
            .map_err(|e| io_err(&what, e))?;
        let mut head = [0u8; 16];
        match s
            .write_all(&hello)
            .and_then(|_| s.flush())
            .and_then(|_| s.read_exact(&mut head))
        {
            Ok(()) => {}
            Err(e) if closed(&e) => {
                // Dropped unanswered: the rendezvous was flooded, or this id's secret is not
                // the one it serves. Dial again until the deadline.
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "{what}: the rendezvous kept closing the connection unanswered until \
                         PCCL_TIMEOUT; is the unique id the current one of this job?"
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(io_err(&what, e)),
        }
        let (status, value) = (word(&head, 0), word(&head, 1));
        return match status {
            JOINED if value == nranks as u64 => read_table(s, nranks, &what),
            WRONG_SIZE | JOINED => Err(Error::invalid(format!(
                "{what}: this rank says the job has {nranks} ranks but the rendezvous's job has \
                 {value}: every rank must pass the same nranks"
            ))),
            RANK_TAKEN => Err(Error::invalid(format!(
                "{what}: rank {rank} already joined this job: every rank must pass a \
                 different rank number"
            ))),
            BAD_REPORT => Err(Error::invalid(format!(
                "{what}: the rendezvous refused rank {rank} of {nranks} (bad rank count or \
                 address)"
            ))),
            other => Err(Error::remote(format!(
                "{what}: the rendezvous answered {other}, which is not a PCCL answer"
            ))),
        };
    }
}

/// Reads the table of `nranks` `(node key, address)` entries the rendezvous sends.
fn read_table(s: TcpStream, nranks: usize, what: &str) -> Result<Vec<(SocketAddr, u64)>> {
    let mut r = BufReader::new(s);
    let mut table = Vec::with_capacity(nranks);
    for j in 0..nranks {
        let mut head = [0u8; 9];
        r.read_exact(&mut head).map_err(|e| io_err(what, e))?;
        let node = word(&head, 0);
        let n = usize::from(head[8]);
        let mut a = [0u8; 255];
        let a = &mut a[..n];
        r.read_exact(a).map_err(|e| io_err(what, e))?;
        let addr = std::str::from_utf8(a)
            .ok()
            .filter(|_| n <= MAX_ADDR)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::remote(format!("{what}: bad address for rank {j}")))?;
        table.push((addr, node));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_outside_the_caps_are_refused() {
        let mut b = [0u8; HELLO_BODY];
        let addr = b"127.0.0.1:5";
        b[24] = addr.len() as u8;
        b[25..25 + addr.len()].copy_from_slice(addr);
        for (rank, nranks, ok) in [
            (0u64, 1u64, true),
            (0, 0, false),
            (1, 1, false),
            (0, 1 << 40, false),
            (0, MAX_RANKS as u64, true),
            (0, MAX_RANKS as u64 + 1, false),
        ] {
            b[..8].copy_from_slice(&rank.to_le_bytes());
            b[8..16].copy_from_slice(&nranks.to_le_bytes());
            assert_eq!(parse_report(&b).is_some(), ok, "rank {rank} of {nranks}");
        }
        b[..16].fill(0);
        b[8] = 1;
        b[24] = MAX_ADDR as u8 + 1;
        assert!(parse_report(&b).is_none());
    }
}
