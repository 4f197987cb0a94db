//! Topology discovery from hand-written hwloc XML files (tests/data/topology), NIC maps, what
//! is applied, and the map a communicator agrees on.

use pccl::config::Config;
use pccl::topology::NicMap;
use pccl::Communicator;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/topology")
        .join(name)
}

#[test]
fn configured_map_is_the_communicators_map() {
    let cfg = Config {
        nic_map: Some("0:3;1:2;2:1;3:0".parse().unwrap()),
        ..Config::default()
    };
    let maps = Communicator::run_threads(4, cfg, |c| c.topology().nic_map().map(|m| m.to_string()))
        .unwrap();
    for m in maps {
        assert_eq!(m.as_deref(), Some("0:3;1:2;2:1;3:0"));
    }
}

#[test]
fn pretend_nodes_take_the_map_from_each_ranks_own_view() {
    let cfg = Config {
        nic_map: Some("0:0;1:1".parse().unwrap()),
        ranks_per_node: Some(2),
        ..Config::default()
    };
    let r = Communicator::run_threads(4, cfg, |c| {
        (c.topology().nic_of_rank(3), c.topology().nic_map().cloned())
    })
    .unwrap();
    let want: NicMap = "0:0;1:1".parse().unwrap();
    assert!(r
        .iter()
        .all(|(nic, m)| *nic == 1 && m.as_ref() == Some(&want)));
}

#[cfg(feature = "hwloc")]
mod with_hwloc {
    use super::*;
    use pccl::topology::affinity::{gpu_of_local_rank, node_map, MapSource};
    use pccl::topology::agree::NicView;

    const NOENV: [(&str, &str); 0] = [];
    use pccl::topology::apply::plan;
    use pccl::topology::discover::{discover, LauncherRank};
    use pccl::topology::hardware::{GpuVendor, NicKind};

    fn map_of(file: &str, ranks: usize, env: &dyn pccl::topology::env::Env) -> (String, MapSource) {
        let hw = discover(Some(&data(file))).unwrap();
        let (m, src) = node_map(&hw, env, None, ranks);
        (m.to_string(), src)
    }

    #[test]
    fn frontier_gcd_pairs_share_the_slingshot_nic_of_their_quadrant() {
        let hw = discover(Some(&data("frontier.xml"))).unwrap();
        assert_eq!(hw.gpus.len(), 8);
        assert!(hw
            .gpus
            .iter()
            .all(|g| g.vendor == GpuVendor::Amd && g.uuid.is_some()));
        let names: Vec<_> = hw.nics.iter().map(|n| (n.name.as_str(), n.kind)).collect();
        assert_eq!(names[3], ("cxi3", NicKind::Slingshot));
        assert_eq!(hw.nics[3].netdev.as_deref(), Some("hsn3"));
        assert_eq!(
            map_of("frontier.xml", 8, &NOENV),
            ("0:0-1;1:2-3;2:4-5;3:6-7".into(), MapSource::Locality)
        );
    }

    #[test]
    fn perlmutter_gpu_i_uses_nic_three_minus_i() {
        assert_eq!(
            map_of("perlmutter.xml", 4, &NOENV),
            ("0:3;1:2;2:1;3:0".into(), MapSource::Locality)
        );
    }

    #[test]
    fn three_nics_for_eight_gpus_follow_switch_then_socket_and_drop_ethernet() {
        let hw = discover(Some(&data("three-nics.xml"))).unwrap();
        assert!(hw.nics.iter().all(|n| n.kind == NicKind::Infiniband));
        assert_eq!(hw.nics[0].device_port(), "mlx5_0:1");
        // GPUs 2, 3 have no NIC on their switch: the NIC of their socket.
        assert_eq!(map_of("three-nics.xml", 8, &NOENV).0, "0:0-3;1:4-5;2:6-7");
    }

    #[test]
    fn one_nic_or_none_puts_every_rank_on_nic_zero() {
        assert_eq!(
            map_of("one-nic.xml", 4, &NOENV),
            ("0:0-3".into(), MapSource::Single)
        );
        let hw = discover(Some(&data("no-nic.xml"))).unwrap();
        assert_eq!((hw.gpus.len(), hw.nics.len()), (4, 0));
        assert_eq!(
            map_of("no-nic.xml", 4, &NOENV),
            ("0:0-3".into(), MapSource::Single)
        );
    }

    #[test]
    fn without_gpus_ranks_spread_evenly_over_the_nics() {
        assert_eq!(
            map_of("no-gpu.xml", 4, &NOENV),
            ("0:0-1;1:2-3".into(), MapSource::Even)
        );
    }

    #[test]
    fn gpus_hidden_by_cuda_visible_devices_are_skipped() {
        // Ranks 0, 1 drive GPUs 2, 3, whose nearest NICs are 1 and 0.
        let env = [("CUDA_VISIBLE_DEVICES", "2,3")];
        assert_eq!(map_of("perlmutter.xml", 2, &env).0, "0:1;1:0");
        let env = [("CUDA_VISIBLE_DEVICES", "")];
        assert_eq!(
            map_of("perlmutter.xml", 4, &env),
            ("0:0;1:1;2:2;3:3".into(), MapSource::Even)
        );
    }

    #[test]
    fn ranks_that_each_see_device_zero_drive_different_gpus_and_agree_on_the_map() {
        for (file, var) in [
            ("perlmutter.xml", "CUDA_VISIBLE_DEVICES"),
            ("frontier.xml", "ROCR_VISIBLE_DEVICES"),
        ] {
            let hw = std::sync::Arc::new(discover(Some(&data(file))).unwrap());
            let p = hw.gpus.len();
            // Each rank's variable names its GPU by UUID: every rank sees it as device 0.
            let envs: Vec<Vec<(String, String)>> = (0..p)
                .map(|l| vec![(var.to_string(), hw.gpus[l].uuid.clone().unwrap())])
                .collect();
            let uuids: Vec<String> = (0..p)
                .map(|l| {
                    let g = gpu_of_local_rank(&hw, &envs[l], l).unwrap().unwrap();
                    hw.gpus[g].uuid.clone().unwrap()
                })
                .collect();
            let mut distinct = uuids.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), p, "{file}: ranks share no GPU");
            let views: Vec<NicView> = envs
                .iter()
                .map(|e| NicView::new(Ok(hw.clone()), e, None))
                .collect();
            let all: Vec<u64> = views.iter().flat_map(|v| v.words(42)).collect();
            let (topo, _, _) = views[p - 1].agree(p - 1, &all).unwrap();
            let (want, _) = node_map(&hw, &NOENV, None, p);
            assert_eq!(topo.nic_map(), Some(&want), "{file}");
        }
    }

    #[test]
    fn apply_plan_for_a_frontier_rank_names_its_nic() {
        let hw = discover(Some(&data("frontier.xml"))).unwrap();
        let local = Some(LauncherRank {
            local: 5,
            local_size: Some(8),
        });
        let p = plan(&[("PCCL_CXI_RENDEZVOUS", "1")], &hw, None, local);
        let nic = p.nic.clone().unwrap();
        assert_eq!((nic.name.as_str(), nic.kind), ("cxi2", NicKind::Slingshot));
        assert_eq!(nic.pci_bus_id, "0000:53:00.0");
        let set: Vec<String> = p
            .settings
            .iter()
            .map(|s| format!("{}={}", s.var, s.value))
            .collect();
        for want in [
            "MPICH_OFI_NIC_POLICY=USER",
            "MPICH_OFI_NIC_MAPPING=0:0-1;1:2-3;2:4-5;3:6-7",
            "NCCL_SOCKET_IFNAME==hsn2",
            "FI_CXI_RDZV_PROTO=alt_read",
        ] {
            assert!(set.iter().any(|s| s == want), "{want} not in {set:?}");
        }
    }

    #[test]
    fn communicator_on_a_frontier_file_agrees_on_the_frontier_map() {
        let cfg = Config {
            topo_file: Some(data("frontier.xml")),
            ..Config::default()
        };
        let r = Communicator::run_threads(8, cfg, |c| {
            let mut out = [0u32; 8];
            c.all_gather(&[c.rank() as u32], &mut out).unwrap();
            (
                c.topology().nic_map().map(|m| m.to_string()),
                out,
                c.topology().group_size(),
            )
        })
        .unwrap();
        for (m, out, group) in r {
            assert_eq!(m.as_deref(), Some("0:0-1;1:2-3;2:4-5;3:6-7"));
            assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 7]);
            // The two GCDs of each MI250X sit under one PCI parent: pairs, one rank per GPU.
            assert_eq!(group, 2);
        }
    }

    #[test]
    fn communicator_with_an_unreadable_topology_file_fails_on_every_rank() {
        let cfg = Config {
            topo_file: Some(data("missing.xml")),
            ..Config::default()
        };
        let r = Communicator::run_threads(3, cfg, |_| ());
        let e = r.unwrap_err();
        assert!(e.message().contains("missing.xml"), "{e}");
    }
}

/// Runs `pccl-info` with `args` and extra variables (launcher variables of the test process
/// are cleared so the output does not depend on how the tests were started).
fn pccl_info(args: &[&str], vars: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pccl-info"));
    cmd.args(args);
    for v in [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "PALS_LOCAL_RANKID",
        "PMI_LOCAL_RANK",
        "SLURM_LOCALID",
        "LOCAL_RANK",
        "PCCL_NIC_MAP",
        "PCCL_TOPO_FILE",
        "HWLOC_XMLFILE",
        "CUDA_VISIBLE_DEVICES",
    ] {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn pccl_info_reports_the_map_and_what_it_would_set() {
    let file = data("perlmutter.xml");
    let out = pccl_info(
        &["--json", "--topo-file", file.to_str().unwrap()],
        &[
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "4"),
            ("PCCL_NIC_MAP", "0:0-1;1:2-3"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nic_map"]["map"], "0:0-1;1:2-3");
    assert_eq!(v["nic_map"]["why"], "from PCCL_NIC_MAP");
    assert_eq!(v["transports"]["tcp"], true);
    let set = v["apply"]["set"].as_array().unwrap();
    assert!(set
        .iter()
        .any(|s| s["var"] == "MPICH_OFI_NIC_MAPPING" && s["value"] == "0:0-1;1:2-3"));
    // Perlmutter's four A100s each have a PCI parent of their own: no groups.
    assert_eq!(v["groups"]["size"], 1);
    if cfg!(feature = "hwloc") {
        assert_eq!(v["gpus"].as_array().unwrap().len(), 4);
        assert_eq!(v["apply"]["nic"], "cxi0");
        assert!(set
            .iter()
            .any(|s| s["var"] == "NCCL_SOCKET_IFNAME" && s["value"] == "=hsn0"));
    } else {
        assert!(v["discovery"]["source"]
            .as_str()
            .unwrap()
            .contains("without the `hwloc` feature"));
    }
}

#[test]
fn pccl_info_rejects_a_bad_map_or_file_with_a_message() {
    let out = pccl_info(&[], &[("PCCL_NIC_MAP", "0:0;0:0")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NIC map"));
    if cfg!(feature = "hwloc") {
        let out = pccl_info(&["--topo-file", "/nonexistent/x.xml"], &[]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.xml"));
    }
}

#[cfg(feature = "ofi")]
#[test]
fn pccl_info_lists_libfabric_entries_and_the_domain_the_ofi_transport_would_open() {
    let json = |vars: &[(&str, &str)]| {
        let out = pccl_info(&["--json"], vars);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["libfabric"].clone()
    };
    // shm is offered on every Debian libfabric, with FI_HMEM.
    let f = json(&[("FI_PROVIDER", "shm")]);
    let offers = f["offers"].as_array().unwrap();
    if offers.is_empty() {
        println!("SKIPPED: libfabric offers no shm entry here");
        return;
    }
    assert!(offers.iter().all(|o| o["provider"] == "shm"), "{f}");
    assert!(offers.iter().any(|o| o["hmem"] == true), "{f}");
    assert_eq!(f["domain"], serde_json::Value::Null, "{f}");
    assert!(f["domain_why"].as_str().unwrap().contains("first"), "{f}");
    assert!(
        f["device_buffers"].as_str().unwrap().contains("auto"),
        "{f}"
    );

    let f = json(&[("FI_PROVIDER", "tcp;ofi_rxm"), ("PCCL_OFI_DOMAIN", "lo")]);
    assert_eq!(f["domain"], "lo", "{f}");
    assert!(f["domain_why"]
        .as_str()
        .unwrap()
        .contains("PCCL_OFI_DOMAIN"));

    // A mapped NIC the provider does not offer (Perlmutter's hsn on this host's tcp).
    if cfg!(feature = "hwloc") {
        let file = data("perlmutter.xml");
        let out = pccl_info(
            &["--json", "--topo-file", file.to_str().unwrap()],
            &[
                ("FI_PROVIDER", "tcp;ofi_rxm"),
                ("PCCL_TOPO_FILE", file.to_str().unwrap()),
                ("MPI_LOCALRANKID", "1"),
                ("MPI_LOCALNRANKS", "4"),
            ],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let why = v["libfabric"]["domain_why"].as_str().unwrap().to_string();
        assert!(why.contains("not among the provider's domains"), "{why}");
    }

    let f = json(&[("FI_PROVIDER", "shm"), ("PCCL_OFI_HMEM", "maybe")]);
    assert!(
        f["device_buffers"]
            .as_str()
            .unwrap()
            .contains("PCCL_OFI_HMEM=maybe"),
        "{f}"
    );
}
