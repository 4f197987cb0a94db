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
//!
//! A rank that holds the id but cannot join (a bad variable, no address to listen on) says so
//! with [`withdraw`]: the rendezvous answers every rank that reported, and every rank that
//! reports later, with that rank's number and reason, so the whole job fails at once naming it
//! instead of waiting out `PCCL_TIMEOUT` (which a torch group sets to 30 minutes). A rendezvous
//! that refuses the connection has ended (it listens before the id exists), so a rank fails at
//! once there too instead of dialling until its deadline.

use super::gate::{closed, frame, Gate};
use super::secret::{Secret, SECRET_BYTES};
use super::tcp::{connect_retry, io_err, listen};
use crate::error::{Error, Result};
use std::collections::btree_map::{BTreeMap, Entry};
use std::collections::BTreeSet;
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
const HELLO_KIND: [u8; 8] = *b"PCCLRDV2";
/// Longest text a hello carries: the rank's address (a report) or why it cannot join (a
/// withdrawal; longer reasons are cut).
const MAX_TEXT: usize = 160;
/// Body of that frame: rank, nranks, node key (u64 each), what it asks (u8: [`REPORT`] or
/// [`WITHDRAW`]), text length (u8), text.
const HELLO_BODY: usize = 3 * 8 + 2 + MAX_TEXT;
/// A hello that reports the rank's address.
const REPORT: u8 = 0;
/// A hello that says the rank cannot join.
const WITHDRAW: u8 = 1;

/// Answers of the rendezvous (first word of its reply; the second is its job size, or the
/// rank that withdrew for [`WITHDRAWN`], which a length byte and that rank's reason follow).
const JOINED: u64 = 1;
const WRONG_SIZE: u64 = 2;
const RANK_TAKEN: u64 = 3;
const BAD_REPORT: u64 = 4;
const WITHDRAWN: u64 = 5;

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

    /// Tells this job's rendezvous that `rank` of `nranks` cannot join, and why, so the ranks
    /// that joined (and those that join later) fail at once with an error naming it instead
    /// of waiting out their timeout. Call it on a rank that holds the id but fails before or
    /// while joining; [`super::select::join`], `pcclCommInitRank` and the launched path do.
    /// Best effort, at most about two seconds, and safe after any failure: a rank that
    /// already joined, or a job that already started, is left alone.
    pub fn withdraw(&self, rank: usize, nranks: usize, why: &str) {
        withdraw(self, rank, nranks, why);
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

/// What an authenticated hello asks.
enum Hello {
    /// The rank joins, listening at its address.
    Report(Report),
    /// The rank cannot join, for the reason given.
    Withdraw {
        rank: usize,
        nranks: usize,
        why: String,
    },
}

impl Hello {
    fn rank(&self) -> usize {
        match self {
            Hello::Report(r) => r.rank,
            Hello::Withdraw { rank, .. } => *rank,
        }
    }
    fn nranks(&self) -> usize {
        match self {
            Hello::Report(r) => r.nranks,
            Hello::Withdraw { nranks, .. } => *nranks,
        }
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[8 * i..8 * i + 8]);
    u64::from_le_bytes(w)
}

/// Parses (and checks) the body of an authenticated hello.
fn parse_hello(b: &[u8]) -> Option<Hello> {
    if b.len() != HELLO_BODY {
        return None;
    }
    let (rank, nranks, node) = (word(b, 0), word(b, 1), word(b, 2));
    let n = usize::from(b[25]);
    if nranks == 0 || nranks > MAX_RANKS as u64 || rank >= nranks || n > MAX_TEXT {
        return None;
    }
    let (rank, nranks) = (rank as usize, nranks as usize);
    let text = &b[26..26 + n];
    match b[24] {
        REPORT if n <= MAX_ADDR => {
            let addr = std::str::from_utf8(text).ok()?;
            addr.parse::<SocketAddr>().ok()?;
            Some(Hello::Report(Report {
                rank,
                nranks,
                node,
                addr: addr.to_string(),
            }))
        }
        WITHDRAW => Some(Hello::Withdraw {
            rank,
            nranks,
            why: String::from_utf8_lossy(text).into_owned(),
        }),
        _ => None,
    }
}

/// A hello body: `rank` of `nranks` on `node` asks `what`, with `text` (cut to [`MAX_TEXT`]
/// bytes at a character boundary).
fn hello_body(rank: usize, nranks: usize, node: u64, what: u8, text: &str) -> [u8; HELLO_BODY] {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut body = [0u8; HELLO_BODY];
    body[..8].copy_from_slice(&(rank as u64).to_le_bytes());
    body[8..16].copy_from_slice(&(nranks as u64).to_le_bytes());
    body[16..24].copy_from_slice(&node.to_le_bytes());
    body[24] = what;
    body[25] = end as u8;
    body[26..26 + end].copy_from_slice(&text.as_bytes()[..end]);
    body
}

/// Answers `s` with `status` and `value` (a refusal: the rank reads it and gives up).
fn answer(mut s: TcpStream, status: u64, value: u64) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&status.to_le_bytes());
    b[8..].copy_from_slice(&value.to_le_bytes());
    let _ = s.write_all(&b).and_then(|_| s.flush());
}

/// Tells a rank that `gone` withdrew from the job, and why (at most [`MAX_TEXT`] bytes).
fn tell_withdrawn(mut s: TcpStream, gone: usize, why: &str) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let why = &why.as_bytes()[..why.len().min(MAX_TEXT)];
    let mut b = Vec::with_capacity(17 + why.len());
    b.extend_from_slice(&WITHDRAWN.to_le_bytes());
    b.extend_from_slice(&(gone as u64).to_le_bytes());
    b.push(why.len() as u8);
    b.extend_from_slice(why);
    let _ = s.write_all(&b).and_then(|_| s.flush());
}

/// Serves the rendezvous: collects every rank's report, then answers each with the table of
/// everyone's node key and address. Once a rank withdraws, every rank that reported and every
/// rank that reports later (until all are accounted for, or the deadline) is told which rank
/// withdrew and why.
fn serve(listener: &TcpListener, secret: &Secret, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut gate = Gate::new(listener, secret, &HELLO_KIND, HELLO_BODY, timeout)?;
    let mut size: Option<usize> = None;
    // Grows with the reports that arrive, not with the size they claim.
    let mut joined: BTreeMap<usize, (TcpStream, Report)> = BTreeMap::new();
    // The first rank that withdrew and its reason; then every rank told so or withdrawn.
    let mut gone: Option<(usize, String)> = None;
    let mut done: BTreeSet<usize> = BTreeSet::new();
    while size != Some(joined.len()) {
        if let (Some((g, why)), Some(n)) = (&gone, size) {
            if done.len() >= n {
                return Err(Error::remote(format!(
                    "rank {g} withdrew from the job ({why}); every rank was told"
                )));
            }
        }
        if Instant::now() >= deadline {
            if let Some((g, why)) = &gone {
                return Err(Error::remote(format!(
                    "rank {g} withdrew from the job ({why}); {} ranks never reported to be told",
                    size.unwrap_or(0).saturating_sub(done.len())
                )));
            }
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
            let Some(h) = parse_hello(&body) else {
                answer(s, BAD_REPORT, size.unwrap_or(0) as u64);
                continue;
            };
            let n = *size.get_or_insert(h.nranks());
            if h.nranks() != n {
                answer(s, WRONG_SIZE, n as u64);
                continue;
            }
            let rank = h.rank();
            match h {
                Hello::Report(r) => match &gone {
                    Some((g, why)) => {
                        tell_withdrawn(s, *g, why);
                        done.insert(rank);
                    }
                    None => match joined.entry(rank) {
                        Entry::Occupied(_) => answer(s, RANK_TAKEN, n as u64),
                        Entry::Vacant(v) => {
                            v.insert((s, r));
                        }
                    },
                },
                // A second process claiming a rank that reported stays a refusal of that
                // process alone: the job goes on.
                Hello::Withdraw { .. } if joined.contains_key(&rank) || done.contains(&rank) => {
                    answer(s, RANK_TAKEN, n as u64)
                }
                Hello::Withdraw { why, .. } => {
                    done.insert(rank);
                    if gone.is_none() {
                        for (r, (st, _)) in std::mem::take(&mut joined) {
                            tell_withdrawn(st, rank, &why);
                            done.insert(r);
                        }
                        gone = Some((rank, why));
                    }
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
    let body = hello_body(rank, nranks, node, REPORT, &me_s);
    let hello = frame(&id.secret, &HELLO_KIND, &body);
    let what = format!("rank {rank} at the rendezvous {}", id.addr);
    loop {
        let mut s = connect_retry(id.addr, deadline).map_err(|e| {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                Error::remote(format!(
                    "{what}: the rendezvous refused the connection, so it has ended: the \
                     process that created the unique id (rank 0) exited or failed, the \
                     rendezvous timed out, or this id's job already started"
                ))
            } else {
                io_err(&format!("{what}: cannot connect"), e)
            }
        })?;
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
            WITHDRAWN => Err(withdrawn(s, value, &what)),
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

/// The error of a rank told that rank `gone` withdrew: the reason follows the answer.
fn withdrawn(mut s: TcpStream, gone: u64, what: &str) -> Error {
    let mut n = [0u8; 1];
    let mut why = [0u8; MAX_TEXT];
    let why = match s.read_exact(&mut n) {
        Ok(()) => {
            let why = &mut why[..usize::from(n[0]).min(MAX_TEXT)];
            match s.read_exact(why) {
                Ok(()) => String::from_utf8_lossy(why).into_owned(),
                Err(_) => "its reason was cut off".into(),
            }
        }
        Err(_) => "no reason given".into(),
    };
    Error::remote(format!(
        "{what}: rank {gone} cannot join the job and withdrew, so no rank can: {why}"
    ))
}

/// Tells the rendezvous of `id` that `rank` of `nranks` cannot join, and why (its error,
/// cut to 160 bytes), so the ranks that reported, and those that report later, fail at once
/// naming it. Best effort and quick: one connection of at most a second, nothing read back.
/// The rendezvous ignores a rank that already reported (a second process claiming its number)
/// and a count that is not the job's, and refuses at once when it has ended (every rank
/// reported, or its deadline passed), so calling this after any failure to join is safe.
fn withdraw(id: &UniqueId, rank: usize, nranks: usize, why: &str) {
    if nranks == 0 || nranks > MAX_RANKS || rank >= nranks {
        return;
    }
    let body = hello_body(rank, nranks, 0, WITHDRAW, why);
    let hello = frame(&id.secret, &HELLO_KIND, &body);
    if let Ok(mut s) = TcpStream::connect_timeout(&id.addr, Duration::from_secs(1)) {
        let _ = s
            .set_write_timeout(Some(Duration::from_secs(1)))
            .and_then(|_| s.write_all(&hello))
            .and_then(|_| s.flush());
        // Wait (briefly) for the rendezvous to read the frame and close, so the frame is not
        // lost to a reset should this process exit at once.
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = s.read(&mut [0u8; 16]);
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
        let ok = |rank: u64, nranks: u64| {
            let mut b = hello_body(0, 1, 0, REPORT, "127.0.0.1:5");
            b[..8].copy_from_slice(&rank.to_le_bytes());
            b[8..16].copy_from_slice(&nranks.to_le_bytes());
            parse_hello(&b).is_some()
        };
        for (rank, nranks, want) in [
            (0u64, 1u64, true),
            (0, 0, false),
            (1, 1, false),
            (0, 1 << 40, false),
            (0, MAX_RANKS as u64, true),
            (0, MAX_RANKS as u64 + 1, false),
        ] {
            assert_eq!(ok(rank, nranks), want, "rank {rank} of {nranks}");
        }
        let mut b = hello_body(0, 1, 0, REPORT, "127.0.0.1:5");
        b[25] = MAX_ADDR as u8 + 1;
        assert!(parse_hello(&b).is_none(), "an address longer than the cap");
        b[25] = MAX_TEXT as u8 + 1;
        b[24] = WITHDRAW;
        assert!(parse_hello(&b).is_none(), "a reason longer than the cap");
        b[24] = 7;
        b[25] = 0;
        assert!(parse_hello(&b).is_none(), "an unknown request");
    }

    #[test]
    fn a_withdrawal_reason_is_cut_at_a_character_boundary() {
        let why = "é".repeat(MAX_TEXT);
        let Some(Hello::Withdraw { rank, nranks, why }) =
            parse_hello(&hello_body(2, 4, 0, WITHDRAW, &why))
        else {
            panic!("not a withdrawal");
        };
        assert_eq!((rank, nranks), (2, 4));
        assert_eq!(why, "é".repeat(MAX_TEXT / 2));
    }

    /// A joining thread: the table it received, or its error.
    type Joiner = std::thread::JoinHandle<Result<Vec<(SocketAddr, u64)>>>;

    /// Ranks of `n` joining `id` from threads (their mesh addresses are never dialled here).
    fn joiners(id: &UniqueId, ranks: &[usize], n: usize) -> Vec<Joiner> {
        ranks
            .iter()
            .map(|&r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let me: SocketAddr = format!("127.0.0.1:{}", 40000 + r).parse().unwrap();
                    join(&id, r, n, me, 7, Instant::now() + Duration::from_secs(30))
                })
            })
            .collect()
    }

    #[test]
    fn a_rank_that_withdraws_fails_every_rank_at_once_naming_it() {
        let id = UniqueId::new(Duration::from_secs(30)).unwrap();
        let t0 = Instant::now();
        let early = joiners(&id, &[0, 1], 4);
        std::thread::sleep(Duration::from_millis(200));
        id.withdraw(2, 4, "PCCL_RANKS_PER_NODE=abc: not a number");
        // Rank 3 reports after the withdrawal and is told as well.
        let late = joiners(&id, &[3], 4);
        for (h, r) in early.into_iter().chain(late).zip([0, 1, 3]) {
            let e = h
                .join()
                .unwrap()
                .expect_err("a rank withdrew: no rank may join");
            assert_eq!(e.kind(), crate::error::ErrorKind::Remote, "rank {r}: {e}");
            let m = e.to_string();
            assert!(
                m.contains("rank 2 cannot join") && m.contains("PCCL_RANKS_PER_NODE=abc"),
                "rank {r}: {m}"
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t0.elapsed()
        );
        // Every rank was told, so the rendezvous has ended: a late dial is refused at once.
        std::thread::sleep(Duration::from_millis(100));
        let t1 = Instant::now();
        let e = join(
            &id,
            1,
            4,
            "127.0.0.1:1".parse().unwrap(),
            7,
            Instant::now() + Duration::from_secs(30),
        )
        .expect_err("the rendezvous has ended");
        assert!(e.to_string().contains("refused"), "{e}");
        assert!(
            t1.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t1.elapsed()
        );
    }

    #[test]
    fn a_withdrawal_claiming_a_rank_that_reported_leaves_the_job_alone() {
        let id = UniqueId::new(Duration::from_secs(30)).unwrap();
        let first = joiners(&id, &[0], 2);
        std::thread::sleep(Duration::from_millis(200));
        id.withdraw(0, 2, "a second process that thinks it is rank 0");
        id.withdraw(1, 3, "a process of another job size");
        let table = joiners(&id, &[1], 2)
            .into_iter()
            .chain(first)
            .map(|h| h.join().unwrap().expect("the job goes on"))
            .collect::<Vec<_>>();
        assert!(table.iter().all(|t| t.len() == 2));
    }
}
