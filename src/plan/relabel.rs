//! Block labels of a hierarchical all-reduce chosen so that its messages are contiguous.
//!
//! A hierarchical all-reduce reduce-scatters into the output's own blocks and gathers them
//! back. Built with block `r` owned by rank `r`, a node's level hands local rank `l` the blocks
//! of every node's local rank `l` — one block in `M` — and the network level sends halves,
//! quarters, … of those: every message strided (on 8 × 2 ranks, `hier-rd` sends 8, 4 and 2
//! blocks apart). A strided message is packed into one buffer by the transport and unpacked
//! by the receiver (a copy at each end, the network idle meanwhile) or sent as many pieces by
//! a device.
//!
//! Unlike a reduce-scatter's, an all-reduce's blocks are only labels: every rank ends with
//! all of them, so any bijection of block indices that every rank applies alike gives a plan
//! as correct as the first. [`level_major`] numbers the blocks by the ranks' coordinates in
//! the order the levels partition them (innermost first), so each level's share of a rank is
//! one run of consecutive blocks; [`relabel`] rewrites a plan's spans with it.

use super::{Buf, Phase, Span, Step};
use crate::topology::Topology;

/// The new label of each block `b` (the block rank `b` owned), or `None` where it would not
/// change anything (one node, one rank per node, or nodes of unequal size).
///
/// Rank `r` at (node `n`, local `l`) labels its block `l·N + n` on `N` nodes; for a
/// three-level plan (`three`) on groups of `G` ranks (`l = g·G + q`), `(q·(M/G) + g)·N + n`.
pub fn level_major(topo: &Topology, three: bool) -> Option<Vec<usize>> {
    let p = topo.nranks();
    let nodes = topo.nodes().len();
    let m = topo.ranks_per_node()?;
    if nodes < 2 || m < 2 || nodes * m != p {
        return None;
    }
    let g = if three && topo.has_groups() {
        topo.group_size()
    } else {
        1
    };
    let groups = m / g;
    let map: Vec<usize> = (0..p)
        .map(|r| {
            let (n, l) = topo.position(r);
            let (grp, q) = (l / g, l % g);
            (q * groups + grp) * nodes + n
        })
        .collect();
    Some(map)
}

/// Rewrites every span over the input and output of `phases` through `map`, and orders each
/// message's blocks by their new labels so that consecutive labels make one run.
///
/// With `pieces` per block (an overlapped plan, whose messages carry piece `j` of several
/// blocks), sub-block `b·pieces + j` becomes `j·P + map[b]`: a piece's blocks are adjacent.
/// A message's order may change because both ends of every all-reduce message list the same
/// blocks in the same order (a block is one label on every rank and in both buffers), so both
/// sort alike; a reduction's operand follows its target. Scratch spans keep their numbering.
pub fn relabel(phases: &mut [Phase], pieces: usize, map: &[usize]) {
    let k = pieces.max(1);
    let p = map.len();
    let label = |unit: usize| {
        if k == 1 {
            map[unit]
        } else {
            (unit % k) * p + map[unit / k]
        }
    };
    for step in phases.iter_mut().flat_map(|ph| ph.steps.iter_mut()) {
        match step {
            Step::Send { src: list, .. } | Step::Recv { dst: list, .. } => {
                let mut u = units(list, &label);
                u.sort_by_key(|&(_, at)| at);
                *list = runs(&u);
            }
            Step::RecvReduce { dst, with, .. } => {
                let mut pairs: Vec<_> = units(dst, &label)
                    .into_iter()
                    .zip(units(with, &label))
                    .collect();
                pairs.sort_by_key(|&((_, at), _)| at);
                let (d, w): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
                *dst = runs(&d);
                *with = runs(&w);
            }
            Step::Copy { src, dst } => {
                *src = runs(&units(src, &label));
                *dst = runs(&units(dst, &label));
            }
            Step::Average { dst } => *dst = runs(&units(dst, &label)),
        }
    }
}

/// Every unit (block or piece) of `spans`, in order, with its new label (scratch: its own).
fn units(spans: &[Span], label: &impl Fn(usize) -> usize) -> Vec<(Buf, usize)> {
    spans
        .iter()
        .flat_map(|s| {
            (s.start..s.start + s.len).map(move |u| match s.buf {
                Buf::Scratch => (s.buf, u),
                b => (b, label(u)),
            })
        })
        .collect()
}

/// `units` as spans, consecutive units of one buffer merged into one.
fn runs(units: &[(Buf, usize)]) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::with_capacity(units.len());
    for &(buf, at) in units {
        match out.last_mut() {
            Some(last) if last.buf == buf && last.start + last.len == at => last.len += 1,
            _ => out.push(Span {
                buf,
                start: at,
                len: 1,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_major_numbers_local_rank_first_and_is_a_bijection() {
        let topo = Topology::uniform(8, 2);
        let map = level_major(&topo, false).expect("4 nodes of 2");
        // Ranks 0, 2, 4, 6 are local rank 0 of nodes 0..4: labels 0..4; local 1: 4..8.
        assert_eq!(map, vec![0, 4, 1, 5, 2, 6, 3, 7]);
        let mut sorted = map.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>());
        assert_eq!(level_major(&Topology::uniform(8, 1), false), None);
        assert_eq!(level_major(&Topology::uniform(8, 8), false), None);
    }

    #[test]
    fn strided_blocks_merge_into_one_run_and_pieces_group_by_piece() {
        let map = vec![0, 4, 1, 5, 2, 6, 3, 7];
        let mut ph = vec![Phase::of(vec![Step::Send {
            peer: 1,
            src: [5, 1, 7, 3].map(|b| Span::block(Buf::Output, b)).into(),
        }])];
        relabel(&mut ph, 1, &map);
        let run = |buf, start, len| Span { buf, start, len };
        assert_eq!(
            ph[0].steps[0],
            Step::Send {
                peer: 1,
                src: vec![run(Buf::Output, 4, 4)]
            }
        );
        // Two pieces per block: piece 1 of blocks 1 and 3 (sub-blocks 3 and 7) are labelled
        // 1·8 + 4 and 1·8 + 5; the operand follows its target, scratch keeps its number.
        let mut ph = vec![Phase::of(vec![Step::RecvReduce {
            peer: 1,
            dst: vec![Span::block(Buf::Output, 7), Span::block(Buf::Output, 3)],
            with: vec![Span::block(Buf::Input, 7), Span::block(Buf::Scratch, 3)],
        }])];
        relabel(&mut ph, 2, &map);
        assert_eq!(
            ph[0].steps[0],
            Step::RecvReduce {
                peer: 1,
                dst: vec![run(Buf::Output, 12, 2)],
                with: vec![Span::block(Buf::Scratch, 3), Span::block(Buf::Input, 13)],
            }
        );
    }
}
