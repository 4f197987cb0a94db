//! Which rank a timed-out collective really waited for.
//!
//! A rank whose collective ran out its deadline knows only the peer *it* waited for, and that
//! peer is often alive and waiting itself: behind a partition between nodes A and C, the ranks
//! of node B time out on A's ranks, which time out on C's. Every rank that gives up tells the
//! others whom it waited for (its refusal notice, [`super::faults::waits_for`]); after its own
//! timeout a rank listens a short grace period for those notices and follows the chain of
//! waits from itself: it ends in a cycle (ranks that each waited for the other: what they sent
//! each other never arrived — a cut link or a partition between them) or at a rank that sent
//! no word (unreachable from the ranks that waited for it, or stalled). The timeout's message
//! then says so, naming the ranks.

use super::faults::{self, Faults};
use crate::error::{Error, ErrorKind};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What the chain of waits from a rank ends in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Ranks that waited for one another in a cycle (two: each for the other).
    Cycle(Vec<usize>),
    /// A rank that others waited for and that reported nothing.
    Silent(usize),
}

/// The chain of waits from `me` through `waits` (rank → the rank it waited for): the ranks
/// in order, and what it ends in; `None` when `me` waited for nobody known.
pub fn chain(me: usize, waits: &BTreeMap<usize, usize>) -> Option<(Vec<usize>, Cause)> {
    let mut path = vec![me];
    let mut cur = *waits.get(&me)?;
    loop {
        if let Some(i) = path.iter().position(|&r| r == cur) {
            return Some((path.clone(), Cause::Cycle(path[i..].to_vec())));
        }
        path.push(cur);
        match waits.get(&cur) {
            Some(&next) => cur = next,
            None => return Some((path, Cause::Silent(cur))),
        }
    }
}

/// The sentence for a chain.
pub fn explain(path: &[usize], cause: &Cause) -> String {
    let hops: Vec<String> = path
        .windows(2)
        .map(|w| format!("rank {} waited for rank {}", w[0], w[1]))
        .collect();
    let mut s = format!("the ranks' reports: {}", hops.join(", "));
    match cause {
        Cause::Cycle(c) if c.len() == 2 => s.push_str(&format!(
            ", rank {} for rank {}: ranks {} and {} each waited in vain for the other, so what \
             they sent each other never arrived (a cut link or a partition between their nodes)",
            c[1], c[0], c[0], c[1]
        )),
        Cause::Cycle(c) => {
            let last = c[c.len() - 1];
            s.push_str(&format!(
                ", rank {last} for rank {}: ranks {} waited for one another in a cycle (messages \
                 between them were lost, or they run different collectives)",
                c[0],
                c.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Cause::Silent(r) => s.push_str(&format!(
            "; rank {r} sent no word before the others' deadlines: it is unreachable from the \
             ranks that waited for it (a dead link or a partition) or stalled"
        )),
    }
    s
}

/// How long a rank listens for the others' reports after its own timeout: a tenth of the
/// timeout, between 50 ms and 1 s (the ranks of one collective time out together, so their
/// reports arrive within scheduling noise; a call still ends well before a second deadline).
pub fn grace(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// `e`, a timeout of collective `seq` on rank `me`, with the diagnosis appended once the chain
/// of waits is known (a cycle: at once; a silent rank: after `grace`). Other errors, and
/// timeouts whose chain cannot be followed, come back unchanged.
pub fn timeout(faults: &Faults, seq: u32, me: usize, e: Error, grace: Duration) -> Error {
    if e.kind() != ErrorKind::Timeout {
        return e;
    }
    // Only a rank whose own wait ran out listens for the others' reports; one that gave up on
    // another's word says what is known already.
    let own = faults::waits_for(e.message()).is_some_and(|(a, _)| a == me);
    let end = Instant::now() + if own { grace } else { Duration::ZERO };
    let mut found = None;
    loop {
        let mut waits = BTreeMap::new();
        // A reason names the rank that waited (a rank that gave up on the board's word
        // quotes the other's wait, not its own).
        for (_, why) in faults.refusals(seq) {
            if let Some((a, b)) = faults::waits_for(&why) {
                waits.entry(a).or_insert(b);
            }
        }
        let quoted = faults::waits_for(e.message());
        if let Some((a, b)) = quoted {
            waits.entry(a).or_insert(b);
        }
        // From this rank, or from the rank whose timeout ended its wait.
        let start = if waits.contains_key(&me) {
            me
        } else {
            quoted.map_or(me, |q| q.0)
        };
        found = chain(start, &waits).or(found);
        let now = Instant::now();
        if matches!(found, Some((_, Cause::Cycle(_)))) || now >= end {
            break;
        }
        faults.nap((end - now).min(faults::POLL));
    }
    match found {
        // The chain ends at this rank: it came late, the others' words say it all.
        Some((_, Cause::Silent(r))) if r == me => e,
        Some((path, cause)) if path.len() > 1 => Error::new(
            ErrorKind::Timeout,
            format!("{}; {}", e.message(), explain(&path, &cause)),
        ),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(pairs: &[(usize, usize)]) -> BTreeMap<usize, usize> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn chains_end_in_a_cycle_or_at_a_silent_rank() {
        // Node B's rank 2 waited for rank 0, which waited for rank 4, which waited for rank 0.
        let (path, cause) = chain(2, &w(&[(2, 0), (0, 4), (4, 0)])).unwrap();
        assert_eq!(path, vec![2, 0, 4]);
        assert_eq!(cause, Cause::Cycle(vec![0, 4]));
        let s = explain(&path, &cause);
        assert!(
            s.contains("ranks 0 and 4 each waited in vain for the other"),
            "{s}"
        );
        // Rank 3 waited for rank 2, which said nothing.
        let (path, cause) = chain(3, &w(&[(3, 2), (1, 2)])).unwrap();
        assert_eq!((path, cause.clone()), (vec![3, 2], Cause::Silent(2)));
        assert!(explain(&[3, 2], &cause).contains("rank 2 sent no word"));
        // A longer cycle.
        let (_, cause) = chain(0, &w(&[(0, 1), (1, 2), (2, 0)])).unwrap();
        assert_eq!(cause, Cause::Cycle(vec![0, 1, 2]));
        assert!(chain(5, &w(&[(0, 1)])).is_none());
    }

    #[test]
    fn a_timeout_names_the_pair_behind_the_cut_from_the_others_reports() {
        let f = Faults::default();
        let own = faults::timed_out(2, 0, "waited in vain for a message from", true);
        assert_eq!(faults::waits_for(own.message()), Some((2, 0)));
        // Ranks 0 and 4 reported their own timeouts (notices, with the prefix).
        for (a, b) in [(0, 4), (4, 0)] {
            let why = format!(
                "{}{}",
                faults::TIMED_OUT,
                faults::timed_out(a, b, "waited in vain for a message from", true).message()
            );
            f.refuse(9, a, &why);
        }
        let t = Instant::now();
        let e = timeout(&f, 9, 2, own, Duration::from_secs(5));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a cycle needs no grace"
        );
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(
            e.message()
                .contains("rank 2 waited for rank 0, rank 0 waited for rank 4")
                && e.message().contains("ranks 0 and 4 each waited in vain"),
            "{e}"
        );
    }

    #[test]
    fn a_silent_rank_is_named_after_the_grace_and_other_errors_pass_through() {
        let f = Faults::default();
        let own = faults::timed_out(1, 3, "waited in vain for a message from", true);
        let t = Instant::now();
        let e = timeout(&f, 4, 1, own, Duration::from_millis(150));
        assert!(t.elapsed() >= Duration::from_millis(150));
        assert!(e.message().contains("rank 3 sent no word"), "{e}");
        let other = Error::remote("rank 1 left");
        assert_eq!(
            timeout(&f, 4, 1, other, Duration::from_secs(5)).message(),
            "rank 1 left"
        );
        // A rank that gave up on another's word does not wait, and one the chain ends at
        // (it came late) gets the error as it was.
        let late = Error::timeout(
            "rank 1 gave up collective #4 at its deadline: rank 1 waited in vain for a \
             message from rank 3 before the collective's deadline",
        );
        let t = Instant::now();
        let e = timeout(&f, 4, 3, late.clone(), Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_millis(100));
        assert_eq!(e.message(), late.message());
        let t = Instant::now();
        let e = timeout(&f, 4, 0, late, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_millis(100));
        assert!(e.message().contains("rank 3 sent no word"), "{e}");
        // The board's word for a rank that gave up on another's notice names both.
        let quoted = "rank 0 gave up collective #4 at its deadline: rank 0 waited in vain for \
                      a message from rank 4 before the collective's deadline; rank 4 may be stuck";
        assert_eq!(faults::waits_for(quoted), Some((0, 4)));
        assert_eq!(grace(Duration::from_secs(300)), Duration::from_secs(1));
        assert_eq!(grace(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(grace(Duration::from_millis(100)), Duration::from_millis(50));
    }
}
