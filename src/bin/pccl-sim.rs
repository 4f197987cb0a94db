//! `pccl-sim`: PCCL's real plans replayed on a modelled cluster (nodes × ranks per node ×
//! NICs, link latencies and bandwidths, NIC contention, pipelined pieces), at any scale.
//!
//! ```text
//! pccl-sim --preset frontier --coll allgather --algo hier-rd --ranks 4096 --size 16M:1G
//! pccl-sim --preset-file my.toml --coll reducescatter --algo auto --ranks 512 --size 1M --json
//! pccl-sim --preset frontier --coll allgather --algo hier-rd --heatmap hm.png --vs ring
//! pccl-sim --preset frontier --coll reducescatter --algo hier-rd --ranks 64 --size 16M --goal rs.goal
//! ```
//! Size = bytes per rank, as in pccl-bench (all-gather input, reduce-scatter output, all-reduce
//! buffer); with `--output-sizes`, each rank's all-gather output / reduce-scatter input (the
//! vendor benchmarks' convention). `--vs rccl|nccl|mpich` adds the vendor baseline of the
//! profile ([`pccl::model::vendor`]) and the speedup over it:
//!
//! ```text
//! pccl-sim --preset frontier --algo hier-rd --vs rccl --ranks 2048 --output-sizes --size 16M:1G
//! pccl-sim --preset frontier --algo rccl --ranks 2048 --size 256K --without proxy,rendezvous
//! ```

use clap::Parser;
use pccl::config::parse_bytes;
use pccl::model::goal::{self, GoalJob};
use pccl::model::presets;
use pccl::model::profile::DeviceKind;
use pccl::model::profile::Profile;
use pccl::model::sim::{Cluster, Engine, Job, Summary};
use pccl::model::tuner;
use pccl::model::vendor::{Baseline, Mechanisms, MECHANISMS};
use pccl::plan::{Algorithm, Collective, LevelAlgo};
use pccl::topology::{NicMap, Topology};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "pccl-sim",
    about = "Simulate PCCL's collectives on a modelled cluster"
)]
struct Args {
    /// Built-in machine: frontier, perlmutter.
    #[arg(long)]
    preset: Option<String>,
    /// Machine profile file (TOML, as written by pccl-tune or in presets/).
    #[arg(long)]
    preset_file: Option<String>,
    /// allgather, reducescatter or allreduce.
    #[arg(long, default_value = "allgather")]
    coll: String,
    /// ring, rd, hier-rd, hier-ring, hier-INTER-INTRA, any hierarchy overlapped in K pieces as
    /// HIER-pipeK (hier-rd-pipe8), three levels as hier3-rd, hier3-ring or
    /// hier3-INTER-MID-INNER (network, the node's groups, inside a group: --groups), auto (the tuner's choice per size), or a vendor baseline of
    /// the profile: rccl / nccl (its `[vendor]` ring) or mpich (its `[mpich]` ring).
    #[arg(long, default_value = "auto")]
    algo: String,
    /// Ranks in the job.
    #[arg(long, default_value_t = 64)]
    ranks: usize,
    /// Ranks per node (default: the profile's `ranks_per_node`).
    #[arg(long)]
    ranks_per_node: Option<usize>,
    /// Ranks per group inside a node, the middle level of three-level algorithms
    /// (hier3-*) and of `auto`'s candidates (default: the profile's `intra.pair_size`, the
    /// GCD pair of an MI250X on Frontier; 1 for none).
    #[arg(long)]
    groups: Option<usize>,
    /// NIC map in Cray syntax (`0:0-1;1:2-3;...`); default: ranks spread evenly over the NICs.
    #[arg(long)]
    nic_map: Option<String>,
    /// Bytes per rank, SIZE or MIN:MAX (doubling), K/M/G suffixes.
    #[arg(long, default_value = "1M")]
    size: String,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Where reductions run: device (GPU rates of the profile) or host.
    #[arg(long, default_value = "device")]
    on: String,
    /// Simulation engine: auto, events (every rank), phases (one node, phases reused).
    #[arg(long, default_value = "auto")]
    engine: String,
    /// Draw the speedup of --algo over --vs across 16 MiB…1 GiB × 32…4096 ranks into this PNG.
    #[arg(long)]
    heatmap: Option<String>,
    /// What --algo is compared with: an algorithm (heatmap only) or a vendor baseline (rccl,
    /// nccl, mpich: a `vs_*` column per size, and the heatmap).
    #[arg(long)]
    vs: Option<String>,
    /// Vendor-model mechanisms to turn off, comma-separated: protocols, channels, proxy,
    /// rendezvous, dragonfly (dragonfly also for PCCL's plans: no groups, no taper).
    #[arg(long, default_value = "")]
    without: String,
    /// The flat ring: `nccl` (as the vendor library runs it: the profile's `[vendor]` model,
    /// else an ideal multi-channel ring over all NICs; the presets' setting) or `pccl` (PCCL's
    /// executor: one message per step through the sender's NIC).
    #[arg(long)]
    ring: Option<String>,
    /// Sizes (--size and the heatmap's) are each rank's output buffer for all-gather and its
    /// input buffer for reduce-scatter (a rank's block is size ÷ ranks), as the vendor
    /// libraries' benchmarks and the Big Send-off study give them; default: bytes per rank.
    #[arg(long)]
    output_sizes: bool,
    /// The quantized all-gather (or reduce-scatter: its two quantized all-to-alls) beside the
    /// plain one (`int8` or `int4`, a scale per `--qblock` elements): the sizes are bf16 data,
    /// the all-gather's records move by the same algorithm, the kernels run at the profile's
    /// copy rate (src/model/quantized.rs).
    #[arg(long)]
    quantize: Option<String>,
    /// Elements per scale of --quantize.
    #[arg(long, default_value_t = 2048)]
    qblock: usize,
    /// How --quantize's reduce-scatter moves its partial sums: `two-hop` (ZeRO++'s qgZ: two
    /// quantized all-to-alls), `per-level` (three: inside the preset's GPU pairs, among
    /// the node's pairs, between nodes) or `halving` (quantized recursive halving inside the
    /// node and between nodes).
    #[arg(long, default_value = "two-hop")]
    qscheme: String,
    /// Print the speedup table of the heatmap as Markdown too.
    #[arg(long)]
    table: bool,
    /// Write every rank's plan for the first size as a GOAL schedule (LogGOPSim / ATLAHS
    /// text format; `-` for stdout) instead of simulating; `auto` exports the tuner's choice.
    #[arg(long)]
    goal: Option<String>,
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("pccl-sim: {msg}");
    std::process::exit(2)
}

fn parse_coll(s: &str) -> Collective {
    match s {
        "allgather" => Collective::AllGather,
        "reducescatter" => Collective::ReduceScatter { average: false },
        "allreduce" => Collective::AllReduce { average: false },
        _ => fail(format!(
            "--coll {s}: expected allgather, reducescatter or allreduce"
        )),
    }
}

fn sizes(s: &str) -> Vec<usize> {
    let (lo, hi) = match s.split_once(':') {
        Some((a, b)) => (parse_bytes(a), parse_bytes(b)),
        None => (parse_bytes(s), parse_bytes(s)),
    };
    let (lo, hi) = (
        lo.unwrap_or_else(|e| fail(e)),
        hi.unwrap_or_else(|e| fail(e)),
    );
    if lo == 0 || hi < lo {
        fail(format!(
            "--size {s}: expected SIZE or MIN:MAX with 0 < MIN <= MAX"
        ));
    }
    let mut v = vec![lo];
    while *v.last().expect("one") * 2 <= hi {
        v.push(v.last().expect("one") * 2);
    }
    v
}

struct Sim {
    prof: Profile,
    coll: Collective,
    engine: Engine,
    nic_map: Option<NicMap>,
    groups: usize,
    mech: Mechanisms,
    output_sizes: bool,
}

/// What to time: the tuner's choice, one of PCCL's algorithms, or a vendor baseline.
#[derive(Clone, Copy, Debug)]
enum Which {
    Auto,
    Algo(Algorithm),
    Base(Baseline, &'static str),
}

impl Which {
    fn name(&self) -> String {
        match self {
            Which::Auto => "auto".into(),
            Which::Algo(a) => a.name(),
            Which::Base(_, n) => (*n).to_string(),
        }
    }
}

impl Sim {
    fn topo(&self, ranks: usize, m: usize) -> Topology {
        let t = Topology::uniform(ranks, m).with_groups(self.groups);
        match &self.nic_map {
            Some(map) => t.with_nic_map(map.clone()),
            None => t,
        }
    }

    /// (name, seconds, detail) for each size (block bytes), one plan summary for all sizes.
    fn times(&self, which: Which, topo: &Topology, blocks: &[f64]) -> Vec<(String, f64, String)> {
        let cl = Cluster::new(topo, &self.prof);
        let algo = match which {
            Which::Base(b, name) => {
                let m = topo.nodes().iter().map(Vec::len).max().unwrap_or(1);
                return blocks
                    .iter()
                    .map(|&blk| {
                        let e = b
                            .estimate(&self.prof, self.mech, self.coll, (topo.nranks(), m), blk)
                            .unwrap_or_else(|e| fail(e));
                        let detail = format!(
                            "{} {}ch, {:.1} us/step ({}), fill {:.0} us",
                            e.protocol,
                            e.channels,
                            e.step * 1e6,
                            e.bound,
                            e.fill * 1e6
                        );
                        (name.to_string(), e.seconds, detail)
                    })
                    .collect();
            }
            Which::Auto => None,
            Which::Algo(a) => Some(a),
        };
        match algo {
            None => blocks
                .iter()
                .map(|&b| {
                    let (c, _) = tuner::choose_with(self.coll, topo, b as usize, &self.prof)
                        .unwrap_or_else(|e| fail(e));
                    (c.algo.to_string(), c.seconds, String::new())
                })
                .collect(),
            Some(a) => {
                let use_phases = match self.engine {
                    Engine::Phases => !self.prof.one_host,
                    Engine::Events => false,
                    Engine::Auto => topo.is_regular() && topo.nranks() > 128,
                };
                if use_phases {
                    let s = Summary::new(&cl, self.coll, a).unwrap_or_else(|e| fail(e));
                    blocks
                        .iter()
                        .map(|&b| {
                            let t = s.outcome(&cl, &Job::new(self.coll, a, b)).seconds;
                            (a.to_string(), t, String::new())
                        })
                        .collect()
                } else {
                    blocks
                        .iter()
                        .map(|&b| {
                            let o = cl
                                .simulate(&Job::new(self.coll, a, b), Engine::Events)
                                .unwrap_or_else(|e| fail(e));
                            (a.to_string(), o.seconds, String::new())
                        })
                        .collect()
                }
            }
        }
    }

    fn block(&self, size: usize, ranks: usize) -> f64 {
        match self.coll {
            Collective::AllReduce { .. } => size as f64 / ranks as f64,
            _ if self.output_sizes => size as f64 / ranks as f64,
            _ => size as f64,
        }
    }
}

fn parse_which(s: &str, prof: &Profile) -> Which {
    if s == "auto" {
        return Which::Auto;
    }
    if let Some(b) = Baseline::parse(s, prof) {
        let name = pccl::model::vendor::BASELINES
            .iter()
            .find(|n| **n == s)
            .expect("a baseline name");
        return Which::Base(b.unwrap_or_else(|e| fail(e)), name);
    }
    let algo: Algorithm = s.parse().unwrap_or_else(|e| fail(e));
    // The flat ring "as NCCL/RCCL run it" is the profile's vendor model where it has one.
    if algo == Algorithm::Flat(LevelAlgo::Ring) && prof.nccl_ring {
        if let Some(v) = &prof.vendor {
            let name = if v.library == "rccl" { "rccl" } else { "nccl" };
            return Which::Base(Baseline::Vendor, name);
        }
    }
    Which::Algo(algo)
}

fn main() {
    let args = Args::parse();
    let mut prof = match (&args.preset, &args.preset_file) {
        (Some(n), None) => presets::named(n),
        (None, Some(f)) => Profile::load(std::path::Path::new(f)),
        (None, None) => Ok(Profile::default()),
        _ => fail("give --preset or --preset-file, not both"),
    }
    .unwrap_or_else(|e| fail(e));
    match args.on.as_str() {
        "device" => prof.reduce_host_gbps = prof.reduce_device_gbps.clone(),
        "host" => {}
        o => fail(format!("--on {o}: expected device or host")),
    }
    match args.ring.as_deref() {
        None => {}
        Some("nccl") => prof.nccl_ring = true,
        Some("pccl") => prof.nccl_ring = false,
        Some(o) => fail(format!("--ring {o}: expected nccl or pccl")),
    }
    let engine = match args.engine.as_str() {
        "auto" => Engine::Auto,
        "events" => Engine::Events,
        "phases" => Engine::Phases,
        o => fail(format!("--engine {o}: expected auto, events or phases")),
    };
    let mech = Mechanisms::without(&args.without)
        .unwrap_or_else(|e| fail(format!("--without: {e} (known: {})", MECHANISMS.join(", "))));
    if !mech.dragonfly {
        prof.inter.group_nodes = 0;
        prof.inter.taper = 1.0;
    }
    let m = args.ranks_per_node.unwrap_or(prof.ranks_per_node).max(1);
    let nic_map = args
        .nic_map
        .as_deref()
        .map(|s| s.parse::<NicMap>().unwrap_or_else(|e| fail(e)));
    let groups = args.groups.unwrap_or(prof.intra.pair_size).max(1);
    let sim = Sim {
        prof,
        coll: parse_coll(&args.coll),
        engine,
        nic_map,
        groups,
        mech,
        output_sizes: args.output_sizes,
    };
    let algo = parse_which(&args.algo, &sim.prof);
    let vs = args.vs.as_deref().map(|v| parse_which(v, &sim.prof));
    if let Some(out) = &args.heatmap {
        let vs = vs.unwrap_or_else(|| parse_which("ring", &sim.prof));
        heatmap(&sim, algo, vs, m, out, &args);
        return;
    }
    if args.ranks == 0 {
        fail("--ranks must be at least 1");
    }
    let topo = sim.topo(args.ranks, m);
    let sz = sizes(&args.size);
    let blocks: Vec<f64> = sz.iter().map(|&s| sim.block(s, args.ranks)).collect();
    if let Some(out) = &args.goal {
        write_goal(&sim, algo, &topo, blocks[0], out);
        return;
    }
    let t0 = Instant::now();
    let res = sim.times(algo, &topo, &blocks);
    let wall = t0.elapsed().as_secs_f64();
    let base = vs.map(|v| (v.name(), sim.times(v, &topo, &blocks)));
    let quant = args.quantize.as_deref().map(|qs| {
        let bits = match qs {
            "int8" => 8,
            "int4" => 4,
            o => fail(format!("--quantize {o}: expected int8 or int4")),
        };
        let q = pccl::Quant {
            bits,
            block: args.qblock,
            allow_nonfinite: false,
        };
        q.validate().unwrap_or_else(|e| fail(e));
        let rs = match sim.coll {
            Collective::AllGather => false,
            Collective::ReduceScatter { .. } => true,
            _ => fail("--quantize models the quantized all-gather and reduce-scatter"),
        };
        if rs && !topo.is_regular() {
            fail("--quantize with reducescatter needs nodes of equal size");
        }
        let cl = Cluster::new(&topo, &sim.prof);
        blocks
            .iter()
            .zip(&res)
            .map(|(&b, (name, _, _))| {
                if rs {
                    let n = (b / 2.0).max(1.0) as usize;
                    let how = match args.qscheme.as_str() {
                        "two-hop" => pccl::model::quantized::reduce_scatter_seconds,
                        "halving" => pccl::model::quantized::reduce_scatter_halving_seconds,
                        "per-level" => pccl::model::quantized::reduce_scatter_per_level_seconds,
                        o => fail(format!(
                            "--qscheme {o}: expected two-hop, per-level or halving"
                        )),
                    };
                    return how(&sim.prof, (topo.nodes().len(), m), n, 2, &q)
                        .unwrap_or_else(|e| fail(e));
                }
                let algo: Algorithm = name
                    .parse()
                    .unwrap_or_else(|_| fail("--quantize needs one of PCCL's algorithms or auto"));
                let n = (b / 2.0).max(1.0) as usize; // bf16 elements
                pccl::model::quantized::all_gather_seconds(
                    &cl,
                    algo,
                    n,
                    2,
                    &q,
                    args.ranks,
                    sim.prof.copy_gbps,
                )
                .unwrap_or_else(|e| fail(e))
            })
            .collect::<Vec<_>>()
    });
    let p = args.ranks as f64;
    let factor = match sim.coll {
        Collective::AllReduce { .. } => 2.0 * (p - 1.0) / p,
        _ => (p - 1.0) / p,
    };
    if !args.json {
        println!(
            "# pccl-sim {} {} on {} ({} ranks, {} per node, profile {}); simulated in {:.3} s",
            args.coll,
            args.algo,
            topo.describe(),
            args.ranks,
            m,
            sim.prof.name,
            wall
        );
        let mut vs_cols = base.as_ref().map_or(String::new(), |(n, _)| {
            format!(" {:>14} {:>9}", format!("{n}(us)"), "speedup")
        });
        if let Some(qs) = &args.quantize {
            vs_cols.push_str(&format!(" {:>14} {:>9}", format!("{qs}(us)"), "gain"));
        }
        println!(
            "{:>12} {:>14} {:>12} {:>12}{vs_cols}  algo",
            "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)"
        );
    }
    for (i, &s) in sz.iter().enumerate() {
        let (a, t, detail) = &res[i];
        let t = *t;
        let total = match sim.coll {
            Collective::AllReduce { .. } => s as f64,
            _ if sim.output_sizes => s as f64,
            _ => s as f64 * p,
        };
        let algbw = total / t / 1e9;
        let vs_row = base
            .as_ref()
            .map(|(n, b)| (n.clone(), b[i].1, b[i].2.clone()));
        if args.json {
            let mut j = serde_json::json!({
                "coll": args.coll, "algo": a, "requested": args.algo,
                "ranks": args.ranks, "ranks_per_node": m, "size": s, "seconds": t,
                "algbw_gbs": algbw, "busbw_gbs": algbw * factor,
                "profile": sim.prof.name, "sim_wall_s": wall,
            });
            if !detail.is_empty() {
                j["detail"] = serde_json::json!(detail);
            }
            if let Some(qv) = &quant {
                j["quantized"] = serde_json::json!(args.quantize);
                j["quantized_seconds"] = serde_json::json!(qv[i].0);
                j["quantized_kernel_seconds"] = serde_json::json!(qv[i].1);
                j["quantized_gain"] = serde_json::json!(t / qv[i].0);
            }
            if let Some((n, bt, bd)) = &vs_row {
                j["vs"] = serde_json::json!(n);
                j["vs_seconds"] = serde_json::json!(bt);
                j["vs_detail"] = serde_json::json!(bd);
                j["speedup"] = serde_json::json!(bt / t);
            }
            println!("{j}");
        } else {
            let mut vs_cols = vs_row.as_ref().map_or(String::new(), |(_, bt, _)| {
                format!(" {:>14.1} {:>9.2}", bt * 1e6, bt / t)
            });
            if let Some(qv) = &quant {
                vs_cols.push_str(&format!(" {:>14.1} {:>9.2}", qv[i].0 * 1e6, t / qv[i].0));
            }
            let what = match (detail.is_empty(), &vs_row) {
                (false, _) => format!("{a}: {detail}"),
                (true, Some((n, _, bd))) if !bd.is_empty() => format!("{a}; {n}: {bd}"),
                _ => a.clone(),
            };
            println!(
                "{:>12} {:>14.1} {:>12.2} {:>12.2}{vs_cols}  {what}",
                s,
                t * 1e6,
                algbw,
                algbw * factor
            );
        }
    }
}

/// `--goal`: the schedule of `algo` (or of the tuner's choice) for one block size.
fn write_goal(sim: &Sim, which: Which, topo: &Topology, block: f64, out: &str) {
    let algo = match which {
        Which::Algo(a) => a,
        Which::Auto => match tuner::choose_with(sim.coll, topo, block as usize, &sim.prof) {
            Ok((c, _)) => c.algo,
            Err(e) => fail(e),
        },
        Which::Base(..) => fail("--goal exports PCCL's plans, not a vendor baseline"),
    };
    // `--on device` already put the device rates in the profile's host slot.
    let job = GoalJob {
        coll: sim.coll,
        algo,
        block_bytes: block.round() as u64,
        prof: &sim.prof,
        device: DeviceKind::Host,
        dtype: "f32",
    };
    let (text, st) = goal::schedule(topo, &job).unwrap_or_else(|e| fail(e));
    if out == "-" {
        print!("{text}");
    } else {
        std::fs::write(out, &text).unwrap_or_else(|e| fail(format!("--goal {out}: {e}")));
        eprintln!(
            "pccl-sim: wrote {out}: {} ranks, {} sends, {} recvs, {} calcs, {} bytes ({})",
            topo.nranks(),
            st.sends,
            st.recvs,
            st.calcs,
            st.bytes,
            algo
        );
    }
}

const HM_SIZES: [usize; 7] = [
    16 << 20,
    32 << 20,
    64 << 20,
    128 << 20,
    256 << 20,
    512 << 20,
    1 << 30,
];
const HM_RANKS: [usize; 8] = [32, 64, 128, 256, 512, 1024, 2048, 4096];

fn human(b: usize) -> String {
    if b >= 1 << 30 {
        format!("{}G", b >> 30)
    } else {
        format!("{}M", b >> 20)
    }
}

fn heatmap(sim: &Sim, algo: Which, vs: Which, m: usize, out: &str, args: &Args) {
    let name = |a: Which| a.name();
    // speed[r][s] = t(vs) / t(algo).
    let mut speed = vec![vec![0.0; HM_SIZES.len()]; HM_RANKS.len()];
    for (ri, &p) in HM_RANKS.iter().enumerate() {
        let topo = sim.topo(p, m);
        let blocks: Vec<f64> = HM_SIZES.iter().map(|&s| sim.block(s, p)).collect();
        let a = sim.times(algo, &topo, &blocks);
        let b = sim.times(vs, &topo, &blocks);
        for si in 0..HM_SIZES.len() {
            speed[ri][si] = b[si].1 / a[si].1;
        }
    }
    let title = format!(
        "{}: speedup of {} over {} ({}, {} ranks/node)",
        args.coll,
        name(algo),
        name(vs),
        sim.prof.name,
        m
    );
    if args.table {
        println!("{title}\n");
        let mut h = "| ranks |".to_string();
        for s in HM_SIZES {
            h.push_str(&format!(" {} |", human(s)));
        }
        println!("{h}");
        println!("|---|{}", "---|".repeat(HM_SIZES.len()));
        for (ri, &p) in HM_RANKS.iter().enumerate() {
            let mut l = format!("| {p} |");
            for v in &speed[ri] {
                l.push_str(&format!(" {v:.2} |"));
            }
            println!("{l}");
        }
    }
    let axis = if sim.output_sizes {
        "buffer per rank (all-gather output, reduce-scatter input)"
    } else {
        "bytes per rank"
    };
    if let Err(e) = draw(out, &title, axis, &speed) {
        fail(format!("heatmap {out}: {e}"));
    }
    eprintln!("pccl-sim: wrote {out}");
}

/// A diverging colour: red below 1 (slower), white at 1, blue above (log scale, ±4×).
fn colour(v: f64) -> plotters::style::RGBColor {
    let x = (v.max(1e-9).log2() / 2.0).clamp(-1.0, 1.0);
    let f = |a: f64| (255.0 * (1.0 - a.abs() * 0.8)) as u8;
    if x >= 0.0 {
        plotters::style::RGBColor(f(x), f(x * 0.6), 255)
    } else {
        plotters::style::RGBColor(255, f(x * 0.6), f(x))
    }
}

fn draw(
    out: &str,
    title: &str,
    axis: &str,
    speed: &[Vec<f64>],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let font = ["DejaVuSans.ttf", "LiberationSans-Regular.ttf"]
        .iter()
        .flat_map(|f| {
            [
                format!("/usr/share/fonts/truetype/dejavu/{f}"),
                format!("/usr/share/fonts/truetype/liberation/{f}"),
            ]
        })
        .find_map(|p| std::fs::read(p).ok());
    let text = match font {
        Some(bytes) => {
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
                .map_err(|_| "font")?;
            true
        }
        None => {
            eprintln!("pccl-sim: no DejaVu/Liberation font found: heatmap without labels");
            false
        }
    };
    let (cw, ch, left, top) = (90i32, 40i32, 80i32, 60i32);
    let w = left + cw * HM_SIZES.len() as i32 + 20;
    let h = top + ch * HM_RANKS.len() as i32 + 50;
    let root = BitMapBackend::new(out, (w as u32, h as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let style = |px: f64| ("sans-serif", px).into_font().color(&BLACK);
    if text {
        root.draw(&Text::new(title.to_string(), (10, 15), style(15.0)))?;
        root.draw(&Text::new(
            format!("ranks \\ {axis}"),
            (10, 38),
            style(12.0),
        ))?;
    }
    // Rows: largest rank count at the top.
    for (ri, row) in speed.iter().enumerate() {
        let y = top + ch * (HM_RANKS.len() - 1 - ri) as i32;
        if text {
            root.draw(&Text::new(
                format!("{}", HM_RANKS[ri]),
                (15, y + ch / 2 - 7),
                style(13.0),
            ))?;
        }
        for (si, &v) in row.iter().enumerate() {
            let x = left + cw * si as i32;
            root.draw(&Rectangle::new(
                [(x, y), (x + cw - 2, y + ch - 2)],
                colour(v).filled(),
            ))?;
            if text {
                root.draw(&Text::new(
                    format!("{v:.2}x"),
                    (x + cw / 2 - 18, y + ch / 2 - 8),
                    style(13.0),
                ))?;
            }
        }
    }
    if text {
        for (si, &s) in HM_SIZES.iter().enumerate() {
            root.draw(&Text::new(
                human(s),
                (
                    left + cw * si as i32 + cw / 2 - 12,
                    top + ch * HM_RANKS.len() as i32 + 8,
                ),
                style(13.0),
            ))?;
        }
    }
    root.present()?;
    Ok(())
}
