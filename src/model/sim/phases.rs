//! The phase engine ([`super::Engine::Phases`]): the ranks of one node, each distinct phase
//! timed once and reused.

use super::{Cluster, Engine, Job, Outcome};
use crate::error::{Error, Result};
use crate::model::contention::run_batch;
use crate::model::traffic::{of_plan, PhaseWork};
use crate::plan::{build, Algorithm, Collective};
use std::collections::HashMap;

impl Cluster<'_> {
    pub(super) fn phases(&self, job: &Job) -> Result<Outcome> {
        let s = Summary::new(self, job.coll, job.algo)?;
        Ok(s.outcome(self, job))
    }
}

/// A plan set reduced to node 0's distinct phases with their multiplicity (the `Phases`
/// engine's input; independent of the message size, so one summary serves every size).
pub struct Summary {
    /// Distinct phases (node 0's local ranks' work, peers as `(node, local)`), with counts.
    phases: Vec<(Vec<LocalWork>, usize)>,
    total: usize,
    msg_phases: usize,
    algo: Algorithm,
    /// Pieces per block of the plans (their spans address sub-blocks).
    pieces: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct LocalWork {
    // (peer node is 0, crosses the global links, peer local, blocks) per send; (peer node
    // is 0, peer local, blocks, reduce) per receive; copies; (blocks, spans, peer node is
    // 0) per send of several spans (whether it is packed depends on the block size).
    sends: Vec<(bool, bool, usize, usize)>,
    recvs: Vec<(bool, usize, usize, bool)>,
    copy_blocks: usize,
    strided: Vec<(usize, usize, bool)>,
}

impl Summary {
    /// Builds node 0's plans and groups their phases. Needs nodes of equal size.
    pub fn new(cl: &Cluster<'_>, coll: Collective, algo: Algorithm) -> Result<Self> {
        let topo = cl.topo;
        if !topo.is_regular() {
            return Err(Error::invalid(format!(
                "the phase engine needs nodes of equal size, not {}",
                topo.describe()
            )));
        }
        let node0 = &topo.nodes()[0];
        let plans: Vec<_> = node0
            .iter()
            .map(|&r| build(coll, algo, topo, r))
            .collect::<Result<_>>()?;
        let pieces = plans.first().map_or(1, |pl| pl.pieces);
        let works: Vec<Vec<PhaseWork>> = plans.iter().map(of_plan).collect();
        drop(plans);
        // Ranks of a node may have different phase counts (non-power-of-two recursive
        // doubling, uneven nodes): a rank without phase k does nothing in it.
        let n = works.iter().map(Vec::len).max().unwrap_or(0);
        let empty = PhaseWork {
            sends: Vec::new(),
            recvs: Vec::new(),
            copy_blocks: 0,
        };
        let mut index: HashMap<Vec<LocalWork>, usize> = HashMap::new();
        let mut phases: Vec<(Vec<LocalWork>, usize)> = Vec::new();
        let mut msg_phases = 0;
        for k in 0..n {
            let sig: Vec<LocalWork> = works
                .iter()
                .map(|w| {
                    let w = w.get(k).unwrap_or(&empty);
                    LocalWork {
                        sends: w
                            .sends
                            .iter()
                            .map(|s| {
                                let (nb, lb) = topo.position(s.peer);
                                (nb == 0, cl.crosses_global(0, nb), lb, s.blocks)
                            })
                            .collect(),
                        recvs: w
                            .recvs
                            .iter()
                            .map(|r| {
                                let (nb, lb) = topo.position(r.peer);
                                (nb == 0, lb, r.blocks, r.reduce)
                            })
                            .collect(),
                        copy_blocks: w.copy_blocks,
                        strided: w
                            .sends
                            .iter()
                            .filter(|s| s.spans > 1)
                            .map(|s| (s.blocks, s.spans, topo.position(s.peer).0 == 0))
                            .collect(),
                    }
                })
                .collect();
            if sig.iter().any(|l| !l.sends.is_empty()) {
                msg_phases += 1;
            }
            match index.get(&sig) {
                Some(&i) => phases[i].1 += 1,
                None => {
                    index.insert(sig.clone(), phases.len());
                    phases.push((sig, 1));
                }
            }
        }
        Ok(Summary {
            phases,
            total: n,
            msg_phases,
            algo: crate::plan::effective_algorithm(algo, topo),
            pieces,
        })
    }

    /// Times the summary's phases for `job` (its block size and reduction rate).
    pub fn outcome(&self, cl: &Cluster<'_>, job: &Job) -> Outcome {
        let job = Job {
            algo: self.algo,
            ..*job
        };
        let nccl = cl.nccl_ring(&job);
        let (speed, link_speed) = cl.speeds(&job);
        let caps = cl.caps(1, 1, link_speed, cl.vendor_intra(job.algo));
        let bb = job.block_bytes / self.pieces as f64;
        let mut seconds = 0.0;
        let mut flows: Vec<(f64, f64, Vec<u32>)> = Vec::new();
        let mut owner: Vec<(usize, usize, usize)> = Vec::new(); // (sender local, receiver local, inter)
        let mut sub = Vec::new();
        for (sig, count) in &self.phases {
            flows.clear();
            owner.clear();
            let local: Vec<(f64, f64)> = sig
                .iter()
                .map(|l| {
                    let rate = cl.prof.copy_gbps * 1e9 * speed;
                    let packed: usize = l
                        .strided
                        .iter()
                        .filter(|&&(blocks, spans, same)| cl.prof.packs(bb, blocks, spans, same))
                        .map(|s| s.0)
                        .sum();
                    let pack = packed as f64 * bb / rate;
                    (pack, pack + l.copy_blocks as f64 * bb / rate)
                })
                .collect();
            for (la, l) in sig.iter().enumerate() {
                for &(same, cross, lb, blocks) in &l.sends {
                    let bytes = blocks as f64 * bb;
                    let start = local[la].0.max(local.get(lb).map_or(0.0, |x| x.1))
                        + cl.alpha(!same, bytes, nccl, self.pieces);
                    // Node 0's messages share its cores: each one's overhead runs there
                    // while its bytes move, and the message ends when both have.
                    if let Some((work, res)) = cl.cpu_flow(1, (0, la), !same) {
                        flows.push((start, work, res.to_vec()));
                        owner.push((la, lb, usize::from(!same)));
                    }
                    // Its receiver's fixed cost of reducing it, on the receiver's core (the
                    // receiver on another node looks like node 0's rank `lb`).
                    let reduced = sig.get(lb).is_some_and(|r| {
                        r.recvs
                            .iter()
                            .any(|&(s, lq, _, reduce)| s == same && lq == la && reduce)
                    });
                    if let Some((work, res)) = cl.reduce_flow(1, (0, lb)).filter(|_| reduced) {
                        flows.push((start, work, res.to_vec()));
                        owner.push((la, lb, usize::from(!same)));
                    }
                    sub.clear();
                    // Another node's receive side looks like node 0's (symmetry): one node.
                    cl.route(1, (0, la), (usize::from(!same), lb), nccl, cross, &mut sub);
                    let work = bytes * cl.prof.eager_factor(bytes);
                    for (share, res) in &sub {
                        flows.push((start, work * share, res.clone()));
                        owner.push((la, lb, usize::from(!same)));
                    }
                }
            }
            let ends = run_batch(&caps, &flows);
            let mut msg_end: HashMap<(usize, usize, usize), (f64, f64)> = HashMap::new();
            for (i, o) in owner.iter().enumerate() {
                let e = msg_end.entry(*o).or_insert((f64::INFINITY, 0.0));
                e.0 = e.0.min(flows[i].0);
                e.1 = e.1.max(ends[i]);
            }
            let slowest = ends.iter().copied().fold(0.0, f64::max);
            let mut phase = 0.0f64;
            let mut arrivals = Vec::new();
            for (lr, l) in sig.iter().enumerate() {
                phase = phase.max(local[lr].1);
                // This rank's receives in the order they arrive, reduced one after another.
                arrivals.clear();
                for &(same, lq, blocks, reduce) in &l.recvs {
                    let span = msg_end
                        .get(&(lq, lr, usize::from(!same)))
                        .copied()
                        .unwrap_or((0.0, slowest));
                    arrivals.push((span, blocks as f64 * bb, reduce));
                }
                arrivals.sort_by(|a, b| a.0 .1.total_cmp(&b.0 .1));
                let mut busy = local[lr].1;
                for &(span, bytes, reduce) in &arrivals {
                    busy = busy.max(cl.recv_end(&job, bytes, reduce, span, busy));
                    phase = phase.max(busy);
                }
            }
            phase = phase.max(slowest);
            seconds += phase * *count as f64;
        }
        Outcome {
            seconds: seconds + cl.nccl_latency(&job, self.msg_phases),
            phases: self.total,
            distinct_phases: self.phases.len(),
            engine: Engine::Phases,
        }
    }
}
