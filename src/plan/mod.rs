//! Algorithms as data.
//!
//! A [`Plan`] is what one rank does for one collective: a list of [`Phase`]s, each a set of
//! [`Step`]s (send, receive, receive-and-reduce, local copy, average) on *block spans*. The
//! planner never touches memory or a transport: the executor runs plans, the checker
//! ([`check`]) proves them correct symbolically for every rank, and the cost model times them.
//!
//! Blocks: every buffer of a collective is cut into blocks; for all-gather and reduce-scatter
//! a block is one rank's share, for all-reduce the vector is cut into `P` balanced blocks.
//! A message is the concatenation of its spans' blocks, in order, and the receiver's spans
//! list the same blocks in the same order.
//!
//! Semantics of a phase: every read (send sources, copy sources, reduce operands) sees the
//! state at the start of the phase; every write targets positions no other step of the phase
//! reads or writes (the checker enforces this), so steps of a phase may run in any order.

mod algorithm;
pub mod alltoall;
pub mod broadcast;
pub mod check;
pub mod deep;
pub mod halving;
pub mod hierarchical;
pub mod overlap;
pub mod recursive;
pub mod relabel;
pub mod ring;
pub mod rooted;
pub mod scratch;
pub mod two_hop;
pub mod vector;

use crate::error::{Error, Result};
use crate::topology::Topology;
pub use algorithm::{Algorithm, LevelAlgo, MAX_PIECES};

/// Which buffer of a collective a span lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The caller's input (send) buffer.
    Input,
    /// The caller's output (receive) buffer.
    Output,
    /// Executor-owned working space in blocks of the input's (reduce-scatter: renumbered by
    /// lifetime, [`scratch::pack`]) or the output's size.
    Scratch,
}

/// A run of `len` consecutive blocks of buffer `buf`, starting at block `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// The buffer.
    pub buf: Buf,
    /// First block.
    pub start: usize,
    /// Number of blocks.
    pub len: usize,
}

impl Span {
    /// One block.
    pub fn block(buf: Buf, index: usize) -> Self {
        Span {
            buf,
            start: index,
            len: 1,
        }
    }
}

/// A list of spans, merged where adjacent.
pub type Spans = Vec<Span>;

/// Appends `s` to `v`, merging it with the last span when they are adjacent.
pub fn push_span(v: &mut Spans, s: Span) {
    if s.len == 0 {
        return;
    }
    if let Some(last) = v.last_mut() {
        if last.buf == s.buf && last.start + last.len == s.start {
            last.len += s.len;
            return;
        }
    }
    v.push(s);
}

/// Concatenates span lists, merging adjacent spans.
pub fn concat<'a>(parts: impl IntoIterator<Item = &'a Spans>) -> Spans {
    let mut v = Spans::new();
    for p in parts {
        for s in p {
            push_span(&mut v, *s);
        }
    }
    v
}

/// Total blocks in a span list.
pub fn blocks(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.len).sum()
}

/// One action of a phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send the blocks of `src` to communicator rank `peer`.
    Send { peer: usize, src: Spans },
    /// Receive a message from `peer` into `dst`.
    Recv { peer: usize, dst: Spans },
    /// Receive a message from `peer` and store `with ⊕ message` into `dst`
    /// (`with` may equal `dst`: an in-place reduction).
    RecvReduce {
        peer: usize,
        dst: Spans,
        with: Spans,
    },
    /// Local copy of `src` to `dst` (the same number of blocks).
    Copy { src: Spans, dst: Spans },
    /// Divide `dst` by the number of ranks (the last act of an average).
    Average { dst: Spans },
}

impl Step {
    /// The span lists the step reads or writes (sources, destinations, reduce operands).
    pub fn span_lists(&self) -> Vec<&Spans> {
        match self {
            Step::Send { src, .. } => vec![src],
            Step::Recv { dst, .. } | Step::Average { dst } => vec![dst],
            Step::RecvReduce { dst, with, .. } => vec![dst, with],
            Step::Copy { src, dst } => vec![src, dst],
        }
    }

    /// [`Step::span_lists`], to rewrite them.
    pub fn span_lists_mut(&mut self) -> Vec<&mut Spans> {
        match self {
            Step::Send { src, .. } => vec![src],
            Step::Recv { dst, .. } | Step::Average { dst } => vec![dst],
            Step::RecvReduce { dst, with, .. } => vec![dst, with],
            Step::Copy { src, dst } => vec![src, dst],
        }
    }
}

/// Steps that run together; see the module docs for their semantics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    /// The steps of this phase.
    pub steps: Vec<Step>,
}

impl Phase {
    /// A phase of the given steps.
    pub fn of(steps: Vec<Step>) -> Self {
        Phase { steps }
    }
}

/// The collective a plan implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank contributes one block; every rank gets all `P` in rank order.
    AllGather,
    /// Every rank contributes `P` blocks; rank `i` gets the reduction of everyone's block `i`.
    ReduceScatter {
        /// Whether the result is divided by `P` at the end.
        average: bool,
    },
    /// Reduce-scatter followed by all-gather over `P` balanced blocks.
    AllReduce {
        /// Whether the result is divided by `P`.
        average: bool,
    },
    /// The root's one block reaches every rank.
    Broadcast {
        /// The rank whose data is sent.
        root: usize,
    },
    /// No data; no rank leaves before every rank has entered.
    Barrier,
    /// Every rank contributes one block; the root gets their reduction (binomial tree).
    Reduce {
        /// The rank that gets the result.
        root: usize,
        /// Whether the result is divided by `P`.
        average: bool,
    },
    /// Every rank contributes one block; the root gets all `P` in rank order.
    Gather {
        /// The rank that gets the blocks.
        root: usize,
    },
    /// The root holds `P` blocks; rank `i` gets block `i`.
    Scatter {
        /// The rank whose blocks are sent.
        root: usize,
    },
    /// Every rank holds `P` blocks, block `j` for rank `j`; rank `i` ends with block `i` of
    /// every rank, in rank order.
    AllToAll {
        /// One phase posting every send and receive at once ([`alltoall::direct`], chosen
        /// for latency-bound sizes by [`alltoall::use_direct`]) instead of `P - 1` pairwise
        /// exchanges ([`alltoall::pairwise`]).
        direct: bool,
    },
}

impl Collective {
    /// The root of a rooted collective.
    pub fn root(self) -> Option<usize> {
        match self {
            Collective::Broadcast { root }
            | Collective::Reduce { root, .. }
            | Collective::Gather { root }
            | Collective::Scatter { root } => Some(root),
            _ => None,
        }
    }

    /// Whether the plan is fixed by the collective (no algorithm choice, no tuner).
    pub fn fixed_algorithm(self) -> bool {
        matches!(
            self,
            Collective::Reduce { .. }
                | Collective::Gather { .. }
                | Collective::Scatter { .. }
                | Collective::AllToAll { .. }
        )
    }
}

/// What one rank does for one collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The collective.
    pub collective: Collective,
    /// The algorithm that produced the plan (after any fallback).
    pub algorithm: Algorithm,
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Pieces per block: the plan's spans address `pieces` sub-blocks per block, sub-block
    /// `b·pieces + j` being the `j`-th of `pieces` balanced element runs of block `b`
    /// (see [`overlap`]).
    pub pieces: usize,
}

impl Plan {
    /// Blocks of the scratch buffer the plan touches (`0..n`): what a rank must allocate
    /// (the collective's scratch layout cut to that many blocks).
    pub fn scratch_blocks(&self) -> usize {
        let k = self.pieces.max(1);
        self.phases
            .iter()
            .flat_map(|ph| &ph.steps)
            .flat_map(Step::span_lists)
            .flatten()
            .filter(|sp| sp.buf == Buf::Scratch && sp.len > 0)
            .map(|sp| (sp.start + sp.len).div_ceil(k))
            .max()
            .unwrap_or(0)
    }

    /// Number of messages this rank sends.
    pub fn sends(&self) -> usize {
        self.phases
            .iter()
            .flat_map(|p| &p.steps)
            .filter(|s| matches!(s, Step::Send { .. }))
            .count()
    }
}

/// One level of a plan: the ranks taking part, in the order the algorithm numbers them, and
/// this rank's index among them.
#[derive(Clone, Copy, Debug)]
pub struct Level<'a> {
    /// Communicator ranks of the members.
    pub group: &'a [usize],
    /// This rank's index in `group`.
    pub me: usize,
}

impl Level<'_> {
    /// Members in the level.
    pub fn size(&self) -> usize {
        self.group.len()
    }
    /// Communicator rank of member `i` (taken modulo the size).
    pub fn peer(&self, i: usize) -> usize {
        self.group[i % self.group.len()]
    }
}

/// Builds the plan of `rank` for `collective` with `algorithm` on `topo`. A hierarchical
/// algorithm on nodes of unequal size falls back to the flat one of its inter-node level
/// (the returned plan's `algorithm` says so). The plan is correct in place and out of place.
pub fn build(
    collective: Collective,
    algorithm: Algorithm,
    topo: &Topology,
    rank: usize,
) -> Result<Plan> {
    build_for(collective, algorithm, topo, rank, false)
}

/// [`build`] for a call whose output does not alias its input when `out_of_place`: the flat
/// ring reduce-scatter then keeps one of its two rotating partial sums in the output block
/// (one scratch block instead of two). Ranks may differ in it: only where a rank keeps its
/// partial sums changes, not what moves between ranks.
pub fn build_for(
    collective: Collective,
    algorithm: Algorithm,
    topo: &Topology,
    rank: usize,
    out_of_place: bool,
) -> Result<Plan> {
    let p = topo.nranks();
    if rank >= p {
        return Err(Error::invalid(format!(
            "rank {rank} is outside a communicator of {p} ranks"
        )));
    }
    let algorithm = effective_algorithm(algorithm, topo).for_collective(collective);
    if let Some(root) = collective.root() {
        if root >= p {
            return Err(Error::invalid(format!(
                "{collective:?}: root {root} is outside a communicator of {p} ranks"
            )));
        }
    }
    let phases = match collective {
        Collective::Barrier => broadcast::barrier(rank, p),
        Collective::Broadcast { root } => broadcast::binomial(rank, p, root),
        Collective::Reduce { root, average } => rooted::reduce(rank, p, root, average),
        Collective::Gather { root } => rooted::gather(rank, p, root),
        Collective::Scatter { root } => rooted::scatter(rank, p, root),
        Collective::AllToAll { direct: false } => alltoall::pairwise(rank, p),
        Collective::AllToAll { direct: true } => alltoall::direct(rank, p),
        Collective::AllGather => {
            let k = algorithm.pieces();
            let mut ph = vec![Phase::of(vec![Step::Copy {
                src: vec![overlap::whole_block(Buf::Input, 0, k)],
                dst: vec![overlap::whole_block(Buf::Output, rank, k)],
            }])];
            ph.extend(allgather_in_output(algorithm, topo, rank));
            ph
        }
        Collective::ReduceScatter { average } => {
            let mut ph = match algorithm {
                // Uniform blocks: the ring's partial sums rotate through two scratch blocks.
                Algorithm::Flat(LevelAlgo::Ring) if p > 2 => {
                    let group = flat_group(p);
                    let lvl = Level {
                        group: &group,
                        me: rank,
                    };
                    let out = vec![Span::block(Buf::Output, 0)];
                    let scratch = |b| vec![Span::block(Buf::Scratch, b)];
                    // Step t folds into slot t % 2 and the last step (p - 2) writes the
                    // output: out of place, the output is the slot of that parity (never the
                    // one sent in the same phase).
                    let slots = match (out_of_place, p % 2) {
                        (false, _) => [scratch(0), scratch(1)],
                        (true, 0) => [out.clone(), scratch(0)],
                        (true, _) => [scratch(0), out.clone()],
                    };
                    let src = flat_units(p, Buf::Input);
                    ring::reduce_scatter_two_slots(lvl, &src, &slots, &out)
                }
                a => reduce_scatter_into(a, topo, rank, (Buf::Output, 0), Buf::Scratch),
            };
            if average {
                ph.push(Phase::of(vec![Step::Average {
                    dst: vec![overlap::whole_block(Buf::Output, 0, algorithm.pieces())],
                }]));
            }
            ph
        }
        Collective::AllReduce { average } if algorithm == Algorithm::VectorRd => {
            vector::allreduce(rank, p, average)
        }
        Collective::AllReduce { average } => {
            // The partial sums live in the output's own blocks: no scratch.
            let mut ph =
                reduce_scatter_into(algorithm, topo, rank, (Buf::Output, rank), Buf::Output);
            let mine = overlap::whole_block(Buf::Output, rank, algorithm.pieces());
            if average {
                ph.push(Phase::of(vec![Step::Average { dst: vec![mine] }]));
            }
            ph.extend(allgather_in_output(algorithm, topo, rank));
            let three = matches!(algorithm, Algorithm::Deep { .. });
            if !matches!(algorithm, Algorithm::Flat(_)) {
                if let Some(map) = relabel::level_major(topo, three) {
                    relabel::relabel(&mut ph, algorithm.pieces(), &map);
                }
            }
            ph
        }
    };
    let mut plan = Plan {
        collective,
        algorithm,
        rank,
        nranks: p,
        phases,
        pieces: match collective {
            // Only the collectives built from levels are cut in pieces.
            Collective::AllGather
            | Collective::ReduceScatter { .. }
            | Collective::AllReduce { .. } => algorithm.pieces(),
            _ => 1,
        },
    };
    if let Collective::ReduceScatter { .. } = collective {
        // Partial sums were laid out like the input; keep only as many blocks as are alive.
        scratch::pack(&mut plan);
    }
    Ok(plan)
}

/// The algorithm that will actually run: hierarchical needs nodes of equal size and more
/// than one level; otherwise the flat algorithm of the inter-node level. Three levels need
/// groups inside the nodes; otherwise the two-level algorithm of the outer two.
pub fn effective_algorithm(algorithm: Algorithm, topo: &Topology) -> Algorithm {
    match algorithm {
        Algorithm::Hier { inter, .. }
        | Algorithm::Overlap { inter, .. }
        | Algorithm::Deep { inter, .. }
            if !topo.is_regular() =>
        {
            Algorithm::Flat(inter)
        }
        Algorithm::Deep {
            inter, mid, pieces, ..
        } if !topo.has_groups() => effective_algorithm(
            match pieces {
                1 => Algorithm::Hier { inter, intra: mid },
                k => Algorithm::Overlap {
                    inter,
                    intra: mid,
                    pieces: k,
                },
            },
            topo,
        ),
        Algorithm::Deep { pieces, .. } if pieces == 0 || pieces > MAX_PIECES => algorithm
            .overlapped(pieces.clamp(1, MAX_PIECES))
            .unwrap_or(algorithm),
        Algorithm::Overlap { pieces, .. } if pieces == 0 || pieces > MAX_PIECES => algorithm
            .overlapped(pieces.clamp(1, MAX_PIECES))
            .unwrap_or(algorithm),
        a => a,
    }
}

/// The all-gather of `Output` blocks by `algorithm`, each rank's own block (its pieces, for
/// an overlapped one) already in place.
fn allgather_in_output(algorithm: Algorithm, topo: &Topology, rank: usize) -> Vec<Phase> {
    let p = topo.nranks();
    match algorithm {
        Algorithm::Flat(a) => flat_allgather_in_output(a, rank, p),
        Algorithm::VectorRd => flat_allgather_in_output(LevelAlgo::Rd, rank, p),
        Algorithm::Hier { inter, intra } => {
            hierarchical::allgather_in_output(topo, rank, inter, intra)
        }
        Algorithm::Deep {
            inter,
            mid,
            inner,
            pieces,
        } => overlap::deep_allgather_in_output(topo, rank, &[inter, mid, inner], pieces),
        Algorithm::Overlap {
            inter,
            intra,
            pieces,
        } => overlap::allgather_in_output(topo, rank, inter, intra, pieces),
    }
}

/// The reduce-scatter of `Input` by `algorithm`: this rank's result lands in logical block
/// `out` (its pieces, for an overlapped one), the partial sum of block `j` in block `j` of
/// `work` (the scratch, or the all-reduce's output).
fn reduce_scatter_into(
    algorithm: Algorithm,
    topo: &Topology,
    rank: usize,
    out: (Buf, usize),
    work: Buf,
) -> Vec<Phase> {
    let p = topo.nranks();
    let span = Span::block(out.0, out.1);
    match algorithm {
        Algorithm::Flat(a) => flat_reduce_scatter_in(a, rank, p, span, work),
        Algorithm::VectorRd => flat_reduce_scatter_in(LevelAlgo::Rd, rank, p, span, work),
        Algorithm::Hier { inter, intra } => {
            hierarchical::reduce_scatter(topo, rank, (inter, intra), span, work)
        }
        Algorithm::Deep {
            inter,
            mid,
            inner,
            pieces,
        } => overlap::deep_reduce_scatter(topo, rank, &[inter, mid, inner], out, pieces, work),
        Algorithm::Overlap {
            inter,
            intra,
            pieces,
        } => overlap::reduce_scatter(topo, rank, (inter, intra), out, pieces, work),
    }
}

fn flat_units(p: usize, buf: Buf) -> Vec<Spans> {
    (0..p).map(|b| vec![Span::block(buf, b)]).collect()
}

fn flat_group(p: usize) -> Vec<usize> {
    (0..p).collect()
}

fn flat_allgather_in_output(a: LevelAlgo, rank: usize, p: usize) -> Vec<Phase> {
    let group = flat_group(p);
    let lvl = Level {
        group: &group,
        me: rank,
    };
    let units = flat_units(p, Buf::Output);
    level_allgather(a, lvl, &units)
}

/// The flat reduce-scatter by `a`, the partial sum of unit `j` kept in block `j` of `work`.
fn flat_reduce_scatter_in(a: LevelAlgo, rank: usize, p: usize, out: Span, work: Buf) -> Vec<Phase> {
    let group = flat_group(p);
    let lvl = Level {
        group: &group,
        me: rank,
    };
    let src = flat_units(p, Buf::Input);
    let work = flat_units(p, work);
    level_reduce_scatter(a, lvl, &src, &work, &vec![out])
}

/// All-gather among the members of `lvl`: member `i` owns `units[i]` (already in place) and
/// ends with every unit.
pub fn level_allgather(a: LevelAlgo, lvl: Level<'_>, units: &[Spans]) -> Vec<Phase> {
    match a {
        LevelAlgo::Ring => ring::allgather(lvl, units),
        LevelAlgo::Rd => recursive::allgather(lvl, units),
    }
}

/// Reduce-scatter among the members of `lvl`: every member holds its contribution to unit
/// `j` at `src[j]`; member `i` ends with the reduction of all contributions to unit `i` at
/// `out`, using `work[j]` as scratch for partial sums.
pub fn level_reduce_scatter(
    a: LevelAlgo,
    lvl: Level<'_>,
    src: &[Spans],
    work: &[Spans],
    out: &Spans,
) -> Vec<Phase> {
    if lvl.size() == 1 {
        return vec![Phase::of(vec![Step::Copy {
            src: src[0].clone(),
            dst: out.clone(),
        }])];
    }
    match a {
        LevelAlgo::Ring => ring::reduce_scatter(lvl, src, work, out),
        LevelAlgo::Rd => recursive::reduce_scatter(lvl, src, work, out),
    }
}

/// Tracks, while a reduce-scatter is generated, whether a unit's partial sum lives in the
/// source (never reduced yet) or in the work area.
pub(crate) struct Partials<'a> {
    src: &'a [Spans],
    work: &'a [Spans],
    written: Vec<bool>,
}

impl<'a> Partials<'a> {
    pub(crate) fn new(src: &'a [Spans], work: &'a [Spans]) -> Self {
        Partials {
            src,
            work,
            written: vec![false; src.len()],
        }
    }
    /// Where unit `u`'s current partial sum is.
    pub(crate) fn current(&self, u: usize) -> &'a Spans {
        if self.written[u] {
            &self.work[u]
        } else {
            &self.src[u]
        }
    }
    /// Where unit `u`'s next partial sum goes (and records it).
    pub(crate) fn next(&mut self, u: usize) -> &'a Spans {
        self.written[u] = true;
        &self.work[u]
    }
}

#[cfg(test)]
mod tests {
    use super::{Algorithm, LevelAlgo};

    #[test]
    fn only_recursive_doubling_across_three_nodes_or_more_asks_for_a_rendezvous() {
        let (ring, rd) = (LevelAlgo::Ring, LevelAlgo::Rd);
        let hier = |inter, intra| Algorithm::Hier { inter, intra };
        let overlap = |inter, intra| Algorithm::Overlap {
            inter,
            intra,
            pieces: 4,
        };
        let deep = |inter, mid, inner| Algorithm::Deep {
            inter,
            mid,
            inner,
            pieces: 1,
        };
        for a in [
            Algorithm::Flat(rd),
            Algorithm::VectorRd,
            hier(rd, ring),
            hier(rd, rd),
            overlap(rd, ring),
            deep(rd, ring, ring),
        ] {
            assert!(
                a.rendezvous(3) && a.rendezvous(4) && a.rendezvous(64),
                "{a}"
            );
            // One node, or two (a single exchange across the network): nothing to gain.
            assert!(!a.rendezvous(1) && !a.rendezvous(2), "{a}");
        }
        for a in [
            Algorithm::Flat(ring),
            hier(ring, rd),
            overlap(ring, rd),
            deep(ring, rd, rd),
        ] {
            assert!(!a.rendezvous(8), "{a}: a ring receives from one peer only");
        }
    }
}
