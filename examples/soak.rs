//! A soak of mixed collectives on real processes over the TCP transport.
//!
//! `soak [--ranks P] [--calls N] [--seed S]` starts P copies of itself (one process per rank,
//! joined through a unique id), each running the same seeded sequence of N calls: every
//! collective, sizes from 0 to 256 KiB, several dtypes and ops, sync and async, on the world,
//! on one communicator per algorithm, and on a half-world sub-communicator. Every result is
//! checked against a reference; all-reduce results are hashed bit for bit and the hashes
//! compared across ranks at the end. Each rank reports its mismatches and its resident
//! memory at the start and at the end. Exits non-zero on any mismatch, error or hang.

#[path = "../tests/common.rs"]
mod common;

use common::{arg, input, reduced, same_bits};
use half::bf16;
use pccl::config::Config;
use pccl::plan::Algorithm;
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::{Communicator, Element, ReduceOp};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// FNV-1a over the bits of `v`, folded into `h`.
fn fold<T: Element>(h: &mut u64, v: &[T]) {
    for &b in bytemuck::cast_slice::<T, u8>(v) {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// One checked call of collective `kind` with `n` elements per block on `comm`.
fn one<T: Element>(
    comm: &Communicator,
    kind: usize,
    n: usize,
    op: ReduceOp,
    asynchronous: bool,
    digest: &mut u64,
) -> Result<(), String> {
    let (r, p) = (comm.rank(), comm.size());
    let err = |e: pccl::Error| format!("{e}");
    match kind {
        0 => {
            let mine: Vec<T> = input(r, n, op);
            let out = if asynchronous {
                comm.all_gather_async(mine, vec![T::from_i64(0); n * p])
                    .map_err(err)?
                    .wait()
                    .map_err(err)?
                    .1
            } else {
                let mut out = vec![T::from_i64(0); n * p];
                comm.all_gather(&mine, &mut out).map_err(err)?;
                out
            };
            for q in 0..p {
                if !same_bits(&out[q * n..(q + 1) * n], &input::<T>(q, n, op)) {
                    return Err(format!("all-gather block {q} wrong"));
                }
            }
        }
        1 => {
            let inp: Vec<T> = (0..n * p).map(|i| common::value::<T>(r, i, op)).collect();
            let out = if asynchronous {
                comm.reduce_scatter_async(inp, vec![T::from_i64(0); n], op)
                    .map_err(err)?
                    .wait()
                    .map_err(err)?
                    .1
            } else {
                let mut out = vec![T::from_i64(0); n];
                comm.reduce_scatter(&inp, &mut out, op).map_err(err)?;
                out
            };
            let want: Vec<T> = (0..n).map(|i| reduced::<T>(p, r * n + i, op)).collect();
            if !same_bits(&out, &want) {
                return Err("reduce-scatter wrong".into());
            }
        }
        2 => {
            let inp: Vec<T> = input(r, n, op);
            let out = if asynchronous {
                comm.all_reduce_async(inp, op)
                    .map_err(err)?
                    .wait()
                    .map_err(err)?
            } else {
                let mut out = vec![T::from_i64(0); n];
                comm.all_reduce(&inp, &mut out, op).map_err(err)?;
                out
            };
            let want: Vec<T> = (0..n).map(|i| reduced::<T>(p, i, op)).collect();
            if !same_bits(&out, &want) {
                return Err("all-reduce wrong".into());
            }
            fold(digest, &out);
        }
        3 => {
            let root = n % p;
            let mut buf: Vec<T> = if r == root {
                input(root, n, op)
            } else {
                vec![T::from_i64(0); n]
            };
            comm.broadcast(&mut buf, root).map_err(err)?;
            if !same_bits(&buf, &input::<T>(root, n, op)) {
                return Err("broadcast wrong".into());
            }
        }
        _ => comm.barrier().map_err(err)?,
    }
    Ok(())
}

fn rank_main(rank: usize, p: usize, id_hex: &str, calls: u64, seed: u64) -> Result<(), String> {
    let bytes: Vec<u8> = (0..id_hex.len() / 2)
        .map(|i| u8::from_str_radix(&id_hex[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect();
    let id = UniqueId::from_bytes(&bytes).map_err(|e| e.to_string())?;
    let cfg = Config {
        ranks_per_node: Some(if p % 2 == 0 { p / 2 } else { 1 }),
        timeout: Duration::from_secs(60),
        ..Config::from_env().map_err(|e| e.to_string())?
    };
    let t = TcpTransport::connect(&id, p, rank, cfg.chunk_bytes, cfg.timeout)
        .map_err(|e| e.to_string())?;
    let world = Communicator::with_config(Arc::new(t), cfg.clone()).map_err(|e| e.to_string())?;
    // One communicator per algorithm (same ranks), and a half-world one.
    let mut comms = vec![world];
    for a in Algorithm::ALL {
        let c = Config {
            algo: Some(a),
            ..cfg.clone()
        };
        let sub = comms[0]
            .split_with_config(Some(0), rank as i32, c)
            .map_err(|e| e.to_string())?
            .ok_or("split lost a rank")?;
        comms.push(sub);
    }
    let half = comms[0]
        .split(Some((rank % 2) as u32), rank as i32)
        .map_err(|e| e.to_string())?
        .ok_or("split lost a rank")?;
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let mut rng = Rng(seed | 1);
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut mismatches = 0u64;
    let mut rss_warm = 0;
    let sizes = [0usize, 1, 7, 64, 1000, 4096, 16384, 65536];
    for call in 0..calls {
        if call == calls / 10 {
            rss_warm = rss_kib();
        }
        let kind = rng.below(5);
        let n = sizes[rng.below(sizes.len())];
        let dt = rng.below(4);
        let which = rng.below(comms.len() + 1);
        let asynchronous = rng.below(3) == 0;
        let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod][rng.below(4)];
        let comm = if which == comms.len() {
            &half
        } else {
            &comms[which]
        };
        let r = match dt {
            0 => one::<f32>(comm, kind, n, op, asynchronous, &mut digest),
            1 => one::<i32>(comm, kind, n, op, asynchronous, &mut digest),
            2 => one::<bf16>(comm, kind, n, op, asynchronous, &mut digest),
            _ => one::<f64>(comm, kind, n, op, asynchronous, &mut digest),
        };
        if let Err(e) = r {
            mismatches += 1;
            eprintln!("soak rank {rank}: call {call} (kind {kind}, n {n}, dtype {dt}): {e}");
            if mismatches > 5 {
                return Err("too many failures".into());
            }
        }
    }
    let took = t0.elapsed();
    // Every rank's all-reduce results must be bit-identical: compare the digests.
    let mut all = vec![0u64; p];
    comms[0]
        .all_gather(&[digest], &mut all)
        .map_err(|e| e.to_string())?;
    let identical = all.iter().all(|&d| d == all[0]);
    let rss1 = rss_kib();
    println!(
        "soak rank {rank}: {calls} calls in {:.1} s, {mismatches} mismatches, all-reduce \
         bit-identical on every rank: {identical}, RSS {rss0} KiB at start, {rss_warm} KiB \
         after {} calls, {rss1} KiB at the end",
        took.as_secs_f64(),
        calls / 10
    );
    if mismatches > 0 || !identical {
        return Err("the soak found mismatches".into());
    }
    Ok(())
}

fn main() {
    let p: usize = arg("--ranks", 4);
    let calls: u64 = arg("--calls", 10_000);
    let seed: u64 = arg("--seed", 0x50a4);
    if let (Ok(r), Ok(id)) = (
        std::env::var("PCCL_SOAK_RANK"),
        std::env::var("PCCL_SOAK_ID"),
    ) {
        let rank: usize = r.parse().unwrap_or(0);
        if let Err(e) = rank_main(rank, p, &id, calls, seed) {
            eprintln!("soak rank {rank}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let id = UniqueId::new(Duration::from_secs(60)).expect("unique id");
    let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().expect("own path");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut kids: Vec<_> = (0..p)
        .map(|r| {
            Command::new(&exe)
                .args(&args)
                .env("PCCL_SOAK_RANK", r.to_string())
                .env("PCCL_SOAK_ID", &hex)
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut failed = false;
    for (r, k) in kids.iter_mut().enumerate() {
        loop {
            match k.try_wait() {
                Ok(Some(st)) => {
                    failed |= !st.success();
                    if !st.success() {
                        eprintln!("soak: rank {r} exited with {st}");
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("soak: rank {r} hung; killing the job");
                    let _ = k.kill();
                    failed = true;
                    break;
                }
            }
        }
    }
    std::process::exit(i32::from(failed));
}
