//! The two-level algorithms.
//!
//! All-gather: (1) among the ranks with the same local index on every node (all `M` such
//! groups at once), (2) inside the node, each local rank contributing the `N` blocks it
//! gathered. The blocks of local rank `m` sit at positions `nodes[n][m]` of the output, so
//! step (2) sends strided block lists: the executor packs and unpacks them, which *is* the
//! local transpose of the layout, fused into the copy the transfer makes anyway.
//!
//! Reduce-scatter is the mirror image: (1) inside the node, reduce-scatter units made of the
//! `N` blocks destined to one local index (the transpose, fused again); (2) among ranks with
//! the same local index. Every rank moves the minimal `(N-1)` blocks over the network.
//!
//! The levels are built over a block map (`blk(buf, logical block) -> span`) and returned
//! separately, so that [`super::overlap`] can build them once per piece and stagger them.

use super::{
    level_allgather, level_reduce_scatter, Buf, Level, LevelAlgo, Phase, Span, Spans, Step,
};
use crate::topology::Topology;

/// Maps a logical block (a rank's share, or `1/P` of an all-reduce vector) of a buffer to the
/// span the plan addresses: the block itself, or one of its pieces.
pub(crate) type BlockMap<'a> = &'a dyn Fn(Buf, usize) -> Span;

fn whole(buf: Buf, b: usize) -> Span {
    Span::block(buf, b)
}

/// Two-level all-gather from `Input[0]` into `Output`.
pub fn allgather(topo: &Topology, rank: usize, inter: LevelAlgo, intra: LevelAlgo) -> Vec<Phase> {
    let mut ph = vec![Phase::of(vec![Step::Copy {
        src: vec![Span::block(Buf::Input, 0)],
        dst: vec![Span::block(Buf::Output, rank)],
    }])];
    ph.extend(allgather_in_output(topo, rank, inter, intra));
    ph
}

/// Two-level all-gather of `Output` blocks, each rank's own block already in place.
pub fn allgather_in_output(
    topo: &Topology,
    rank: usize,
    inter: LevelAlgo,
    intra: LevelAlgo,
) -> Vec<Phase> {
    let (mut a, b) = allgather_levels(topo, rank, inter, intra, &whole);
    a.extend(b);
    a
}

/// The two levels of an all-gather of `Output` blocks mapped by `blk`: (inter-node phases,
/// intra-node phases).
pub(crate) fn allgather_levels(
    topo: &Topology,
    rank: usize,
    inter: LevelAlgo,
    intra: LevelAlgo,
    blk: BlockMap<'_>,
) -> (Vec<Phase>, Vec<Phase>) {
    let nodes = topo.nodes();
    let (n, m) = topo.position(rank);
    let nn = nodes.len();
    let mm = nodes[n].len();
    let inter_group: Vec<usize> = (0..nn).map(|x| nodes[x][m]).collect();
    let inter_units: Vec<Spans> = inter_group
        .iter()
        .map(|&r| vec![blk(Buf::Output, r)])
        .collect();
    let first = level_allgather(
        inter,
        Level {
            group: &inter_group,
            me: n,
        },
        &inter_units,
    );
    let intra_units: Vec<Spans> = (0..mm)
        .map(|lm| {
            let mut v = Spans::new();
            for node in nodes.iter() {
                super::push_span(&mut v, blk(Buf::Output, node[lm]));
            }
            v
        })
        .collect();
    let second = level_allgather(
        intra,
        Level {
            group: &nodes[n],
            me: m,
        },
        &intra_units,
    );
    (first, second)
}

/// Two-level reduce-scatter of `Input` (one block per rank) whose own result lands in `out`,
/// the partial sum of block `r` kept in block `r` of `work` (the scratch; the all-reduce's
/// output, which has a block per rank).
pub fn reduce_scatter(
    topo: &Topology,
    rank: usize,
    (inter, intra): (LevelAlgo, LevelAlgo),
    out: Span,
    work: Buf,
) -> Vec<Phase> {
    let (mut a, b) = reduce_scatter_levels(topo, rank, (inter, intra), out, &whole, work);
    a.extend(b);
    a
}

/// The two levels of a reduce-scatter of `Input` blocks mapped by `blk`, this rank's result
/// landing in `out`, partial sums in `work`'s blocks: (intra-node phases, inter-node phases).
pub(crate) fn reduce_scatter_levels(
    topo: &Topology,
    rank: usize,
    (inter, intra): (LevelAlgo, LevelAlgo),
    out: Span,
    blk: BlockMap<'_>,
    work_buf: Buf,
) -> (Vec<Phase>, Vec<Phase>) {
    let nodes = topo.nodes();
    let (n, m) = topo.position(rank);
    let nn = nodes.len();
    let mm = nodes[n].len();
    let unit_of = |buf: Buf, lm: usize| -> Spans {
        let mut v = Spans::new();
        for node in nodes.iter() {
            super::push_span(&mut v, blk(buf, node[lm]));
        }
        v
    };
    let mut first = Vec::new();
    // Where each block's node-local partial sum is after the intra-node level.
    let partial = if mm > 1 {
        let src: Vec<Spans> = (0..mm).map(|lm| unit_of(Buf::Input, lm)).collect();
        let work: Vec<Spans> = (0..mm).map(|lm| unit_of(work_buf, lm)).collect();
        first = level_reduce_scatter(
            intra,
            Level {
                group: &nodes[n],
                me: m,
            },
            &src,
            &work,
            &work[m].clone(),
        );
        work_buf
    } else {
        Buf::Input
    };
    let inter_group: Vec<usize> = (0..nn).map(|x| nodes[x][m]).collect();
    let src: Vec<Spans> = inter_group.iter().map(|&r| vec![blk(partial, r)]).collect();
    let work: Vec<Spans> = inter_group
        .iter()
        .map(|&r| vec![blk(work_buf, r)])
        .collect();
    let second = level_reduce_scatter(
        inter,
        Level {
            group: &inter_group,
            me: n,
        },
        &src,
        &work,
        &vec![out],
    );
    (first, second)
}
