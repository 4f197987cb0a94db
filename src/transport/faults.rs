//! What a transport knows about failures, and the stamp every message carries.
//!
//! **Stamps.** A message's [`Tag`] is a 64-bit stamp: the collective's sequence number on the
//! communicator (high 32 bits, taken by every call on every rank, failed or not) and a
//! fingerprint of the call (low 32 bits: collective, dtype, op, and a hash of the count, root
//! and algorithm). A receiver accepts only a message with exactly the stamp it expects, so
//! ranks that disagree on what they are running fail instead of pairing silently; a message
//! of an *earlier* sequence number belongs to a collective that failed somewhere and is
//! discarded. Stamps with [`CONTROL`] set carry the transport's own traffic (sub-communicator
//! bootstraps, shrink), which only the peer's own fate can fail.
//!
//! **The board.** [`Faults`] is one communicator's (one transport's) record of what went
//! wrong: collectives a rank refused (with its reason), ranks known dead (how it was
//! detected), a local abort, a peer's abort (revoke). Every blocking wait of a transport
//! calls [`Faults::check`] while it waits, so a refusal, a death or an abort ends every wait
//! on every rank promptly instead of running out the timeout. Transports fill the board from
//! their own signals (notices from peers, closed sockets, vanished processes).

use crate::error::{Error, ErrorKind, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A message's stamp: sequence number (high 32 bits) and call fingerprint (low 32 bits).
pub type Tag = u64;

/// Fingerprint bit of the transport's own traffic (bootstraps of sub-communicators, shrink).
pub const CONTROL: u32 = 1 << 31;

/// Marks a refusal whose cause was a timeout, so the peers report a timeout too.
pub const TIMED_OUT: &str = "[timeout] ";

/// How long a receive that met a later collective's message waits for the board to say why
/// ([`Faults::explain`]).
pub const EXPLAIN: Duration = Duration::from_millis(500);

/// How often a blocked wait looks at the board (bounds how late a failure is noticed).
pub const POLL: Duration = Duration::from_millis(20);

/// The stamp of a message of collective `seq` whose call has fingerprint `call`.
pub fn stamp(seq: u32, call: u32) -> Tag {
    (u64::from(seq) << 32) | u64::from(call)
}

/// The sequence number of a stamp.
pub fn seq_of(tag: Tag) -> u32 {
    (tag >> 32) as u32
}

/// The call fingerprint of a stamp.
pub fn call_of(tag: Tag) -> u32 {
    tag as u32
}

/// Whether a stamp is the transport's own traffic ([`CONTROL`]).
pub fn is_control(tag: Tag) -> bool {
    call_of(tag) & CONTROL != 0
}

/// Whether a message stamped `got` belongs to a collective issued before `want`'s (a
/// collective that failed on some rank and left it behind): the receiver drops it.
pub fn is_stale(got: Tag, want: Tag) -> bool {
    // Sequence numbers wrap: "before" is within half the space behind.
    let d = seq_of(got).wrapping_sub(seq_of(want)) as i32;
    d < 0 && is_control(got) == is_control(want) && is_p2p(got) == is_p2p(want)
}

/// Whether a message stamped `got`, where one stamped `want` was expected (and not stale),
/// shows that its sender is done with `want`'s call: it belongs to a later call, or to
/// other traffic (control traffic where a collective's message was due: the sender gave the
/// collective up and began a shrink or an agreement). Otherwise the two ranks made the same
/// call differently.
pub fn moved_on(got: Tag, want: Tag) -> bool {
    seq_of(got) != seq_of(want)
        || is_control(got) != is_control(want)
        || is_p2p(got) != is_p2p(want)
}

/// Names of the collective kinds a fingerprint can hold (index = the low 4 bits).
const KINDS: [&str; 14] = [
    "barrier",
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "broadcast",
    "shrink",
    "split",
    "device collective",
    "reduce",
    "gather",
    "scatter",
    "all-to-all",
    "all-to-all-v",
    "point-to-point",
];

/// Fingerprint kind of point-to-point messages (with the [`P2P`] flag).
pub const KIND_P2P: u32 = 13;

/// Fingerprint bit of point-to-point traffic: its sequence number counts the messages of one
/// (sender, receiver) pair, not the communicator's collectives, so it is never compared with
/// a collective's (not stale for one, never failed by a collective's refusal).
pub const P2P: u32 = 1 << 30;

/// Whether a stamp is point-to-point traffic ([`P2P`]).
pub fn is_p2p(tag: Tag) -> bool {
    call_of(tag) & (P2P | CONTROL) == P2P
}

/// Fingerprint bit of a collective whose plan exchanges with several peers across the
/// network in turn (recursive doubling or halving over three or more nodes,
/// [`crate::plan::Algorithm::rendezvous`]). A transport may hold such a collective's large
/// messages until their receiver is ready for them: both ends read the choice from the
/// stamp, so they always agree on it. Set apart from the hash, so with checks off too.
pub const RENDEZVOUS: u32 = 1 << 29;

/// Whether a stamp is a collective's with [`RENDEZVOUS`] set.
pub fn is_rendezvous(tag: Tag) -> bool {
    call_of(tag) & (RENDEZVOUS | P2P | CONTROL) == RENDEZVOUS
}
const DTYPES: [&str; 10] = [
    "i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64",
];
const OPS: [&str; 5] = ["sum", "prod", "min", "max", "avg"];

/// Builds a call fingerprint: `kind` indexes the collective names above, `dtype` and `op`
/// are indices + 1 (0 = none), `detail` is hashed into the next 17 bits.
pub fn fingerprint(kind: u32, dtype: u32, op: u32, detail: &[u64]) -> u32 {
    // A multiply-xorshift mix per word: a few nanoseconds per call on the hot path.
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for &d in detail {
        h = (h ^ d).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    // 17 bits: bit 29 is [`RENDEZVOUS`], bit 30 [`P2P`], bit 31 [`CONTROL`].
    let hash = ((h ^ (h >> 29)) as u32) & 0x1_ffff;
    (kind & 0xf) | ((dtype & 0xf) << 4) | ((op & 0xf) << 8) | (hash << 12)
}

/// A human description of a fingerprint ("all-reduce of f32 (sum)"), for mismatch errors.
pub fn describe(call: u32) -> String {
    if call & CONTROL != 0 {
        return "PCCL control traffic".into();
    }
    let kind = KINDS.get((call & 0xf) as usize).copied().unwrap_or("?");
    let dt = (call >> 4) & 0xf;
    let op = (call >> 8) & 0xf;
    let mut s = kind.to_string();
    if dt > 0 {
        s += &format!(
            " of {}",
            DTYPES.get(dt as usize - 1).copied().unwrap_or("?")
        );
    }
    if op > 0 {
        s += &format!(" ({})", OPS.get(op as usize - 1).copied().unwrap_or("?"));
    }
    s
}

/// The error of a message stamped `got` arriving at `rank` from `peer` where `want` was
/// expected (not stale: see [`is_stale`]).
pub fn mismatch(rank: usize, peer: usize, want: Tag, got: Tag) -> Error {
    let (ws, gs) = (seq_of(want), seq_of(got));
    let (wc, gc) = (call_of(want), call_of(got));
    if is_control(got) && !is_control(want) {
        return Error::remote(format!(
            "rank {rank} is running collective #{ws} ({}) but rank {peer} left it without \
             telling why and sent PCCL control traffic (a shrink, split or agreement): did \
             rank {peer} skip this collective, or fail it and go on?",
            describe(wc)
        ));
    }
    if ws != gs {
        return Error::remote(format!(
            "rank {rank} is running collective #{ws} ({}) but rank {peer} sent it a message of \
             its collective #{gs} ({}): the ranks called collectives in different orders or \
             numbers",
            describe(call_of(want)),
            describe(call_of(got))
        ));
    }
    let how = if describe(wc) == describe(gc) {
        "with a different count, root or algorithm".to_string()
    } else {
        format!("as {}", describe(gc))
    };
    Error::remote(format!(
        "collective #{ws}: rank {rank} called {} but rank {peer} called it {how}: do all ranks \
         pass the same count and dtype (and the same PCCL_ALGO)?",
        describe(wc)
    ))
}

#[derive(Default)]
struct Board {
    /// This communicator was aborted here (`abort`), with the reason.
    aborted: Option<String>,
    /// A peer aborted the communicator (it revoked it for everyone).
    revoked: Option<(usize, String)>,
    /// Peers known dead, with how it was detected.
    dead: BTreeMap<usize, String>,
    /// Of those, the ones only this rank's own failure cut off (its links were cut): no
    /// proof that they died, so the survivors' agreement does not count them dead.
    cut_off: std::collections::BTreeSet<usize>,
    /// Collectives some rank refused: (sequence number, rank, why), the newest few, the
    /// first refusal of each.
    refused: VecDeque<(u32, usize, String)>,
    /// Every rank's own refusal report, the newest [`REPORTS`] (the timeout diagnosis).
    reports: VecDeque<(u32, usize, String)>,
}

/// How many refusals the board remembers (a collective older than these has long ended).
const REMEMBER: usize = 256;

/// How many ranks' refusal reports the board keeps for the timeout diagnosis.
const REPORTS: usize = 4096;

/// One communicator's record of failures; see the module documentation.
#[derive(Default)]
pub struct Faults {
    /// 0 while nothing ever went wrong (the hot path's only check), then bumped on each change.
    generation: AtomicU64,
    board: Mutex<Board>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Faults {
    fn update(&self, f: impl FnOnce(&mut Board) -> bool) {
        let mut b = lock(&self.board);
        if f(&mut b) {
            self.generation.fetch_add(1, Ordering::SeqCst);
            self.changed.notify_all();
        }
    }

    /// Records that `rank` refused collective `seq` because of `why`; returns false if a
    /// refusal of that collective was already known (its notice need not be sent again).
    /// Waits end with the first refusal known; every rank's own report is kept besides, for
    /// the timeout diagnosis ([`Self::refusals`], [`super::diagnose`]).
    pub fn refuse(&self, seq: u32, rank: usize, why: &str) -> bool {
        let mut fresh = false;
        self.update(|b| {
            let mut changed = false;
            if !b.reports.iter().any(|(s, r, _)| *s == seq && *r == rank) {
                if b.reports.len() == REPORTS {
                    b.reports.pop_front();
                }
                b.reports.push_back((seq, rank, why.to_string()));
                changed = true;
            }
            if !b.refused.iter().any(|(s, _, _)| *s == seq) {
                if b.refused.len() == REMEMBER {
                    b.refused.pop_front();
                }
                b.refused.push_back((seq, rank, why.to_string()));
                fresh = true;
                changed = true;
            }
            changed
        });
        fresh
    }

    /// Every rank's report of why it refused collective `seq`, as known here: (rank, why), in
    /// arrival order.
    pub fn refusals(&self, seq: u32) -> Vec<(usize, String)> {
        if !self.any() {
            return Vec::new();
        }
        lock(&self.board)
            .reports
            .iter()
            .filter(|(s, _, _)| *s == seq)
            .map(|(_, r, w)| (*r, w.clone()))
            .collect()
    }

    /// Records that `rank` is dead (`how`: what showed it).
    pub fn dead(&self, rank: usize, how: &str) {
        self.update(|b| {
            if b.dead.contains_key(&rank) {
                return false;
            }
            b.dead.insert(rank, how.to_string());
            true
        });
    }

    /// Records that `rank` can no longer be reached because of a failure on this side (this
    /// rank's own links were cut): waits on it fail as for a death, but nothing proves it
    /// died, so [`Faults::confirmed_dead`] leaves it out.
    pub fn cut_off(&self, rank: usize, how: &str) {
        self.update(|b| {
            if b.dead.contains_key(&rank) {
                return false;
            }
            b.dead.insert(rank, how.to_string());
            b.cut_off.insert(rank);
            true
        });
    }

    /// The dead ranks whose death was seen from outside this rank (a closed connection, a
    /// vanished process), not only inferred from a failure here ([`Faults::cut_off`]).
    pub fn confirmed_dead(&self) -> Vec<usize> {
        if !self.any() {
            return Vec::new();
        }
        let b = lock(&self.board);
        b.dead
            .keys()
            .filter(|r| !b.cut_off.contains(r))
            .copied()
            .collect()
    }

    /// Records a local abort; every wait fails from now on.
    pub fn abort(&self, why: &str) {
        self.update(|b| {
            if b.aborted.is_some() {
                return false;
            }
            b.aborted = Some(why.to_string());
            true
        });
    }

    /// Records that peer `rank` aborted (revoked) the communicator.
    pub fn revoked(&self, rank: usize, why: &str) {
        self.update(|b| {
            if b.revoked.is_some() {
                return false;
            }
            b.revoked = Some((rank, why.to_string()));
            true
        });
    }

    /// Whether anything was ever recorded (cheap).
    pub fn any(&self) -> bool {
        self.generation.load(Ordering::Relaxed) != 0
    }

    /// The local abort's reason, if this communicator was aborted here.
    pub fn aborted(&self) -> Option<String> {
        if !self.any() {
            return None;
        }
        lock(&self.board).aborted.clone()
    }

    /// Ranks known dead, with how each was detected.
    pub fn dead_ranks(&self) -> Vec<(usize, String)> {
        if !self.any() {
            return Vec::new();
        }
        lock(&self.board)
            .dead
            .iter()
            .map(|(r, h)| (*r, h.clone()))
            .collect()
    }

    /// Whether a wait for a message stamped `tag` from `peer` must end, and with what error:
    /// a local abort, a peer's abort, a dead rank (for control traffic only `peer` itself),
    /// or a refusal of this collective by any rank.
    pub fn check(&self, tag: Tag, peer: usize) -> Result<()> {
        if !self.any() {
            return Ok(());
        }
        let b = lock(&self.board);
        if let Some(why) = &b.aborted {
            return Err(Error::usage(format!("the communicator was aborted: {why}")));
        }
        if let Some((r, why)) = &b.revoked {
            return Err(Error::remote(format!(
                "rank {r} aborted the communicator ({why}); create a new one (or shrink this one)"
            )));
        }
        if is_control(tag) || is_p2p(tag) {
            if let Some(how) = b.dead.get(&peer) {
                return Err(dead_error(peer, how));
            }
            return Ok(());
        }
        if let Some((r, how)) = b.dead.iter().next() {
            return Err(dead_error(*r, how));
        }
        let seq = seq_of(tag);
        if let Some((_, r, why)) = b.refused.iter().rev().find(|(s, _, _)| *s == seq) {
            if let Some(why) = why.strip_prefix(TIMED_OUT) {
                return Err(Error::timeout(format!(
                    "rank {r} gave up collective #{seq} at its deadline: {why}"
                )));
            }
            return Err(Error::remote(format!(
                "rank {r} refused collective #{seq}: {why}"
            )));
        }
        Ok(())
    }

    /// A number that changes whenever the board does (0 while nothing ever went wrong).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Sequence numbers of the collectives some rank refused (the newest the board keeps),
    /// oldest first: a transport drains their leftover messages.
    pub fn refused_seqs(&self) -> Vec<u32> {
        lock(&self.board)
            .refused
            .iter()
            .map(|(s, _, _)| *s)
            .collect()
    }

    /// A message of a later collective (`got`) came from `peer` where one of `want` was
    /// expected: the peer is done with `want`'s collective without sending this rank its
    /// message, so the collective failed somewhere and the notice saying so is on its way
    /// (a refusing rank tells the others one by one, and the peer may have heard first):
    /// waits up to [`EXPLAIN`] (or `deadline`) for this board to say why, returning that
    /// error, so the error names the cause rather than the symptom. The same holds for
    /// control traffic where a collective's message was expected (the peer gave the
    /// collective up and went on to a shrink or an agreement), whatever its sequence number.
    /// Same-collective mismatches are their own cause: Ok at once.
    pub fn explain(&self, want: Tag, got: Tag, peer: usize, deadline: Instant) -> Result<()> {
        self.check(want, peer)?;
        if !moved_on(got, want) {
            return Ok(());
        }
        let until = deadline.min(Instant::now() + EXPLAIN);
        while Instant::now() < until {
            self.nap(POLL);
            self.check(want, peer)?;
        }
        Ok(())
    }

    /// Sleeps until the board changes or `dur` passes (a waiter's idle step when it has no
    /// event of its own to wait on).
    pub fn nap(&self, dur: Duration) {
        let b = lock(&self.board);
        let g = self.generation.load(Ordering::SeqCst);
        let _ = self
            .changed
            .wait_timeout_while(b, dur, |_| self.generation.load(Ordering::SeqCst) == g);
    }
}

fn dead_error(rank: usize, how: &str) -> Error {
    Error::new(
        ErrorKind::Remote,
        format!(
            "rank {rank} died ({how}); this communicator cannot run collectives any more: \
             shrink it without the dead ranks (Communicator::shrink / pcclCommShrink, or \
             shrink_to_survivors / pcclCommShrinkSurvivors to let the survivors agree) or \
             create a new one"
        ),
    )
}

/// The error of a wait that ran out its collective's deadline, naming the peer (the
/// timeout diagnosis reads who waited for whom back from it: [`waits_for`]).
pub fn timed_out(rank: usize, peer: usize, what: &str, timeout_hint: bool) -> Error {
    let hint = if timeout_hint {
        " (raise PCCL_TIMEOUT if it is only slow)"
    } else {
        ""
    };
    Error::timeout(format!(
        "rank {rank} {what} rank {peer}{DEADLINE_WORDS}; rank {peer} may be \
         stuck, or running a different collective{hint}"
    ))
}

/// The words [`timed_out`] puts after the peer it names.
const DEADLINE_WORDS: &str = " before the collective's deadline";

/// Who waited for whom in a refusal's reason or a timeout's message ([`timed_out`]'s
/// words: "rank A … rank B before the collective's deadline"; a [`TIMED_OUT`] prefix and
/// words in front are skipped): `(A, B)`.
pub fn waits_for(why: &str) -> Option<(usize, usize)> {
    let head = &why[..why.find(DEADLINE_WORDS)?];
    let num = |s: &str| -> Option<usize> {
        let d: String = s.chars().take_while(char::is_ascii_digit).collect();
        d.parse().ok()
    };
    let b = num(&head[head.rfind("rank ")? + 5..])?;
    // A: the "rank N" that starts the sentence of the timeout (the last one before B's that
    // is followed by the waiting words, i.e. the first "rank" of the sentence).
    let sentence = head.rfind(": ").map_or(head, |i| &head[i + 2..]);
    let sentence = sentence.strip_prefix(TIMED_OUT).unwrap_or(sentence);
    let a = num(sentence.strip_prefix("rank ")?)?;
    Some((a, b))
}

/// Waits in steps of at most [`POLL`] until `ready()` or the deadline, checking `faults`
/// for `tag`/`peer` between steps; `step(d)` blocks for up to `d` on the caller's own event.
pub fn wait_until(
    faults: &Faults,
    tag: Tag,
    peer: usize,
    deadline: Instant,
    mut ready: impl FnMut() -> bool,
    mut step: impl FnMut(Duration),
) -> Result<bool> {
    loop {
        if ready() {
            return Ok(true);
        }
        faults.check(tag, peer)?;
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        step((deadline - now).min(POLL));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_order_wraps() {
        let t = stamp(7, fingerprint(3, 9, 1, &[100]));
        assert_eq!(seq_of(t), 7);
        assert_eq!(describe(call_of(t)), "all-reduce of f32 (sum)");
        assert!(is_stale(stamp(6, 1), stamp(7, 2)));
        assert!(!is_stale(stamp(8, 1), stamp(7, 2)));
        assert!(is_stale(stamp(u32::MAX, 1), stamp(0, 2)), "wraps");
        assert!(
            !is_stale(stamp(6, CONTROL), stamp(7, 2)),
            "control never stale for data"
        );
    }

    #[test]
    fn fingerprints_tell_calls_apart() {
        let a = fingerprint(1, 9, 0, &[64]);
        let b = fingerprint(3, 9, 1, &[128]);
        assert_ne!(a, b);
        let e = mismatch(0, 1, stamp(4, a), stamp(4, b));
        assert!(e.message().contains("all-gather of f32"), "{e}");
        assert!(e.message().contains("all-reduce of f32 (sum)"), "{e}");
        let c = fingerprint(1, 9, 0, &[65]);
        assert_ne!(a, c, "counts differ");
        let e = mismatch(0, 1, stamp(4, a), stamp(4, c));
        assert!(e.message().contains("different count"), "{e}");
    }

    #[test]
    fn only_a_stamp_that_asks_for_it_has_a_rendezvous() {
        // The hash never sets the flag bits: a plain call is never taken for one.
        for d in 0..10_000u64 {
            let f = fingerprint(1, 9, 0, &[d, d * 7]);
            assert_eq!(f & (RENDEZVOUS | P2P | CONTROL), 0, "detail {d}");
            assert!(!is_rendezvous(stamp(3, f)));
            assert!(is_rendezvous(stamp(3, f | RENDEZVOUS)));
        }
        // Point-to-point and control traffic never waits for a receiver.
        let f = fingerprint(KIND_P2P, 0, 0, &[1]) | RENDEZVOUS;
        assert!(!is_rendezvous(stamp(1, f | P2P)));
        assert!(!is_rendezvous(stamp(1, f | CONTROL)));
        assert!(is_p2p(stamp(1, f | P2P)), "the flag leaves the class alone");
    }

    #[test]
    fn a_later_collectives_message_waits_for_the_refusal_that_explains_it() {
        let f = std::sync::Arc::new(Faults::default());
        let far = Instant::now() + Duration::from_secs(30);
        // Same collective, other call: its own cause, no wait.
        let t0 = Instant::now();
        assert!(f.explain(stamp(3, 1), stamp(3, 2), 1, far).is_ok());
        assert!(t0.elapsed() < POLL);
        // Collective #4's message where #3's was expected; the refusal of #3 by rank 2
        // arrives 100 ms later: the error names it.
        let g = std::sync::Arc::clone(&f);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            g.refuse(3, 2, "short buffer");
        });
        let e = f.explain(stamp(3, 1), stamp(4, 1), 1, far).unwrap_err();
        late.join().unwrap();
        assert!(e.message().contains("rank 2 refused collective #3"), "{e}");
        // Nothing arrives: Ok after EXPLAIN (the caller reports the mismatch), or sooner at
        // the collective's deadline.
        let t0 = Instant::now();
        assert!(f.explain(stamp(5, 1), stamp(6, 1), 1, far).is_ok());
        assert!(t0.elapsed() >= EXPLAIN && t0.elapsed() < EXPLAIN * 4);
        let t0 = Instant::now();
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(f.explain(stamp(5, 1), stamp(6, 1), 1, soon).is_ok());
        assert!(t0.elapsed() < EXPLAIN);
        // Control traffic (a shrink's) where collective #7's message was due, with the same
        // sequence number: the peer gave #7 up; the death that explains it shows up 100 ms
        // later and the error names it.
        let g = std::sync::Arc::clone(&f);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            g.dead(3, "its connection closed");
        });
        let e = f
            .explain(stamp(7, 1), stamp(7, CONTROL | 5), 1, far)
            .unwrap_err();
        late.join().unwrap();
        assert!(e.message().contains("rank 3 died"), "{e}");
    }

    #[test]
    fn board_reports_refusals_deaths_and_aborts() {
        let f = Faults::default();
        assert!(f.check(stamp(1, 5), 2).is_ok());
        assert!(f.refuse(1, 3, "bad buffer"));
        assert!(!f.refuse(1, 0, "again"));
        let e = f.check(stamp(1, 5), 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert!(
            e.message()
                .contains("rank 3 refused collective #1: bad buffer"),
            "{e}"
        );
        assert!(f.check(stamp(2, 5), 2).is_ok());
        f.dead(4, "connection closed");
        assert!(f
            .check(stamp(2, 5), 2)
            .unwrap_err()
            .message()
            .contains("rank 4 died"));
        assert!(
            f.check(stamp(2, CONTROL), 2).is_ok(),
            "control: only the peer matters"
        );
        assert!(f.check(stamp(2, CONTROL), 4).is_err());
        f.refuse(2, 1, &format!("{TIMED_OUT}waited in vain"));
        let e = f.check(stamp(2, 5), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote, "death first: {e}");
        f.abort("by the test");
        assert_eq!(
            f.check(stamp(2, CONTROL), 2).unwrap_err().kind(),
            ErrorKind::InvalidUsage
        );
    }
}
