//! What a plan asks of the machine, phase by phase: the messages it sends and receives (in
//! blocks, with the number of pieces a strided send is packed from) and its local copies.
//! This is all the model needs of a plan; block lists themselves are dropped.

use crate::plan::{blocks, Plan, Step};

/// A send of one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Send {
    /// Destination rank.
    pub peer: usize,
    /// Blocks sent.
    pub blocks: usize,
    /// Separate spans the message is gathered from (more than one: the executor packs it).
    pub spans: usize,
}

/// A receive of one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Recv {
    /// Source rank.
    pub peer: usize,
    /// Blocks received.
    pub blocks: usize,
    /// Whether the message is reduced into local data as it arrives.
    pub reduce: bool,
}

/// One phase of one rank.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PhaseWork {
    /// Messages sent.
    pub sends: Vec<Send>,
    /// Messages received.
    pub recvs: Vec<Recv>,
    /// Blocks copied locally (`Copy` steps, and `Average`, which touches its blocks once).
    pub copy_blocks: usize,
}

impl PhaseWork {
    /// Blocks packed into contiguous messages before sending: those of the sends of more
    /// than one span that `packs` says the transport packs (`Profile::packs`).
    pub fn packed_blocks(&self, packs: impl Fn(&Send) -> bool) -> usize {
        self.sends
            .iter()
            .filter(|s| s.spans > 1 && packs(s))
            .map(|s| s.blocks)
            .sum()
    }
}

/// The work of every phase of `plan`.
pub fn of_plan(plan: &Plan) -> Vec<PhaseWork> {
    plan.phases
        .iter()
        .map(|ph| {
            let mut w = PhaseWork::default();
            for st in &ph.steps {
                match st {
                    Step::Send { peer, src } => w.sends.push(Send {
                        peer: *peer,
                        blocks: blocks(src),
                        spans: src.len(),
                    }),
                    Step::Recv { peer, dst } => w.recvs.push(Recv {
                        peer: *peer,
                        blocks: blocks(dst),
                        reduce: false,
                    }),
                    Step::RecvReduce { peer, dst, .. } => w.recvs.push(Recv {
                        peer: *peer,
                        blocks: blocks(dst),
                        reduce: true,
                    }),
                    Step::Copy { src, dst } => {
                        // The in-place form (same span) costs nothing.
                        if src != dst {
                            w.copy_blocks += blocks(dst)
                        }
                    }
                    Step::Average { dst } => w.copy_blocks += blocks(dst),
                }
            }
            w
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{build, Algorithm, Collective, LevelAlgo};
    use crate::topology::Topology;

    #[test]
    fn hierarchical_intra_sends_are_packed_from_one_span_per_node() {
        let topo = Topology::uniform(8, 4);
        let a = Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Ring,
        };
        let plan = build(Collective::AllGather, a, &topo, 1).unwrap();
        let w = of_plan(&plan);
        // copy, 1 inter-node exchange, 3 intra ring steps.
        assert_eq!(w.len(), 5);
        assert_eq!(w[0].copy_blocks, 1);
        assert_eq!(w[1].sends[0].blocks, 1);
        assert_eq!(w[1].sends[0].peer, 5);
        for p in &w[2..] {
            assert_eq!(p.sends[0].blocks, 2);
            assert_eq!(p.sends[0].spans, 2);
            assert_eq!(p.packed_blocks(|_| true), 2);
            assert_eq!(p.packed_blocks(|_| false), 0);
        }
    }
}
