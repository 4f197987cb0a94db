//! Picks the algorithm with the lowest modelled time for a collective and message size.

use super::cost::{plan_time, CostParams};
use crate::error::Result;
use crate::plan::{build, Algorithm, Collective, LevelAlgo};
use crate::topology::Topology;

/// The algorithms worth considering on `topo`.
pub fn candidates(topo: &Topology) -> Vec<Algorithm> {
    let mut v = vec![
        Algorithm::Flat(LevelAlgo::Ring),
        Algorithm::Flat(LevelAlgo::Rd),
    ];
    if let Some(m) = topo.ranks_per_node() {
        if m > 1 && topo.nodes().len() > 1 {
            for inter in [LevelAlgo::Rd, LevelAlgo::Ring] {
                for intra in [LevelAlgo::Ring, LevelAlgo::Rd] {
                    v.push(Algorithm::Hier { inter, intra });
                }
            }
        }
    }
    v
}

/// The best algorithm for `coll` on `topo` with blocks of `block_bytes`, with each
/// candidate's predicted seconds (for `PCCL_DEBUG=INFO`).
///
/// Every rank must choose the same algorithm, so the score depends only on the topology: the
/// slowest of a few fixed sample ranks (first, middle, last), not on the calling rank.
pub fn choose(
    coll: Collective,
    topo: &Topology,
    block_bytes: usize,
    prm: &CostParams,
) -> Result<(Algorithm, Vec<(Algorithm, f64)>)> {
    let p = topo.nranks();
    let mut samples = vec![0, p / 2, p.saturating_sub(1)];
    samples.dedup();
    let mut scored = Vec::new();
    for a in candidates(topo) {
        let mut worst: f64 = 0.0;
        for &r in &samples {
            let plan = build(coll, a, topo, r)?;
            worst = worst.max(plan_time(&plan, topo, block_bytes as f64, prm));
        }
        scored.push((a, worst));
    }
    let best = scored
        .iter()
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|x| x.0)
        .unwrap_or(Algorithm::Flat(LevelAlgo::Ring));
    Ok((best, scored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_small_blocks_across_nodes_prefer_logarithmic_inter_node_steps() {
        let topo = Topology::uniform(64, 4);
        let prm = CostParams {
            alpha_inter: 20e-6,
            ..CostParams::default()
        };
        let (best, _) = choose(Collective::AllGather, &topo, 1024, &prm).unwrap();
        assert!(
            matches!(
                best,
                Algorithm::Flat(LevelAlgo::Rd)
                    | Algorithm::Hier {
                        inter: LevelAlgo::Rd,
                        ..
                    }
            ),
            "{best}"
        );
    }

    #[test]
    fn a_slow_network_prefers_the_hierarchy() {
        let topo = Topology::uniform(16, 4);
        let prm = CostParams {
            beta_inter: 1.0 / 1e9,
            beta_intra: 1.0 / 50e9,
            ..CostParams::default()
        };
        let (best, _) = choose(Collective::AllGather, &topo, 1 << 20, &prm).unwrap();
        assert!(matches!(best, Algorithm::Hier { .. }), "{best}");
    }
}
