//! The routing of the two-hop quantized reduce-scatter (ZeRO++'s qgZ,
//! `Communicator::reduce_scatter_quantized`), and its proof.
//!
//! On `N` nodes of `M` ranks (`nodes[k][j]`: the global rank of local index `j` on node `k`):
//!
//! 1. inside each node an all-to-all among its ranks, ordered by local index: the piece a rank
//!    sends to local index `j` is its input blocks of the ranks [`hop1_piece`]`(nodes, j)` —
//!    those of local index `j` on every node, in node order; the receiver sums the `M` pieces;
//! 2. between nodes an all-to-all among the ranks of one local index, ordered by node: the
//!    piece for node `k` is segment `k` of the sum.
//!
//! [`prove`] follows every contribution symbolically through both hops, as the
//! implementation moves them, and checks that each rank ends with the contributions of every
//! rank to its own block, each exactly once, and nothing else — the plan checker's
//! guarantee for the all-to-all compositions that are not plans.
//!
//! **One hop per level** (`QuantScheme::PerLevel`): on the topology's levels — radices
//! `[nodes, groups per node, ranks per group]` (or `[nodes, ranks per node]`), a rank's
//! coordinates its node, then its local index written in the inner radices — one all-to-all
//! per level, innermost first, among the ranks that differ only in that level's coordinate.
//! Every rank lays out its blocks in [`level_order`] (the innermost coordinate the most
//! significant digit), so the piece for the member with coordinate `d` at the current level
//! is always the `d`-th contiguous part of what it holds; [`prove_levels`] follows that.
//! With two levels it is exactly the two-hop routing above.

use crate::error::{Error, Result};

/// The global ranks whose blocks make the hop-1 piece for local index `j`, in node order.
pub fn hop1_piece(nodes: &[Vec<usize>], j: usize) -> Vec<usize> {
    nodes.iter().map(|members| members[j]).collect()
}

/// Whether the two-hop scheme applies: more than one node, all of one size above one.
pub fn applies(nodes: &[Vec<usize>]) -> bool {
    let m = nodes.first().map_or(0, Vec::len);
    nodes.len() > 1 && m > 1 && nodes.iter().all(|n| n.len() == m)
}

/// Proves the routing on `nodes` (every rank exactly once in them): the two hops where they
/// apply, else the one all-to-all of blocks. Returns the first violation, naming the rank,
/// the block and the contributions found.
pub fn prove(nodes: &[Vec<usize>]) -> Result<()> {
    let p: usize = nodes.iter().map(Vec::len).sum();
    let mut seen = vec![false; p];
    for &r in nodes.iter().flatten() {
        if r >= p || std::mem::replace(&mut seen[r], true) {
            return Err(Error::invalid(format!(
                "rank {r} is not one of 0..{p} once"
            )));
        }
    }
    // held[r] = (block, contributors) pairs rank r ends with.
    let held: Vec<Vec<(usize, Vec<usize>)>> = if applies(nodes) {
        let (nn, m) = (nodes.len(), nodes[0].len());
        // After hop 1, rank nodes[n][j] holds, per segment k, the sum over the node's ranks
        // of their block of rank hop1_piece(nodes, j)[k].
        let mut partial = vec![Vec::new(); p]; // per rank: Vec<(block, contributors)>
        for members in nodes {
            for j in 0..m {
                let piece = hop1_piece(nodes, j);
                let segs: Vec<(usize, Vec<usize>)> =
                    piece.iter().map(|&b| (b, members.clone())).collect();
                partial[members[j]] = segs;
            }
        }
        // Hop 2: rank nodes[k][j] receives segment k from nodes[n][j] for every node n.
        let mut out = vec![Vec::new(); p];
        for j in 0..m {
            for k in 0..nn {
                let dst = nodes[k][j];
                let mut block = None;
                let mut from = Vec::new();
                for members in nodes {
                    let (b, c) = &partial[members[j]][k];
                    if block.is_some_and(|x| x != *b) {
                        return Err(Error::internal(format!(
                            "two-hop: rank {dst} would sum blocks of ranks {} and {b}",
                            block.unwrap_or(0)
                        )));
                    }
                    block = Some(*b);
                    from.extend_from_slice(c);
                }
                out[dst].push((block.unwrap_or(dst), from));
            }
        }
        out
    } else {
        // One all-to-all: rank r receives every rank's block r.
        (0..p).map(|r| vec![(r, (0..p).collect())]).collect()
    };
    for (r, h) in held.iter().enumerate() {
        let [(b, from)] = h.as_slice() else {
            return Err(Error::internal(format!(
                "two-hop: rank {r} ends with {} sums, not one",
                h.len()
            )));
        };
        let mut sorted = from.clone();
        sorted.sort_unstable();
        if *b != r || sorted != (0..p).collect::<Vec<_>>() {
            return Err(Error::internal(format!(
                "two-hop: rank {r} ends with block {b} from ranks {sorted:?}, not its own \
                 block from each of the {p} ranks once"
            )));
        }
    }
    Ok(())
}

/// `local` written in the inner radices `radices[1..]` (the last digit least significant).
pub fn local_digits(radices: &[usize], mut local: usize) -> Vec<usize> {
    let mut d = vec![0; radices.len().saturating_sub(1)];
    for (i, &r) in radices.iter().enumerate().skip(1).rev() {
        d[i - 1] = local % r.max(1);
        local /= r.max(1);
    }
    d
}

/// The local index whose inner digits are `digits` (inverse of [`local_digits`]).
pub fn local_of(radices: &[usize], digits: &[usize]) -> usize {
    radices
        .iter()
        .skip(1)
        .zip(digits)
        .fold(0, |acc, (&r, &d)| acc * r + d)
}

/// The coordinates (`[node, inner digits…]`) of rank `r`.
pub fn coords(nodes: &[Vec<usize>], radices: &[usize], r: usize) -> Vec<usize> {
    for (k, members) in nodes.iter().enumerate() {
        if let Some(j) = members.iter().position(|&x| x == r) {
            let mut c = vec![k];
            c.extend(local_digits(radices, j));
            return c;
        }
    }
    Vec::new()
}

/// The levels the per-level scheme takes a hop at, innermost first (levels of one member
/// are skipped: nothing to exchange).
pub fn hop_levels(radices: &[usize]) -> Vec<usize> {
    (0..radices.len())
        .rev()
        .filter(|&l| radices[l] > 1)
        .collect()
}

/// The destination ranks of the blocks every rank sends in the per-level scheme, in payload
/// order: position `i` written with the node as the least significant digit and the
/// innermost level as the most significant.
pub fn level_order(nodes: &[Vec<usize>], radices: &[usize]) -> Vec<usize> {
    let p: usize = radices.iter().product();
    (0..p)
        .map(|mut i| {
            let mut c = vec![0; radices.len()];
            for (l, &r) in radices.iter().enumerate() {
                c[l] = i % r;
                i /= r;
            }
            nodes[c[0]][local_of(radices, &c[1..])]
        })
        .collect()
}

/// Proves the per-level routing on `nodes` with `radices` (their product the rank count,
/// `radices[0]` the number of nodes, every node `radices[1..]`'s product in size): follows
/// every contribution through the hops as the implementation moves them.
pub fn prove_levels(nodes: &[Vec<usize>], radices: &[usize]) -> Result<()> {
    let p: usize = radices.iter().product();
    if nodes.len() != radices[0] || nodes.iter().any(|n| n.len() * radices[0] != p) {
        return Err(Error::invalid(format!(
            "per-level: nodes of sizes {:?} do not match the radices {radices:?}",
            nodes.iter().map(Vec::len).collect::<Vec<_>>()
        )));
    }
    let order = level_order(nodes, radices);
    // held[r]: (destination block, contributors) in the order rank r holds them.
    let mut held: Vec<Vec<(usize, Vec<usize>)>> = (0..p)
        .map(|r| order.iter().map(|&d| (d, vec![r])).collect())
        .collect();
    let at = |c: &[usize]| nodes[c[0]][local_of(radices, &c[1..])];
    for l in hop_levels(radices) {
        let mut next = vec![Vec::new(); p];
        for (dst, slot) in next.iter_mut().enumerate() {
            let mine = coords(nodes, radices, dst);
            let mut sum: Vec<(usize, Vec<usize>)> = Vec::new();
            for d in 0..radices[l] {
                // Member `d` of this level's group sends its piece for coordinate mine[l].
                let mut c = mine.clone();
                c[l] = d;
                let src = at(&c);
                let len = held[src].len() / radices[l];
                let piece = &held[src][mine[l] * len..(mine[l] + 1) * len];
                if sum.is_empty() {
                    sum = piece.to_vec();
                    continue;
                }
                for (acc, (b, from)) in sum.iter_mut().zip(piece) {
                    if acc.0 != *b {
                        return Err(Error::internal(format!(
                            "per-level: rank {dst} would sum blocks of ranks {} and {b} at \
                             level {l}",
                            acc.0
                        )));
                    }
                    acc.1.extend_from_slice(from);
                }
            }
            *slot = sum;
        }
        held = next;
    }
    for (r, h) in held.iter().enumerate() {
        let [(b, from)] = h.as_slice() else {
            return Err(Error::internal(format!(
                "per-level: rank {r} ends with {} sums, not one",
                h.len()
            )));
        };
        let mut sorted = from.clone();
        sorted.sort_unstable();
        if *b != r || sorted != (0..p).collect::<Vec<_>>() {
            return Err(Error::internal(format!(
                "per-level: rank {r} ends with block {b} from ranks {sorted:?}, not its own \
                 block from each of the {p} ranks once"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `N × M` nodes, ranks numbered node by node (or interleaved: rank = j·N + k).
    fn shape(n: usize, m: usize, interleaved: bool) -> Vec<Vec<usize>> {
        (0..n)
            .map(|k| {
                (0..m)
                    .map(|j| if interleaved { j * n + k } else { k * m + j })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_contribution_arrives_exactly_once_for_every_shape_up_to_64_ranks() {
        let mut proven = 0;
        for p in 1..=64usize {
            for m in (1..=p).filter(|m| p % m == 0) {
                for interleaved in [false, true] {
                    let nodes = shape(p / m, m, interleaved);
                    prove(&nodes).unwrap_or_else(|e| panic!("{}x{m}: {e}", p / m));
                    proven += 1;
                }
            }
        }
        assert!(proven > 500, "{proven}");
        // Uneven nodes take the one-hop route, proven too.
        for nodes in [
            vec![vec![0, 1, 2], vec![3, 4]],
            vec![vec![4], vec![0, 1, 2, 3]],
        ] {
            assert!(!applies(&nodes));
            prove(&nodes).unwrap();
        }
    }

    #[test]
    fn one_hop_per_level_delivers_every_contribution_once_for_three_levels() {
        let mut proven = 0;
        for nn in 1..=6usize {
            for groups in 1..=4usize {
                for g in 1..=4usize {
                    let m = groups * g;
                    for interleaved in [false, true] {
                        let nodes = shape(nn, m, interleaved);
                        let radices = [nn, groups, g];
                        prove_levels(&nodes, &radices)
                            .unwrap_or_else(|e| panic!("{nn}x{groups}x{g}: {e}"));
                        proven += 1;
                    }
                }
            }
        }
        assert!(proven >= 190, "{proven}");
        // Two levels: the same order as the two-hop scheme's units.
        let nodes = shape(3, 4, false);
        let order = level_order(&nodes, &[3, 4]);
        for j in 0..4 {
            assert_eq!(&order[j * 3..(j + 1) * 3], hop1_piece(&nodes, j).as_slice());
        }
        assert_eq!(hop_levels(&[1, 4, 2]), vec![2, 1]);
        assert_eq!(local_digits(&[2, 3, 4], 11), vec![2, 3]);
        assert_eq!(local_of(&[2, 3, 4], &[2, 3]), 11);
    }

    #[test]
    fn a_wrong_route_is_caught() {
        // Nodes that do not match the radices are refused.
        assert!(prove_levels(&shape(2, 4, false), &[2, 3, 2]).is_err());
        // A node list that repeats a rank is refused.
        assert!(prove(&[vec![0, 1], vec![1, 2]]).is_err());
        assert!(prove(&[vec![0, 5]]).is_err());
        // hop1_piece picks local index j of every node, in node order.
        assert_eq!(hop1_piece(&shape(3, 2, false), 1), vec![1, 3, 5]);
        assert_eq!(hop1_piece(&shape(3, 2, true), 1), vec![3, 4, 5]);
    }
}
