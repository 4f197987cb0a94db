//! Which ranks share a node, each rank's local index, and which NIC each local rank uses.

pub mod affinity;
pub mod agree;
pub mod apply;
pub mod discover;
pub mod env;
pub mod hardware;
#[cfg(feature = "hwloc")]
mod hwloc;
pub mod iface;
pub mod nic_map;
pub mod numa;

pub use nic_map::NicMap;

/// The node structure of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<Vec<usize>>,
    position: Vec<(usize, usize)>,
    nic_map: Option<NicMap>,
    /// Ranks per group inside a node (consecutive local indices sharing a faster link: the
    /// two GCDs of an MI250X, a package, a NUMA domain); `1` for none.
    group: usize,
}

impl Topology {
    /// Groups ranks by a per-rank node key (a host id), nodes ordered by their lowest rank and
    /// ranks inside a node in rank order.
    pub fn from_node_keys(keys: &[u64]) -> Self {
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        let mut index: Vec<(u64, usize)> = Vec::new();
        for (r, &k) in keys.iter().enumerate() {
            match index.iter().find(|(key, _)| *key == k) {
                Some(&(_, n)) => nodes[n].push(r),
                None => {
                    index.push((k, nodes.len()));
                    nodes.push(vec![r]);
                }
            }
        }
        Self::from_nodes(nodes)
    }

    /// `p` ranks on nodes of `m` consecutive ranks (the last node may be smaller).
    pub fn uniform(p: usize, m: usize) -> Self {
        let m = m.max(1);
        let keys: Vec<u64> = (0..p).map(|r| (r / m) as u64).collect();
        Self::from_node_keys(&keys)
    }

    /// Builds from explicit node membership lists (every rank exactly once).
    pub fn from_nodes(nodes: Vec<Vec<usize>>) -> Self {
        let p: usize = nodes.iter().map(Vec::len).sum();
        let mut position = vec![(0, 0); p];
        for (n, node) in nodes.iter().enumerate() {
            for (m, &r) in node.iter().enumerate() {
                position[r] = (n, m);
            }
        }
        Topology {
            nodes,
            position,
            nic_map: None,
            group: 1,
        }
    }

    /// The same topology whose nodes are cut into groups of `size` consecutive local ranks
    /// (a level between the rank and the node: [`Self::levels`]). Kept as given; it only
    /// makes a level where it divides equal nodes into more than one group of more than one
    /// rank.
    pub fn with_groups(mut self, size: usize) -> Self {
        self.group = size.max(1);
        self
    }

    /// Ranks per group inside a node, as set by [`Self::with_groups`] (`1`: none).
    pub fn group_size(&self) -> usize {
        self.group
    }

    /// Whether the groups make a level of their own: equal nodes, each cut into more than
    /// one group of more than one rank.
    pub fn has_groups(&self) -> bool {
        matches!(self.ranks_per_node(), Some(m) if self.group > 1 && self.group < m && m % self.group == 0)
    }

    /// The radices of the hierarchy, outermost first: `[nodes, groups per node, ranks per
    /// group]` with groups ([`Self::has_groups`]), else `[nodes, ranks per node]`; `None` on
    /// unequal nodes. A rank's coordinates in it are its node, then its local index written
    /// in the inner radices ([`Self::coords`]).
    pub fn levels(&self) -> Option<Vec<usize>> {
        let m = self.ranks_per_node()?;
        Some(if self.has_groups() {
            vec![self.nodes.len(), m / self.group, self.group]
        } else {
            vec![self.nodes.len(), m]
        })
    }

    /// The same topology with the NIC map every node uses.
    pub fn with_nic_map(mut self, map: NicMap) -> Self {
        self.nic_map = Some(map);
        self
    }

    /// The same topology for a sub-group whose rank `i` was rank `members[i]` of `parent`:
    /// each member keeps its NIC (the map is that of the sub-group's first node).
    pub fn inherit_nic_map(self, parent: &Topology, members: &[usize]) -> Self {
        let (Some(pm), Some(first)) = (parent.nic_map(), self.nodes.first()) else {
            return self;
        };
        let nics = first
            .iter()
            .map(|&r| parent.nic_of_rank(members[r]))
            .collect();
        let map = NicMap::from_nics(nics, pm.nics());
        self.with_nic_map(map)
    }

    /// The same topology for a sub-group whose rank `i` was rank `members[i]` of `parent`,
    /// keeping the parent's groups where every node of the sub-group is made of whole
    /// groups of the parent, each in its order (a split that keeps the ranks' order).
    pub fn inherit_groups(self, parent: &Topology, members: &[usize]) -> Self {
        let g = parent.group;
        if !parent.has_groups() {
            return self;
        }
        let whole = self.nodes.iter().all(|node| {
            node.len() % g == 0
                && node.chunks(g).all(|c| {
                    let (n0, l0) = parent.position(members[c[0]]);
                    l0 % g == 0
                        && c.iter()
                            .enumerate()
                            .all(|(i, &r)| parent.position(members[r]) == (n0, l0 + i))
                })
        });
        if whole {
            self.with_groups(g)
        } else {
            self
        }
    }

    /// The NIC map, when one is known (discovered, given by `PCCL_NIC_MAP`, or set by a model).
    pub fn nic_map(&self) -> Option<&NicMap> {
        self.nic_map.as_ref()
    }

    /// NIC of `rank` on its node: from the NIC map, or NIC 0 when none is known.
    pub fn nic_of_rank(&self, rank: usize) -> usize {
        let local = self.position[rank].1;
        self.nic_map.as_ref().map_or(0, |m| m.nic_of(local))
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.position.len()
    }
    /// The nodes, each a list of communicator ranks.
    pub fn nodes(&self) -> &[Vec<usize>] {
        &self.nodes
    }
    /// `(node, local index)` of `rank`.
    pub fn position(&self, rank: usize) -> (usize, usize) {
        self.position[rank]
    }
    /// True when every node has the same number of ranks (the hierarchical algorithms need it).
    pub fn is_regular(&self) -> bool {
        self.nodes.windows(2).all(|w| w[0].len() == w[1].len())
    }
    /// Ranks per node when all nodes are the same size.
    pub fn ranks_per_node(&self) -> Option<usize> {
        self.is_regular()
            .then(|| self.nodes.first().map_or(1, Vec::len))
    }
    /// A short description such as `2x4`, `2x4 (groups of 2)` or `irregular [4, 2]`.
    pub fn describe(&self) -> String {
        match self.ranks_per_node() {
            Some(m) if self.has_groups() => {
                format!("{}x{} (groups of {})", self.nodes.len(), m, self.group)
            }
            Some(m) => format!("{}x{}", self.nodes.len(), m),
            None => format!(
                "irregular {:?}",
                self.nodes.iter().map(Vec::len).collect::<Vec<_>>()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_host_keys_group_into_nodes() {
        let t = Topology::from_node_keys(&[7, 9, 7, 9]);
        assert_eq!(t.nodes(), &[vec![0, 2], vec![1, 3]]);
        assert_eq!(t.position(3), (1, 1));
        assert_eq!(t.describe(), "2x2");
    }

    #[test]
    fn sub_groups_keep_each_members_nic() {
        let parent = Topology::uniform(8, 4).with_nic_map("0:0-1;1:2-3".parse().unwrap());
        // Members 1 and 3 of node 0, then 5 of node 1: NICs 0, 1 on the first node.
        let sub = Topology::from_node_keys(&[0, 0, 1]).inherit_nic_map(&parent, &[1, 3, 5]);
        assert_eq!(sub.nic_map().unwrap().to_string(), "0:0;1:1");
        assert_eq!(
            Topology::uniform(2, 2)
                .inherit_nic_map(&Topology::uniform(4, 2), &[0, 1])
                .nic_map(),
            None
        );
    }

    #[test]
    fn sub_groups_keep_whole_groups_only() {
        let parent = Topology::uniform(8, 4).with_groups(2);
        // The same ranks in order: groups kept.
        let all: Vec<usize> = (0..8).collect();
        let same = Topology::from_node_keys(&[0, 0, 0, 0, 1, 1, 1, 1]);
        assert!(same.inherit_groups(&parent, &all).has_groups());
        // Ranks 0, 1 of each node: one whole pair per node, no level of its own.
        let pairs = Topology::from_node_keys(&[0, 0, 1, 1]).inherit_groups(&parent, &[0, 1, 4, 5]);
        assert_eq!(pairs.group_size(), 2);
        assert!(!pairs.has_groups());
        // Ranks 1, 2 of each node: halves of two pairs, no groups.
        let cut = Topology::from_node_keys(&[0, 0, 0, 0, 1, 1, 1, 1])
            .inherit_groups(&parent, &[1, 2, 0, 3, 5, 6, 4, 7]);
        assert_eq!(cut.group_size(), 1);
    }

    #[test]
    fn partial_last_node_is_irregular() {
        let t = Topology::uniform(6, 4);
        assert!(!t.is_regular());
        assert_eq!(t.describe(), "irregular [4, 2]");
    }
}
