//! A small emulated cluster (`scripts/cluster.sh`): 3 nodes × 2 ranks, 2 NICs per node, each
//! NIC shaped to 1 Gbit/s both ways. One process per rank, launched by environment
//! (`PCCL_RANK`, `PCCL_WORLD_SIZE`, `PCCL_UNIQUE_ID_FILE`):
//!
//! - checked collectives (`pccl-bench --check`: every element compared) over TCP and, with
//!   the `ofi` feature, libfabric's `tcp;ofi_rxm`;
//! - the traffic on the NICs the map gives each rank (interface counters): both NICs of every
//!   node carry the hierarchy's traffic with one rank per NIC, and one NIC carries all of it
//!   when the map puts both ranks there;
//! - a NIC taken down, a partition between two nodes and a link slowed to 8 bit/s, each in the
//!   middle of a run of collectives, end in an error on every rank within `PCCL_TIMEOUT` and
//!   the diagnosis' grace (never a hang, never a success); behind the partition the timeouts
//!   name the ranks across the cut;
//! - a node lost (its ranks exit abruptly): the survivors' calls fail, `dead_ranks()` names
//!   the lost ranks, the survivors shrink them out and go on with checked all-reduces
//!   (`examples/survive.rs`);
//! - `down` leaves no namespace, veth, process or state behind.
//!
//! Needs root, `ip`, `tc`, `unshare` and the `hwloc` feature (the NICs come from a topology
//! file); skips, saying why, otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const NODES: usize = 3;
const NICS: usize = 2;

/// The cluster of this test process (its own name and state directory); `down` on drop.
struct Cluster {
    name: String,
    dir: PathBuf,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh")
}

impl Cluster {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("bash");
        c.arg(script())
            .args(args)
            .env("PCCL_CLUSTER_NAME", &self.name)
            .env("PCCL_CLUSTER_DIR", &self.dir)
            .env_remove("PCCL_NIC_MAP")
            .env_remove("PCCL_SOCKET_ADDR")
            .env_remove("PCCL_TRANSPORT");
        c
    }

    fn up() -> Result<Cluster, String> {
        let id = std::process::id() % 100_000;
        let c = Cluster {
            name: format!("pt{id}"),
            dir: std::env::temp_dir().join(format!("pccl-cluster-test-{id}")),
        };
        let out = c
            .cmd(&[
                "up",
                "--nodes",
                &NODES.to_string(),
                "--nics",
                &NICS.to_string(),
                "--rate",
                "1gbit",
            ])
            .output()
            .map_err(|e| format!("cannot run cluster.sh: {e}"))?;
        match out.status.code() {
            Some(0) => Ok(c),
            Some(77) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            _ => panic!(
                "cluster.sh up failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// `run` with 2 ranks per node; the extra environment goes to every rank.
    fn run(&self, env: &[(&str, &str)], timeout_s: u32, cmd: &[&str]) -> Output {
        let t = timeout_s.to_string();
        let mut args = vec!["run", "--ranks-per-node", "2", "--timeout", &t, "--"];
        args.extend_from_slice(cmd);
        let mut c = self.cmd(&args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("cluster.sh run")
    }

    /// Bytes sent plus received by NIC `pn{nic}` of every node.
    fn bytes(&self) -> Vec<[u64; NICS]> {
        let out = self.cmd(&["counters"]).output().expect("counters");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut v = vec![[0u64; NICS]; NODES];
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Ok(node), Some(nic)) = (
                f[0].parse::<usize>(),
                f[1].strip_prefix("pn")
                    .and_then(|n| n.parse::<usize>().ok()),
            ) else {
                continue;
            };
            let n = |i: usize| f[i].parse::<u64>().expect("a byte count");
            v[node][nic] = n(2) + n(3);
        }
        v
    }

    fn rank_logs(&self) -> Vec<String> {
        (0..NODES * 2)
            .map(|r| {
                std::fs::read_to_string(self.dir.join(format!("run/rank{r}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.cmd(&["down"]).output();
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn unsupported() -> Option<&'static str> {
    if !cfg!(feature = "hwloc") {
        return Some("built without the `hwloc` feature (the NICs come from a topology file)");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for network namespaces");
    }
    None
}

fn delta(a: &[[u64; NICS]], b: &[[u64; NICS]]) -> Vec<[u64; NICS]> {
    a.iter()
        .zip(b)
        .map(|(x, y)| [y[0] - x[0], y[1] - x[1]])
        .collect()
}

fn bench() -> &'static str {
    env!("CARGO_BIN_EXE_pccl-bench")
}

/// Checked collectives of every algorithm; the bytes each NIC moved meanwhile.
fn checked_run(c: &Cluster, transport: &str, env: &[(&str, &str)]) -> Vec<[u64; NICS]> {
    let before = c.bytes();
    let o = c.run(
        env,
        240,
        &[
            bench(),
            "--transport",
            transport,
            "-m",
            "4K:256K",
            "-i",
            "2",
            "-x",
            "1",
            "--coll",
            "all",
            "--algo",
            "auto,ring,rd,hier-rd,hier-ring,hier-rd-pipe4",
            "--check",
        ],
    );
    let out = text(&o);
    assert!(
        o.status.success(),
        "{transport}: checked collectives failed:\n{out}\n{}",
        c.rank_logs().join("\n---\n")
    );
    assert!(out.contains("all results correct"), "{transport}:\n{out}");
    delta(&before, &c.bytes())
}

/// All-reduces in a loop on every rank (`PCCL_TIMEOUT=5`) and `fault` applied 3 s in: every
/// rank must end with an error within 30 s of it (a rank's deadline plus the diagnosis'
/// grace), none may hang (the run's own limit is 60 s) or succeed. `undo` repairs it. The
/// ranks' logs.
/// `examples/survive`, built by `cargo test` beside this test.
fn survive_bin() -> Option<String> {
    std::env::current_exe()
        .ok()
        .and_then(|t| Some(t.parent()?.parent()?.join("examples/survive")))
        .filter(|p| p.exists())
        .map(|p| p.to_str().expect("a UTF-8 path").to_string())
}

/// Node 0 cut off from nodes 1 and 2 while every rank loops over checked all-reduces
/// (`examples/survive --partition 1`): ranks 2–5 agree, shrink and go on; ranks 0 and 1 stop.
fn partition_survive(c: &Cluster, bin: &str) {
    let runner = {
        let c2 = Cluster {
            name: c.name.clone(),
            dir: c.dir.clone(),
        };
        let bin = bin.to_string();
        std::thread::spawn(move || {
            let o = c2.run(
                &[("PCCL_TIMEOUT", "5")],
                90,
                &[&bin, "--partition", "1", "--then", "10"],
            );
            std::mem::forget(c2);
            o
        })
    };
    std::thread::sleep(Duration::from_secs(4));
    for other in ["1", "2"] {
        let o = c.cmd(&["partition", "0", other, "cut"]).output().unwrap();
        assert!(o.status.success(), "partition 0 {other}: {}", text(&o));
    }
    let o = runner.join().unwrap();
    for other in ["1", "2"] {
        let h = c.cmd(&["partition", "0", other, "heal"]).output().unwrap();
        assert!(h.status.success(), "heal 0 {other}: {}", text(&h));
    }
    let logs = c.rank_logs();
    let all = logs.join("\n---\n");
    assert!(
        o.status.success(),
        "partition survival: {}\n{all}",
        text(&o)
    );
    for (r, log) in logs.iter().enumerate() {
        if r < 2 {
            assert!(
                log.contains("stopped:") && log.contains("not a majority"),
                "rank {r} (the minority side) was not refused:\n{all}"
            );
        } else {
            assert!(
                log.contains("survived the partition") && log.contains("on 4 ranks"),
                "rank {r} (the majority side) did not go on:\n{all}"
            );
        }
    }
    println!(
        "partition survival: {}",
        logs[2].lines().last().unwrap_or("")
    );
    println!(
        "partition survival: {}",
        logs[0].lines().last().unwrap_or("")
    );
}

fn fault_run(c: &Cluster, fault: &[&str], undo: &[&str]) -> Vec<String> {
    let t0 = Instant::now();
    let runner = {
        let c2 = Cluster {
            name: c.name.clone(),
            dir: c.dir.clone(),
        };
        std::thread::spawn(move || {
            let o = c2.run(
                &[("PCCL_TIMEOUT", "5")],
                60,
                &[
                    bench(),
                    "--transport",
                    "tcp",
                    "-m",
                    "64K:64K",
                    "-i",
                    "1000000",
                    "--coll",
                    "allreduce",
                    "--algo",
                    "hier-ring",
                ],
            );
            // Not `down` when this handle goes: the test's own cluster does that.
            std::mem::forget(c2);
            o
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let o = c.cmd(fault).output().unwrap();
    assert!(o.status.success(), "{fault:?}: {}", text(&o));
    let at = t0.elapsed();
    let o = runner.join().unwrap();
    let after = t0.elapsed() - at;
    let logs = c.rank_logs();
    let all = logs.join("\n---\n");
    println!("{fault:?}: every rank out {after:?} after it");
    assert_ne!(o.status.code(), Some(124), "{fault:?}: a rank hung:\n{all}");
    assert!(!o.status.success(), "{fault:?}: the run succeeded:\n{all}");
    assert!(
        after < Duration::from_secs(30),
        "{fault:?}: the ranks took {after:?} to fail:\n{all}"
    );
    let o = c.cmd(undo).output().unwrap();
    assert!(o.status.success(), "{undo:?}: {}", text(&o));
    logs
}

#[test]
fn an_emulated_cluster_runs_checked_collectives_on_the_mapped_nics_and_fails_cleanly() {
    if let Some(why) = unsupported() {
        println!("skipped: {why}");
        return;
    }
    let c = match Cluster::up() {
        Ok(c) => c,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let (name, dir) = (c.name.clone(), c.dir.clone());

    // TCP, one rank per NIC: every node's two NICs both carry traffic (the hierarchy's
    // inter-node steps run between same-index ranks, one per NIC).
    let moved = checked_run(&c, "tcp", &[]);
    println!("tcp, map 0:0;1:1: bytes per node and NIC {moved:?}");
    for (node, m) in moved.iter().enumerate() {
        assert!(
            m[0] > 1 << 20 && m[1] > 1 << 20,
            "node {node}: both NICs must carry traffic: {moved:?}"
        );
    }
    // Both ranks on NIC 0: NIC 1 carries nothing but stray packets.
    let moved = checked_run(&c, "tcp", &[("PCCL_NIC_MAP", "0:0-1")]);
    println!("tcp, map 0:0-1: bytes per node and NIC {moved:?}");
    for (node, m) in moved.iter().enumerate() {
        assert!(
            m[0] > 1 << 20 && m[1] * 100 < m[0],
            "node {node}: only NIC 0 may carry traffic: {moved:?}"
        );
    }
    if cfg!(feature = "ofi") {
        let moved = checked_run(&c, "ofi", &[("FI_PROVIDER", "tcp;ofi_rxm")]);
        println!("ofi tcp;ofi_rxm, map 0:0;1:1: bytes per node and NIC {moved:?}");
        for (node, m) in moved.iter().enumerate() {
            assert!(
                m[0] > 1 << 20 && m[1] > 1 << 20,
                "node {node}: both NICs must carry libfabric's traffic: {moved:?}"
            );
        }
    }

    // pccl-tune measures the network from inside it: each NIC's rate as shaped (1 Gbit/s,
    // 1448/1514 of it TCP payload), the three nodes found on one host, the overheads fitted.
    let prof = dir.join("tuned.toml");
    let o = c.run(
        &[],
        120,
        &[
            env!("CARGO_BIN_EXE_pccl-tune"),
            "--transport",
            "tcp",
            "--quick",
            "-o",
            prof.to_str().expect("a UTF-8 path"),
        ],
    );
    assert!(
        o.status.success(),
        "pccl-tune in the cluster failed:
{}
{}",
        text(&o),
        c.rank_logs().join("\n---\n")
    );
    let p = pccl::model::profile::Profile::load(&prof).expect("the profile pccl-tune wrote");
    println!(
        "pccl-tune: NIC {:.4} GB/s, inter {:.1} us + {:.1} us of core time, {} nodes per host",
        p.inter.nic_bandwidth_gbps,
        p.inter.alpha_us,
        p.oversub.inter_cpu_us,
        p.oversub.nodes_per_host
    );
    // The rate as shaped, never above it; how close is a measurement of the benchmarks
    // (docs/CLUSTER.md): on a busy CI host a quick run has read a third of it.
    let payload = 0.125 * 1448.0 / 1514.0;
    assert!(
        (0.25 * payload..1.05 * payload).contains(&p.inter.nic_bandwidth_gbps),
        "NIC rate {} GB/s measured, shaped to {payload} of payload",
        p.inter.nic_bandwidth_gbps
    );
    assert_eq!((p.inter.nics, p.oversub.nodes_per_host), (NICS, NODES));
    // The nodes share the CPUs the ranks' affinity masks allow between them: here, unpinned,
    // every CPU this process may use.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(p.oversub.cores, cpus, "cores the nodes share");

    // A node lost (node 2's ranks exit abruptly mid-run): the survivors' calls fail, the
    // lost ranks show in `dead_ranks()`, the survivors shrink them out and go on, every
    // result checked (examples/survive.rs; built by `cargo test` beside this test).
    match survive_bin() {
        None => println!("node loss: skipped (examples/survive not built)"),
        Some(bin) => {
            let o = c.run(
                &[("PCCL_TIMEOUT", "5")],
                90,
                &[&bin, "--lose", "2", "--after", "10", "--then", "10"],
            );
            let logs = c.rank_logs();
            let all = logs.join("\n---\n");
            assert!(o.status.success(), "node loss: {}\n{all}", text(&o));
            for (r, log) in logs.iter().enumerate().take(4) {
                assert!(
                    log.contains("survived:") && log.contains("ranks [4, 5] shrunk out"),
                    "rank {r} did not go on after the node loss:\n{all}"
                );
            }
            println!("node loss: {}", logs[0].lines().last().unwrap_or(""));
        }
    }

    // A NIC taken down while every rank loops over all-reduces: every rank fails within
    // PCCL_TIMEOUT (5 s) of it, none hangs (the run's own limit is 60 s), none succeeds.
    let logs = fault_run(&c, &["link", "1", "0", "down"], &["link", "1", "0", "up"]);
    for (r, log) in logs.iter().enumerate() {
        assert!(
            log.contains("pccl-bench: ") && log.contains("rank "),
            "rank {r} did not end with an error naming a rank:\n{log}"
        );
    }
    // A partition between nodes 0 and 2 (ranks 0, 1 and 4, 5): the same, and the timeouts
    // name the ranks across the cut from the others' reports, not only the peer each waited
    // for.
    let logs = fault_run(
        &c,
        &["partition", "0", "2", "cut"],
        &["partition", "0", "2", "heal"],
    );
    let all = logs.join("\n---\n");
    for (r, l) in logs.iter().enumerate() {
        if let Some(line) = l.lines().find(|x| x.contains("the ranks' reports")) {
            println!("partition, rank {r}: {line}");
        }
    }
    assert!(
        logs.iter().any(|l| l.contains("the ranks' reports")
            && (l.contains("each waited in vain for the other") || l.contains("sent no word"))),
        "no rank named the ranks behind the partition:\n{all}"
    );
    // A partition that leaves node 0 alone: the majority (nodes 1 and 2) agrees on who is
    // left, shrinks and goes on with checked all-reduces; node 0's ranks are refused (not a
    // majority) instead of going on as a second job.
    if let Some(bin) = survive_bin() {
        partition_survive(&c, &bin);
    }
    // A link slowed to 8 bit/s (node 1's NIC 0, every class): a stall, not a slow run.
    let logs = fault_run(
        &c,
        &["rate", "1", "0", "8bit"],
        &["rate", "1", "0", "1gbit"],
    );
    for (r, log) in logs.iter().enumerate() {
        assert!(
            log.contains("pccl-bench: "),
            "rank {r} did not end with an error:\n{log}"
        );
    }

    // `down` removes everything.
    drop(c);
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let ns = String::from_utf8_lossy(&ns.stdout);
    assert!(
        !ns.lines().any(|l| l.starts_with(&format!("{name}-"))),
        "namespaces left behind:\n{ns}"
    );
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains(&format!("{name}-")),
        "veths left behind:\n{links}"
    );
    assert!(!Path::new(&dir).exists(), "state left in {}", dir.display());
}
