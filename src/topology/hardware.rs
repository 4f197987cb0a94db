//! What discovery found on one host: its GPUs and NICs with their PCI locality. Plain data, so
//! the mapping rules ([`super::affinity`]) run and are tested without hwloc.

use std::cmp::Ordering;
use std::fmt;

/// Maker of a GPU (decides which `*_VISIBLE_DEVICES` variables number it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuVendor {
    /// PCI vendor 0x10de: CUDA devices, `CUDA_VISIBLE_DEVICES`.
    Nvidia,
    /// PCI vendor 0x1002: ROCm devices, `ROCR_VISIBLE_DEVICES` then `HIP_VISIBLE_DEVICES`.
    Amd,
}

impl GpuVendor {
    /// The vendor of a PCI vendor id, if it makes GPUs PCCL drives.
    pub fn from_pci_vendor(vendor: u16) -> Option<Self> {
        match vendor {
            0x10de => Some(GpuVendor::Nvidia),
            0x1002 => Some(GpuVendor::Amd),
            _ => None,
        }
    }
}

impl fmt::Display for GpuVendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuVendor::Nvidia => "nvidia",
            GpuVendor::Amd => "amd",
        })
    }
}

/// One GPU (a PCI function: an A100, or one GCD of an MI250X).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Maker.
    pub vendor: GpuVendor,
    /// PCI bus id, `dddd:bb:dd.f` in lower case.
    pub pci_bus_id: String,
    /// UUID as the driver reports it (`GPU-…`), when hwloc knows it (NVML / ROCm SMI).
    pub uuid: Option<String>,
    /// Names of the OS devices attached to it (`nvml0`, `cuda0`, `rsmi3`, `card1`, …).
    pub os_devices: Vec<String>,
    /// Ids of its ancestors from the root of the host down to the device itself.
    pub path: Vec<u64>,
}

/// Network family of a NIC, in order of preference for inter-node traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NicKind {
    /// HPE Slingshot (Cassini): `cxi*` / `hsn*`.
    Slingshot,
    /// InfiniBand or RoCE verbs devices: `mlx5_*` and other OpenFabrics devices.
    Infiniband,
    /// Plain Ethernet (only used when no high-speed NIC is present).
    Ethernet,
}

impl fmt::Display for NicKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NicKind::Slingshot => "slingshot",
            NicKind::Infiniband => "infiniband",
            NicKind::Ethernet => "ethernet",
        })
    }
}

/// One NIC (a PCI function with its OS devices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// The device name the network libraries use: `cxi0`, `mlx5_0`, or the interface (`eth0`).
    pub name: String,
    /// Its IP interface, when it has one (`hsn0`, `ib0`, `eth0`).
    pub netdev: Option<String>,
    /// Family.
    pub kind: NicKind,
    /// Verbs port to use (first active port, else 1) for InfiniBand devices.
    pub port: Option<u32>,
    /// PCI bus id, `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// Ids of its ancestors from the root of the host down to the device itself.
    pub path: Vec<u64>,
}

impl Nic {
    /// The device as UCX and NCCL name it: `mlx5_0:1` for a verbs port, else the name.
    pub fn device_port(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.name),
            None => self.name.clone(),
        }
    }
}

/// The GPUs and NICs of one host, as discovery found them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHardware {
    /// GPUs in PCI bus id order (the order CUDA and ROCm number them by default).
    pub gpus: Vec<Gpu>,
    /// NICs used for inter-node traffic, numbered as in NIC maps (natural name order). Ethernet
    /// NICs are left out when a Slingshot or InfiniBand NIC is present.
    pub nics: Vec<Nic>,
    /// Where this came from (`hwloc`, `hwloc XML file F`, or why nothing was discovered).
    pub source: String,
}

impl NodeHardware {
    /// Nothing known, with the reason.
    pub fn unknown(why: impl Into<String>) -> Self {
        NodeHardware {
            source: why.into(),
            ..Default::default()
        }
    }

    /// Puts GPUs in bus id order and NICs in preference then natural name order, keeping only
    /// the preferred family when a high-speed one exists.
    pub fn normalise(mut self) -> Self {
        self.gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
        if let Some(best) = self.nics.iter().map(|n| n.kind).min() {
            if best != NicKind::Ethernet {
                self.nics.retain(|n| n.kind != NicKind::Ethernet);
            }
        }
        self.nics
            .sort_by(|a, b| natural_cmp(&a.name, &b.name).then(a.pci_bus_id.cmp(&b.pci_bus_id)));
        self
    }

    /// GPUs of one maker, in the order its runtime numbers them (PCI bus order).
    pub fn gpus_of(&self, vendor: GpuVendor) -> Vec<usize> {
        (0..self.gpus.len())
            .filter(|&g| self.gpus[g].vendor == vendor)
            .collect()
    }
}

/// Orders `mlx5_2` before `mlx5_10`: digit runs compare as numbers.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn split(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (xa, xb) = (split(a), split(b));
    for (pa, pb) in xa.iter().zip(&xb) {
        let o = match (pa, pb) {
            ((true, na), (true, nb)) => na
                .trim_start_matches('0')
                .len()
                .cmp(&nb.trim_start_matches('0').len())
                .then(na.trim_start_matches('0').cmp(nb.trim_start_matches('0'))),
            ((_, sa), (_, sb)) => sa.cmp(sb),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    xa.len().cmp(&xb.len())
}

/// Normal form of a GPU UUID for comparison: lower case, no `GPU-` prefix.
pub fn uuid_key(uuid: &str) -> String {
    let u = uuid.trim();
    let u = u
        .strip_prefix("GPU-")
        .or_else(|| u.strip_prefix("gpu-"))
        .unwrap_or(u);
    u.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_digit_runs_as_numbers() {
        let mut v = vec!["mlx5_10", "mlx5_2", "cxi1", "cxi0", "mlx5_1"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["cxi0", "cxi1", "mlx5_1", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn ethernet_is_dropped_when_a_high_speed_nic_exists() {
        let nic = |name: &str, kind| Nic {
            name: name.into(),
            netdev: None,
            kind,
            port: None,
            pci_bus_id: String::new(),
            path: vec![],
        };
        let hw = NodeHardware {
            nics: vec![
                nic("mlx5_1", NicKind::Infiniband),
                nic("eth0", NicKind::Ethernet),
                nic("mlx5_0", NicKind::Infiniband),
            ],
            ..Default::default()
        }
        .normalise();
        let names: Vec<_> = hw.nics.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0", "mlx5_1"]);
    }

    #[test]
    fn uuids_compare_without_prefix_or_case() {
        assert_eq!(uuid_key("GPU-AbC-1"), uuid_key("abc-1"));
    }
}
