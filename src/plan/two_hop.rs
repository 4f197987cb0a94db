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
    fn a_wrong_route_is_caught() {
        // A node list that repeats a rank is refused.
        assert!(prove(&[vec![0, 1], vec![1, 2]]).is_err());
        assert!(prove(&[vec![0, 5]]).is_err());
        // hop1_piece picks local index j of every node, in node order.
        assert_eq!(hop1_piece(&shape(3, 2, false), 1), vec![1, 3, 5]);
        assert_eq!(hop1_piece(&shape(3, 2, true), 1), vec![3, 4, 5]);
    }
}
