//! One NIC map every rank agrees on. Each rank knows only its own view (its visible GPUs, its
//! `PCCL_NIC_MAP`), and ranks of one node may see their GPUs differently (each its own
//! `CUDA_VISIBLE_DEVICES`), so the views travel with the host keys the communicator already
//! all-gathers, and every rank computes the same map from the same gathered words.

use super::affinity::{nearest_nics, visible_gpus, MapSource};
use super::env::Env;
use super::hardware::NodeHardware;
use super::{NicMap, Topology};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Words per rank in the exchange: host key, header, then 32 NIC indices of 8 bits.
pub const WORDS: usize = 6;
/// Entries a view carries; a longer `PCCL_NIC_MAP` is agreed as its first 32 entries repeated.
const ENTRIES: usize = 32;
/// Header flag: this rank could not discover its topology.
const FAILED: u64 = 1 << 63;

/// What one rank contributes: its NIC for every local rank it could have.
#[derive(Clone, Debug)]
pub struct NicView {
    hw: Arc<NodeHardware>,
    user: Option<NicMap>,
    source: MapSource,
    nics: usize,
    /// The NIC of local rank `l` is `period[l % period.len()]`; empty: even spread or one NIC.
    period: Vec<usize>,
    error: Option<String>,
}

impl NicView {
    /// This rank's view from its discovery `hw` (or the error that discovery gave), its
    /// variables `env` and the configured map `user`.
    pub fn new(hw: Result<Arc<NodeHardware>>, env: &dyn Env, user: Option<NicMap>) -> Self {
        let (hw, error) = match hw {
            Ok(hw) => (hw, None),
            Err(e) => (
                Arc::new(NodeHardware::unknown(e.message().to_string())),
                Some(e.message().to_string()),
            ),
        };
        let nics = hw.nics.len();
        let (source, n, period) = if let Some(m) = &user {
            let p = (0..m.local_ranks()).map(|l| m.nic_of(l)).collect();
            (MapSource::User, m.nics(), p)
        } else if nics <= 1 {
            (MapSource::Single, 1, Vec::new())
        } else {
            let near = nearest_nics(&hw);
            match visible_gpus(&hw, env) {
                Ok(v) if !v.is_empty() => (
                    MapSource::Locality,
                    nics,
                    v.iter().map(|&g| near[g]).collect(),
                ),
                _ => (MapSource::Even, nics, Vec::new()),
            }
        };
        NicView {
            hw,
            user,
            source,
            nics: n,
            period,
            error,
        }
    }

    /// The discovered hardware.
    pub fn hardware(&self) -> &NodeHardware {
        &self.hw
    }

    /// The configured map, if any.
    pub fn user_map(&self) -> Option<&NicMap> {
        self.user.as_ref()
    }

    /// The words to all-gather with host key `key`.
    pub fn words(&self, key: u64) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        w[0] = key;
        w[1] = self.source as u64
            | ((self.nics.min(0xfff) as u64) << 4)
            | ((self.period.len().min(0xffff) as u64) << 16)
            | if self.error.is_some() { FAILED } else { 0 };
        for (k, &nic) in self.period.iter().take(ENTRIES).enumerate() {
            w[2 + k / 8] |= (nic.min(255) as u64) << (8 * (k % 8));
        }
        w
    }

    /// This rank's own map for a node of `local_ranks` ranks that all share its view (used
    /// when there is no exchange: `PCCL_RANKS_PER_NODE`).
    pub fn own_map(&self, local_ranks: usize) -> NicMap {
        let w = self.words(0);
        NicMap::from_nics(
            (0..local_ranks)
                .map(|l| decode(&w, l, local_ranks))
                .collect(),
            self.nics,
        )
    }

    /// The topology and NIC map from every rank's gathered words (`WORDS` per rank, in rank
    /// order). Fails on every rank when any rank could not discover its topology. The map is
    /// node 0's; [`Self::agree`] also returns every node's map.
    pub fn agree(&self, rank: usize, all: &[u64]) -> Result<(Topology, Vec<NicMap>, MapSource)> {
        let p = all.len() / WORDS;
        if let Some(bad) = (0..p).find(|&r| all[r * WORDS + 1] & FAILED != 0) {
            return Err(Error::invalid(match (&self.error, bad == rank) {
                (Some(e), true) => format!("rank {rank}: {e}"),
                _ => format!(
                    "rank {bad} could not discover its node's topology (its error says why; \
                     check PCCL_TOPO_FILE / HWLOC_XMLFILE there)"
                ),
            }));
        }
        let keys: Vec<u64> = (0..p).map(|r| all[r * WORDS]).collect();
        let topo = Topology::from_node_keys(&keys);
        let maps: Vec<NicMap> = topo
            .nodes()
            .iter()
            .map(|node| {
                let m = node.len();
                let lowest = &all[node[0] * WORDS..(node[0] + 1) * WORDS];
                let nics = ((lowest[1] >> 4) & 0xfff) as usize;
                NicMap::from_nics(
                    node.iter()
                        .enumerate()
                        .map(|(l, &r)| decode(&all[r * WORDS..(r + 1) * WORDS], l, m))
                        .collect(),
                    nics,
                )
            })
            .collect();
        let source = MapSource::from_code(all[topo.nodes()[0][0] * WORDS + 1] & 0xf);
        let topo = topo.with_nic_map(maps[0].clone());
        Ok((topo, maps, source))
    }
}

/// The NIC of local rank `l` of `m` from one rank's words.
fn decode(w: &[u64], l: usize, m: usize) -> usize {
    let source = MapSource::from_code(w[1] & 0xf);
    let nics = ((w[1] >> 4) & 0xfff) as usize;
    let len = ((w[1] >> 16) & 0xffff) as usize;
    let entry = |k: usize| ((w[2 + k / 8] >> (8 * (k % 8))) & 0xff) as usize;
    match (source, len) {
        (MapSource::Even, _) => NicMap::even(m.max(l + 1), nics).nic_of(l),
        (_, 0) => 0,
        (_, len) => entry((l % len) % ENTRIES),
    }
}

#[cfg(test)]
mod tests {
    use super::super::hardware::{Gpu, GpuVendor, Nic, NicKind};
    use super::*;

    /// GPU g nearest NIC 3 − g (Perlmutter-like).
    fn crossed() -> Arc<NodeHardware> {
        let gpus = (0..4)
            .map(|g| Gpu {
                vendor: GpuVendor::Nvidia,
                pci_bus_id: format!("0000:{:02x}:00.0", g + 1),
                uuid: Some(format!("GPU-{g}{g}{g}")),
                os_devices: vec![],
                path: vec![0, 10 + g as u64, 100 + g as u64],
            })
            .collect();
        let nics = (0..4)
            .map(|n| Nic {
                name: format!("cxi{n}"),
                netdev: None,
                kind: NicKind::Slingshot,
                port: None,
                pci_bus_id: String::new(),
                path: vec![0, 13 - n as u64, 200 + n as u64],
            })
            .collect();
        Arc::new(NodeHardware {
            gpus,
            nics,
            source: "test".into(),
        })
    }

    fn gather(views: &[(u64, NicView)]) -> Vec<u64> {
        views.iter().flat_map(|(k, v)| v.words(*k)).collect()
    }

    #[test]
    fn ranks_that_each_see_one_gpu_as_device_zero_agree_on_the_locality_map() {
        // Two nodes of 4 ranks; rank l of a node sees only GPU l (by UUID on node 0, by index
        // on node 1).
        let mut views = Vec::new();
        for node in 0..2u64 {
            for l in 0..4 {
                let spec = if node == 0 {
                    format!("GPU-{l}{l}{l}")
                } else {
                    l.to_string()
                };
                let env = vec![("CUDA_VISIBLE_DEVICES".to_string(), spec)];
                views.push((node + 7, NicView::new(Ok(crossed()), &env, None)));
            }
        }
        let all = gather(&views);
        for (r, (_, v)) in views.iter().enumerate() {
            let (topo, maps, src) = v.agree(r, &all).unwrap();
            assert_eq!(topo.nic_map().unwrap().to_string(), "0:3;1:2;2:1;3:0");
            assert_eq!(maps[1], maps[0]);
            assert_eq!(src, MapSource::Locality);
            assert_eq!(topo.nic_of_rank(5), 2);
        }
    }

    #[test]
    fn the_lowest_local_ranks_nic_count_and_each_ranks_own_nic_make_the_map() {
        let user: NicMap = "0:1;1:0".parse().unwrap();
        let views = [
            (1, NicView::new(Ok(crossed()), &[("X", "")], Some(user))),
            (
                1,
                NicView::new(Ok(crossed()), &[("CUDA_VISIBLE_DEVICES", "1")], None),
            ),
        ];
        let all = gather(&views);
        let (topo, _, src) = views[1].1.agree(1, &all).unwrap();
        // Rank 0 follows its map (NIC 1); rank 1 its GPU 1's nearest NIC (2); NICs from rank 0.
        assert_eq!(topo.nic_map().unwrap().to_string(), "1:0;2:1");
        assert_eq!(src, MapSource::User);
    }

    #[test]
    fn a_rank_whose_discovery_failed_fails_every_rank_naming_it() {
        let views = [
            (1, NicView::new(Ok(crossed()), &[("X", "")], None)),
            (
                1,
                NicView::new(Err(Error::system("no such file t.xml")), &[("X", "")], None),
            ),
        ];
        let all = gather(&views);
        let e0 = views[0].1.agree(0, &all).unwrap_err();
        assert!(e0.message().contains("rank 1"), "{e0}");
        let e1 = views[1].1.agree(1, &all).unwrap_err();
        assert!(e1.message().contains("t.xml"), "{e1}");
    }

    #[test]
    fn without_gpus_ranks_spread_evenly_and_with_one_nic_all_use_it() {
        let mut hw = (*crossed()).clone();
        hw.gpus.clear();
        let v = NicView::new(Ok(Arc::new(hw.clone())), &[("X", "")], None);
        assert_eq!(v.own_map(8).to_string(), "0:0-1;1:2-3;2:4-5;3:6-7");
        hw.nics.truncate(1);
        let v = NicView::new(Ok(Arc::new(hw)), &[("X", "")], None);
        assert_eq!(v.own_map(3).to_string(), "0:0-2");
    }
}
