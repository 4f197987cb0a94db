//! Predicted all-gather and reduce-scatter times at cluster scale, from the α-β-γ cost model
//! applied to the real plans (the slowest of a few sample ranks), for every algorithm.
//!
//! cargo run --release --example model_scale -- [ranks-per-node] [bytes-per-rank]
//! Parameters: a 25 GB/s, 5 µs network between nodes; 150 GB/s, 10 µs inside a node (NVLink-
//! class); 1 TB/s device reductions.

use pccl::model::cost::{plan_time, CostParams};
use pccl::model::tuner::candidates;
use pccl::plan::{build, Collective};
use pccl::Topology;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let m: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    let bytes: f64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1048576.0);
    let prm = CostParams {
        alpha_intra: 10e-6,
        beta_intra: 1.0 / 150e9,
        alpha_inter: 5e-6,
        beta_inter: 1.0 / 25e9,
        gamma: 1.0 / 1e12,
    };
    for coll in [
        Collective::AllGather,
        Collective::ReduceScatter { average: false },
    ] {
        println!("# {coll:?}, {bytes} bytes per rank, {m} ranks per node (predicted microseconds)");
        let mut header = format!("{:>6}", "ranks");
        let algos = candidates(&Topology::uniform(2 * m, m));
        for a in &algos {
            header.push_str(&format!(" {:>14}", a.name()));
        }
        println!("{header}");
        for nodes in [2usize, 8, 32, 128, 256, 512] {
            let p = nodes * m;
            let topo = Topology::uniform(p, m);
            let mut line = format!("{p:>6}");
            for a in &algos {
                let worst = [0, p / 2, p - 1]
                    .iter()
                    .map(|&r| {
                        plan_time(
                            &build(coll, *a, &topo, r).expect("plan"),
                            &topo,
                            bytes,
                            &prm,
                        )
                    })
                    .fold(0.0f64, f64::max);
                line.push_str(&format!(" {:>14.1}", worst * 1e6));
            }
            println!("{line}");
        }
    }
}
