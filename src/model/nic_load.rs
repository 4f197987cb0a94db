//! The bytes each NIC carries in a collective: where the network is the bottleneck, a plan
//! cannot finish before its busiest NIC direction has moved its bytes at the NIC's rate
//! (`pccl-bench --nic-rate`'s floor column, docs/CLUSTER.md).
//!
//! Every rank's plan is walked; a message between ranks of different nodes leaves through the
//! sender's NIC and enters through the receiver's (the topology's NIC map; NIC 0 without one).
//! Messages inside a node cross no NIC. NICs are full duplex: each direction is counted apart.

use crate::error::Result;
use crate::plan::{build, Algorithm, Collective};
use crate::topology::Topology;
use std::collections::HashMap;

use super::traffic;

/// One direction of one NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NicDir {
    /// Node index.
    pub node: usize,
    /// NIC index on the node.
    pub nic: usize,
    /// True for what the node sends, false for what it receives.
    pub send: bool,
}

/// Blocks through each NIC direction (an overlapped plan's pieces counted as fractions of
/// a block).
#[derive(Clone, Debug, Default)]
pub struct NicLoad {
    /// Blocks per NIC direction that carries any.
    pub blocks: HashMap<NicDir, f64>,
}

impl NicLoad {
    /// The busiest NIC direction and its blocks (`None` when nothing leaves a node).
    pub fn busiest(&self) -> Option<(NicDir, f64)> {
        self.blocks.iter().map(|(d, b)| (*d, *b)).max_by(|x, y| {
            x.1.total_cmp(&y.1)
                .then((y.0.node, y.0.nic).cmp(&(x.0.node, x.0.nic)))
        })
    }

    /// Seconds the busiest NIC direction needs at `bytes_per_s` with blocks of `block_bytes`.
    pub fn floor_seconds(&self, block_bytes: f64, bytes_per_s: f64) -> f64 {
        self.busiest()
            .map_or(0.0, |(_, b)| b * block_bytes / bytes_per_s)
    }
}

/// The NIC load of `collective` run with `algorithm` on `topo`, every rank's plan together.
pub fn nic_load(collective: Collective, algorithm: Algorithm, topo: &Topology) -> Result<NicLoad> {
    let mut load = NicLoad::default();
    // An overlapped plan moves pieces: `pieces` of them make a block.
    let unit = 1.0 / algorithm.pieces().max(1) as f64;
    for r in 0..topo.nranks() {
        let plan = build(collective, algorithm, topo, r)?;
        let (node, _) = topo.position(r);
        for phase in traffic::of_plan(&plan) {
            for s in phase.sends {
                let (peer_node, _) = topo.position(s.peer);
                if peer_node == node || s.blocks == 0 {
                    continue;
                }
                let out = NicDir {
                    node,
                    nic: topo.nic_of_rank(r),
                    send: true,
                };
                let inn = NicDir {
                    node: peer_node,
                    nic: topo.nic_of_rank(s.peer),
                    send: false,
                };
                *load.blocks.entry(out).or_default() += s.blocks as f64 * unit;
                *load.blocks.entry(inn).or_default() += s.blocks as f64 * unit;
            }
        }
    }
    Ok(load)
}

/// A NIC rate written as `tc` writes it (`200mbit`, `1gbit`, `500kbit`, `100bit`), in bytes
/// per second.
pub fn parse_rate(s: &str) -> Result<f64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.to_string(), *m)))
        .ok_or_else(|| {
            crate::Error::invalid(format!(
                "NIC rate {s}: expected a number with gbit, mbit, kbit or bit (as tc writes it)"
            ))
        })?;
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v * mult / 8.0),
        _ => Err(crate::Error::invalid(format!(
            "NIC rate {s}: expected a positive number before the unit"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::LevelAlgo;
    use crate::topology::NicMap;

    fn two_nics(n: usize) -> Topology {
        Topology::uniform(2 * n, 2).with_nic_map("0:0;1:1".parse::<NicMap>().unwrap())
    }

    #[test]
    fn a_ring_over_nodes_moves_p_minus_one_blocks_through_one_nic_each_way() {
        // 3 nodes x 2: the ring's node-crossing edges are 1->2, 3->4, 5->0; each node sends
        // P-1 = 5 blocks out of local rank 1's NIC and receives 5 into local rank 0's.
        let l = nic_load(
            Collective::AllGather,
            Algorithm::Flat(LevelAlgo::Ring),
            &two_nics(3),
        )
        .unwrap();
        for node in 0..3 {
            let out = NicDir {
                node,
                nic: 1,
                send: true,
            };
            let inn = NicDir {
                node,
                nic: 0,
                send: false,
            };
            assert_eq!(l.blocks.get(&out), Some(&5.0), "{:?}", l.blocks);
            assert_eq!(l.blocks.get(&inn), Some(&5.0), "{:?}", l.blocks);
        }
        assert_eq!(
            l.blocks.len(),
            6,
            "nothing else crosses a NIC: {:?}",
            l.blocks
        );
        assert_eq!(l.busiest().unwrap().1, 5.0);
        assert!((l.floor_seconds(1e6, 25e6) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn the_hierarchy_spreads_its_node_traffic_over_both_nics() {
        // Hierarchical all-gather on 3x2: local rank l exchanges with the l-th rank of every
        // other node, one block each: 2 blocks out and 2 in per NIC.
        let a = Algorithm::Hier {
            inter: LevelAlgo::Ring,
            intra: LevelAlgo::Ring,
        };
        let l = nic_load(Collective::AllGather, a, &two_nics(3)).unwrap();
        assert_eq!(l.blocks.len(), 12, "{:?}", l.blocks);
        assert!(l.blocks.values().all(|&b| b == 2.0), "{:?}", l.blocks);
        // One NIC for both local ranks doubles it.
        let one = Topology::uniform(6, 2);
        let l = nic_load(Collective::AllGather, a, &one).unwrap();
        assert_eq!(l.busiest().unwrap().1, 4.0);
    }

    #[test]
    fn overlapped_plans_count_whole_blocks() {
        let a = Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Ring,
        };
        let t = two_nics(4);
        let whole = nic_load(Collective::AllGather, a, &t).unwrap();
        let piped = nic_load(Collective::AllGather, a.overlapped(4).unwrap(), &t).unwrap();
        assert_eq!(whole.blocks, piped.blocks);
    }

    #[test]
    fn one_node_crosses_no_nic() {
        let l = nic_load(
            Collective::AllReduce { average: false },
            Algorithm::Flat(LevelAlgo::Ring),
            &Topology::uniform(4, 4),
        )
        .unwrap();
        assert!(l.busiest().is_none());
        assert_eq!(l.floor_seconds(1e6, 1e6), 0.0);
    }

    #[test]
    fn rates_parse_as_tc_writes_them() {
        assert_eq!(parse_rate("200mbit").unwrap(), 25e6);
        assert_eq!(parse_rate("1Gbit").unwrap(), 125e6);
        assert_eq!(parse_rate("8bit").unwrap(), 1.0);
        for bad in ["200", "mbit", "-1mbit", "fastmbit"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }
}
