//! Overlapped hierarchy: the two levels of a hierarchical collective run at the same time on
//! different pieces of the data.
//!
//! Every block (a rank's share, or `1/P` of an all-reduce vector) is cut into `K` pieces: the
//! plan addresses `P·K` sub-blocks, piece `j` of block `b` being sub-block `b·K + j`
//! ([`super::Plan::pieces`]; the executors map it to the `j`-th of `K` balanced element runs of
//! the block). The two levels of [`super::hierarchical`] are built once per piece, and piece
//! `j`'s schedule starts `D = max(|first level|, |second level|)` phases after piece `j-1`'s,
//! so that the second level of piece `j` shares its phases with the first level of piece
//! `j+1`: all-gather runs the inter-node step of piece `j+1` beside the intra-node step of
//! piece `j`, reduce-scatter the intra-node step of piece `j+1` beside the inter-node step of
//! piece `j`. The NICs and the intra-node links are busy at once, and a collective pays about
//! `max(inter, intra)` per piece instead of their sum, plus one level's fill at the ends.
//!
//! Where the two levels differ in length the shorter one is placed inside the longer one's
//! window so that it meets the longer one's *largest* phases: recursive doubling grows its
//! messages (all-gather: the second level ends with the first level's last phase), recursive
//! halving shrinks them (reduce-scatter: the second level starts with the next first level).
//!
//! Correctness rests on the phase semantics (reads see the start of the phase, writes are
//! disjoint): the two steps of a shared phase touch different pieces. A shared phase never
//! holds two messages between the same pair of ranks in one direction (the levels' peers are
//! on the same node and on other nodes); should it, the two are kept in separate phases.

use super::deep;
use super::hierarchical::{allgather_levels, reduce_scatter_levels};
use super::{Buf, LevelAlgo, Phase, Span, Step};
use crate::topology::Topology;

/// Sub-block map of piece `j` of `k`.
fn piece(k: usize, j: usize) -> impl Fn(Buf, usize) -> Span {
    move |buf, b| Span::block(buf, b * k + j)
}

/// The whole of logical block `b` of `buf` as a span of sub-blocks.
pub fn whole_block(buf: Buf, b: usize, k: usize) -> Span {
    Span {
        buf,
        start: b * k,
        len: k,
    }
}

/// Overlapped all-gather from `Input` (this rank's `k` pieces) into `Output`.
pub fn allgather(
    topo: &Topology,
    rank: usize,
    inter: LevelAlgo,
    intra: LevelAlgo,
    k: usize,
) -> Vec<Phase> {
    let mut ph = vec![Phase::of(vec![Step::Copy {
        src: vec![whole_block(Buf::Input, 0, k)],
        dst: vec![whole_block(Buf::Output, rank, k)],
    }])];
    ph.extend(allgather_in_output(topo, rank, inter, intra, k));
    ph
}

/// Overlapped all-gather of `Output` sub-blocks, this rank's own pieces already in place.
pub fn allgather_in_output(
    topo: &Topology,
    rank: usize,
    inter: LevelAlgo,
    intra: LevelAlgo,
    k: usize,
) -> Vec<Phase> {
    let pieces: Vec<_> = (0..k)
        .map(|j| allgather_levels(topo, rank, inter, intra, &piece(k, j)))
        .collect();
    // First level: inter-node; the intra-node steps go first in a shared phase.
    stagger(pieces, Align::SecondEndsWithNextFirst, false)
}

/// Overlapped reduce-scatter of `Input` sub-blocks; this rank's result lands in the `k`
/// pieces of logical block `out`, partial sums in `work`'s blocks.
pub fn reduce_scatter(
    topo: &Topology,
    rank: usize,
    levels: (LevelAlgo, LevelAlgo),
    out: (Buf, usize),
    k: usize,
    work: Buf,
) -> Vec<Phase> {
    let pieces: Vec<_> = (0..k)
        .map(|j| {
            let out_j = Span::block(out.0, out.1 * k + j);
            reduce_scatter_levels(topo, rank, levels, out_j, &piece(k, j), work)
        })
        .collect();
    stagger(pieces, Align::SecondStartsWithNextFirst, true)
}

/// Overlapped all-gather of three or more levels ([`deep`]), this rank's own pieces already
/// in `Output`: the network level of piece `j + 1` beside the node's levels (run one after
/// the other) of piece `j`. One piece is the plain hierarchy.
pub fn deep_allgather_in_output(
    topo: &Topology,
    rank: usize,
    algos: &[LevelAlgo],
    k: usize,
) -> Vec<Phase> {
    let pieces: Vec<_> = (0..k)
        .map(|j| {
            let mut levels = deep::allgather_levels(topo, rank, algos, &piece(k, j)).into_iter();
            let network = levels.next().unwrap_or_default();
            (network, levels.flatten().collect())
        })
        .collect();
    stagger(pieces, Align::SecondEndsWithNextFirst, false)
}

/// Overlapped reduce-scatter of three or more levels: the node's levels of piece `j + 1`
/// beside the network level of piece `j`; this rank's result lands in the `k` pieces of
/// logical block `out`, partial sums in `work`'s blocks.
pub fn deep_reduce_scatter(
    topo: &Topology,
    rank: usize,
    algos: &[LevelAlgo],
    out: (Buf, usize),
    k: usize,
    work: Buf,
) -> Vec<Phase> {
    let pieces: Vec<_> = (0..k)
        .map(|j| {
            let out_j = Span::block(out.0, out.1 * k + j);
            let mut levels =
                deep::reduce_scatter_levels(topo, rank, algos, out_j, &piece(k, j), work);
            let network = levels.pop().unwrap_or_default();
            (levels.into_iter().flatten().collect(), network)
        })
        .collect();
    stagger(pieces, Align::SecondStartsWithNextFirst, true)
}

/// Where a piece's second level sits inside the window it shares with the next first level.
#[derive(Clone, Copy)]
enum Align {
    /// It ends together with the next piece's first level (growing first-level messages).
    SecondEndsWithNextFirst,
    /// It starts together with the next piece's first level (shrinking second-level messages).
    SecondStartsWithNextFirst,
}

/// Staggers per-piece `(first level, second level)` schedules by `D` phases (see the module
/// docs). `first_is_intra` orders a shared phase's steps intra-node first: the executor
/// completes receives in step order, and the intra-node message is the quicker one.
fn stagger(
    pieces: Vec<(Vec<Phase>, Vec<Phase>)>,
    align: Align,
    first_is_intra: bool,
) -> Vec<Phase> {
    let a = pieces.iter().map(|p| p.0.len()).max().unwrap_or(0);
    let b = pieces.iter().map(|p| p.1.len()).max().unwrap_or(0);
    let d = a.max(b).max(1);
    let gap = match align {
        Align::SecondEndsWithNextFirst => d - b,
        Align::SecondStartsWithNextFirst => d - a,
    };
    let total = (pieces.len().saturating_sub(1)) * d + a + gap + b;
    // slots[t] = (first-level phase, second-level phase) running at time t.
    let mut slots: Vec<(Option<Phase>, Option<Phase>)> = vec![(None, None); total];
    for (j, (first, second)) in pieces.into_iter().enumerate() {
        for (i, ph) in first.into_iter().enumerate() {
            let s = &mut slots[j * d + i].0;
            debug_assert!(s.is_none(), "two first-level phases share a slot");
            *s = Some(ph);
        }
        for (i, ph) in second.into_iter().enumerate() {
            let s = &mut slots[j * d + a + gap + i].1;
            debug_assert!(s.is_none(), "two second-level phases share a slot");
            *s = Some(ph);
        }
    }
    let mut out = Vec::with_capacity(total);
    for (first, second) in slots {
        let (x, y) = if first_is_intra {
            (first, second)
        } else {
            (second, first)
        };
        // x: the intra-node level's phase, y: the inter-node level's.
        match (x, y) {
            (Some(x), Some(y)) if shares_a_pair(&x, &y) => {
                out.push(x);
                out.push(y);
            }
            (Some(mut x), Some(y)) => {
                x.steps.extend(y.steps);
                out.push(x);
            }
            (Some(p), None) | (None, Some(p)) => out.push(p),
            (None, None) => {}
        }
    }
    out
}

/// Whether two phases send to a common peer or receive from a common peer (then they cannot
/// share a phase: two messages between one pair in one phase could be matched either way).
fn shares_a_pair(x: &Phase, y: &Phase) -> bool {
    let peers = |p: &Phase, send: bool| -> Vec<usize> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Send { peer, .. } if send => Some(*peer),
                Step::Recv { peer, .. } | Step::RecvReduce { peer, .. } if !send => Some(*peer),
                _ => None,
            })
            .collect()
    };
    [true, false]
        .iter()
        .any(|&dir| peers(x, dir).iter().any(|q| peers(y, dir).contains(q)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::check::check_plans;
    use crate::plan::{build, Algorithm, Collective};

    fn overlapped(inter: LevelAlgo, intra: LevelAlgo, pieces: usize) -> Algorithm {
        Algorithm::Overlap {
            inter,
            intra,
            pieces,
        }
    }

    #[test]
    fn shared_phases_carry_one_inter_and_one_intra_message() {
        // 4 nodes x 4 ranks, ring inside, recursive doubling across: 2 inter, 3 intra phases.
        let topo = Topology::uniform(16, 4);
        let plan = build(
            Collective::AllGather,
            overlapped(LevelAlgo::Rd, LevelAlgo::Ring, 4),
            &topo,
            5,
        )
        .unwrap();
        assert_eq!(plan.pieces, 4);
        // copy + 4 pieces staggered by D = 3, the last piece's 2 + 3 phases after 3 * 3.
        assert_eq!(plan.phases.len(), 1 + 3 * 3 + 2 + 1 + 3 - 1);
        let two_peer_phases = plan
            .phases
            .iter()
            .filter(|p| {
                p.steps
                    .iter()
                    .filter(|s| matches!(s, Step::Send { .. }))
                    .count()
                    == 2
            })
            .count();
        // Every intra-node phase of pieces 0..3 meets an inter-node phase of the next piece:
        // 2 inter phases per shared window, 3 windows.
        assert_eq!(two_peer_phases, 6);
    }

    #[test]
    fn collectives_without_levels_are_not_cut_in_pieces() {
        let topo = Topology::uniform(8, 4);
        for coll in [
            Collective::Broadcast { root: 3 },
            Collective::Barrier,
            Collective::Reduce {
                root: 1,
                average: false,
            },
            Collective::AllToAll { direct: false },
            Collective::AllToAll { direct: true },
        ] {
            let plan = build(
                coll,
                overlapped(LevelAlgo::Rd, LevelAlgo::Ring, 4),
                &topo,
                2,
            )
            .unwrap();
            assert_eq!(plan.pieces, 1, "{coll:?}");
        }
    }

    #[test]
    fn one_piece_is_the_plain_hierarchy() {
        let topo = Topology::uniform(12, 3);
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter { average: true },
            Collective::AllReduce { average: false },
        ] {
            for (inter, intra) in [
                (LevelAlgo::Rd, LevelAlgo::Ring),
                (LevelAlgo::Ring, LevelAlgo::Rd),
            ] {
                for r in 0..12 {
                    let a = build(coll, overlapped(inter, intra, 1), &topo, r).unwrap();
                    let b = build(coll, Algorithm::Hier { inter, intra }, &topo, r).unwrap();
                    assert_eq!(a.phases, b.phases, "{coll:?} rank {r}");
                }
            }
        }
    }

    #[test]
    fn overlapped_plans_pass_the_checker_for_small_shapes() {
        for (p, m) in [(4, 2), (6, 2), (6, 3), (8, 4), (12, 4), (15, 5)] {
            let topo = Topology::uniform(p, m);
            for k in [2, 3, 4] {
                for coll in [
                    Collective::AllGather,
                    Collective::ReduceScatter { average: false },
                    Collective::AllReduce { average: true },
                ] {
                    let algo = overlapped(LevelAlgo::Rd, LevelAlgo::Ring, k);
                    let ps: Vec<_> = (0..p)
                        .map(|r| build(coll, algo, &topo, r).unwrap())
                        .collect();
                    for inplace in [false, true] {
                        check_plans(coll, &ps, inplace)
                            .unwrap_or_else(|e| panic!("{coll:?} {p}x{m} k={k}: {e}"));
                    }
                }
            }
        }
    }

    #[test]
    fn checker_rejects_an_overlapped_plan_whose_pieces_collide() {
        // Shift one rank's pieces by one sub-block: a piece lands where another belongs.
        let topo = Topology::uniform(8, 4);
        let coll = Collective::AllGather;
        let algo = overlapped(LevelAlgo::Rd, LevelAlgo::Ring, 2);
        let mut ps: Vec<_> = (0..8)
            .map(|r| build(coll, algo, &topo, r).unwrap())
            .collect();
        for ph in &mut ps[3].phases {
            for st in &mut ph.steps {
                if let Step::Recv { dst, .. } = st {
                    for s in dst.iter_mut() {
                        s.start ^= 1;
                    }
                }
            }
        }
        assert!(check_plans(coll, &ps, false).is_err());
    }
}
