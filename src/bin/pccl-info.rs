//! `pccl-info`: what PCCL sees on this host: GPUs (UUID, PCI bus id), NICs, the NIC map and
//! why, the transports built in, and what it would set before a transport starts. Under a
//! launcher (`srun`, `mpiexec`, `torchrun`) every process prints its own view, headed by its
//! rank; alone it prints this host.

use clap::Parser;
use pccl::topology::affinity::{gpu_of_local_rank, nearest_nics, node_map, visible_gpus};
use pccl::topology::apply::plan;
use pccl::topology::discover::{discover, launcher_rank, topo_file, HWLOC_BUILT};
use pccl::topology::env::{nonempty, Env, ProcessEnv};
use pccl::topology::hardware::NodeHardware;
use pccl::topology::NicMap;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "pccl-info",
    about = "Show the GPUs, NICs and NIC map PCCL finds on this host"
)]
struct Args {
    /// hwloc XML file to read instead of this host (else PCCL_TOPO_FILE or HWLOC_XMLFILE).
    #[arg(long)]
    topo_file: Option<PathBuf>,
    /// Local ranks to show the NIC map for (default: the launcher's count, else one per GPU).
    #[arg(long)]
    local_ranks: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Global rank and size from the launcher, if any.
fn world(env: &dyn Env) -> Option<(usize, Option<usize>)> {
    pccl::transport::launch::RANK_VARS
        .iter()
        .find_map(|&(r, s)| {
            let rank = nonempty(env, r)?.parse().ok()?;
            Some((rank, nonempty(env, s).and_then(|v| v.parse().ok())))
        })
}

/// The groups inside a node that three-level algorithms would use for `local_ranks` ranks:
/// `PCCL_GROUP_SIZE`, else GPUs under one PCI parent (one rank per GPU), else (no GPUs) the
/// ranks' NUMA nodes, which only the ranks' agreement knows (this process's is shown).
fn groups(env: &ProcessEnv, hw: &NodeHardware, local_ranks: usize) -> Value {
    let user = nonempty(env, "PCCL_GROUP_SIZE").and_then(|v| v.parse::<usize>().ok());
    let found = pccl::topology::agree::gpu_group(hw);
    let (size, why) = match user {
        Some(g) => (g, "PCCL_GROUP_SIZE".to_string()),
        None if found > 1 && hw.gpus.len() == local_ranks => {
            (found, format!("{found} GPUs under each PCI parent"))
        }
        None if found > 1 => (
            1,
            format!(
                "{found} GPUs under each PCI parent, but {local_ranks} local ranks for {} GPUs",
                hw.gpus.len()
            ),
        ),
        None if hw.gpus.is_empty() => (
            1,
            match pccl::topology::numa::this_thread() {
                Some(n) => format!(
                    "no GPUs; this process runs on the CPUs of NUMA node {n} only: ranks each on one NUMA \
                     node, contiguous and equal in number, make the groups"
                ),
                None => "no GPUs, and this process may run on several NUMA nodes".to_string(),
            },
        ),
        None => (1, "no GPUs sharing a PCI parent".to_string()),
    };
    let level = size > 1 && size < local_ranks && local_ranks % size == 0;
    json!({"size": size, "why": why, "level": level})
}

fn report(args: &Args) -> Result<Value, pccl::Error> {
    let env = ProcessEnv;
    let file = args.topo_file.clone().or_else(|| topo_file(&env));
    let hw: NodeHardware = discover(file.as_deref())?;
    let user = match nonempty(&env, "PCCL_NIC_MAP") {
        Some(s) => Some(s.parse::<NicMap>()?),
        None => None,
    };
    let launcher = launcher_rank(&env);
    let local_ranks = args
        .local_ranks
        .or(launcher.and_then(|l| l.local_size))
        .unwrap_or(hw.gpus.len().max(1));
    let near = nearest_nics(&hw);
    let gpus: Vec<Value> = hw
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            json!({"index": i, "vendor": g.vendor.to_string(), "pci_bus_id": g.pci_bus_id,
                   "uuid": g.uuid, "os_devices": g.os_devices,
                   "nearest_nic": near.get(i)})
        })
        .collect();
    let nics: Vec<Value> = hw
        .nics
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({"index": i, "name": n.name, "kind": n.kind.to_string(), "netdev": n.netdev,
                   "port": n.port, "pci_bus_id": n.pci_bus_id})
        })
        .collect();
    let (map, source) = node_map(&hw, &env, user.as_ref(), local_ranks);
    let visible = visible_gpus(&hw, &env);
    let my_gpu = launcher.map(|l| gpu_of_local_rank(&hw, &env, l.local));
    let ap = plan(&env, &hw, user.as_ref(), launcher);
    Ok(json!({
        "host": pccl::transport::hostname(),
        "rank": world(&env).map(|w| w.0),
        "ranks": world(&env).and_then(|w| w.1),
        "local_rank": launcher.map(|l| l.local),
        "discovery": {"source": hw.source, "hwloc_built": HWLOC_BUILT,
                      "topo_file": file.map(|f| f.display().to_string())},
        "gpus": gpus,
        "visible_gpus": match &visible { Ok(v) => json!(v), Err(e) => json!(e) },
        "this_rank_gpu": match my_gpu { Some(Ok(g)) => json!(g), Some(Err(e)) => json!(e), None => Value::Null },
        "nics": nics,
        "nic_map": {"local_ranks": local_ranks, "map": map.to_string(), "why": source.describe(),
                    "pccl_nic_map": user.map(|m| m.to_string())},
        "groups": groups(&env, &hw, local_ranks),
        "transports": {"threads": true, "tcp": true, "mpi": cfg!(feature = "mpi"), "ofi": cfg!(feature = "ofi")},
        "built_features": pccl::features().join(","),
        "features": {"hwloc": cfg!(feature = "hwloc"), "mpi": cfg!(feature = "mpi"),
                     "cuda": cfg!(feature = "cuda"), "rocm": cfg!(feature = "rocm"),
                     "ofi": cfg!(feature = "ofi")},
        "libfabric": libfabric(),
        "apply": {
            "nic": ap.nic.as_ref().map(|n| n.name.clone()),
            "nic_index": ap.nic_index,
            "set": ap.settings.iter().map(|s| json!({"var": s.var, "value": s.value, "for": s.why})).collect::<Vec<_>>(),
            "kept": ap.kept, "notes": ap.notes,
        },
    }))
}

/// What libfabric offers here and what the `ofi` transport would choose, and why (`null`
/// without the `ofi` feature).
#[cfg(feature = "ofi")]
fn libfabric() -> Value {
    use pccl::transport::ofi::{domain_choice, offers, Hmem, HmemMode};
    let offered: Vec<Value> = offers()
        .into_iter()
        .map(|o| json!({"provider": o.provider, "fabric": o.fabric, "domain": o.domain, "hmem": o.hmem}))
        .collect();
    let (domain, why) = domain_choice();
    let hmem = match Hmem::from_env() {
        Ok(h) => {
            let mode = match h.mode {
                HmemMode::Auto => {
                    "auto: where the provider has FI_HMEM and every rank registers the iface"
                }
                HmemMode::Off => "0: device collectives stage through pinned host memory",
                HmemMode::On => "1: init fails where this rank cannot",
            };
            format!("{} ({mode})", h.iface.name())
        }
        Err(e) => e.to_string(),
    };
    json!({
        "fi_provider": std::env::var("FI_PROVIDER").ok(),
        "offers": offered,
        "domain": domain, "domain_why": why,
        "device_buffers": hmem,
    })
}

#[cfg(not(feature = "ofi"))]
fn libfabric() -> Value {
    Value::Null
}

fn text(v: &Value) -> String {
    let s = |x: &Value| match x {
        Value::Null => "-".to_string(),
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    let mut o = String::new();
    let who = match (&v["rank"], &v["local_rank"]) {
        (Value::Null, _) => "this host (no launcher)".to_string(),
        (r, l) => format!("rank {} of {} (local rank {})", s(r), s(&v["ranks"]), s(l)),
    };
    o += &format!("host {}: {who}\n", s(&v["host"]));
    o += &format!("discovery: {}\n", s(&v["discovery"]["source"]));
    let gpus = v["gpus"].as_array().cloned().unwrap_or_default();
    o += &format!("GPUs: {}\n", gpus.len());
    for g in &gpus {
        o += &format!(
            "  [{}] {} {} uuid {} nearest NIC {} ({})\n",
            s(&g["index"]),
            s(&g["vendor"]),
            s(&g["pci_bus_id"]),
            s(&g["uuid"]),
            s(&g["nearest_nic"]),
            g["os_devices"]
                .as_array()
                .map(|a| a.iter().map(&s).collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        );
    }
    o += &format!(
        "visible GPUs: {}; this rank's GPU: {}\n",
        s(&v["visible_gpus"]),
        s(&v["this_rank_gpu"])
    );
    let nics = v["nics"].as_array().cloned().unwrap_or_default();
    o += &format!("NICs: {}\n", nics.len());
    for n in &nics {
        o += &format!(
            "  [{}] {} {} netdev {} port {} at {}\n",
            s(&n["index"]),
            s(&n["name"]),
            s(&n["kind"]),
            s(&n["netdev"]),
            s(&n["port"]),
            s(&n["pci_bus_id"])
        );
    }
    let m = &v["nic_map"];
    o += &format!(
        "NIC map for {} local ranks: {} ({})\n",
        s(&m["local_ranks"]),
        s(&m["map"]),
        s(&m["why"])
    );
    let g = &v["groups"];
    o += &format!(
        "Groups inside the node: {} rank(s) each ({}; {})\n",
        s(&g["size"]),
        s(&g["why"]),
        if g["level"].as_bool() == Some(true) {
            "a level of its own: hier3-* runs and the tuner considers it"
        } else {
            "no level of its own"
        }
    );
    let t = &v["transports"];
    let built: Vec<&str> = ["threads", "tcp", "mpi", "ofi"]
        .into_iter()
        .filter(|k| t[*k].as_bool() == Some(true))
        .collect();
    o += &format!("transports built in: {}\n", built.join(", "));
    o += &format!(
        "features built in: {}\n",
        v["built_features"].as_str().unwrap_or("")
    );
    let f = &v["libfabric"];
    if !f.is_null() {
        let offers = f["offers"].as_array().cloned().unwrap_or_default();
        o += &format!(
            "libfabric (FI_PROVIDER {}): {} RDM tagged entries\n",
            s(&f["fi_provider"]),
            offers.len()
        );
        for x in &offers {
            o += &format!(
                "  {}  fabric {}  domain {}{}\n",
                s(&x["provider"]),
                s(&x["fabric"]),
                s(&x["domain"]),
                if x["hmem"].as_bool() == Some(true) {
                    "  FI_HMEM"
                } else {
                    ""
                }
            );
        }
        o += &format!(
            "  the ofi transport opens domain {} ({})\n  device buffers: {}\n",
            match &f["domain"] {
                Value::Null => "of the first entry".to_string(),
                d => s(d),
            },
            s(&f["domain_why"]),
            s(&f["device_buffers"])
        );
    }
    let a = &v["apply"];
    o += &format!(
        "before a transport starts, PCCL would pin this process to NIC {}:\n",
        s(&a["nic"])
    );
    for x in a["set"].as_array().cloned().unwrap_or_default() {
        o += &format!(
            "  set {}={}  ({})\n",
            s(&x["var"]),
            s(&x["value"]),
            s(&x["for"])
        );
    }
    for x in a["kept"].as_array().cloned().unwrap_or_default() {
        o += &format!("  keep the user's {}\n", s(&x));
    }
    for x in a["notes"].as_array().cloned().unwrap_or_default() {
        o += &format!("  note: {}\n", s(&x));
    }
    o
}

fn main() {
    let args = Args::parse();
    match report(&args) {
        Ok(v) if args.json => println!("{v}"),
        Ok(v) => print!("{}", text(&v)),
        Err(e) => {
            eprintln!("pccl-info: {e}");
            std::process::exit(1);
        }
    }
}
