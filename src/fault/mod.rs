//! Fault injection (`PCCL_FAULT` or [`crate::config::Config::faults`]): make one rank of a
//! communicator misbehave at one collective, to test that the others fail cleanly.
//!
//! `PCCL_FAULT=rank:seq:kind[,rank:seq:kind...]` — at the communicator's collective number
//! `seq` (0 = the first call; every call counts, failed or not), rank `rank`:
//!
//! | kind | what happens | what the other ranks see |
//! |---|---|---|
//! | `kill` | the rank dies: its process ends at once (thread-ranks: only that thread's rank) | `Remote` naming it, by detection (closed socket, vanished process) |
//! | `stall` | the rank sleeps for twice `PCCL_TIMEOUT` before the collective | `Timeout` naming it, at the collective's deadline |
//! | `slow` | the rank sleeps 50 ms ([`SLOW_MS`]) before the collective | nothing but a slower call (the online tuner's trials must not keep an algorithm for it) |
//! | `drop` | every link of the rank fails, as if its cable were cut; the process lives on | `Remote` naming it, by detection |
//! | `corrupt` | the collective's messages leave with a damaged stamp | `Remote`: the receivers see a call that does not match theirs |
//! | `isolate` | the rank's network goes silent (a partition): every message between it and the ranks outside its side is lost, nobody is told; the ranks isolated at the same collective form one side and still reach each other (thread-ranks and TCP: there the sockets stay open, nothing more is read or written across the cut) | `Timeout` naming it, at the deadline; [`crate::Communicator::shrink_to_survivors`] lets the majority side go on |

use crate::error::{Error, Result};

/// What the faulty rank does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Dies (its process ends; a thread-rank marks only itself).
    Kill,
    /// Sleeps for twice the timeout before running the collective.
    Stall,
    /// Sleeps [`SLOW_MS`] before running the collective: a slow peer, well within any
    /// timeout.
    Slow,
    /// All its links fail; it stays alive.
    Drop,
    /// Its messages of the collective carry a damaged stamp.
    Corrupt,
    /// A partition: its messages to and from the ranks outside its side are lost silently
    /// (the side: every rank isolated at the same collective).
    Isolate,
}

/// How long a `slow` rank sleeps before its collective, in milliseconds.
pub const SLOW_MS: u64 = 50;

/// One injected fault: `rank` misbehaves at its communicator's collective number `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The rank of the communicator that misbehaves.
    pub rank: usize,
    /// The collective (sequence number on the communicator, from 0) where it does.
    pub seq: u32,
    /// How.
    pub kind: FaultKind,
}

/// Parses `PCCL_FAULT`'s value: comma-separated `rank:seq:kind`.
pub fn parse(v: &str) -> Result<Vec<Fault>> {
    let bad = |part: &str, why: &str| {
        Error::invalid(format!(
            "PCCL_FAULT entry '{part}' {why}: expected rank:seq:kind with kind one of kill, \
             stall, slow, drop, corrupt, isolate (e.g. PCCL_FAULT=1:3:kill)"
        ))
    };
    v.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let f: Vec<&str> = part.split(':').map(str::trim).collect();
            let [rank, seq, kind] = f[..] else {
                return Err(bad(part, "does not have three fields"));
            };
            Ok(Fault {
                rank: rank.parse().map_err(|_| bad(part, "has a bad rank"))?,
                seq: seq
                    .parse()
                    .map_err(|_| bad(part, "has a bad collective number"))?,
                kind: match kind.to_ascii_lowercase().as_str() {
                    "kill" => FaultKind::Kill,
                    "stall" => FaultKind::Stall,
                    "slow" => FaultKind::Slow,
                    "drop" => FaultKind::Drop,
                    "corrupt" => FaultKind::Corrupt,
                    "isolate" => FaultKind::Isolate,
                    _ => return Err(bad(part, "has an unknown kind")),
                },
            })
        })
        .collect()
}

/// The fault `rank` must inject at collective `seq`, if any.
pub fn at(faults: &[Fault], rank: usize, seq: u32) -> Option<FaultKind> {
    faults
        .iter()
        .find(|f| f.rank == rank && f.seq == seq)
        .map(|f| f.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_rejects_nonsense() {
        let f = parse("1:3:kill, 0:0:corrupt, 2:5:slow, 3:1:isolate").unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!(at(&f, 3, 1), Some(FaultKind::Isolate));
        assert_eq!(at(&f, 2, 5), Some(FaultKind::Slow));
        assert_eq!(at(&f, 1, 3), Some(FaultKind::Kill));
        assert_eq!(at(&f, 0, 0), Some(FaultKind::Corrupt));
        assert_eq!(at(&f, 0, 1), None);
        for bad in ["1:3", "x:1:kill", "1:1:explode", "1:-1:kill"] {
            let e = parse(bad).unwrap_err();
            assert!(e.message().contains("PCCL_FAULT"), "{e}");
        }
    }
}
