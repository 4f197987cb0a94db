//! The libfabric transport (feature `ofi`) on this host's providers: `tcp;ofi_rxm` over
//! loopback and `shm`. Each test runs once per provider in a child process of this test
//! executable with `FI_PROVIDER` set (libfabric reads it once per process); ranks are threads
//! of that child, or processes of their own for the fault tests. A provider libfabric does
//! not offer here is skipped with a message.
#![cfg(feature = "ofi")]

mod common;

use common::{input, reduced, same_bits};
use pccl::config::Config;
use pccl::plan::{Algorithm, LevelAlgo};
use pccl::transport::ofi::OfiTransport;
use pccl::transport::tcp::UniqueId;
use pccl::transport::Transport;
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in a child: `<provider>` (thread tests) or `<provider>|<rank>|<p>|<id hex>` (ranks as
/// processes).
const CHILD: &str = "PCCL_OFI_TEST_CHILD";
const PROVIDERS: [&str; 2] = ["tcp;ofi_rxm", "shm"];

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// In the parent: runs test `name` once per provider in a child process (skipping providers
/// libfabric does not offer) and fails if a child fails. In a child: returns true (run the
/// body).
fn per_provider(name: &str) -> bool {
    if std::env::var(CHILD).is_ok() {
        return true;
    }
    let exe = std::env::current_exe().expect("test executable");
    for prov in PROVIDERS {
        let out = Command::new(&exe)
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, prov)
            .env("FI_PROVIDER", prov)
            .env_remove("PCCL_FAULT")
            .output()
            .expect("spawn the test");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        for l in text.lines().filter(|l| l.starts_with("@@")) {
            println!("{name} [{prov}]: {l}");
        }
        assert!(out.status.success(), "{name} on {prov} failed:\n{text}");
    }
    false
}

/// Whether a provider is usable in this (child) process; prints why not.
fn usable() -> bool {
    if pccl::transport::ofi::providers().is_empty() {
        println!(
            "@@ SKIPPED: libfabric offers no RDM tagged provider for FI_PROVIDER={}",
            std::env::var("FI_PROVIDER").unwrap_or_default()
        );
        return false;
    }
    true
}

fn connect(id: &UniqueId, p: usize, r: usize, timeout: Duration) -> OfiTransport {
    OfiTransport::connect(id, p, r, 256 * 1024, timeout).expect("connect")
}

fn on_ofi<R: Send>(p: usize, cfg: Config, f: impl Fn(Communicator, &OfiTransport) -> R + Sync) -> Vec<R> {
    let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let (cfg, id, f) = (cfg.clone(), id.clone(), &f);
                s.spawn(move || {
                    let t = Arc::new(connect(&id, p, r, cfg.timeout));
                    let comm = Communicator::with_config(t.clone(), cfg).expect("communicator");
                    f(comm, &t)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

fn cfg(m: usize, algo: Algorithm) -> Config {
    Config {
        ranks_per_node: Some(m),
        algo: Some(algo),
        timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

fn exact(comm: &Communicator, counts: &[usize]) -> Result<(), String> {
    let (r, p) = (comm.rank(), comm.size());
    for &count in counts {
        let mine = input::<f32>(r, count, ReduceOp::Sum);
        let mut out = vec![0f32; count * p];
        comm.all_gather(&mine, &mut out).map_err(|e| e.to_string())?;
        let want: Vec<f32> = (0..p)
            .flat_map(|q| input::<f32>(q, count, ReduceOp::Sum))
            .collect();
        if !same_bits(&out, &want) {
            return Err(format!("all_gather count={count} wrong"));
        }
        let full = input::<f64>(r, count * p, ReduceOp::Avg);
        let mut o = vec![0f64; count];
        comm.reduce_scatter(&full, &mut o, ReduceOp::Avg)
            .map_err(|e| e.to_string())?;
        let want: Vec<f64> = (r * count..(r + 1) * count)
            .map(|i| reduced::<f64>(p, i, ReduceOp::Avg))
            .collect();
        if !same_bits(&o, &want) {
            return Err(format!("reduce_scatter count={count} wrong"));
        }
        let mut a = input::<i32>(r, count + 5, ReduceOp::Max);
        comm.all_reduce_in_place(&mut a, ReduceOp::Max)
            .map_err(|e| e.to_string())?;
        let want: Vec<i32> = (0..count + 5)
            .map(|i| reduced::<i32>(p, i, ReduceOp::Max))
            .collect();
        if a != want {
            return Err(format!("all_reduce count={count} wrong"));
        }
    }
    Ok(())
}

#[test]
fn every_algorithm_is_exact_for_two_to_eight_ranks() {
    if !per_provider("every_algorithm_is_exact_for_two_to_eight_ranks") || !usable() {
        return;
    }
    let hier = |inter, intra| Algorithm::Hier { inter, intra };
    for (p, m, algo) in [
        (2, 1, Algorithm::Flat(LevelAlgo::Ring)),
        (3, 1, Algorithm::Flat(LevelAlgo::Rd)),
        (4, 2, hier(LevelAlgo::Rd, LevelAlgo::Ring)),
        (5, 1, Algorithm::Flat(LevelAlgo::Ring)),
        (6, 3, hier(LevelAlgo::Ring, LevelAlgo::Rd)),
        (8, 2, hier(LevelAlgo::Ring, LevelAlgo::Ring)),
        (8, 4, hier(LevelAlgo::Rd, LevelAlgo::Rd)),
    ] {
        let t0 = Instant::now();
        let res = on_ofi(p, cfg(m, algo), |comm, _| exact(&comm, &[0, 1, 7, 300_001]));
        for r in res {
            r.unwrap_or_else(|e| panic!("P={p} M={m} {algo}: {e}"));
        }
        println!("@@ P={p} M={m} {algo}: exact in {} ms", t0.elapsed().as_millis());
    }
}
