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
//!   same run, at 4 × cores ranks too where that is at most 16, the slope fitted to both.
//!   MPI (whose world is fixed): a second run `mpiexec -n 2×cores pccl-tune --transport mpi
//!   --oversub-of FILE -o FILE2` adds the term to the 2-rank profile FILE (a third, at
//!   4 × cores on FILE2, gives the slope its second point), and
//!   `oversub.rate_share` (busy-polling ranks take core time from the copies): the share
//!   with which the model's 4 MiB ring at those ranks takes the measured time. Threads sleep
//!   while they wait (no share; their node-bus measurement at 4 ranks already ran
//!   oversubscribed).
//!
//! The raw timings go into the profile's `[measured]` table and the terms are derived from
//! them ([`pccl::model::calibrate`]). `pccl-tune --merge A B C -o F` measures nothing: it
//! derives F from the per-size medians of several runs' timings. On a shared host a
//! process's exchange can run slow for its whole life (on the 2-core VM 16 KiB–2 MiB took
//! 3–4.5× longer in some periods, where the hypervisor placed the two vCPUs, and a single
//! slow run's fit put a false +310–450 µs step at 512 KiB): runs merged outvote it, and
//! runs spread over a job's time take the machine's usual state.
//!
//! Threads transport here (ranks are threads of one host: the inter-node level gets the same
//! figures, one "NIC"); with `--features mpi` under `mpiexec -n 2` the MPI transport
//! (`--transport mpi`), α and β from the MPI world's exchange.

use clap::Parser;
use half::{bf16, f16};
use pccl::config::Config;
use pccl::model::calibrate::{self, Measured, PROBE_BYTES, PROBE_PIECE, RING_BYTES};
use pccl::model::profile::Profile;
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
    /// Transport: threads, mpi (under mpiexec, built with --features mpi), or tcp / ofi
    /// with one process per rank under a launcher (`scripts/cluster.sh run`, `mpiexec`,
    /// Slurm): the network's terms measured across the nodes (at least 2 of 2 ranks each).
    #[arg(long, default_value = "threads")]
    transport: String,
    /// With tcp / ofi: the profile that holds this host's own terms (copies, reductions;
    /// a threads run of pccl-tune); PCCL's defaults without it.
    #[arg(long, value_name = "PROFILE")]
    base: Option<String>,
    /// With tcp / ofi: NICs per node (default: the NICs the topology's NIC map puts a rank on,
    /// else 1).
    #[arg(long)]
    nics: Option<usize>,
    /// With tcp / ofi or `--refit`: bytes each NIC direction passes at once after an idle
    /// spell (K/M suffixes): a shaper's burst, 32K on `scripts/cluster.sh`'s emulated NICs,
    /// 0 (the default) for physical ones. The model charges a message the NIC's rate only
    /// beyond it.
    #[arg(long, value_name = "BYTES")]
    nic_burst: Option<String>,
    /// Measure nothing: fit the network's terms of this profile (one `--transport tcp|ofi`
    /// wrote) again to the timings it holds, with this build's model (and `--nic-burst`
    /// where given), written to `-o`.
    #[arg(long, value_name = "PROFILE")]
    refit: Option<String>,
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
    /// Measure nothing: derive one profile from the per-size medians of these profiles'
    /// measurements (runs of the same pccl-tune command on the same host), written to `-o`.
    #[arg(long, num_args = 1.., value_name = "PROFILE")]
    merge: Vec<String>,
    /// With `--merge`: the oversubscribed rings from this profile's measurements (a merge of
    /// `--oversub-of` runs) instead of the merged runs' (MPI measures them in runs of their
    /// own, so a later 2-rank calibration can be paired with an earlier ring measurement).
    #[arg(long, value_name = "PROFILE", requires = "merge")]
    rings_of: Option<String>,
}

/// Cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Ranks for the oversubscribed measurements: 2 × and 4 × cores, those at most 16 (the
/// term is linear in the extra ranks per core; two points fit its slope where the growth
/// bends instead of extrapolating one).
fn oversub_ranks(cores: usize) -> Vec<usize> {
    [2 * cores, 4 * cores]
        .into_iter()
        .filter(|&p| p <= 16)
        .collect()
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

/// The `memcpy` sweep: (working set, GB/s) for working sets 256 KiB … 4× `llc` (at least
/// 128 MiB).
fn copy_sweep(llc: Option<usize>, reps: usize) -> Vec<(f64, f64)> {
    let top = (4 * llc.unwrap_or(0)).max(128 << 20);
    let mut sweep = Vec::new();
    let mut ws = 256usize << 10;
    while ws <= top {
        sweep.push((ws as f64, copy_rate(ws / 2, reps.max(7))));
        ws *= 2;
    }
    sweep
}

/// `-v`: the sweep measured and as the profile's cache tier fits it.
fn copy_table(prof: &Profile) {
    let Some(m) = &prof.measured else { return };
    eprintln!("pccl-tune: memcpy sweep, working set, measured vs fitted (GB/s):");
    for (w, r) in m.copy_set_bytes.iter().zip(&m.copy_gbps) {
        eprintln!(
            "  {:>10} KiB {r:>8.2} {:>8.2}",
            *w as usize >> 10,
            prof.copy_gbps * prof.cache_speedup(*w)
        );
    }
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

/// `--oversub-of BASE`: the oversubscribed rings at this MPI world's size, added to BASE's
/// measurements and the profile derived again.
#[cfg(feature = "mpi")]
fn mpi_oversub_only(args: &Args, base: &str) {
    let prof = Profile::load(std::path::Path::new(base)).unwrap_or_else(|e| fail(e));
    let Some(mut m) = prof.measured else {
        fail(format!(
            "--oversub-of {base}: the profile holds no [measured] table (written by an older \
             pccl-tune, or by hand): measure it again with `mpiexec -n 2 pccl-tune --transport mpi`"
        ))
    };
    let sizes = [1usize << 10, RING_BYTES];
    let q = args.quick;
    let (t, p, root) = on_mpi(|c| ag_times(c, &sizes, q));
    let n = cores();
    if p <= n {
        fail(format!(
            "--oversub-of: run under mpiexec -n {} (more ranks than the {n} cores)",
            2 * n
        ));
    }
    m.add_oversub_point(p, t[0] * 1e6, t[1] * 1e6);
    let prof = calibrate::derive(&m).unwrap_or_else(|e| fail(e));
    if root {
        write_profile(args, &prof);
    }
}

/// The raw measurements of profile `f` (named by `flag` when it has none).
fn measured_of(f: &str, flag: &str) -> Measured {
    let p = Profile::load(std::path::Path::new(f)).unwrap_or_else(|e| fail(e));
    p.measured.unwrap_or_else(|| {
        fail(format!(
            "{flag} {f}: the profile holds no [measured] table (written by an older \
             pccl-tune, or by hand)"
        ))
    })
}

/// `--merge FILES`: one profile from the per-size medians of several runs' measurements.
fn merge(args: &Args) {
    let runs: Vec<Measured> = args
        .merge
        .iter()
        .map(|f| measured_of(f, "--merge"))
        .collect();
    let mut m = Measured::median(&runs).unwrap_or_else(|e| fail(e));
    if let Some(f) = &args.rings_of {
        let rings = measured_of(f, "--rings-of");
        if (rings.transport.as_str(), rings.cores) != (m.transport.as_str(), m.cores) {
            fail(format!(
                "--rings-of {f}: measured {} on {} cores, the runs {} on {} cores",
                rings.transport, rings.cores, m.transport, m.cores
            ));
        }
        (m.oversub_ranks, m.oversub_us, m.oversub_ring_us) =
            (rings.oversub_ranks, rings.oversub_us, rings.oversub_ring_us);
    }
    if let Some((bytes, r)) = Measured::spread(&runs) {
        let note = if r > 1.5 {
            ": the machine's state changed between the runs; the median takes the state most \
             of them met (merge more runs, spread over the time the job runs)"
        } else {
            ""
        };
        eprintln!("pccl-tune: the runs' exchanges differ up to {r:.2}x (at {bytes} B){note}");
    }
    let mut prof = calibrate::derive(&m).unwrap_or_else(|e| fail(e));
    prof.source = format!(
        "the median of {} pccl-tune runs ({}): {}",
        runs.len(),
        args.merge.join(", "),
        prof.source
    );
    if args.verbose {
        exchange_table(&prof);
    }
    write_profile(args, &prof);
}

#[path = "tune_network/mod.rs"]
mod tune_network;

/// `--transport tcp|ofi`: the network's terms, measured by every launched rank.
fn network(args: &Args) {
    use pccl::transport::{launch, select};
    let cfg = Config::from_env().unwrap_or_else(|e| fail(e));
    let kind = select::parse(&args.transport).unwrap_or_else(|e| fail(e));
    // Under mpiexec the transport bootstraps through the MPI world, as pccl-bench's does:
    // measured beside an initialised MPI library (UCX's progress takes core time), which is
    // what a benchmark under mpiexec runs beside too.
    #[cfg(feature = "mpi")]
    let mpi = pccl::transport::mpi::launched_by_mpiexec();
    #[cfg(not(feature = "mpi"))]
    let mpi = false;
    let joined = if mpi {
        #[cfg(feature = "mpi")]
        {
            pccl::transport::mpi::init().unwrap_or_else(|e| fail(e));
            Some(select::world(kind, cfg.chunk_bytes, cfg.timeout).unwrap_or_else(|e| fail(e)))
        }
        #[cfg(not(feature = "mpi"))]
        None
    } else {
        launch::join_launched(kind, cfg.chunk_bytes, cfg.timeout)
            .unwrap_or_else(|e| fail(e))
            .map(|(_, t)| t)
    };
    let Some(t) = joined else {
        fail(format!(
            "--transport {}: start one process per rank under a launcher (PCCL_RANK, \
             PCCL_WORLD_SIZE and PCCL_UNIQUE_ID_FILE, as scripts/cluster.sh run sets them)",
            args.transport
        ))
    };
    let world = Communicator::with_config(t, cfg).unwrap_or_else(|e| fail(e));
    let a = tune_network::NetworkArgs {
        transport: &args.transport,
        quick: args.quick,
        base: args.base.as_deref(),
        nics: args.nics,
        burst: nic_burst(args),
    };
    let out = tune_network::run(&world, &a).unwrap_or_else(|e| fail(e));
    if let Some((prof, worst, m)) = out {
        if args.verbose {
            for (what, v) in [
                ("between nodes", &m.inter_pair),
                ("in a node", &m.intra_pair),
            ] {
                for (s, t) in v.iter() {
                    eprintln!("pccl-tune: pair {what}: {s:>9} B {:>10.1} us", t * 1e6);
                }
            }
            for (al, s, t) in &m.world {
                eprintln!("pccl-tune: world {al}: {s} B {:>10.1} us", t * 1e6);
            }
        }
        eprintln!(
            "pccl-tune: network: {:.1} us + {:.1} us of core time per message between nodes, \
             {:.4} GB/s per NIC; {:.1} us + {:.1} us inside a node; {:.1} us per message per \
             extra rank per core; the world's timings predicted within {worst:.2}x",
            prof.inter.alpha_us,
            prof.oversub.inter_cpu_us,
            prof.inter.nic_bandwidth_gbps,
            prof.intra.alpha_us,
            prof.oversub.intra_cpu_us,
            prof.oversub.per_message_us
        );
        write_profile(args, &prof);
    }
    // Nobody leaves before rank 0 wrote the profile: under mpiexec a rank whose
    // MPI_Finalize hangs ends itself after 10 s (`finalize_guarded`), and hydra then kills
    // every other process, rank 0 too if it is still fitting (a profile lost that way in 3 of
    // 6 runs of 8 nodes x 2 ranks on the emulated cluster).
    if let Err(e) = world.barrier() {
        eprintln!("pccl-tune: the closing barrier failed: {e}");
    }
    #[cfg(feature = "mpi")]
    if mpi {
        finalize_guarded();
    }
}

/// `--nic-burst` in bytes.
fn nic_burst(args: &Args) -> Option<usize> {
    args.nic_burst.as_deref().map(|v| {
        pccl::config::parse_bytes(v.trim())
            .unwrap_or_else(|e| fail(format!("--nic-burst {v}: {e}")))
    })
}

/// `--refit PROFILE`: the network's terms fitted again, nothing measured.
fn refit(args: &Args, path: &str) {
    let old = Profile::load(std::path::Path::new(path)).unwrap_or_else(|e| fail(e));
    let (prof, worst) =
        tune_network::refit(&old, nic_burst(args)).unwrap_or_else(|e| fail(format!("{path}: {e}")));
    eprintln!(
        "pccl-tune: refitted {path}: {:.1} us + {:.1} us of core time per message between \
         nodes (was {:.1} + {:.1}); {:.1} us per message per extra rank per core (was {:.1}); \
         NIC burst {:.0} B; the world's timings predicted within {worst:.2}x",
        prof.inter.alpha_us,
        prof.oversub.inter_cpu_us,
        old.inter.alpha_us,
        old.oversub.inter_cpu_us,
        prof.oversub.per_message_us,
        old.oversub.per_message_us,
        prof.inter.burst_bytes,
    );
    write_profile(args, &prof);
}

/// `MPI_Finalize`, given 10 s: across network namespaces UCX's TCP progress sometimes never
/// returns from it (a known UCX issue); the profile is written by then (the closing barrier
/// waits for it).
#[cfg(feature = "mpi")]
fn finalize_guarded() {
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(10));
        eprintln!("pccl-tune: MPI_Finalize did not return within 10 s; exiting without it");
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(0) };
    });
    pccl::transport::mpi::finalize();
}

/// `-v`: the exchange measured and as the profile fits it, per size.
fn exchange_table(prof: &Profile) {
    let Some(m) = &prof.measured else { return };
    eprintln!("pccl-tune: 2-rank exchange, measured vs fitted (us):");
    for (&t, &s) in m.exchange_us.iter().zip(&m.exchange_bytes) {
        let fit = calibrate::exchange_seconds(prof, s as f64) * 1e6;
        eprintln!("  {:>9} B {:>10.1} {:>10.1}  x{:.2}", s, t, fit, t / fit);
    }
}

fn main() {
    let args = Args::parse();
    if !args.merge.is_empty() {
        merge(&args);
        return;
    }
    if let Some(path) = args.refit.as_deref() {
        refit(&args, path);
        return;
    }
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
    if matches!(args.transport.as_str(), "tcp" | "ofi") {
        network(&args);
        return;
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
    let cache_bytes = args.cache_bytes.as_deref().map(|s| {
        pccl::config::parse_bytes(s).unwrap_or_else(|e| fail(format!("--cache-bytes {s}: {e}")))
    });
    // The exchanges first, in a process as fresh as pccl-bench's: the sweeps below free
    // 128 MiB buffers, after which glibc serves every allocation up to 32 MiB from its heap
    // (its mmap threshold follows the largest freed chunk); a 2-rank exchange of 16–256 KiB
    // timed after them ran 5–10× slower than in pccl-bench in one run.
    let ncores = cores();
    let mut m = Measured {
        cores: ncores,
        exchange_bytes: sizes.clone(),
        cache_bytes,
        ..Measured::default()
    };
    let us = |t: f64| t * 1e6;
    let is_root = match args.transport.as_str() {
        "threads" => {
            let q = args.quick;
            let pair = on_threads(2, |c| ag_times(&c, &sizes, q));
            m.exchange_us = pair.into_iter().map(us).collect();
            let whole = on_threads_cfg(2, piece_cfg(2 * PROBE_BYTES), |c| {
                ag_times(&c, &[PROBE_BYTES], q)
            })[0];
            let pieced = on_threads_cfg(2, piece_cfg(PROBE_PIECE), |c| {
                ag_times(&c, &[PROBE_BYTES], q)
            })[0];
            (m.probe_whole_us, m.probe_pieced_us) = (us(whole), us(pieced));
            let conc = on_threads(args.ranks, |c| ag_times(&c, &[RING_BYTES], q));
            (m.concurrent_ranks, m.concurrent_us) = (args.ranks, us(conc[0]));
            for p in oversub_ranks(ncores) {
                let t = on_threads(p, |c| ag_times(&c, &[1usize << 10], q))[0];
                m.oversub_ranks.push(p);
                m.oversub_us.push(us(t));
            }
            true
        }
        "mpi" => {
            #[cfg(feature = "mpi")]
            {
                let q = args.quick;
                let (pair, p, root) = on_mpi(|c| ag_times(c, &sizes, q));
                if p != 2 {
                    fail("the MPI measurement runs under mpiexec -n 2");
                }
                m.exchange_us = pair.into_iter().map(us).collect();
                let whole = mpi_comm(piece_cfg(2 * PROBE_BYTES));
                let pieced = mpi_comm(piece_cfg(PROBE_PIECE));
                let (w, p) = probe_times(&whole, &pieced, q).unwrap_or_else(|e| fail(e));
                (m.probe_whole_us, m.probe_pieced_us) = (us(w), us(p));
                root
            }
            #[cfg(not(feature = "mpi"))]
            fail("this pccl-tune was built without the `mpi` feature")
        }
        o => fail(format!("--transport {o}: expected threads or mpi")),
    };
    m.transport = args.transport.clone();
    let llc = llc_bytes();
    let sweep = copy_sweep(llc, reps);
    (m.copy_set_bytes, m.copy_gbps) = sweep.into_iter().unzip();
    m.cache_quarter_bytes = llc.unwrap_or(4 << 20) as f64 / 4.0;
    m.reduce_gbps = [
        ("f32", reduce_gbps(reps, 1f32)),
        ("f64", reduce_gbps(reps, 1f64)),
        ("f16", reduce_gbps(reps, f16::ONE)),
        ("bf16", reduce_gbps(reps, bf16::ONE)),
        ("i32", reduce_gbps(reps, 1i32)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let prof = calibrate::derive(&m).unwrap_or_else(|e| fail(e));
    if args.verbose && is_root {
        copy_table(&prof);
        exchange_table(&prof);
    }
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
