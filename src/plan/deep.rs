//! Hierarchies of any depth: one level per radix of [`Topology::levels`] (network → node, or
//! network → groups of a node → ranks of a group: the GCD pair of an MI250X, a package).
//!
//! A rank's coordinates are `(c₀, c₁, …, c_{d−1})`, outermost first: its node, then its local
//! index written in the inner radices. Level `l` joins the ranks that differ only in `cₗ`.
//! The *unit* of member `v` at level `l`, seen from a rank `me`, is the set of ranks whose
//! `cₗ = v`, whose inner coordinates (`j > l`) equal `me`'s and whose outer ones (`j < l`) are
//! anything, in lexicographic order of their coordinates:
//!
//! * all-gather runs the levels outermost first: after level `l` a rank holds the blocks of
//!   every rank that shares its coordinates inner to `l`, so at level `l` member `v`
//!   contributes exactly its unit (one block at the network level, `N` at the next, …);
//! * reduce-scatter runs them innermost first, over the same units: after level `l` a rank
//!   holds, for each rank whose coordinates from `l` inward equal its own, the sum over every
//!   rank that differs from it only inside `l`. The network level ends with the rank's own
//!   block summed over everyone.
//!
//! Every rank moves the fewest blocks at the outermost level (the slowest links) and the most
//! at the innermost (the fastest). Two levels give exactly the plans of [`super::hierarchical`]
//! (tests check it); three give pair → node → network on Frontier. The strided units are
//! packed by the executor, as in two levels.

use super::hierarchical::BlockMap;
use super::{level_allgather, level_reduce_scatter, Buf, Level, LevelAlgo, Phase, Span, Spans};
use crate::topology::Topology;

/// Coordinates of `rank` in `radix` (outermost first; `radix[0]` is the node count).
fn coords(topo: &Topology, radix: &[usize], rank: usize) -> Vec<usize> {
    let (n, mut m) = topo.position(rank);
    let mut c = vec![0; radix.len()];
    c[0] = n;
    for l in (1..radix.len()).rev() {
        c[l] = m % radix[l];
        m /= radix[l];
    }
    c
}

/// The rank at coordinates `c`.
fn rank_at(topo: &Topology, radix: &[usize], c: &[usize]) -> usize {
    let local = (1..radix.len()).fold(0, |m, l| m * radix[l] + c[l]);
    topo.nodes()[c[0]][local]
}

/// The ranks of member `v`'s unit at level `l` seen from coordinates `me` (module docs), in
/// lexicographic order of their coordinates.
fn unit_ranks(topo: &Topology, radix: &[usize], l: usize, v: usize, me: &[usize]) -> Vec<usize> {
    let outer: usize = radix[..l].iter().product();
    let mut c = me.to_vec();
    c[l] = v;
    (0..outer)
        .map(|mut x| {
            for j in (0..l).rev() {
                c[j] = x % radix[j];
                x /= radix[j];
            }
            rank_at(topo, radix, &c)
        })
        .collect()
}

/// The blocks of `ranks` in `buf` as `blk` maps them, merged where adjacent.
fn span_of(blk: BlockMap<'_>, buf: Buf, ranks: &[usize]) -> Spans {
    let mut v = Spans::new();
    for &r in ranks {
        super::push_span(&mut v, blk(buf, r));
    }
    v
}

#[cfg(test)]
fn whole(buf: Buf, b: usize) -> Span {
    Span::block(buf, b)
}

/// Level `l`'s members (communicator ranks, by `cₗ`) seen from `me`.
fn group(topo: &Topology, radix: &[usize], l: usize, me: &[usize]) -> Vec<usize> {
    let mut c = me.to_vec();
    (0..radix[l])
        .map(|v| {
            c[l] = v;
            rank_at(topo, radix, &c)
        })
        .collect()
}

/// The topology's radices, as many as `algos`. The planner only builds these plans where
/// [`crate::plan::effective_algorithm`] kept the hierarchy (equal nodes, with groups for
/// three levels), which is what the two checks here rely on.
fn radix_for(topo: &Topology, algos: &[LevelAlgo]) -> Vec<usize> {
    let radix = topo.levels().expect("a hierarchy needs equal nodes");
    assert_eq!(radix.len(), algos.len(), "one algorithm per level");
    radix
}

/// All-gather of `Output` blocks over every level, outermost first, each rank's own block
/// already in place. `algos[l]` runs level `l` (outermost first). (The planner builds these
/// through [`super::overlap::deep_allgather_in_output`], one piece being the plain form.)
#[cfg(test)]
fn allgather_in_output(topo: &Topology, rank: usize, algos: &[LevelAlgo]) -> Vec<Phase> {
    allgather_levels(topo, rank, algos, &whole)
        .into_iter()
        .flatten()
        .collect()
}

/// The levels of an all-gather of `Output` blocks mapped by `blk`, in the order they run
/// (outermost first).
pub(crate) fn allgather_levels(
    topo: &Topology,
    rank: usize,
    algos: &[LevelAlgo],
    blk: BlockMap<'_>,
) -> Vec<Vec<Phase>> {
    let radix = radix_for(topo, algos);
    let me = coords(topo, &radix, rank);
    algos
        .iter()
        .enumerate()
        .map(|(l, &a)| {
            let members = group(topo, &radix, l, &me);
            let units: Vec<Spans> = (0..radix[l])
                .map(|v| span_of(blk, Buf::Output, &unit_ranks(topo, &radix, l, v, &me)))
                .collect();
            level_allgather(
                a,
                Level {
                    group: &members,
                    me: me[l],
                },
                &units,
            )
        })
        .collect()
}

/// Reduce-scatter of `Input` (one block per rank) over every level, innermost first; this
/// rank's result lands in `out`, partial sums in `work`'s blocks (the scratch, laid out like
/// the input, or the all-reduce's output).
#[cfg(test)]
fn reduce_scatter(
    topo: &Topology,
    rank: usize,
    algos: &[LevelAlgo],
    out: Span,
    work: Buf,
) -> Vec<Phase> {
    reduce_scatter_levels(topo, rank, algos, out, &whole, work)
        .into_iter()
        .flatten()
        .collect()
}

/// The levels of a reduce-scatter of `Input` blocks mapped by `blk`, in the order they run
/// (innermost first; a level of one member is left out but for the network level, which
/// lands the result in `out`).
pub(crate) fn reduce_scatter_levels(
    topo: &Topology,
    rank: usize,
    algos: &[LevelAlgo],
    out: Span,
    blk: BlockMap<'_>,
    work: Buf,
) -> Vec<Vec<Phase>> {
    let radix = radix_for(topo, algos);
    let me = coords(topo, &radix, rank);
    let mut levels = Vec::new();
    // Where the partial sums are: the input until a level has reduced into the work buffer.
    let mut partial = Buf::Input;
    for l in (0..radix.len()).rev() {
        if radix[l] == 1 && l > 0 {
            continue;
        }
        let members = group(topo, &radix, l, &me);
        let ranks: Vec<Vec<usize>> = (0..radix[l])
            .map(|v| unit_ranks(topo, &radix, l, v, &me))
            .collect();
        let src: Vec<Spans> = ranks.iter().map(|r| span_of(blk, partial, r)).collect();
        let w: Vec<Spans> = ranks.iter().map(|r| span_of(blk, work, r)).collect();
        let dst = if l == 0 { vec![out] } else { w[me[l]].clone() };
        levels.push(level_reduce_scatter(
            algos[l],
            Level {
                group: &members,
                me: me[l],
            },
            &src,
            &w,
            &dst,
        ));
        partial = work;
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::hierarchical;

    const ALGOS: [LevelAlgo; 2] = [LevelAlgo::Ring, LevelAlgo::Rd];

    #[test]
    fn two_levels_give_exactly_the_two_level_plans() {
        let interleaved: Vec<u64> = (0..12).map(|r| (r % 3) as u64).collect();
        for topo in [
            Topology::uniform(12, 4),
            Topology::uniform(8, 2),
            Topology::uniform(6, 1),
            Topology::uniform(5, 5),
            Topology::from_node_keys(&interleaved),
        ] {
            for inter in ALGOS {
                for intra in ALGOS {
                    for r in 0..topo.nranks() {
                        assert_eq!(
                            allgather_in_output(&topo, r, &[inter, intra]),
                            hierarchical::allgather_in_output(&topo, r, inter, intra),
                            "all-gather {} rank {r}",
                            topo.describe()
                        );
                        for (out, work) in [
                            (Span::block(Buf::Output, 0), Buf::Scratch),
                            (Span::block(Buf::Output, r), Buf::Output),
                        ] {
                            assert_eq!(
                                reduce_scatter(&topo, r, &[inter, intra], out, work),
                                hierarchical::reduce_scatter(&topo, r, (inter, intra), out, work),
                                "reduce-scatter {} rank {r}",
                                topo.describe()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn coordinates_number_groups_inside_nodes() {
        // 2 nodes of 6 as groups of 2: rank 9 is node 1, local 3 = group 1, member 1.
        let topo = Topology::uniform(12, 6).with_groups(2);
        let radix = topo.levels().unwrap();
        assert_eq!(radix, vec![2, 3, 2]);
        assert_eq!(coords(&topo, &radix, 9), vec![1, 1, 1]);
        assert_eq!(rank_at(&topo, &radix, &[1, 1, 1]), 9);
        // The node level's units of rank 9: its member position (1) in every group, both
        // nodes (what the network level gathered).
        let me = coords(&topo, &radix, 9);
        assert_eq!(unit_ranks(&topo, &radix, 1, 2, &me), vec![5, 11]);
        assert_eq!(group(&topo, &radix, 1, &me), vec![7, 9, 11]);
        // The pair level's unit of member 0: every node's and group's position 0.
        assert_eq!(
            unit_ranks(&topo, &radix, 2, 0, &me),
            vec![0, 2, 4, 6, 8, 10]
        );
    }
}
