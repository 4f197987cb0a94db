//! All-to-all latency, one-phase (direct) against pairwise, on thread-ranks in one process.
//!
//! `cargo run --release --example alltoall_latency -- [threads|tcp] [RANKS] [ITERS]`
//!
//! For every block size from 4 B to 64 KiB (bytes per peer, u8 elements) it times `ITERS`
//! all-to-alls with `PCCL_ALLTOALL_DIRECT`'s limit at 0 (pairwise) and unlimited (direct),
//! interleaved in rounds so that load on the machine hits both alike, and prints the median
//! of the per-round means (rank 0's clock, after a barrier).

use pccl::config::Config;
use pccl::transport::{select, tcp::UniqueId};
use pccl::Communicator;
use std::time::Instant;

fn on_ranks<R: Send>(
    kind: &str,
    p: usize,
    cfg: Config,
    f: impl Fn(Communicator) -> pccl::Result<R> + Sync,
) -> pccl::Result<Vec<pccl::Result<R>>> {
    if kind == "threads" {
        return Communicator::run_threads(p, cfg, f);
    }
    let k = select::parse(kind)?;
    let id = UniqueId::new(cfg.timeout)?;
    Ok(std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let (cfg, id, f) = (cfg.clone(), id.clone(), &f);
                s.spawn(move || {
                    let t = select::join(k, &id, p, r, cfg.chunk_bytes, cfg.timeout)?;
                    f(Communicator::with_config(t, cfg)?)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    }))
}

/// Mean seconds per all-to-all of `block` bytes per peer over `iters` calls.
fn time(comm: &Communicator, block: usize, iters: usize) -> pccl::Result<f64> {
    let p = comm.size();
    let inp = vec![comm.rank() as u8; block * p];
    let mut out = vec![0u8; block * p];
    comm.all_to_all(&inp, &mut out)?;
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        comm.all_to_all(&inp, &mut out)?;
    }
    let dt = t0.elapsed().as_secs_f64() / iters as f64;
    for (i, b) in out.chunks(block.max(1)).enumerate().take(p) {
        if block > 0 && b.iter().any(|&x| x as usize != i) {
            return Err(pccl::Error::internal("all-to-all result is wrong"));
        }
    }
    Ok(dt)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> pccl::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map_or("threads", String::as_str).to_string();
    let p: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    let iters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100);
    let rounds = 5;
    println!("# all-to-all on {p} {kind} ranks, {iters} calls x {rounds} rounds, u8 blocks");
    println!(
        "{:>8} {:>14} {:>14} {:>8}",
        "block_B", "pairwise_us", "direct_us", "ratio"
    );
    let mut block = 4;
    while block <= 64 << 10 {
        let mut pair = Vec::new();
        let mut direct = Vec::new();
        for _ in 0..rounds {
            for (limit, into) in [(0, &mut pair), (usize::MAX, &mut direct)] {
                let cfg = Config {
                    alltoall_direct_max: limit,
                    ..Config::default()
                };
                let res = on_ranks(&kind, p, cfg, |c| time(&c, block, iters))?;
                let t = res.into_iter().next().expect("rank 0")?;
                into.push(t);
            }
        }
        let (a, b) = (median(pair) * 1e6, median(direct) * 1e6);
        println!("{block:>8} {a:>14.1} {b:>14.1} {:>8.2}", a / b);
        block *= 4;
    }
    Ok(())
}
