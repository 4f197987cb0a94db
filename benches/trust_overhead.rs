//! What the trust machinery costs: all-gather on 4 ranks with call fingerprints on and off
//! (`Config::checks`, `PCCL_CHECKS`), in the same run, interleaved round by round so both
//! see the same machine noise. Deadlines and the failure board cannot be turned off (they are
//! how a dead peer is detected); they are in both columns.
//!
//! `cargo bench --bench trust_overhead [-- ITERS]` prints, per transport and size, the median
//! time with and without fingerprints and their ratio.

use pccl::config::Config;
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::transport::threads::ThreadWorld;
use pccl::transport::Transport;
use pccl::Communicator;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const P: usize = 4;

/// Per rank: the times with fingerprints on, and off (µs, one per round).
type Times = (Vec<f64>, Vec<f64>);

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Four transports of one job: thread-ranks, or TCP ranks (shared-memory rings between
/// them, as processes of one host would use) in this process.
fn transports(kind: &str) -> Vec<Arc<dyn Transport>> {
    match kind {
        "threads" => {
            let w = ThreadWorld::new(P);
            (0..P).map(|r| w.transport(r).unwrap()).collect()
        }
        _ => {
            let id = UniqueId::new(Duration::from_secs(30)).unwrap();
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..P)
                    .map(|r| {
                        let id = id.clone();
                        s.spawn(move || {
                            let t = TcpTransport::connect_with(
                                &id,
                                P,
                                r,
                                1 << 20,
                                Duration::from_secs(30),
                                true,
                            )
                            .unwrap();
                            Arc::new(t) as Arc<dyn Transport>
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        }
    }
}

fn main() {
    let iters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    println!("# all-gather on {P} ranks, fingerprints on vs off, {iters} interleaved rounds");
    println!("# transport  bytes/rank  checks-on(us)  checks-off(us)  on/off");
    for kind in ["threads", "tcp"] {
        for bytes in [1usize << 20, 16 << 20] {
            let n = bytes / 4;
            let on_t = transports(kind);
            let off_t = transports(kind);
            let cfg = |checks| Config {
                ranks_per_node: Some(2),
                checks,
                timeout: Duration::from_secs(60),
                ..Config::default()
            };
            let gate = Barrier::new(P);
            let times: Vec<Times> = std::thread::scope(|s| {
                let hs: Vec<_> = on_t
                    .into_iter()
                    .zip(off_t)
                    .map(|(a, b)| {
                        let gate = &gate;
                        let cfg = &cfg;
                        s.spawn(move || {
                            let on = Communicator::with_config(a, cfg(true)).unwrap();
                            let off = Communicator::with_config(b, cfg(false)).unwrap();
                            let mine = vec![1f32; n];
                            let mut out = vec![0f32; n * P];
                            let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
                            for round in 0..iters + 3 {
                                for (c, ts) in [(&on, &mut t_on), (&off, &mut t_off)] {
                                    gate.wait();
                                    let t0 = Instant::now();
                                    c.all_gather(&mine, &mut out).unwrap();
                                    if round >= 3 {
                                        ts.push(t0.elapsed().as_secs_f64() * 1e6);
                                    }
                                }
                            }
                            (t_on, t_off)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            // The slowest rank's time per round is the collective's time.
            let per_round = |pick: fn(&Times) -> &Vec<f64>| {
                let mut v: Vec<f64> = (0..iters)
                    .map(|i| times.iter().map(|t| pick(t)[i]).fold(0.0, f64::max))
                    .collect();
                median(&mut v)
            };
            let on = per_round(|t| &t.0);
            let off = per_round(|t| &t.1);
            println!(
                "{kind:9}  {bytes:>10}  {on:>13.1}  {off:>14.1}  {:>6.3}",
                on / off
            );
        }
    }
}
