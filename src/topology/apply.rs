//! Applying the NIC map before a transport initialises: the variables that make Cray MPICH,
//! UCX, NCCL/RCCL and libfabric use this rank's NIC. A variable the user set is never touched.

use super::affinity::{node_map, rank_nic, MapSource};
use super::discover::{host_hardware, launcher_rank, topo_file, LauncherRank};
use super::env::{nonempty, Env, ProcessEnv};
use super::hardware::{Nic, NicKind, NodeHardware};
use super::NicMap;
use std::sync::OnceLock;

/// One variable to set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Variable name.
    pub var: &'static str,
    /// Value PCCL gives it.
    pub value: String,
    /// Which library reads it.
    pub why: &'static str,
}

/// What applying would do for one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyPlan {
    /// The process's place on its node, if the launcher said.
    pub local: Option<LauncherRank>,
    /// Index of the NIC chosen for it.
    pub nic_index: Option<usize>,
    /// That NIC, when discovery knows it (a `PCCL_NIC_MAP` may name NICs discovery did not find).
    pub nic: Option<Nic>,
    /// Why that NIC.
    pub source: Option<MapSource>,
    /// The node's map handed to Cray MPICH.
    pub map: Option<NicMap>,
    /// Variables to set.
    pub settings: Vec<Setting>,
    /// Variables left alone because the user set them (`VAR=value`).
    pub kept: Vec<String>,
    /// Why some or all of the NIC settings are missing.
    pub notes: Vec<String>,
}

/// Slingshot rendezvous settings behind `PCCL_CXI_RENDEZVOUS=1`.
const CXI_RENDEZVOUS: [(&str, &str); 4] = [
    ("FI_CXI_RDZV_THRESHOLD", "0"),
    ("FI_CXI_RDZV_GET_MIN", "0"),
    ("FI_CXI_RDZV_EAGER_SIZE", "0"),
    ("FI_CXI_RDZV_PROTO", "alt_read"),
];

impl ApplyPlan {
    fn set(&mut self, env: &dyn Env, var: &'static str, value: String, why: &'static str) {
        match env.var(var) {
            Some(v) if !v.trim().is_empty() => self.kept.push(format!("{var}={v}")),
            _ => self.settings.push(Setting { var, value, why }),
        }
    }
}

/// What to set for the process whose variables are `env` on a host with hardware `hw`, with
/// the configured map `user` and launcher place `local`. Pure: sets nothing.
pub fn plan(
    env: &dyn Env,
    hw: &NodeHardware,
    user: Option<&NicMap>,
    local: Option<LauncherRank>,
) -> ApplyPlan {
    let mut p = ApplyPlan {
        local,
        ..Default::default()
    };
    if nonempty(env, "PCCL_CXI_RENDEZVOUS").as_deref() == Some("1") {
        for (var, value) in CXI_RENDEZVOUS {
            p.set(
                env,
                var,
                value.to_string(),
                "libfabric cxi provider (PCCL_CXI_RENDEZVOUS=1)",
            );
        }
    }
    let Some(lr) = local else {
        p.notes.push(
            "no launcher local rank (SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, \
             MPI_LOCALRANKID, PALS_LOCAL_RANKID, PMI_LOCAL_RANK, LOCAL_RANK): NIC left to the \
             libraries"
                .into(),
        );
        return p;
    };
    let size = lr
        .local_size
        .unwrap_or_else(|| (lr.local + 1).max(hw.nics.len()));
    let me = rank_nic(hw, env, user, lr.local, size);
    if me.source == MapSource::Single && user.is_none() {
        p.notes.push(format!(
            "{} NIC(s) for inter-node traffic found ({}): nothing to pin",
            hw.nics.len(),
            hw.source
        ));
        return p;
    }
    if user.is_none() && hw.nics.iter().all(|n| n.kind == NicKind::Ethernet) {
        // Several Ethernet ports are often a data and a management network: only the user
        // knows which ones the job's hosts reach each other through.
        p.notes.push(format!(
            "only Ethernet NICs found ({}): pinned only when PCCL_NIC_MAP is set",
            hw.source
        ));
        return p;
    }
    if let Some(n) = me.note {
        p.notes.push(n);
    }
    let (map, _) = node_map(hw, env, user, size);
    let mut nics: Vec<usize> = (0..size).map(|l| map.nic_of(l)).collect();
    nics[lr.local] = me.nic;
    let map = NicMap::from_nics(nics, map.nics());
    p.nic_index = Some(me.nic);
    p.source = Some(me.source);
    p.nic = hw.nics.get(me.nic).cloned();
    if env.var("MPICH_OFI_NIC_POLICY").is_some() || env.var("MPICH_OFI_NIC_MAPPING").is_some() {
        for v in ["MPICH_OFI_NIC_POLICY", "MPICH_OFI_NIC_MAPPING"] {
            if let Some(x) = env.var(v) {
                p.kept.push(format!("{v}={x}"));
            }
        }
    } else {
        p.set(env, "MPICH_OFI_NIC_POLICY", "USER".into(), "Cray MPICH");
        p.set(env, "MPICH_OFI_NIC_MAPPING", map.to_string(), "Cray MPICH");
    }
    p.map = Some(map);
    let Some(nic) = p.nic.clone() else {
        p.notes.push(format!(
            "NIC {} is not among the {} discovered ({}): UCX, NCCL and libfabric settings \
             need its name",
            me.nic,
            hw.nics.len(),
            hw.source
        ));
        return p;
    };
    match nic.kind {
        NicKind::Infiniband => {
            p.set(env, "UCX_NET_DEVICES", nic.device_port(), "UCX (Open MPI)");
            p.set(
                env,
                "NCCL_IB_HCA",
                format!("={}", nic.device_port()),
                "NCCL/RCCL",
            );
        }
        NicKind::Ethernet => {
            p.set(env, "UCX_NET_DEVICES", nic.name.clone(), "UCX (Open MPI)");
        }
        NicKind::Slingshot => p
            .notes
            .push("UCX has no Slingshot transport: UCX_NET_DEVICES left alone".into()),
    }
    if let Some(dev) = &nic.netdev {
        p.set(
            env,
            "NCCL_SOCKET_IFNAME",
            format!("={dev}"),
            "NCCL/RCCL bootstrap",
        );
    }
    p
}

/// Adds `PCCL_SOCKET_ADDR` (PCCL's TCP transport listens and is reached there) from the IPv4
/// address `addr_of` gives the chosen NIC's interface, unless the user set it.
pub fn with_socket_addr(
    mut p: ApplyPlan,
    env: &dyn Env,
    addr_of: impl Fn(&str) -> Option<std::net::IpAddr>,
) -> ApplyPlan {
    let Some(dev) = p.nic.as_ref().and_then(|n| n.netdev.clone()) else {
        return p;
    };
    match addr_of(&dev) {
        Some(ip) => p.set(
            env,
            "PCCL_SOCKET_ADDR",
            ip.to_string(),
            "PCCL tcp transport",
        ),
        None => p.notes.push(format!(
            "interface {dev} has no IPv4 address: PCCL_SOCKET_ADDR left alone"
        )),
    }
    p
}

/// The plan for this process (process environment, cached discovery, `PCCL_NIC_MAP`).
pub fn process_plan() -> ApplyPlan {
    let env = ProcessEnv;
    let local = launcher_rank(&env);
    let user = match nonempty(&env, "PCCL_NIC_MAP").map(|s| s.parse::<NicMap>()) {
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            return ApplyPlan {
                local,
                notes: vec![format!("PCCL_NIC_MAP not applied: {e}")],
                ..Default::default()
            }
        }
        None => None,
    };
    match host_hardware(topo_file(&env).as_deref()) {
        Ok(hw) => with_socket_addr(
            plan(&env, &hw, user.as_ref(), local),
            &env,
            super::iface::ipv4_of,
        ),
        Err(e) => ApplyPlan {
            local,
            notes: vec![format!("no NIC settings: {e}")],
            ..Default::default()
        },
    }
}

/// Sets this process's variables once (later calls return the first plan). Call before MPI,
/// UCX, NCCL or libfabric initialise; MPI initialised by the application has already read
/// them. With `PCCL_DEBUG=INFO` prints what it set and why.
pub fn apply() -> &'static ApplyPlan {
    static APPLIED: OnceLock<ApplyPlan> = OnceLock::new();
    APPLIED.get_or_init(|| {
        let p = process_plan();
        for s in &p.settings {
            std::env::set_var(s.var, &s.value);
        }
        let info = nonempty(&ProcessEnv, "PCCL_DEBUG")
            .is_some_and(|d| matches!(d.to_ascii_uppercase().as_str(), "INFO" | "TRACE"));
        if info && (!p.settings.is_empty() || !p.kept.is_empty()) {
            let set: Vec<String> = p
                .settings
                .iter()
                .map(|s| format!("{}={}", s.var, s.value))
                .collect();
            let kept = if p.kept.is_empty() {
                String::new()
            } else {
                format!("; kept the user's {}", p.kept.join(" "))
            };
            eprintln!(
                "PCCL INFO local rank {:?} NIC {:?}: set {}{kept}",
                p.local.map(|l| l.local),
                p.nic.as_ref().map(|n| n.name.as_str()),
                set.join(" ")
            );
        }
        p
    })
}

/// The NIC this process should open (for the libfabric transport): the launcher's local rank
/// mapped through `PCCL_NIC_MAP` or discovery. `None` when the local rank or the NIC's name is
/// unknown.
pub fn nic_for_local_rank() -> Option<Nic> {
    process_plan().nic
}

#[cfg(test)]
mod tests {
    use super::super::hardware::Nic;
    use super::*;

    fn hw(kind: NicKind, n: usize) -> NodeHardware {
        let nics = (0..n)
            .map(|i| Nic {
                name: match kind {
                    NicKind::Infiniband => format!("mlx5_{i}"),
                    NicKind::Slingshot => format!("cxi{i}"),
                    NicKind::Ethernet => format!("eth{i}"),
                },
                netdev: Some(match kind {
                    NicKind::Infiniband => format!("ib{i}"),
                    NicKind::Slingshot => format!("hsn{i}"),
                    NicKind::Ethernet => format!("eth{i}"),
                }),
                kind,
                port: (kind == NicKind::Infiniband).then_some(1),
                pci_bus_id: format!("0000:{i:02x}:00.0"),
                path: vec![0, i as u64],
            })
            .collect();
        NodeHardware {
            gpus: vec![],
            nics,
            source: "test".into(),
        }
    }
    fn at(local: usize, size: usize) -> Option<LauncherRank> {
        Some(LauncherRank {
            local,
            local_size: Some(size),
        })
    }
    fn value(p: &ApplyPlan, var: &str) -> Option<String> {
        p.settings
            .iter()
            .find(|s| s.var == var)
            .map(|s| s.value.clone())
    }

    #[test]
    fn infiniband_rank_gets_its_hca_for_ucx_nccl_and_mpich() {
        let p = plan(&[("X", "")], &hw(NicKind::Infiniband, 4), None, at(5, 8));
        assert_eq!(p.nic.as_ref().unwrap().name, "mlx5_2");
        assert_eq!(value(&p, "UCX_NET_DEVICES").as_deref(), Some("mlx5_2:1"));
        assert_eq!(value(&p, "NCCL_IB_HCA").as_deref(), Some("=mlx5_2:1"));
        assert_eq!(value(&p, "NCCL_SOCKET_IFNAME").as_deref(), Some("=ib2"));
        assert_eq!(value(&p, "MPICH_OFI_NIC_POLICY").as_deref(), Some("USER"));
        assert_eq!(
            value(&p, "MPICH_OFI_NIC_MAPPING").as_deref(),
            Some("0:0-1;1:2-3;2:4-5;3:6-7")
        );
    }

    #[test]
    fn variables_the_user_set_are_kept() {
        let env = [
            ("UCX_NET_DEVICES", "mlx5_0:1"),
            ("MPICH_OFI_NIC_POLICY", "NUMA"),
            ("FI_CXI_RDZV_PROTO", "default"),
            ("PCCL_CXI_RENDEZVOUS", "1"),
        ];
        let p = plan(&env, &hw(NicKind::Infiniband, 2), None, at(1, 2));
        assert_eq!(value(&p, "UCX_NET_DEVICES"), None);
        assert_eq!(value(&p, "MPICH_OFI_NIC_MAPPING"), None);
        assert_eq!(value(&p, "FI_CXI_RDZV_PROTO"), None);
        assert_eq!(value(&p, "FI_CXI_RDZV_THRESHOLD").as_deref(), Some("0"));
        assert!(p.kept.contains(&"UCX_NET_DEVICES=mlx5_0:1".to_string()));
        assert!(p.kept.contains(&"MPICH_OFI_NIC_POLICY=NUMA".to_string()));
        assert_eq!(value(&p, "NCCL_IB_HCA").as_deref(), Some("=mlx5_1:1"));
    }

    #[test]
    fn slingshot_rank_sets_socket_interface_not_ucx() {
        let p = plan(&[("X", "")], &hw(NicKind::Slingshot, 4), None, at(3, 4));
        assert_eq!(value(&p, "NCCL_SOCKET_IFNAME").as_deref(), Some("=hsn3"));
        assert_eq!(value(&p, "UCX_NET_DEVICES"), None);
        assert_eq!(value(&p, "NCCL_IB_HCA"), None);
    }

    #[test]
    fn tcp_listens_on_the_mapped_interfaces_address_unless_user_chose() {
        let ip = |d: &str| (d == "eth1").then(|| "10.1.2.3".parse().unwrap());
        let user: NicMap = "0:0;1:1".parse().unwrap();
        let eth = hw(NicKind::Ethernet, 2);
        let p = plan(&[("X", "")], &eth, Some(&user), at(1, 2));
        let p = with_socket_addr(p, &[("X", "")], ip);
        assert_eq!(value(&p, "PCCL_SOCKET_ADDR").as_deref(), Some("10.1.2.3"));
        assert_eq!(value(&p, "UCX_NET_DEVICES").as_deref(), Some("eth1"));
        let env = [("PCCL_SOCKET_ADDR", "192.168.0.9")];
        let p = plan(&env, &eth, Some(&user), at(1, 2));
        let p = with_socket_addr(p, &env, ip);
        assert_eq!(value(&p, "PCCL_SOCKET_ADDR"), None);
        let p = plan(&[("X", "")], &eth, Some(&user), at(0, 2));
        let p = with_socket_addr(p, &[("X", "")], ip);
        assert!(p.notes.iter().any(|n| n.contains("eth0 has no IPv4")));
    }

    #[test]
    fn discovered_ethernet_ports_are_not_pinned_without_a_user_map() {
        let p = plan(&[("X", "")], &hw(NicKind::Ethernet, 2), None, at(1, 2));
        let p = with_socket_addr(p, &[("X", "")], |_| "10.0.0.1".parse().ok());
        assert!(p.settings.is_empty(), "{:?}", p.settings);
        assert!(p.notes[0].contains("only Ethernet"));
    }

    #[test]
    fn nothing_is_pinned_without_local_rank_or_with_one_nic() {
        let p = plan(&[("X", "")], &hw(NicKind::Infiniband, 4), None, None);
        assert!(p.settings.is_empty() && p.notes[0].contains("local rank"));
        let p = plan(&[("X", "")], &hw(NicKind::Ethernet, 1), None, at(0, 4));
        assert!(p.settings.is_empty() && p.notes[0].contains("nothing to pin"));
    }

    #[test]
    fn user_map_without_discovery_still_reaches_cray_mpich() {
        let user: NicMap = "0:0-1;1:2-3".parse().unwrap();
        let p = plan(
            &[("X", "")],
            &NodeHardware::unknown("no hwloc"),
            Some(&user),
            at(2, 4),
        );
        assert_eq!(p.nic_index, Some(1));
        assert_eq!(p.nic, None);
        assert_eq!(
            value(&p, "MPICH_OFI_NIC_MAPPING").as_deref(),
            Some("0:0-1;1:2-3")
        );
        assert_eq!(value(&p, "UCX_NET_DEVICES"), None);
        assert!(p.notes.iter().any(|n| n.contains("not among")));
    }
}
