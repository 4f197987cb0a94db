//! Discovery entry points: which topology to read (`PCCL_TOPO_FILE`, `HWLOC_XMLFILE`, the live
//! host), a per-process cache of it, and the launcher's local rank.

use super::env::{nonempty, Env};
use super::hardware::NodeHardware;
use crate::error::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Whether this build can discover hardware (cargo feature `hwloc`).
pub const HWLOC_BUILT: bool = cfg!(feature = "hwloc");

/// The hwloc XML file to read instead of the live host: `PCCL_TOPO_FILE`, else `HWLOC_XMLFILE`.
pub fn topo_file(env: &dyn Env) -> Option<PathBuf> {
    nonempty(env, "PCCL_TOPO_FILE")
        .or_else(|| nonempty(env, "HWLOC_XMLFILE"))
        .map(PathBuf::from)
}

/// Discovers the host (or reads `file`) without caching. A file that cannot be read is an
/// error; a live discovery that fails, or a build without the `hwloc` feature, gives an empty
/// [`NodeHardware`] whose `source` says why.
pub fn discover(file: Option<&Path>) -> Result<NodeHardware> {
    #[cfg(feature = "hwloc")]
    {
        match super::hwloc::load(file) {
            Ok(hw) => Ok(hw),
            Err(e) if file.is_some() => Err(e),
            Err(e) => Ok(NodeHardware::unknown(e.message().to_string())),
        }
    }
    #[cfg(not(feature = "hwloc"))]
    {
        let why = match file {
            Some(f) => format!(
                "built without the `hwloc` feature: topology file {} not read; no GPU or NIC \
                 discovery (PCCL_NIC_MAP, else one NIC)",
                f.display()
            ),
            None => "built without the `hwloc` feature: no GPU or NIC discovery \
                     (PCCL_NIC_MAP, else one NIC)"
                .to_string(),
        };
        Ok(NodeHardware::unknown(why))
    }
}

/// [`discover`], once per process and file (every thread-rank and communicator shares it).
pub fn host_hardware(file: Option<&Path>) -> Result<Arc<NodeHardware>> {
    static CACHE: OnceLock<Mutex<HashMap<Option<PathBuf>, Arc<NodeHardware>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = file.map(Path::to_path_buf);
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(hw) = c.get(&key) {
        return Ok(hw.clone());
    }
    let hw = Arc::new(discover(file)?);
    c.insert(key, hw.clone());
    Ok(hw)
}

/// The GPU that local rank `local` of this process drives (process environment, cached
/// discovery of `PCCL_TOPO_FILE` / `HWLOC_XMLFILE` or the host): its UUID and PCI bus id tell
/// whether two ranks share a GPU. `None` when discovery found no GPU or cannot tell which.
pub fn local_gpu(local: usize) -> Option<super::hardware::Gpu> {
    let env = super::env::ProcessEnv;
    let hw = host_hardware(topo_file(&env).as_deref()).ok()?;
    let g = super::affinity::gpu_of_local_rank(&hw, &env, local).ok()??;
    hw.gpus.get(g).cloned()
}

/// A process's place on its node as its launcher tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LauncherRank {
    /// Index among the processes of this node.
    pub local: usize,
    /// Processes on this node, when the launcher says.
    pub local_size: Option<usize>,
}

/// Local-rank variables of the launchers, with their local-size companions: Slurm, Open MPI,
/// MPICH Hydra, Cray PALS, PMI, torchrun.
const LAUNCHERS: [(&str, &str); 6] = [
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
    ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
];

/// The local rank the launcher gave this process, if any launcher did.
pub fn launcher_rank(env: &dyn Env) -> Option<LauncherRank> {
    LAUNCHERS.iter().find_map(|&(rank, size)| {
        let local = nonempty(env, rank)?.parse().ok()?;
        let local_size = nonempty(env, size)
            .and_then(|s| s.parse().ok())
            .or_else(|| {
                // Slurm: SLURM_TASKS_PER_NODE looks like "4(x2),3"; take this layout's first.
                (rank == "SLURM_LOCALID")
                    .then(|| nonempty(env, "SLURM_TASKS_PER_NODE"))
                    .flatten()
                    .and_then(|s| {
                        s.split(|c: char| !c.is_ascii_digit())
                            .next()
                            .and_then(|n| n.parse().ok())
                    })
            })
            .filter(|&n: &usize| n > local);
        Some(LauncherRank { local, local_size })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topo_file_prefers_pccl_variable_over_hwloc_one() {
        let env = [("HWLOC_XMLFILE", "/a.xml"), ("PCCL_TOPO_FILE", "/b.xml")];
        assert_eq!(topo_file(&env), Some(PathBuf::from("/b.xml")));
        assert_eq!(
            topo_file(&[("HWLOC_XMLFILE", "/a.xml")]),
            Some(PathBuf::from("/a.xml"))
        );
        assert_eq!(topo_file(&[("PCCL_TOPO_FILE", " ")]), None);
    }

    #[test]
    fn launcher_local_rank_from_each_launcher() {
        let e = [("MPI_LOCALRANKID", "3"), ("MPI_LOCALNRANKS", "8")];
        assert_eq!(
            launcher_rank(&e),
            Some(LauncherRank {
                local: 3,
                local_size: Some(8)
            })
        );
        let e = [("SLURM_LOCALID", "1"), ("SLURM_TASKS_PER_NODE", "4(x2),3")];
        assert_eq!(launcher_rank(&e).unwrap().local_size, Some(4));
        // A size that cannot hold the rank is ignored, and no launcher means none.
        let e = [("LOCAL_RANK", "5"), ("LOCAL_WORLD_SIZE", "2")];
        assert_eq!(launcher_rank(&e).unwrap().local_size, None);
        assert_eq!(launcher_rank(&[("PATH", "/bin")]), None);
    }

    #[test]
    fn unreadable_topology_file_is_an_error_or_said_to_be_ignored() {
        let r = discover(Some(Path::new("/nonexistent/pccl-topo.xml")));
        if HWLOC_BUILT {
            let e = r.unwrap_err();
            assert!(e.message().contains("pccl-topo.xml"), "{e}");
        } else {
            assert!(r.unwrap().source.contains("hwloc"));
        }
    }

    #[test]
    fn malformed_topology_file_is_an_error_naming_it() {
        let f = std::env::temp_dir().join(format!("pccl-bad-topo-{}.xml", std::process::id()));
        std::fs::write(&f, "<topology version=\"2.0\"><object type=").unwrap();
        let r = discover(Some(&f));
        let _ = std::fs::remove_file(&f);
        if HWLOC_BUILT {
            let e = r.unwrap_err();
            assert!(e.message().contains("pccl-bad-topo"), "{e}");
        }
    }
}
