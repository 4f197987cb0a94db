//! α-β-γ costs of real plans: each phase costs its slowest message (latency α plus bytes
//! times β of the level the message crosses) plus the reduction of what it received (γ).

use crate::error::{Error, Result};
use crate::plan::{blocks, Plan, Step};
use crate::topology::Topology;
use std::str::FromStr;

/// Model parameters per level, in seconds and seconds per byte.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostParams {
    /// Latency of a message inside a node.
    pub alpha_intra: f64,
    /// Seconds per byte inside a node.
    pub beta_intra: f64,
    /// Latency of a message between nodes.
    pub alpha_inter: f64,
    /// Seconds per byte between nodes.
    pub beta_inter: f64,
    /// Seconds per byte reduced.
    pub gamma: f64,
}

impl Default for CostParams {
    /// Host-memory defaults measured on the 2-core CI machine with `pccl-bench`
    /// (threads transport): α ≈ 5 µs, ≈ 8 GB/s copies, ≈ 6 GB/s reductions; inter-node
    /// defaults of a 100 Gb/s network (α ≈ 5 µs, 12.5 GB/s).
    fn default() -> Self {
        CostParams {
            alpha_intra: 5e-6,
            beta_intra: 1.0 / 8e9,
            alpha_inter: 5e-6,
            beta_inter: 1.0 / 12.5e9,
            gamma: 1.0 / 6e9,
        }
    }
}

impl FromStr for CostParams {
    type Err = Error;
    /// `a_intra_us,bw_intra_GBps,a_inter_us,bw_inter_GBps,bw_reduce_GBps`.
    fn from_str(s: &str) -> Result<Self> {
        let v: Vec<f64> = s.split(',').map(|x| x.trim().parse::<f64>()).collect::<std::result::Result<_, _>>().map_err(|_| {
            Error::invalid(format!("PCCL_MODEL='{s}': expected five numbers a_intra_us,bw_intra_GBps,a_inter_us,bw_inter_GBps,bw_reduce_GBps"))
        })?;
        if v.len() != 5
            || v.iter().any(|x| !(x.is_finite() && *x >= 0.0))
            || v[1] == 0.0
            || v[3] == 0.0
            || v[4] == 0.0
        {
            return Err(Error::invalid(format!(
                "PCCL_MODEL='{s}': expected five non-negative numbers, bandwidths above zero"
            )));
        }
        Ok(CostParams {
            alpha_intra: v[0] * 1e-6,
            beta_intra: 1.0 / (v[1] * 1e9),
            alpha_inter: v[2] * 1e-6,
            beta_inter: 1.0 / (v[3] * 1e9),
            gamma: 1.0 / (v[4] * 1e9),
        })
    }
}

/// Predicted seconds for `plan` when every block is `block_bytes` long.
pub fn plan_time(plan: &Plan, topo: &Topology, block_bytes: f64, prm: &CostParams) -> f64 {
    let my_node = topo.position(plan.rank).0;
    plan.phases
        .iter()
        .map(|ph| {
            let mut slowest: f64 = 0.0;
            let mut reduce = 0.0;
            for st in &ph.steps {
                let (peer, n) = match st {
                    Step::Send { peer, src } => (*peer, blocks(src)),
                    Step::Recv { peer, dst } => (*peer, blocks(dst)),
                    Step::RecvReduce { peer, dst, .. } => {
                        reduce += blocks(dst) as f64 * block_bytes * prm.gamma;
                        (*peer, blocks(dst))
                    }
                    Step::Copy { dst, .. } => {
                        slowest = slowest.max(blocks(dst) as f64 * block_bytes * prm.beta_intra);
                        continue;
                    }
                    Step::Average { .. } => continue,
                };
                let inter = topo.position(peer).0 != my_node;
                let (a, b) = if inter {
                    (prm.alpha_inter, prm.beta_inter)
                } else {
                    (prm.alpha_intra, prm.beta_intra)
                };
                slowest = slowest.max(a + n as f64 * block_bytes * b);
            }
            slowest + reduce
        })
        .sum()
}
