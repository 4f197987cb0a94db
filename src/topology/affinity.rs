//! The mapping rules: which GPU a local rank drives, which NIC is nearest each GPU, and so
//! which NIC each local rank sends through.

use super::env::Env;
use super::hardware::{uuid_key, GpuVendor, NodeHardware};
use super::NicMap;

/// Why a rank uses the NIC it uses (codes travel between ranks as numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapSource {
    /// `PCCL_NIC_MAP` (or the communicator's configured map).
    User = 1,
    /// Its GPU's nearest NIC (deepest common ancestor in the PCI tree).
    Locality = 2,
    /// No GPU known for the rank: local ranks spread evenly over the NICs.
    Even = 3,
    /// One NIC or none found: nothing to choose.
    Single = 4,
}

impl MapSource {
    /// The source of a code, `Single` for unknown codes.
    pub fn from_code(c: u64) -> Self {
        match c {
            1 => MapSource::User,
            2 => MapSource::Locality,
            3 => MapSource::Even,
            _ => MapSource::Single,
        }
    }

    /// Words for `PCCL_DEBUG=INFO` and `pccl-info`.
    pub fn describe(self) -> &'static str {
        match self {
            MapSource::User => "from PCCL_NIC_MAP",
            MapSource::Locality => "each GPU's nearest NIC (PCI locality)",
            MapSource::Even => "no GPU known: ranks spread evenly over the NICs",
            MapSource::Single => "one NIC or none found",
        }
    }
}

/// The NIC of one local rank, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankNic {
    /// NIC index on the node.
    pub nic: usize,
    /// NICs on the node (at least one).
    pub nics: usize,
    /// The rank's GPU (index into [`NodeHardware::gpus`]), when known.
    pub gpu: Option<usize>,
    /// Why this NIC.
    pub source: MapSource,
    /// Why the GPU is unknown, when it is and GPUs exist.
    pub note: Option<String>,
}

/// Length of the common prefix of two ancestor paths (depth of the deepest common ancestor).
fn shared_depth(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// For every GPU, its nearest NIC: the NICs whose deepest common ancestor with the GPU is
/// deepest; GPUs with the same set of equally near NICs are spread over it in blocks (8 GPUs
/// equally near 4 NICs: GPUs 2k, 2k+1 on NIC k). Empty when there is no NIC.
pub fn nearest_nics(hw: &NodeHardware) -> Vec<usize> {
    if hw.nics.is_empty() {
        return Vec::new();
    }
    let candidates: Vec<Vec<usize>> = hw
        .gpus
        .iter()
        .map(|g| {
            let depth: Vec<usize> = hw
                .nics
                .iter()
                .map(|n| shared_depth(&g.path, &n.path))
                .collect();
            let best = depth.iter().copied().max().unwrap_or(0);
            (0..hw.nics.len()).filter(|&n| depth[n] == best).collect()
        })
        .collect();
    let mut out = vec![0; hw.gpus.len()];
    let mut done = vec![false; hw.gpus.len()];
    for g in 0..hw.gpus.len() {
        if done[g] {
            continue;
        }
        let group: Vec<usize> = (g..hw.gpus.len())
            .filter(|&h| candidates[h] == candidates[g])
            .collect();
        let set = &candidates[g];
        for (j, &h) in group.iter().enumerate() {
            out[h] = set[j * set.len() / group.len()];
            done[h] = true;
        }
    }
    out
}

/// The maker whose devices the runtime exposes: NVIDIA when it has at least as many GPUs.
fn vendor_of(hw: &NodeHardware) -> Option<GpuVendor> {
    let nv = hw.gpus_of(GpuVendor::Nvidia).len();
    let amd = hw.gpus_of(GpuVendor::Amd).len();
    match (nv, amd) {
        (0, 0) => None,
        (n, a) if n >= a => Some(GpuVendor::Nvidia),
        _ => Some(GpuVendor::Amd),
    }
}

/// Applies one `*_VISIBLE_DEVICES` list (indices into `list`, or UUIDs / unique UUID prefixes)
/// the way the runtimes do: the list ends at the first entry that names no device.
fn filter_visible(
    hw: &NodeHardware,
    list: &[usize],
    var: &str,
    spec: &str,
) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for tok in spec.split(',').map(str::trim) {
        if tok.is_empty() {
            break;
        }
        if let Ok(i) = tok.parse::<i64>() {
            match usize::try_from(i).ok().and_then(|i| list.get(i)) {
                Some(&g) => out.push(g),
                None => break,
            }
            continue;
        }
        if tok.starts_with("MIG-") {
            return Err(format!(
                "{var} names MIG instance {tok}, which has no PCI device of its own"
            ));
        }
        let key = uuid_key(tok);
        let hits: Vec<usize> = list
            .iter()
            .copied()
            .filter(|&g| {
                hw.gpus[g]
                    .uuid
                    .as_deref()
                    .is_some_and(|u| uuid_key(u).starts_with(&key))
            })
            .collect();
        match hits.as_slice() {
            [g] => out.push(*g),
            [] if hw.gpus.iter().all(|g| g.uuid.is_none()) => {
                return Err(format!(
                    "{var} names {tok}, but discovery knows no GPU UUIDs (hwloc has no NVML or \
                     ROCm SMI plugin here)"
                ))
            }
            _ => break,
        }
    }
    Ok(out)
}

/// The GPUs this process's runtime would expose, in device-ordinal order, after
/// `CUDA_VISIBLE_DEVICES` (NVIDIA) or `ROCR_VISIBLE_DEVICES` then `HIP_VISIBLE_DEVICES` /
/// `CUDA_VISIBLE_DEVICES` (AMD).
pub fn visible_gpus(hw: &NodeHardware, env: &dyn Env) -> Result<Vec<usize>, String> {
    let Some(vendor) = vendor_of(hw) else {
        return Ok(Vec::new());
    };
    let mut list = hw.gpus_of(vendor);
    let vars: &[&str] = match vendor {
        GpuVendor::Nvidia => &["CUDA_VISIBLE_DEVICES"],
        GpuVendor::Amd => &["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"],
    };
    for &var in vars {
        let spec = match env.var(var) {
            Some(s) => Some(s),
            None if var == "HIP_VISIBLE_DEVICES" => env.var("CUDA_VISIBLE_DEVICES"),
            None => None,
        };
        if let Some(spec) = spec {
            list = filter_visible(hw, &list, var, &spec)?;
        }
    }
    Ok(list)
}

/// The GPU local rank `local` drives: visible device `local % visible` (device 0 when each
/// rank sees one GPU, device `local` when all see all).
pub fn gpu_of_local_rank(
    hw: &NodeHardware,
    env: &dyn Env,
    local: usize,
) -> Result<Option<usize>, String> {
    let visible = visible_gpus(hw, env)?;
    Ok((!visible.is_empty()).then(|| visible[local % visible.len()]))
}

/// The NIC of local rank `local` of `local_ranks`: from `user` (`PCCL_NIC_MAP`) when given,
/// else its GPU's nearest NIC, else an even spread.
pub fn rank_nic(
    hw: &NodeHardware,
    env: &dyn Env,
    user: Option<&NicMap>,
    local: usize,
    local_ranks: usize,
) -> RankNic {
    let (gpu, note) = match gpu_of_local_rank(hw, env, local) {
        Ok(g) => (g, None),
        Err(why) => (None, Some(why)),
    };
    let nics = hw.nics.len();
    let (nic, n, source) = if let Some(m) = user {
        (m.nic_of(local), m.nics(), MapSource::User)
    } else if nics <= 1 {
        (0, 1, MapSource::Single)
    } else if let Some(g) = gpu {
        (nearest_nics(hw)[g], nics, MapSource::Locality)
    } else {
        (
            NicMap::even(local_ranks.max(local + 1), nics).nic_of(local),
            nics,
            MapSource::Even,
        )
    };
    RankNic {
        nic,
        nics: n,
        gpu,
        source,
        note,
    }
}

/// The map of a node whose `local_ranks` ranks all read `env`, and why (the source of local
/// rank 0).
pub fn node_map(
    hw: &NodeHardware,
    env: &dyn Env,
    user: Option<&NicMap>,
    local_ranks: usize,
) -> (NicMap, MapSource) {
    let per: Vec<RankNic> = (0..local_ranks)
        .map(|l| rank_nic(hw, env, user, l, local_ranks))
        .collect();
    let nics = per.first().map_or(1, |r| r.nics);
    let source = per.first().map_or(MapSource::Single, |r| r.source);
    (
        NicMap::from_nics(per.iter().map(|r| r.nic).collect(), nics),
        source,
    )
}

#[cfg(test)]
mod tests {
    use super::super::hardware::{Gpu, Nic, NicKind};
    use super::*;

    fn gpu(bus: &str, uuid: &str, path: &[u64]) -> Gpu {
        Gpu {
            vendor: GpuVendor::Nvidia,
            pci_bus_id: bus.into(),
            uuid: (!uuid.is_empty()).then(|| uuid.into()),
            os_devices: vec![],
            path: path.to_vec(),
        }
    }
    fn nic(name: &str, path: &[u64]) -> Nic {
        Nic {
            name: name.into(),
            netdev: None,
            kind: NicKind::Infiniband,
            port: Some(1),
            pci_bus_id: String::new(),
            path: path.to_vec(),
        }
    }
    const NOENV: [(&str, &str); 0] = [];

    /// Two switches: GPUs 0,1 and NIC 1 under switch 10, GPUs 2,3 and NIC 0 under switch 20.
    fn crossed() -> NodeHardware {
        NodeHardware {
            gpus: vec![
                gpu("0000:01:00.0", "GPU-aa", &[0, 10, 100]),
                gpu("0000:02:00.0", "GPU-bb", &[0, 10, 101]),
                gpu("0000:81:00.0", "GPU-cc", &[0, 20, 200]),
                gpu("0000:82:00.0", "GPU-dd", &[0, 20, 201]),
            ],
            nics: vec![nic("mlx5_0", &[0, 20, 210]), nic("mlx5_1", &[0, 10, 110])],
            source: "test".into(),
        }
    }

    #[test]
    fn each_gpu_gets_the_nic_under_its_own_switch() {
        assert_eq!(nearest_nics(&crossed()), [1, 1, 0, 0]);
        let (m, src) = node_map(&crossed(), &NOENV, None, 4);
        assert_eq!(m.to_string(), "0:2-3;1:0-1");
        assert_eq!(src, MapSource::Locality);
    }

    #[test]
    fn equally_near_nics_are_shared_in_blocks() {
        let mut hw = crossed();
        for g in &mut hw.gpus {
            g.path = vec![0, 5, 50];
        }
        hw.nics.push(nic("mlx5_2", &[0, 30]));
        assert_eq!(nearest_nics(&hw), [0, 0, 1, 2]);
    }

    #[test]
    fn visible_devices_by_index_and_uuid_pick_the_same_gpus() {
        let hw = crossed();
        assert_eq!(
            visible_gpus(&hw, &[("CUDA_VISIBLE_DEVICES", "3,1")]),
            Ok(vec![3, 1])
        );
        assert_eq!(
            visible_gpus(&hw, &[("CUDA_VISIBLE_DEVICES", "GPU-DD,gpu-b")]),
            Ok(vec![3, 1])
        );
        // The list ends at the first entry that names no device, as in CUDA.
        assert_eq!(
            visible_gpus(&hw, &[("CUDA_VISIBLE_DEVICES", "2,9,0")]),
            Ok(vec![2])
        );
        assert_eq!(
            visible_gpus(&hw, &[("CUDA_VISIBLE_DEVICES", "")]),
            Ok(vec![])
        );
    }

    #[test]
    fn mig_or_unknowable_uuids_leave_the_gpu_unknown_with_a_reason() {
        let hw = crossed();
        let e = visible_gpus(&hw, &[("CUDA_VISIBLE_DEVICES", "MIG-1234")]).unwrap_err();
        assert!(e.contains("MIG"), "{e}");
        let mut bare = crossed();
        for g in &mut bare.gpus {
            g.uuid = None;
        }
        let r = rank_nic(&bare, &[("CUDA_VISIBLE_DEVICES", "GPU-aa")], None, 1, 2);
        assert_eq!(r.gpu, None);
        assert_eq!(r.source, MapSource::Even);
        assert_eq!(r.nic, 1);
        assert!(r.note.unwrap().contains("UUID"));
    }

    #[test]
    fn user_map_wins_and_no_nic_means_nic_zero() {
        let user: NicMap = "0:1;1:0".parse().unwrap();
        let r = rank_nic(&crossed(), &NOENV, Some(&user), 0, 2);
        assert_eq!((r.nic, r.source), (1, MapSource::User));
        let mut hw = crossed();
        hw.nics.clear();
        let r = rank_nic(&hw, &NOENV, None, 3, 4);
        assert_eq!((r.nic, r.nics, r.source), (0, 1, MapSource::Single));
    }

    #[test]
    fn amd_gpus_follow_rocr_then_hip_visible_devices() {
        let mut hw = crossed();
        for g in &mut hw.gpus {
            g.vendor = GpuVendor::Amd;
        }
        let env = [
            ("ROCR_VISIBLE_DEVICES", "2,3"),
            ("HIP_VISIBLE_DEVICES", "1"),
        ];
        assert_eq!(visible_gpus(&hw, &env), Ok(vec![3]));
        // CUDA_VISIBLE_DEVICES stands in for HIP_VISIBLE_DEVICES on AMD.
        let env = [
            ("ROCR_VISIBLE_DEVICES", "2,3"),
            ("CUDA_VISIBLE_DEVICES", "0"),
        ];
        assert_eq!(visible_gpus(&hw, &env), Ok(vec![2]));
    }
}
