//! Two "hosts" (network namespaces, each its own host name) joined by two veth pairs: two
//! NICs per host, `pn0` and `pn1`, described to PCCL by tests/data/topology/two-eth.xml. Four
//! TCP ranks, two per host; the NIC map pins each local rank to a NIC (through the address the
//! TCP transport listens on), and the bytes each interface counts show the traffic goes where
//! the map says. Needs root, `ip netns`, `unshare` and the `hwloc` feature; skips otherwise.

use pccl::config::Config;
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::{Communicator, ReduceOp};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ENV_RANK: &str = "PCCL_VETH_RANK";
const ENV_DIR: &str = "PCCL_VETH_DIR";
const N: usize = 1 << 20;
const ROUNDS: usize = 4;

fn run(cmd: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces joined by two veth pairs; deleted on drop.
struct Hosts {
    ns: [String; 2],
}

impl Hosts {
    fn new() -> Result<Self, String> {
        let id = std::process::id();
        let h = Hosts {
            ns: [format!("pccl{id}a"), format!("pccl{id}b")],
        };
        for ns in &h.ns {
            run(&["ip", "netns", "add", ns])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        for nic in 0..2 {
            let (x, y) = (format!("px{id}{nic}"), format!("py{id}{nic}"));
            run(&["ip", "link", "add", &x, "type", "veth", "peer", "name", &y])?;
            for (end, host) in [(&x, 0), (&y, 1)] {
                let ns = &h.ns[host];
                let name = format!("pn{nic}");
                let addr = format!("10.213.{nic}.{}/24", host + 1);
                run(&["ip", "link", "set", end, "netns", ns])?;
                run(&["ip", "-n", ns, "link", "set", end, "name", &name])?;
                run(&["ip", "-n", ns, "addr", "add", &addr, "dev", &name])?;
                run(&["ip", "-n", ns, "link", "set", &name, "up"])?;
            }
        }
        Ok(h)
    }

    /// Bytes sent plus received on interface `pn{nic}` of host 0.
    fn bytes(&self, nic: usize) -> u64 {
        ["tx_bytes", "rx_bytes"]
            .iter()
            .map(|f| {
                let out = Command::new("ip")
                    .args(["netns", "exec", &self.ns[0], "cat"])
                    .arg(format!("/sys/class/net/pn{nic}/statistics/{f}"))
                    .output()
                    .expect("read interface counters");
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<u64>()
                    .expect("a byte count")
            })
            .sum()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

/// Why this machine cannot run the test, if it cannot.
fn unsupported() -> Option<String> {
    if !cfg!(feature = "hwloc") {
        return Some(
            "built without the `hwloc` feature (the NICs come from a topology file)".into(),
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for ip netns".into());
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        return Some("no unshare command".into());
    }
    None
}

fn spawn(hosts: &Hosts, rank: usize, dir: &Path, map: &str) -> Child {
    let host = rank / 2;
    let topo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/topology/two-eth.xml");
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &hosts.ns[host],
            "unshare",
            "--uts",
            "sh",
            "-c",
        ])
        .arg(format!("hostname pccl-veth-{host} && exec \"$0\" \"$@\""))
        .arg(std::env::current_exe().expect("test executable"))
        .args([
            "--exact",
            "ranks_use_the_nics_the_map_gives_them",
            "--nocapture",
        ])
        .env(ENV_RANK, rank.to_string())
        .env(ENV_DIR, dir)
        .env("PCCL_TOPO_FILE", topo)
        .env("PCCL_NIC_MAP", map)
        .env("PCCL_ALGO", "hier-ring")
        .env("LOCAL_RANK", (rank % 2).to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env_remove("PCCL_SOCKET_ADDR")
        .env_remove("PCCL_SHM_DISABLE")
        .spawn()
        .expect("spawn a rank")
}

/// One rank: rank 0 opens the rendezvous and writes the id to `dir`; all join, then all-reduce.
fn rank_main(rank: usize, dir: &Path) {
    let file = dir.join("id");
    let id = if rank == 0 {
        let id = UniqueId::new(Duration::from_secs(60)).expect("rendezvous");
        std::fs::write(dir.join("id.tmp"), id.to_bytes()).unwrap();
        std::fs::rename(dir.join("id.tmp"), &file).unwrap();
        id
    } else {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(b) = std::fs::read(&file) {
                break UniqueId::from_bytes(&b).expect("unique id");
            }
            assert!(Instant::now() < until, "rank {rank}: no unique id");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let cfg = Config::from_env().expect("config");
    let t = TcpTransport::connect(&id, 4, rank, cfg.chunk_bytes, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let comm = Communicator::with_config(Arc::new(t), cfg).expect("communicator");
    let mine: Vec<f32> = (0..N).map(|i| ((i % 97) * (rank + 1)) as f32).collect();
    let mut sum = vec![0f32; N];
    for _ in 0..ROUNDS {
        comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
    assert!(sum
        .iter()
        .enumerate()
        .all(|(i, &v)| v == ((i % 97) * 10) as f32));
    // The transport listens on the address of the NIC the map gives this local rank.
    let map: pccl::topology::NicMap = std::env::var("PCCL_NIC_MAP").unwrap().parse().unwrap();
    let want = format!("10.213.{}.{}", map.nic_of(rank % 2), rank / 2 + 1);
    assert_eq!(std::env::var("PCCL_SOCKET_ADDR").ok(), Some(want));
    println!(
        "rank {rank}: PCCL_SOCKET_ADDR={:?} map {:?}",
        std::env::var("PCCL_SOCKET_ADDR").ok(),
        comm.topology().nic_map().map(|m| m.to_string())
    );
}

/// Runs the 4-rank job with `map`; returns the bytes on host 0's `pn0` and `pn1`.
fn job(hosts: &Hosts, map: &str) -> (u64, u64) {
    let dir = std::env::temp_dir().join(format!("pccl-veth-{}-{}", std::process::id(), map.len()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let before = (hosts.bytes(0), hosts.bytes(1));
    let children: Vec<Child> = (0..4).map(|r| spawn(hosts, r, &dir, map)).collect();
    let until = Instant::now() + Duration::from_secs(120);
    for (r, mut c) in children.into_iter().enumerate() {
        loop {
            match c.try_wait().unwrap() {
                Some(st) => {
                    assert!(st.success(), "rank {r} with map {map} failed: {st}");
                    break;
                }
                None if Instant::now() > until => {
                    let _ = c.kill();
                    panic!("rank {r} with map {map} did not finish");
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    (hosts.bytes(0) - before.0, hosts.bytes(1) - before.1)
}

#[test]
fn ranks_use_the_nics_the_map_gives_them() {
    if let (Ok(rank), Ok(dir)) = (std::env::var(ENV_RANK), std::env::var(ENV_DIR)) {
        rank_main(rank.parse().unwrap(), Path::new(&dir));
        return;
    }
    if let Some(why) = unsupported() {
        println!("skipped: {why}");
        return;
    }
    let hosts = match Hosts::new() {
        Ok(h) => h,
        Err(e) => {
            println!("skipped: cannot build the network namespaces ({e})");
            return;
        }
    };
    // Per round, each pair of same-index ranks moves N × 4 bytes over its NIC, counting both
    // directions (two-rank ring: half the vector each way in the reduce-scatter and again in
    // the all-gather); intra-node traffic stays in shared memory.
    let payload = (ROUNDS * N * 4) as u64;
    let (a0, a1) = job(&hosts, "0:0;1:1");
    println!("map 0:0;1:1: pn0 {a0} bytes, pn1 {a1} bytes");
    assert!(
        a0 > payload / 2 && a1 > payload / 2,
        "both NICs carry traffic"
    );
    assert!(
        a0.min(a1) * 10 > a0.max(a1) * 7,
        "the two NICs carry the same share"
    );
    let (b0, b1) = job(&hosts, "0:0-1");
    println!("map 0:0-1: pn0 {b0} bytes, pn1 {b1} bytes");
    assert!(b0 > payload, "NIC 0 carries both local ranks' traffic");
    assert!(b1 * 50 < b0, "NIC 1 carries nothing but stray packets");
    let (c0, c1) = job(&hosts, "0:1;1:0");
    println!("map 0:1;1:0: pn0 {c0} bytes, pn1 {c1} bytes");
    assert!(c0 > payload / 2 && c1 > payload / 2);
}
