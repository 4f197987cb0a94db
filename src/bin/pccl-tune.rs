//! `pccl-tune`: measures the model's parameters where it runs and writes a profile (TOML) the
//! communicator's tuner loads (`PCCL_TUNE_FILE`, else `$XDG_CONFIG_HOME/pccl/tune.toml`).
//!
//! * copy rates and the cache tier: `memcpy` repeated over working sets (source +
//!   destination) of 256 KiB … 4× the last-level cache (sysfs
//!   `/sys/devices/system/cpu/cpu0/cache`, the highest level; 128 MiB at least). Memory's rate
//!   is the largest set's, the cache's the median of the sets up to a quarter of the cache,
//!   and the cache size the one that fits the model's tier ([`Profile::cache_speedup`]) to the
//!   whole sweep best — the knee, which on a shared or virtual machine lies below what sysfs
//!   says. `--cache-bytes` sets the size instead (`0`: no tier);
//! * γ per dtype: the host reduction kernel (`a ⊕ b → c`, the executor's receive-reduce) on
//!   16 MiB, in GB/s of output;
//! * α, β, the transfers' share of the cache's gain and the protocol's steps: a 2-rank
//!   exchange (PCCL's all-gather, ring) at 1 KiB…64 MiB in 2× steps (1.5× up to 1 MiB), less
//!   its local copy (`s/(copy·f)`, `f` the cache tier's speed-up for the exchange's
//!   footprint, 2 ranks × 3 s), fitted by [`pccl::model::link_fit`] (relative least squares,
//!   a step kept only where it explains a jump: under MPICH ch4/UCX the end of the 8 KiB
//!   copy-in path shows as +3–5 µs above 8 KiB, the rendezvous as +15–60 µs above 64–256 KiB);
//! * the cost of a piece: the 2-rank all-gather of 2 MiB sent whole and in 128 KiB pieces;
//!   what the pieces cost beyond the model's prediction, per extra piece, is
//!   `piece_overhead_us` (the tuner weighs it when it picks a call's piece size);
//! * concurrent flows: the ring all-gather at `--ranks` ranks (default 4): when each of the P
//!   simultaneous messages gets less than β, the node's shared bandwidth is `P ×` what each got.
//!
//! * oversubscription: the host's cores (`available_parallelism`) and the 1 KiB ring
//!   all-gather at 2 × cores ranks (at most 16) against the 2-rank exchange's 1 KiB time per
//!   message: the growth per extra rank per core is `oversub.per_message_us`. Threads: in the
//!   same run. MPI (whose world is fixed): a second run `mpiexec -n 2×cores pccl-tune
//!   --transport mpi --oversub-of FILE -o FILE` adds the term to the 2-rank profile FILE, and
//!   `oversub.rate_share` (busy-polling ranks take core time from the copies): the share
//!   with which the model's 4 MiB ring at those ranks takes the measured time. Threads sleep
//!   while they wait (no share; their node-bus measurement at 4 ranks already ran
//!   oversubscribed).
//!
//! Threads transport here (ranks are threads of one host: the inter-node level gets the same
//! figures, one "NIC"); with `--features mpi` under `mpiexec -n 2` the MPI transport
//! (`--transport mpi`), α and β from the MPI world's exchange.

use clap::Parser;
use half::{bf16, f16};
use pccl::config::Config;
use pccl::model::link_fit::{self, Sample};
use pccl::model::profile::{CacheTier, Profile, Protocol, ReceiveReduce, Strided};
use pccl::{Algorithm, Communicator, Element, LevelAlgo, ReduceOp};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "pccl-tune",
    about = "Measure α, β, γ and write a PCCL tuning profile"
)]
struct Args {
    /// Thread-ranks for the concurrent-flows measurement (2…8).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Output file (default: $XDG_CONFIG_HOME/pccl/tune.toml); `-` prints it.
    #[arg(short = 'o', long)]
    output: Option<String>,
    /// Fewer iterations (a rough profile in a few seconds).
    #[arg(long)]
    quick: bool,
    /// Transport: threads, or mpi (under mpiexec, built with --features mpi).
    #[arg(long, default_value = "threads")]
    transport: String,
    /// Last-level cache size in bytes (K/M suffixes) instead of sysfs's; 0: no cache tier.
    #[arg(long)]
    cache_bytes: Option<String>,
    /// Print the exchange's measured and fitted time per size.
    #[arg(short, long)]
    verbose: bool,
    /// Only measure the oversubscription term at this MPI world's size (more ranks than
    /// cores) and add it to this profile (from a 2-rank run), written to `-o`.
    #[arg(long)]
    oversub_of: Option<String>,
}

/// Cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Ranks for the oversubscribed measurement: 2 × cores, if that is a size we can run.
fn oversub_ranks(cores: usize) -> Option<usize> {
    (2 * cores <= 16).then_some(2 * cores)
}

/// The size of the highest cache level cpu 0 has (sysfs), in bytes.
fn llc_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let (Ok(level), Ok(bytes)) = (
            level.trim().parse::<u32>(),
            pccl::config::parse_bytes(size.trim()),
        ) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, b)| b)
}

/// Copy rate (GB/s, read + write) of `bytes` copied again and again: source and destination
/// of `bytes` each.
fn copy_rate(bytes: usize, reps: usize) -> f64 {
    let n = (bytes / 4).max(1 << 14);
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0f32; n];
    // Enough copies per sample to last ~2 ms.
    let inner = ((8usize << 20) / (n * 4)).max(1);
    let t = time(reps, || {
        for _ in 0..inner {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
    });
    (n * 4 * inner) as f64 / t / 1e9
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("pccl-tune: {msg}");
    std::process::exit(2)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `f` over `reps` runs.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// Memory's copy rate (GB/s) and the cache tier, from a `memcpy` sweep of working sets
/// 256 KiB … 4× `llc` (at least 128 MiB).
fn copy_tiers(llc: Option<usize>, reps: usize, verbose: bool) -> (f64, CacheTier) {
    let top = (4 * llc.unwrap_or(0)).max(128 << 20);
    let mut sweep = Vec::new();
    let mut ws = 256usize << 10;
    while ws <= top {
        sweep.push((ws as f64, copy_rate(ws / 2, reps.max(7))));
        ws *= 2;
    }
    let quarter = llc.unwrap_or(4 << 20) as f64 / 4.0;
    let (mem, tier) = pccl::model::cache::fit(&sweep, quarter);
    if verbose {
        let p = Profile {
            copy_gbps: mem,
            cache: tier.clone(),
            ..Profile::default()
        };
        eprintln!("pccl-tune: memcpy sweep, working set, measured vs fitted (GB/s):");
        for (w, r) in &sweep {
            eprintln!(
                "  {:>10} KiB {r:>8.2} {:>8.2}",
                *w as usize >> 10,
                mem * p.cache_speedup(*w)
            );
        }
    }
    (mem, tier)
}

fn reduce_gbps<T: Element>(reps: usize, one: T) -> f64 {
    let n = (16 << 20) / std::mem::size_of::<T>();
    let a = vec![one; n];
    let b = vec![one; n];
    let mut c = vec![one; n];
    let t = time(reps, || {
        T::reduce3(ReduceOp::Sum, &mut c, std::hint::black_box(&a), &b)
    });
    (n * std::mem::size_of::<T>()) as f64 / t / 1e9
}

/// Seconds per all-gather of `s` bytes per rank on `comm` (ring), every size in `sizes`, timed
/// as pccl-bench times the runs the model is judged against: rounds of back-to-back calls
/// after a barrier, the median over rounds of the time per call. The sizes are swept
/// `ROUNDS` times and each keeps its fastest sweep's median, so a burst of load on a shared
/// host spoils one sweep of a few sizes, not the profile. (Calls timed one by one after a
/// barrier include the receiver's wake-up: on the 2-core VM 16–256 KiB thread exchanges then
/// took 3–7× their back-to-back time in some runs, and such profiles predicted the benchmark
/// less consistently; docs/SCALING.md.)
fn ag_times(comm: &Communicator, sizes: &[usize], quick: bool) -> pccl::Result<Vec<f64>> {
    const ROUNDS: usize = 3;
    let p = comm.size();
    let mut best = vec![f64::INFINITY; sizes.len()];
    for _ in 0..if quick { 1 } else { ROUNDS } {
        for (b, &s) in best.iter_mut().zip(sizes) {
            let n = (s / 4).max(1);
            let input = vec![1f32; n];
            let mut output = vec![0f32; n * p];
            let iters = ((64 << 20) / (s * p).max(1)).clamp(3, if quick { 20 } else { 100 });
            for _ in 0..2 {
                comm.all_gather(&input, &mut output)?;
            }
            // As pccl-bench times: rounds of back-to-back batches, each after a barrier.
            let rounds = iters.clamp(1, 15);
            let batch = iters.div_ceil(rounds);
            let mut v = Vec::new();
            for _ in 0..rounds {
                comm.barrier()?;
                let t = Instant::now();
                for _ in 0..batch {
                    comm.all_gather(&input, &mut output)?;
                }
                v.push(t.elapsed().as_secs_f64() / batch as f64);
            }
            *b = b.min(median(v));
        }
    }
    Ok(best)
}

fn ring_cfg() -> Config {
    let mut cfg = Config::from_env().unwrap_or_else(|e| fail(e));
    cfg.algo = Some(Algorithm::Flat(LevelAlgo::Ring));
    cfg.ranks_per_node = None;
    cfg
}

/// The piece-cost probe: an all-gather of `PROBE_BYTES` per rank sent whole and cut in
/// pieces of `PROBE_PIECE` bytes.
const PROBE_BYTES: usize = 2 << 20;
const PROBE_PIECE: usize = 128 << 10;

/// [`ring_cfg`] cutting messages at `piece` bytes (explicit, as `PCCL_CHUNK_SIZE`).
fn piece_cfg(piece: usize) -> Config {
    let mut cfg = ring_cfg();
    cfg.chunk_bytes = piece;
    cfg.chunk_explicit = true;
    cfg
}

/// Runs `f` on thread-ranks and returns rank 0's result.
fn on_threads<R: Send>(p: usize, f: impl Fn(Communicator) -> pccl::Result<R> + Sync) -> R {
    on_threads_cfg(p, ring_cfg(), f)
}

fn on_threads_cfg<R: Send>(
    p: usize,
    cfg: Config,
    f: impl Fn(Communicator) -> pccl::Result<R> + Sync,
) -> R {
    let mut v = Communicator::run_threads(p, cfg, f).unwrap_or_else(|e| fail(e));
    v.swap_remove(0).unwrap_or_else(|e| fail(e))
}

/// Seconds of the probe's all-gather on `whole` (cutting at more than its size) and on
/// `pieced` (cutting at `PROBE_PIECE`).
#[cfg(feature = "mpi")]
fn probe_times(
    whole: &Communicator,
    pieced: &Communicator,
    quick: bool,
) -> pccl::Result<(f64, f64)> {
    let w = ag_times(whole, &[PROBE_BYTES], quick)?[0];
    let p = ag_times(pieced, &[PROBE_BYTES], quick)?[0];
    Ok((w, p))
}

#[cfg(feature = "mpi")]
fn mpi_comm(cfg: Config) -> Communicator {
    use pccl::transport::mpi::{init, MpiTransport};
    init().unwrap_or_else(|e| fail(e));
    let t = MpiTransport::world(cfg.chunk_bytes).unwrap_or_else(|e| fail(e));
    Communicator::with_config(std::sync::Arc::new(t), cfg).unwrap_or_else(|e| fail(e))
}

#[cfg(feature = "mpi")]
fn on_mpi<R>(f: impl Fn(&Communicator) -> pccl::Result<R>) -> (R, usize, bool) {
    let comm = mpi_comm(ring_cfg());
    let r = f(&comm).unwrap_or_else(|e| fail(e));
    (r, comm.size(), comm.rank() == 0)
}

/// `piece_overhead_us`: what each piece after the first costs beyond what the model already
/// predicts for cutting a message (the pieces' pipelining), from the probe's all-gather at 2
/// ranks whole (`t_whole`) and in pieces (`t_pieced`): the measured difference less the
/// model's, per extra piece, never below 0 (pieces that run faster than modelled are the
/// host's cache at work, not a negative cost).
fn piece_overhead(prof: &Profile, t_whole: f64, t_pieced: f64) -> f64 {
    use pccl::model::sim::{Cluster, Engine, Job};
    use pccl::plan::Collective;
    let topo = pccl::topology::Topology::uniform(2, 2);
    let job = Job::new(
        Collective::AllGather,
        Algorithm::Flat(LevelAlgo::Ring),
        PROBE_BYTES as f64,
    );
    let at = |piece: usize| {
        let q = Profile {
            piece_bytes: piece,
            piece_overhead_us: 0.0,
            ..prof.clone()
        };
        Cluster::new(&topo, &q)
            .simulate(&job, Engine::Events)
            .map_or(f64::NAN, |o| o.seconds)
    };
    let extra = (PROBE_BYTES / PROBE_PIECE - 1) as f64;
    let modelled = at(PROBE_PIECE) - at(PROBE_BYTES);
    let per = ((t_pieced - t_whole) - modelled) / extra * 1e6;
    if per.is_finite() {
        per.max(0.0)
    } else {
        0.0
    }
}

/// Adds the oversubscription term from the 1 KiB ring at `p` ranks (`t` seconds), against
/// `base_msg` seconds per message at 2 ranks; returns a note for the profile's source.
fn set_oversub(prof: &mut Profile, cores: usize, p: usize, t: f64, base_msg: f64) -> String {
    prof.oversub.cores = cores;
    match pccl::model::oversub::per_message_us(t, p, base_msg, 2, cores) {
        Some(us) => {
            prof.oversub.per_message_us = us;
            format!(
                "; {p} ranks on {cores} cores: {:.1} us per 1 KiB message vs {:.1} at 2 ranks, +{us:.1} us per extra rank per core",
                t / (p - 1) as f64 * 1e6,
                base_msg * 1e6
            )
        }
        None => format!("; {cores} cores, oversubscription not measured"),
    }
}

/// The `oversub.rate_share` (0 … `MAX_RATE_SHARE`) with which the model's ring all-gather of
/// `s` bytes per rank at `p` ranks on one host takes `t` seconds (bisection: the time grows
/// with it); 0 when even no share predicts it slower, the maximum at most.
#[cfg(feature = "mpi")]
fn rate_share(prof: &Profile, p: usize, s: f64, t: f64) -> f64 {
    use pccl::model::sim::{Cluster, Engine, Job};
    use pccl::plan::Collective;
    let topo = pccl::topology::Topology::uniform(p, p);
    let job = Job::new(Collective::AllGather, Algorithm::Flat(LevelAlgo::Ring), s);
    let at = |share: f64| {
        let mut q = prof.clone();
        q.oversub.rate_share = share;
        Cluster::new(&topo, &q)
            .simulate(&job, Engine::Events)
            .map_or(f64::NAN, |o| o.seconds)
    };
    let (mut lo, mut hi) = (0.0, pccl::model::profile::MAX_RATE_SHARE);
    if at(lo).is_nan() || at(lo) >= t {
        return 0.0;
    }
    if at(hi) <= t {
        return hi;
    }
    for _ in 0..30 {
        let mid = 0.5 * (lo + hi);
        if at(mid) < t {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(feature = "mpi")]
fn mpi_oversub_only(args: &Args, base: &str) {
    let mut prof = Profile::load(std::path::Path::new(base)).unwrap_or_else(|e| fail(e));
    let sizes = [1usize << 10, 4 << 20];
    let q = args.quick;
    let (t, p, root) = on_mpi(|c| ag_times(c, &sizes, q));
    let n = cores();
    if p <= n {
        fail(format!(
            "--oversub-of: run under mpiexec -n {} (more ranks than the {n} cores)",
            2 * n
        ));
    }
    // The 2-rank profile's time of one 1 KiB message: latency, the transfer and the copy.
    let s = 1024.0;
    let base = prof.intra.alpha_us * 1e-6
        + prof.rendezvous_seconds(s)
        + s * prof.eager_factor(s) / (prof.intra.bandwidth_gbps * 1e9)
        + s / (prof.copy_gbps * 1e9);
    let note = set_oversub(&mut prof, n, p, t[0], base);
    prof.source.push_str(&note);
    let share = rate_share(&prof, p, sizes[1] as f64, t[1]);
    prof.oversub.rate_share = share;
    prof.source.push_str(&format!(
        "; {} KiB ring at {p} ranks {:.0} us: rate share {share:.2}",
        sizes[1] >> 10,
        t[1] * 1e6
    ));
    if root {
        write_profile(args, &prof);
    }
}

fn main() {
    let args = Args::parse();
    if let Some(base) = args.oversub_of.as_deref() {
        #[cfg(feature = "mpi")]
        {
            if args.transport != "mpi" {
                fail("--oversub-of is for --transport mpi (threads measure it in one run)");
            }
            mpi_oversub_only(&args, base);
            return;
        }
        #[cfg(not(feature = "mpi"))]
        fail(format!(
            "--oversub-of {base}: this pccl-tune was built without the `mpi` feature"
        ));
    }
    if !(2..=8).contains(&args.ranks) {
        fail("--ranks must be 2…8");
    }
    let reps = if args.quick { 3 } else { 9 };
    // 2× steps, with 1.5× steps in between up to 1 MiB, where protocols switch: two sizes on
    // each side of a step pin it down (link_fit).
    let sizes: Vec<usize> = (10..=26)
        .flat_map(|k| {
            let half = (k < 20).then_some(3usize << (k - 1));
            std::iter::once(1usize << k).chain(half)
        })
        .collect();
    // The exchanges first, in a process as fresh as pccl-bench's: the sweeps below free
    // 128 MiB buffers, after which glibc serves every allocation up to 32 MiB from its heap
    // (its mmap threshold follows the largest freed chunk); a 2-rank exchange of 16–256 KiB
    // timed after them ran 5–10× slower than in pccl-bench in one run.
    let ncores = cores();
    let mut over = None;
    let probe: (f64, f64);
    let (pair, concurrent, transport, is_root) = match args.transport.as_str() {
        "threads" => {
            let q = args.quick;
            let pair = on_threads(2, |c| ag_times(&c, &sizes, q));
            let whole = on_threads_cfg(2, piece_cfg(2 * PROBE_BYTES), |c| {
                ag_times(&c, &[PROBE_BYTES], q)
            })[0];
            let pieced = on_threads_cfg(2, piece_cfg(PROBE_PIECE), |c| {
                ag_times(&c, &[PROBE_BYTES], q)
            })[0];
            probe = (whole, pieced);
            let big = [4usize << 20];
            let conc = on_threads(args.ranks, |c| ag_times(&c, &big, q));
            if let Some(p) = oversub_ranks(ncores) {
                let small = [1usize << 10];
                over = Some((p, on_threads(p, |c| ag_times(&c, &small, q))[0]));
            }
            (pair, Some((args.ranks, conc[0])), "threads", true)
        }
        "mpi" => {
            #[cfg(feature = "mpi")]
            {
                let q = args.quick;
                let (pair, p, root) = on_mpi(|c| ag_times(c, &sizes, q));
                if p != 2 {
                    fail("the MPI measurement runs under mpiexec -n 2");
                }
                let whole = mpi_comm(piece_cfg(2 * PROBE_BYTES));
                let pieced = mpi_comm(piece_cfg(PROBE_PIECE));
                probe = probe_times(&whole, &pieced, q).unwrap_or_else(|e| fail(e));
                (pair, None, "mpi", root)
            }
            #[cfg(not(feature = "mpi"))]
            fail("this pccl-tune was built without the `mpi` feature")
        }
        o => fail(format!("--transport {o}: expected threads or mpi")),
    };
    let (copy, cache) = copy_tiers(llc_bytes(), reps, args.verbose);
    let mut prof = Profile {
        name: "measured".into(),
        copy_gbps: copy,
        cache,
        ..Profile::default()
    };
    if let Some(s) = args.cache_bytes.as_deref() {
        let b = pccl::config::parse_bytes(s)
            .unwrap_or_else(|e| fail(format!("--cache-bytes {s}: {e}")));
        if b == 0 || prof.cache.copy_gbps == 0.0 {
            prof.cache = CacheTier::default(); // no tier
        } else {
            prof.cache.bytes = b;
        }
    }
    prof.reduce_host_gbps.clear();
    prof.reduce_host_gbps
        .insert("f32".into(), reduce_gbps(reps, 1f32));
    prof.reduce_host_gbps
        .insert("f64".into(), reduce_gbps(reps, 1f64));
    prof.reduce_host_gbps
        .insert("f16".into(), reduce_gbps(reps, f16::ONE));
    prof.reduce_host_gbps
        .insert("bf16".into(), reduce_gbps(reps, bf16::ONE));
    prof.reduce_host_gbps
        .insert("i32".into(), reduce_gbps(reps, 1i32));
    prof.reduce_host_gbps
        .insert("default".into(), prof.reduce_host_gbps["f32"]);

    // The exchange is a local copy and one message: t = s/(copy·f) + link(s), f the cache
    // tier's speed-up for its footprint (2 ranks × (input s + output 2s)). The message's
    // part is fitted to α, β, the transfers' share of the cache's gain, an
    // eager/rendezvous step and the small-message path's step (pccl::model::link_fit).
    let tier = prof.clone();
    let f = |s: f64, ranks: f64| tier.cache_speedup(ranks * (ranks + 1.0) * s);
    let hit = |ws: f64| tier.cache_hit(ws);
    let samples: Vec<Sample> = pair
        .iter()
        .zip(&sizes)
        .map(|(t, &s)| {
            let s = s as f64;
            Sample {
                bytes: s,
                seconds: t - s / (copy * 1e9 * f(s, 2.0)),
                hit: hit(6.0 * s),
            }
        })
        .collect();
    let ratio = if tier.cache.bytes == 0 {
        1.0
    } else {
        tier.cache.copy_gbps / copy
    };
    // Thread ranks' transfer is the receiver's memcpy: only α is free (link_fit::fit_latency).
    let fitted = if transport == "threads" {
        link_fit::fit_latency(&samples, copy * 1e9, ratio)
    } else {
        link_fit::fit(&samples, ratio, transport == "mpi")
    };
    let (alpha, beta_gbps) = match fitted {
        Some(lf) => {
            prof.cache.link_share = lf.link_share;
            prof.protocol = Protocol {
                eager_bytes: lf.eager_bytes,
                rendezvous_us: lf.rendezvous * 1e6,
                eager_slowdown: lf.eager_slowdown.clamp(1.0, 100.0),
                small_bytes: lf.small_bytes,
                small_step_us: lf.small_step * 1e6,
            };
            (lf.alpha, lf.beta / 1e9)
        }
        None => fail(format!(
            "the 2-rank exchange's times do not fit a latency and a bandwidth: {:?}",
            pair.iter()
                .zip(&sizes)
                .map(|(t, s)| format!("{s} B {:.1} us", t * 1e6))
                .collect::<Vec<_>>()
        )),
    };
    prof.intra.alpha_us = alpha * 1e6;
    prof.intra.bandwidth_gbps = beta_gbps;
    prof.intra.pair_bandwidth_gbps = beta_gbps;
    // How the transport sends strided blocks (`Transport::isendv`): not measured, known.
    prof.strided = match transport {
        "threads" => Strided::Gathered,
        "mpi" => Strided::PackedBelowPiece,
        _ => Strided::Packed,
    };
    // How a received block meets its reduction: also known, not measured.
    prof.receive_reduce = match transport {
        "threads" => ReceiveReduce::Fused,
        "mpi" => ReceiveReduce::After,
        _ => ReceiveReduce::Pieces,
    };
    if args.verbose && is_root {
        eprintln!("pccl-tune: 2-rank exchange, measured vs fitted (us):");
        for (t, &s) in pair.iter().zip(&sizes) {
            let s = s as f64;
            let ws = 6.0 * s;
            let fit = s / (copy * 1e9 * prof.cache_speedup(ws))
                + alpha
                + prof.rendezvous_seconds(s)
                + s * prof.eager_factor(s) / (beta_gbps * 1e9 * prof.link_speedup(ws));
            eprintln!(
                "  {:>9} B {:>10.1} {:>10.1}  x{:.2}",
                s,
                t * 1e6,
                fit * 1e6,
                t / fit
            );
        }
    }
    // The reductions ran on 3 × 16 MiB: memory's rate is what the cache did not speed up.
    let sped = prof.cache_speedup(3.0 * (16u64 << 20) as f64);
    for v in prof.reduce_host_gbps.values_mut() {
        *v /= sped;
    }
    let mut notes = format!(
        "pccl-tune --transport {transport}: copy {copy:.2} GB/s, {:.2} GB/s in a {} KiB cache; 2-rank exchange fit alpha {:.2} us, beta {beta_gbps:.2} GB/s, transfers get {:.0}% of the cache's gain",
        prof.cache.copy_gbps,
        prof.cache.bytes >> 10,
        alpha * 1e6,
        prof.cache.link_share * 100.0
    );
    if prof.protocol.eager_bytes > 0 {
        notes.push_str(&format!(
            ", +{:.1} us above {} B (rendezvous), eager bytes {:.2}x slower",
            prof.protocol.rendezvous_us, prof.protocol.eager_bytes, prof.protocol.eager_slowdown
        ));
    }
    if prof.protocol.small_bytes > 0 {
        notes.push_str(&format!(
            ", +{:.1} us above {} B (small-message path)",
            prof.protocol.small_step_us, prof.protocol.small_bytes
        ));
    }
    if let Some((p, t)) = concurrent {
        let s = (4 << 20) as f64;
        let ws = p as f64 * (p as f64 + 1.0) * s;
        let (fp, fl) = (prof.cache_speedup(ws), prof.link_speedup(ws));
        // Ring at P ranks: copy + (P−1)(α + s/rate), copies sped up fp times, transfers fl.
        let per_step =
            (t - s / (copy * 1e9 * fp)) / (p - 1) as f64 - alpha - prof.rendezvous_seconds(s);
        let rate = s / per_step.max(1e-9) / 1e9 / fl;
        if rate < 0.95 * beta_gbps {
            prof.intra.node_bandwidth_gbps = rate * p as f64;
        }
        notes.push_str(&format!(
            "; {p} concurrent flows got {rate:.2} GB/s each (node total {:.2} GB/s)",
            prof.intra.node_bandwidth_gbps
        ));
    }
    if let Some((p, t)) = over {
        // sizes[0] is 1 KiB: the 2-rank exchange is one message.
        let note = set_oversub(&mut prof, ncores, p, t, pair[0]);
        notes.push_str(&note);
    } else {
        prof.oversub.cores = ncores;
    }
    // One host: the "inter-node" level of pretend nodes is the same memory (the simulator
    // gives each rank its own port there, so `nics` does not matter).
    prof.inter.alpha_us = prof.intra.alpha_us;
    prof.inter.nic_bandwidth_gbps = beta_gbps;
    prof.inter.nics = 1;
    prof.one_host = true;
    prof.piece_overhead_us = piece_overhead(&prof, probe.0, probe.1);
    notes.push_str(&format!(
        "; {} KiB in {} KiB pieces {:.0} us vs whole {:.0} us: +{:.1} us per piece",
        PROBE_BYTES >> 10,
        PROBE_PIECE >> 10,
        probe.1 * 1e6,
        probe.0 * 1e6,
        prof.piece_overhead_us
    ));
    prof.source = notes;
    prof.validate().unwrap_or_else(|e| fail(e));
    if is_root {
        write_profile(&args, &prof);
    }
}

/// Writes `prof` where `-o` says (or the default path).
fn write_profile(args: &Args, prof: &Profile) {
    let text = format!(
        "# PCCL tuning profile written by pccl-tune (see src/model/profile.rs for every field).\n\
         # Units: microseconds, GB/s (1e9 B/s). Load: PCCL_TUNE_FILE=this-file, or put it at\n\
         # $XDG_CONFIG_HOME/pccl/tune.toml.\n{}",
        prof.to_toml()
    );
    match args.output.as_deref() {
        Some("-") => print!("{text}"),
        o => {
            let path = o
                .map(std::path::PathBuf::from)
                .or_else(Profile::default_path)
                .unwrap_or_else(|| fail("no output path: give -o FILE"));
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            std::fs::write(&path, text)
                .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
            eprintln!("pccl-tune: {} -> {}", prof.source, path.display());
        }
    }
}
