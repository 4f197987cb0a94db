//! The survivors' agreement: after a failure the ranks that can still reach each other agree
//! on who they are, so they can shrink without being told whom to exclude — also after a
//! partition, where nobody is dead and each side only timed out on the other. Only a strict
//! majority of the ranks not known to be dead may go on, so two sides of a partition never
//! both continue (the minority's calls fail, naming what it could reach).
//! (`docs/ARCHITECTURE.md`, "Trust"; ULFM's `MPIX_Comm_agree` / `MPIX_Comm_shrink` are the
//! MPI counterpart.)

use super::Communicator;
use crate::error::{Error, Result};
use crate::transport::faults::{self as stamps, Tag};
use crate::transport::SendOp;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A rank's view: ranks it counts out (unreachable or dead), and of those the dead ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct View {
    out: BTreeSet<usize>,
    dead: BTreeSet<usize>,
}

impl View {
    /// Two bitmaps of `p` bits (out, then dead).
    fn encode(&self, p: usize) -> Vec<u8> {
        let n = p.div_ceil(8);
        let mut b = vec![0u8; 2 * n];
        for &r in &self.out {
            b[r / 8] |= 1 << (r % 8);
        }
        for &r in &self.dead {
            b[n + r / 8] |= 1 << (r % 8);
        }
        b
    }

    fn decode(b: &[u8], p: usize) -> View {
        let n = p.div_ceil(8);
        let bit = |base: usize, r: usize| b[base + r / 8] & (1 << (r % 8)) != 0;
        View {
            out: (0..p).filter(|&r| bit(0, r)).collect(),
            dead: (0..p).filter(|&r| bit(n, r)).collect(),
        }
    }

    fn merge(&mut self, o: &View) {
        self.out.extend(&o.out);
        self.dead.extend(&o.dead);
        self.out.extend(&o.dead);
    }
}

/// Rounds at most: a round that changes no view agrees, and between two such rounds at least
/// one more rank is counted out.
fn max_rounds(p: usize) -> usize {
    (2 * p + 4).min(0xffff)
}

/// The stamp of round `round` of agreement `nth`: control traffic whose sequence numbers lie
/// half the space behind 0, so a leftover is stale for the next agreement's rounds and for
/// the bootstraps of later sub-communicators (sequence number 0), never in their way.
fn round_tag(nth: u32, round: usize) -> Tag {
    let seq = 0x8000_0000 | ((nth & 0x7fff) << 16) | (round as u32 & 0xffff);
    stamps::stamp(
        seq,
        stamps::CONTROL | (stamps::fingerprint(5, 0, 0, &[u64::from(nth)]) & !stamps::CONTROL),
    )
}

/// The end of a round for a rank whose view was `view`: the peers it did not hear from
/// (`unheard`), the views it received, and the deaths its transport saw during the round
/// (`dead`: links the peer's side closed; `confirmed`: of those, the proven deaths). Returns
/// whether the round agreed (every peer heard, each with this very view), after folding into
/// `view` whom the round counts out; an error when a peer counted this rank out.
fn close_round(
    view: &mut View,
    me: usize,
    mut unheard: BTreeSet<usize>,
    views: &[(usize, View)],
    (dead, confirmed): (&[usize], &[usize]),
) -> Result<bool> {
    // Deaths seen during the round: counted out (those proven, dead). A rank already counted
    // out stays as it was counted: its death learned now would change this view after it was
    // sent, and the peers that settled on it in this round would have left while this rank
    // went on alone (CI, 12-02: ranks 3 and 4 of a partition ended, and their closed sockets
    // reached one majority rank a round after the others). Counting a dead rank as
    // unreachable only makes the majority harder to reach.
    for &r in dead {
        if !view.out.contains(&r) {
            unheard.insert(r);
        }
    }
    for &r in confirmed {
        if !view.out.contains(&r) && !view.dead.contains(&r) {
            unheard.insert(r);
            view.dead.insert(r);
        }
    }
    if let Some((r, _)) = views.iter().find(|(_, v)| v.out.contains(&me)) {
        return Err(Error::remote(format!(
            "survivors: rank {r} counted rank {me} out (it could not reach it: a partition, a \
             cut link or a stalled rank); the ranks that agree go on without rank {me}"
        )));
    }
    let agreed = unheard.is_empty() && views.iter().all(|(_, v)| v == view);
    view.out.extend(unheard);
    for (_, v) in views {
        view.merge(v);
    }
    Ok(agreed)
}

impl Communicator {
    /// Agrees with the ranks this one can still reach on which ranks go on, and returns
    /// them (ranks of this communicator, ascending, this one included): the ranks that
    /// return `Ok` return the same list unless the network changed during the agreement
    /// ([`Communicator::shrink_to_survivors`] checks it: a disagreement fails there). Call it
    /// on every rank that is still running after a call failed (a dead peer, a timeout, a
    /// partition); ranks that cannot reach each other, or that the others could not reach,
    /// are counted out. Not after [`Communicator::abort`] (on any rank): an aborted
    /// communicator carries no more traffic.
    ///
    /// A rank returns an error instead when another rank counted it out, or when the ranks
    /// it agrees with are not a strict majority of the ranks not known to be dead (a
    /// connection the peer's side closed, a vanished process; a failure of this rank's own
    /// links proves nothing; a death learned only after the rank was counted out as
    /// unreachable does not count): after a partition only the larger side goes on, and an
    /// even split stops both. Each round in which a rank does not answer costs up to
    /// one timeout ([`Communicator::timeout`]). Thread-ranks, TCP and libfabric; under MPI
    /// every rank must be alive.
    pub fn survivors(&self) -> Result<Vec<usize>> {
        let _one = self.inner.enter("survivors")?;
        let t = &self.inner.transport;
        let (p, me) = (t.size(), t.rank());
        let nth = self.inner.agreements.fetch_add(1, Ordering::SeqCst);
        let mut view = View::default();
        view.out
            .extend(t.faults().dead_ranks().into_iter().map(|(r, _)| r));
        view.dead.extend(t.faults().confirmed_dead());
        // The dead are counted out as well (so a round that agreed merges nothing new).
        let dead = view.dead.clone();
        view.out.extend(dead);
        let mut heard_from: Vec<usize> = Vec::new();
        let mut agreed_before = false;
        for round in 0..max_rounds(p) {
            let tag = round_tag(nth, round);
            let peers: Vec<usize> = (0..p)
                .filter(|&r| r != me && !view.out.contains(&r))
                .collect();
            let msg = view.encode(p);
            let deadline = Instant::now() + self.timeout();
            let mut unheard = BTreeSet::new();
            let mut sends: Vec<(usize, Box<dyn SendOp>)> = Vec::new();
            for &r in &peers {
                // SAFETY: `msg` lives until every posted send is waited for below.
                match unsafe { t.isend(r, tag, msg.as_ptr(), msg.len()) } {
                    Ok(op) => sends.push((r, op)),
                    Err(_) => {
                        unheard.insert(r);
                    }
                }
            }
            let mut views = Vec::new();
            let mut buf = vec![0u8; msg.len()];
            for &r in &peers {
                match t.recv_into(r, tag, &mut buf, deadline) {
                    Ok(()) => views.push((r, View::decode(&buf, p))),
                    Err(_) => {
                        unheard.insert(r);
                    }
                }
            }
            // A peer may read this round's message only once it stopped waiting for one
            // that never came (its receives run in turn, each up to the deadline): sends
            // wait one timeout longer, except to peers already counted out.
            let later = deadline + self.timeout();
            for (r, op) in sends {
                let until = if unheard.contains(&r) {
                    Instant::now()
                } else {
                    later
                };
                if op.wait(until).is_err() {
                    unheard.insert(r);
                }
            }
            let dead: Vec<usize> = t
                .faults()
                .dead_ranks()
                .into_iter()
                .map(|(r, _)| r)
                .collect();
            let agreed = close_round(
                &mut view,
                me,
                unheard,
                &views,
                (&dead, &t.faults().confirmed_dead()),
            )?;
            // Settled: two rounds in a row in which every peer answered with this view. One
            // is not enough: a rank that arrives late still finds the first round's messages
            // (queued, or in its socket) after the others have counted it out; it never gets
            // their next round, so it cannot settle on a list they do not share.
            if agreed && agreed_before {
                heard_from = peers;
                break;
            }
            agreed_before = agreed;
            if round + 1 == max_rounds(p) {
                return Err(Error::remote(format!(
                    "survivors: rank {me} found no agreement in {} rounds (ranks kept \
                     appearing and disappearing)",
                    max_rounds(p)
                )));
            }
        }
        let alive: Vec<usize> = (0..p).filter(|r| !view.out.contains(r)).collect();
        let eligible = p - view.dead.len();
        if 2 * alive.len() <= eligible {
            let unreachable: Vec<usize> = view.out.difference(&view.dead).copied().collect();
            return Err(Error::remote(format!(
                "survivors: rank {me} reaches only ranks {alive:?} ({} of the {eligible} ranks \
                 not known dead; unreachable: {unreachable:?}, dead: {:?}): not a majority, so \
                 it must not go on (the other side of a partition may); heard from {} peers \
                 in the last round",
                alive.len(),
                view.dead,
                heard_from.len()
            )));
        }
        Ok(alive)
    }

    /// [`Communicator::survivors`], then [`Communicator::shrink`] without the ranks they
    /// counted out: the way on after a failure when the survivors do not know whom to
    /// exclude (a partition, a stalled rank). Fails where `survivors` does.
    pub fn shrink_to_survivors(&self) -> Result<Communicator> {
        let alive = self.survivors()?;
        let excluded: Vec<usize> = (0..self.size())
            .filter(|r| alive.binary_search(r).is_err())
            .collect();
        self.shrink(&excluded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(out: &[usize], dead: &[usize]) -> View {
        View {
            out: out.iter().copied().collect(),
            dead: dead.iter().copied().collect(),
        }
    }

    #[test]
    fn a_death_learned_after_the_rank_was_counted_out_leaves_an_agreed_round_agreed() {
        // Rank 2 of five after a partition cut 3 and 4 off: ranks 0 and 1 answer with its
        // view, and only now do 3's and 4's closed sockets reach it. Had the deaths changed
        // its view, it would go on alone into another round while 0 and 1 left to shrink.
        let mut v = view(&[3, 4], &[]);
        let peers = [(0, v.clone()), (1, v.clone())];
        let agreed = close_round(&mut v, 2, BTreeSet::new(), &peers, (&[3, 4], &[3, 4]));
        assert!(agreed.unwrap());
        assert_eq!(v, view(&[3, 4], &[]), "the view changed after it was sent");
    }

    #[test]
    fn a_death_of_a_rank_still_counted_in_counts_it_out_as_dead_and_reopens_the_round() {
        let mut v = view(&[], &[]);
        let peers = [(0, v.clone()), (1, v.clone())];
        let agreed = close_round(&mut v, 2, BTreeSet::new(), &peers, (&[4], &[4])).unwrap();
        assert!(!agreed);
        assert_eq!(v, view(&[4], &[4]));
        // A closed link that is not a proven death: unreachable, not dead.
        let mut v = view(&[], &[]);
        let agreed = close_round(&mut v, 2, BTreeSet::new(), &peers, (&[3], &[])).unwrap();
        assert!(!agreed);
        assert_eq!(v, view(&[3], &[]));
    }

    #[test]
    fn a_round_with_an_unheard_peer_or_another_view_does_not_agree_and_merges() {
        let mut v = view(&[], &[]);
        let peers = [(0, view(&[], &[])), (1, view(&[4], &[4]))];
        let agreed = close_round(&mut v, 2, [3].into(), &peers, (&[], &[])).unwrap();
        assert!(!agreed);
        assert_eq!(v, view(&[3, 4], &[4]));
    }

    #[test]
    fn a_peer_that_counted_this_rank_out_ends_its_agreement_naming_that_peer() {
        let mut v = view(&[], &[]);
        let peers = [(0, view(&[], &[])), (1, view(&[2], &[]))];
        let e = close_round(&mut v, 2, BTreeSet::new(), &peers, (&[], &[])).unwrap_err();
        assert!(e.message().contains("rank 1 counted rank 2 out"), "{e}");
    }

    #[test]
    fn views_round_trip_and_merge_dead_into_out() {
        let v = View {
            out: [1, 8, 9].into(),
            dead: [9].into(),
        };
        assert_eq!(View::decode(&v.encode(10), 10), v);
        let mut w = View {
            out: [2].into(),
            dead: BTreeSet::new(),
        };
        w.merge(&View {
            out: BTreeSet::new(),
            dead: [4].into(),
        });
        assert_eq!(w.out, [2, 4].into());
        assert_eq!(w.dead, [4].into());
    }

    #[test]
    fn round_tags_are_control_and_stale_for_what_follows() {
        let a = round_tag(0, 0);
        assert!(stamps::is_control(a));
        assert!(stamps::is_stale(a, round_tag(0, 1)));
        assert!(stamps::is_stale(round_tag(0, 5), round_tag(1, 0)));
        assert!(stamps::is_stale(a, stamps::stamp(0, stamps::CONTROL | 7)));
        assert!(!stamps::is_stale(round_tag(1, 0), a));
    }
}
