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

/// Words per rank in the exchange: host key, header, 32 NIC indices of 8 bits, then the
/// rank's NUMA node + 1 (0: none).
pub const WORDS: usize = 7;
/// The word of the NUMA node.
const NUMA: usize = 6;
/// Entries a view carries; a longer `PCCL_NIC_MAP` is agreed as its first 32 entries repeated.
const ENTRIES: usize = 32;
/// Header flag: this rank could not discover its topology.
const FAILED: u64 = 1 << 63;
/// Header flag: the group size (bits 32–43) is the user's. Bits 48–59: the rank's GPU count.
const GROUP_USER: u64 = 1 << 44;

/// Ranks per group of GPUs sharing a PCI parent (the GCDs of one MI250X, GPUs behind one
/// switch), when every such group has the same size of at least 2 and is contiguous in bus
/// order (ranks drive GPUs in that order); else 0.
pub fn gpu_group(hw: &NodeHardware) -> usize {
    let parent = |g: &super::hardware::Gpu| g.path.len().checked_sub(2).map(|i| g.path[i]);
    let mut sizes: Vec<usize> = Vec::new();
    let mut last: Option<Option<u64>> = None;
    let mut seen: Vec<Option<u64>> = Vec::new();
    for g in &hw.gpus {
        let p = parent(g);
        if p.is_none() {
            return 0;
        }
        if last == Some(p) {
            if let Some(s) = sizes.last_mut() {
                *s += 1;
            }
        } else {
            if seen.contains(&p) {
                return 0; // not contiguous in bus order
            }
            seen.push(p);
            sizes.push(1);
            last = Some(p);
        }
    }
    match sizes.first() {
        Some(&k) if k >= 2 && sizes.len() >= 2 && sizes.iter().all(|&s| s == k) => k,
        _ => 0,
    }
}

/// Ranks per group of ranks bound to one NUMA node, on nodes without GPUs:
/// every rank's NUMA node known (`numa[r]`: node + 1, 0 unknown), each NUMA node's ranks
/// contiguous in local rank order, every group of one size of at least 2 and at least 2
/// groups per node, the same on every node; else 1.
fn numa_group(topo: &Topology, headers: &[u64], numa: &[u64]) -> usize {
    let gpus = |r: usize| ((headers[r] >> 48) & 0xfff) as usize;
    let mut size = None;
    for node in topo.nodes() {
        if node.iter().any(|&r| numa[r] == 0 || gpus(r) > 0) {
            return 1;
        }
        let mut runs: Vec<(u64, usize)> = Vec::new();
        for &r in node {
            if let Some((id, n)) = runs.last_mut() {
                if *id == numa[r] {
                    *n += 1;
                    continue;
                }
            }
            if runs.iter().any(|(id, _)| *id == numa[r]) {
                return 1; // not contiguous
            }
            runs.push((numa[r], 1));
        }
        let g = runs[0].1;
        if g < 2 || runs.len() < 2 || runs.iter().any(|&(_, n)| n != g) {
            return 1;
        }
        if *size.get_or_insert(g) != g {
            return 1;
        }
    }
    size.unwrap_or(1)
}

/// The group size every rank agrees on from the gathered header words: the user's (every
/// rank must give the same, dividing the nodes), else discovery's where every rank found the
/// same one and drives one GPU of its node each, else the ranks' NUMA nodes
/// ([`numa_group`]); 1 for none.
fn agree_group(topo: &Topology, headers: &[u64], numa: &[u64]) -> Result<usize> {
    let of = |h: u64| ((h >> 32) & 0xfff) as usize;
    let user = |h: u64| h & GROUP_USER != 0;
    if let Some(u) = headers.iter().position(|&h| user(h)) {
        if let Some(bad) = headers
            .iter()
            .position(|&h| !user(h) || of(h) != of(headers[u]))
        {
            let say = |r: usize| match user(headers[r]) {
                true => format!("PCCL_GROUP_SIZE={}", of(headers[r])),
                false => "no PCCL_GROUP_SIZE".to_string(),
            };
            return Err(Error::invalid(format!(
                "ranks disagree on the groups inside a node: rank {u} has {}, rank {bad} has {} \
                 (set the same PCCL_GROUP_SIZE on every rank)",
                say(u),
                say(bad)
            )));
        }
        let g = of(headers[u]).max(1);
        if let Some(m) = topo.ranks_per_node() {
            if g > 1 && m % g != 0 {
                return Err(Error::invalid(format!(
                    "PCCL_GROUP_SIZE={g} does not divide the {m} ranks of each node ({}); \
                     use a divisor of {m}, or 1 for no groups",
                    topo.describe()
                )));
            }
        }
        return Ok(g);
    }
    let g = of(headers[0]);
    let one_gpu_each = topo.nodes().iter().all(|node| {
        node.iter()
            .all(|&r| ((headers[r] >> 48) & 0xfff) as usize == node.len())
    });
    Ok(
        if g > 1 && one_gpu_each && headers.iter().all(|&h| of(h) == g) {
            g
        } else {
            numa_group(topo, headers, numa)
        },
    )
}

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
    /// Ranks per group inside the node (0: none): `PCCL_GROUP_SIZE`, else the GPUs that
    /// share a PCI parent ([`gpu_group`]).
    group: usize,
    /// Whether `group` was set by the user (then every rank must say the same).
    group_user: bool,
    /// The NUMA node this rank is bound to, if one ([`super::numa`]).
    numa: Option<usize>,
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
        let group = gpu_group(&hw);
        NicView {
            hw,
            user,
            source,
            nics: n,
            period,
            error,
            group,
            group_user: false,
            numa: None,
        }
    }

    /// The same view with this rank's NUMA node (`None`: unbound or unknown).
    pub fn with_numa(mut self, numa: Option<usize>) -> Self {
        self.numa = numa;
        self
    }

    /// The same view with the user's group size (`PCCL_GROUP_SIZE`) instead of discovery's.
    pub fn with_group_size(mut self, user: Option<usize>) -> Self {
        if let Some(g) = user {
            self.group = g;
            self.group_user = true;
        }
        self
    }

    /// Group size for a node of `local_ranks` ranks that all share this view (no exchange):
    /// the user's, else discovery's when the node has one rank per GPU.
    pub fn own_group(&self, local_ranks: usize) -> usize {
        match self.group_user {
            true => self.group,
            false if self.hw.gpus.len() == local_ranks => self.group.max(1),
            false => 1,
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
            | if self.error.is_some() { FAILED } else { 0 }
            | ((self.group.min(0xfff) as u64) << 32)
            | if self.group_user { GROUP_USER } else { 0 }
            | ((self.hw.gpus.len().min(0xfff) as u64) << 48);
        for (k, &nic) in self.period.iter().take(ENTRIES).enumerate() {
            w[2 + k / 8] |= (nic.min(255) as u64) << (8 * (k % 8));
        }
        w[NUMA] = self.numa.map_or(0, |n| n as u64 + 1);
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
        let headers: Vec<u64> = (0..p).map(|r| all[r * WORDS + 1]).collect();
        let numa: Vec<u64> = (0..p).map(|r| all[r * WORDS + NUMA]).collect();
        let group = agree_group(&topo, &headers, &numa)?;
        let topo = topo.with_nic_map(maps[0].clone()).with_groups(group);
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

    /// Four GPUs as two pairs, each pair under one PCI parent (two MI250X).
    fn pairs() -> Arc<NodeHardware> {
        let mut hw = (*crossed()).clone();
        for (g, gpu) in hw.gpus.iter_mut().enumerate() {
            gpu.path = vec![0, 10 + g as u64 / 2, 100 + g as u64];
        }
        Arc::new(hw)
    }

    #[test]
    fn gpus_sharing_a_parent_make_groups_when_each_rank_drives_one() {
        assert_eq!(gpu_group(&pairs()), 2);
        assert_eq!(gpu_group(&crossed()), 0);
        let view =
            |g: Option<usize>| NicView::new(Ok(pairs()), &[("X", "")], None).with_group_size(g);
        // Two nodes of 4 ranks, one per GPU: groups of 2.
        let views: Vec<(u64, NicView)> = (0..8).map(|r| (r / 4, view(None))).collect();
        let (topo, _, _) = views[5].1.agree(5, &gather(&views)).unwrap();
        assert!(topo.has_groups());
        assert_eq!(topo.describe(), "2x4 (groups of 2)");
        // Two ranks on a node of four GPUs: which GPUs they drive is unknown, no groups.
        let views: Vec<(u64, NicView)> = (0..4).map(|r| (r / 2, view(None))).collect();
        let (topo, _, _) = views[0].1.agree(0, &gather(&views)).unwrap();
        assert_eq!(topo.group_size(), 1);
        assert_eq!(view(None).own_group(4), 2);
        assert_eq!(view(None).own_group(2), 1);
        assert_eq!(view(Some(4)).own_group(8), 4);
    }

    #[test]
    fn cpu_ranks_bound_to_numa_nodes_make_groups_when_each_node_is_contiguous() {
        let mut hw = (*crossed()).clone();
        hw.gpus.clear();
        let hw = Arc::new(hw);
        // Two nodes of 4 ranks; `ids[l]` the NUMA node of local rank l (None: unbound).
        let agree_with = |ids: &[Option<usize>], user: Option<usize>| -> Result<Topology> {
            let views: Vec<(u64, NicView)> = (0..8)
                .map(|r| {
                    let v = NicView::new(Ok(hw.clone()), &[("X", "")], None)
                        .with_group_size(user)
                        .with_numa(ids[r % 4]);
                    (r as u64 / 4, v)
                })
                .collect();
            let all = gather(&views);
            let topos: Vec<Topology> = views
                .iter()
                .enumerate()
                .map(|(r, (_, v))| v.agree(r, &all).map(|t| t.0))
                .collect::<Result<_>>()?;
            assert!(topos.iter().all(|t| t.describe() == topos[0].describe()));
            Ok(topos[0].clone())
        };
        let (a, b) = (Some(0), Some(1));
        let t = agree_with(&[a, a, b, b], None).unwrap();
        assert_eq!(t.describe(), "2x4 (groups of 2)");
        assert_eq!(t.levels(), Some(vec![2, 2, 2]));
        // Interleaved, unequal, unknown on one rank, one NUMA node: no groups.
        for ids in [[a, b, a, b], [a, a, a, b], [a, a, b, None], [a, a, a, a]] {
            assert_eq!(agree_with(&ids, None).unwrap().group_size(), 1, "{ids:?}");
        }
        // The user's size wins.
        assert_eq!(agree_with(&[a, a, b, b], Some(4)).unwrap().group_size(), 4);
        // Ranks that drive GPUs keep the GPUs' grouping (none for crossed GPUs), not NUMA's.
        let views: Vec<(u64, NicView)> = (0..8)
            .map(|r| {
                let v =
                    NicView::new(Ok(crossed()), &[("X", "")], None).with_numa([a, a, b, b][r % 4]);
                (r as u64 / 4, v)
            })
            .collect();
        let (t, _, _) = views[0].1.agree(0, &gather(&views)).unwrap();
        assert_eq!(t.group_size(), 1);
    }

    #[test]
    fn ranks_that_disagree_on_the_group_size_fail_every_rank_naming_both() {
        let view =
            |g: Option<usize>| NicView::new(Ok(pairs()), &[("X", "")], None).with_group_size(g);
        let views: Vec<(u64, NicView)> = (0..8)
            .map(|r| (r / 4, view(Some(if r == 6 { 4 } else { 2 }))))
            .collect();
        let all = gather(&views);
        for (r, (_, v)) in views.iter().enumerate() {
            let e = v.agree(r, &all).unwrap_err();
            assert!(
                e.message().contains("rank 0 has PCCL_GROUP_SIZE=2")
                    && e.message().contains("rank 6 has PCCL_GROUP_SIZE=4"),
                "{e}"
            );
        }
        // Set on some ranks only.
        let views: Vec<(u64, NicView)> = (0..4).map(|r| (0, view((r != 3).then_some(2)))).collect();
        let e = views[0].1.agree(0, &gather(&views)).unwrap_err();
        assert!(e.message().contains("rank 3 has no PCCL_GROUP_SIZE"), "{e}");
        // A size that does not divide the nodes.
        let views: Vec<(u64, NicView)> = (0..6).map(|r| (r / 3, view(Some(2)))).collect();
        let e = views[0].1.agree(0, &gather(&views)).unwrap_err();
        assert!(e.message().contains("does not divide the 3 ranks"), "{e}");
        // The user's size wins over discovery's, and 1 turns groups off.
        let views: Vec<(u64, NicView)> = (0..8).map(|r| (r / 4, view(Some(1)))).collect();
        let (topo, _, _) = views[0].1.agree(0, &gather(&views)).unwrap();
        assert!(!topo.has_groups());
    }
}
