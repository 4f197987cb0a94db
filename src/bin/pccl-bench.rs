//! `pccl-bench`: osu-style latency and nccl-tests-style bandwidth of PCCL's collectives,
//! on thread-ranks (`--ranks P`) or on the MPI world (under `mpiexec`), side by side with
//! MPI's own collective on the same buffers when MPI is the transport.
//!
//! `-d cuda` (osu's `-d cuda`, feature `cuda`) puts the buffers in GPU memory instead: each
//! rank opens CUDA device `local rank % device count` (thread-ranks in one process share the
//! GPUs round-robin, all on device 0 with one GPU), runs the device collectives
//! (`Communicator::*_device`) and times them with CUDA events on its own stream, as
//! nccl-tests does. MPI's native collective is not timed there (MPI here is not CUDA-aware).
//! `-d rocm` (feature `rocm`) does the same on AMD GPUs through HIP, `-d gpu` picks the vendor
//! whose runtime reports devices. On device buffers the vendor library's own collective
//! (NCCL's or RCCL's, over all ranks) is timed on the same buffers beside PCCL's, where every
//! rank has a GPU of its own (`--no-vendor-compare` turns it off).

use clap::Parser;
use pccl::config::{parse_bytes, Config};
use pccl::{Communicator, DType, Element, ReduceOp};
use std::time::Instant;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "pccl-bench",
    about = "Benchmark PCCL all-gather / reduce-scatter / all-reduce"
)]
struct Args {
    /// Thread-ranks to run (ignored under mpiexec, where the ranks are the MPI world).
    #[arg(long)]
    ranks: Option<usize>,
    /// Pretend nodes of this many consecutive ranks (sets PCCL_RANKS_PER_NODE).
    #[arg(long)]
    ranks_per_node: Option<usize>,
    /// Collective: allgather, reducescatter, allreduce (or all).
    #[arg(long, default_value = "allgather")]
    coll: String,
    /// Algorithm: auto, auto-online (the tuner with PCCL_TUNE_ONLINE's trials, 8 per
    /// candidate unless set; the warm-up runs until they settle), hier-rd, hier-ring, ring, rd,
    /// rdv (all-reduce by whole-vector doubling) (or hier-INTER-INTRA), any hierarchy
    /// overlapped in K pieces as HIER-pipeK (hier-rd-pipe4). A comma-separated list
    /// (`auto,ring,rd`) measures them interleaved in one run, a row per algorithm with its
    /// median (host buffers).
    #[arg(long, default_value = "auto")]
    algo: String,
    /// Bytes per rank, MIN:MAX (doubling), with K/M/G suffixes.
    #[arg(short = 'm', default_value = "1K:16M")]
    sizes: String,
    /// Timed iterations per size (default: fewer for larger sizes).
    #[arg(short = 'i')]
    iters: Option<usize>,
    /// In a list run (`--algo a,b,..`): calls per timed round grow until a round lasts about
    /// this long (at most 64; the ranks agree on it from the warm-up), so that small sizes
    /// are not dominated by the ranks' skew leaving the barrier before each round. Such a
    /// size runs the whole balanced order of the list (more, shorter rounds, as many calls
    /// in all), each batch after one untimed call.
    #[arg(long, value_name = "MS")]
    batch_ms: Option<f64>,
    /// In a list run: sweep the sizes this many times, each row the median of its passes
    /// (a slow spell of the host, tens of seconds on a shared VM, falls on one pass and not
    /// on the median).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    passes: u32,
    /// Warm-up iterations per size.
    #[arg(short = 'x', default_value_t = 2)]
    warmup: usize,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Reduction operator.
    #[arg(long, default_value = "sum")]
    op: String,
    /// Validate every size's result; exit non-zero on any wrong element.
    #[arg(long)]
    check: bool,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Transport: auto (mpi under mpiexec, else threads), threads, mpi, tcp or ofi (the
    /// last two: one transport per thread-rank, bootstrapped from a unique id; ofi under
    /// mpiexec: one per MPI rank, bootstrapped through the MPI world; default
    /// `PCCL_TRANSPORT`).
    #[arg(long, default_value = "auto")]
    transport: String,
    /// Do not time MPI's native collective beside PCCL's.
    #[arg(long)]
    no_mpi_compare: bool,
    /// Measure the machine's copy bandwidth (every rank copying at once) and print how far each
    /// all-gather is from its memory floor: every rank must read and write each of the P·size
    /// bytes of its output at least once.
    #[arg(long)]
    floor: bool,
    /// Rate of each NIC of the network the ranks run on (`tc` units: 200mbit, 1gbit), as on
    /// `scripts/cluster.sh`: adds a column with the NIC floor (the bytes through the busiest
    /// NIC direction, from every rank's plan and the topology's NIC map, at this rate) and the
    /// measured time over it.
    #[arg(long)]
    nic_rate: Option<String>,
    /// Add the model's prediction for each row (the tuner's simulator with this run's profile,
    /// `PCCL_TUNE_FILE`, on this communicator's topology and NIC map) and the measured time
    /// (the slowest rank's) over it.
    #[arg(long)]
    model: bool,
    /// Print each size's peak host scratch bytes per rank (the executor's working space for
    /// partial sums) and, at the end, the process's peak resident memory (VmHWM): run one
    /// collective per process to compare them.
    #[arg(long)]
    memory: bool,
    /// Where the buffers live: host memory, or cuda / rocm (GPU `local rank % devices`;
    /// needs a build with `--features cuda` / `rocm`), or gpu (whichever of the two has
    /// devices here).
    #[arg(short = 'd', long = "device", value_enum, default_value_t = Device::Host)]
    device: Device,
    /// On device buffers, do not time the vendor library's collective (NCCL, RCCL) beside
    /// PCCL's.
    #[arg(long)]
    no_vendor_compare: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Device {
    Host,
    Cuda,
    Rocm,
    Gpu,
}

impl Device {
    fn name(self) -> &'static str {
        match self {
            Device::Host => "host",
            Device::Cuda => "cuda",
            Device::Rocm => "rocm",
            Device::Gpu => "gpu",
        }
    }
}

/// `$go!(T)` for the element type `T` of `$dtype` (a `DType`); `$go` is a macro of the
/// caller's, so each call site keeps its own arguments.
macro_rules! by_dtype {
    ($dtype:expr, $go:ident) => {
        match $dtype {
            DType::I8 => $go!(i8),
            DType::U8 => $go!(u8),
            DType::I32 => $go!(i32),
            DType::U32 => $go!(u32),
            DType::I64 => $go!(i64),
            DType::U64 => $go!(u64),
            DType::F16 => $go!(half::f16),
            DType::BF16 => $go!(half::bf16),
            DType::F32 => $go!(f32),
            DType::F64 => $go!(f64),
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    AllGather,
    ReduceScatter,
    AllReduce,
}

impl Coll {
    fn name(self) -> &'static str {
        match self {
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reducescatter",
            Coll::AllReduce => "allreduce",
        }
    }
    fn osu_title(self) -> &'static str {
        match self {
            Coll::AllGather => "Allgather",
            Coll::ReduceScatter => "Reduce_scatter",
            Coll::AllReduce => "Allreduce",
        }
    }
    /// nccl-tests' bus-bandwidth factor on `p` ranks: (p−1)/p, twice that for all-reduce.
    fn busbw_factor(self, p: usize) -> f64 {
        let f = (p as f64 - 1.0) / p as f64;
        match self {
            Coll::AllReduce => 2.0 * f,
            _ => f,
        }
    }
    /// The planner's collective (the tuner's key) for this collective with `op`.
    fn plan_key(self, op: ReduceOp) -> pccl::plan::Collective {
        let average = op == ReduceOp::Avg;
        match self {
            Coll::AllGather => pccl::plan::Collective::AllGather,
            Coll::ReduceScatter => pccl::plan::Collective::ReduceScatter { average },
            Coll::AllReduce => pccl::plan::Collective::AllReduce { average },
        }
    }
    /// Bytes of one block of a call of `count` elements of `es` bytes on `p` ranks.
    fn block_bytes(self, count: usize, p: usize, es: usize) -> usize {
        match self {
            Coll::AllReduce => count.div_ceil(p) * es,
            _ => count * es,
        }
    }
}

#[derive(Clone, Debug)]
struct Row {
    coll: Coll,
    bytes: usize,
    count: usize,
    avg_us: f64,
    min_us: f64,
    max_us: f64,
    iters: usize,
    algbw: f64,
    busbw: f64,
    algo: String,
    mpi_us: Option<f64>,
    /// Mean over ranks of the vendor library's collective on the same device buffers.
    vendor_us: Option<f64>,
    floor_us: Option<f64>,
    /// Peak host scratch bytes of rank 0 so far (`--memory`).
    scratch: Option<usize>,
    wrong: u64,
    /// The algorithm asked for, in a list run.
    requested: Option<String>,
    /// Median over rounds of the per-iteration time, in a list run.
    median_us: Option<f64>,
    /// The slowest rank's time per iteration (a list run: the median over rounds of it): the
    /// collective's completion, which the NIC floor bounds.
    slowest_us: Option<f64>,
    /// The model's prediction (`--model`).
    model_us: Option<f64>,
    /// Share of the host's CPU time its hypervisor took (steal) while this size ran, in a
    /// list run: a noisy neighbour, which no model of ours knows about.
    steal_pct: Option<f64>,
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("pccl-bench: {msg}");
    std::process::exit(2);
}

fn sizes(spec: &str) -> Result<Vec<usize>, String> {
    let (a, b) = spec.split_once(':').unwrap_or((spec, spec));
    let lo = parse_bytes(a).map_err(|e| e.to_string())?;
    let hi = parse_bytes(b).map_err(|e| e.to_string())?;
    if lo == 0 || lo > hi {
        return Err(format!("-m {spec}: need 0 < MIN <= MAX"));
    }
    let mut v = Vec::new();
    let mut s = lo;
    while s <= hi {
        v.push(s);
        s = s.saturating_mul(2);
    }
    Ok(v)
}

/// The value rank `r` holds at element `i` (exact in every dtype after summing 1000 ranks).
fn val<T: Element>(r: usize, i: usize) -> T {
    T::from_i64(((r * 7 + i * 3) % 5) as i64)
}

fn expected<T: Element>(p: usize, i: usize, op: ReduceOp) -> T {
    let mut acc = [val::<T>(0, i)];
    for r in 1..p {
        T::reduce_into(op, &mut acc, &[val::<T>(r, i)]);
    }
    if op == ReduceOp::Avg {
        T::divide(&mut acc, p);
    }
    acc[0]
}

/// Timing and checks of one size, on one rank.
struct Native<'a> {
    #[cfg(feature = "mpi")]
    mpi: Option<&'a pccl::transport::mpi::MpiTransport>,
    #[cfg(not(feature = "mpi"))]
    _p: std::marker::PhantomData<&'a ()>,
}

/// Input and output lengths (elements) of `coll` with `count` elements per block.
fn lens(coll: Coll, count: usize, p: usize) -> (usize, usize) {
    match coll {
        Coll::AllGather => (count, count * p),
        Coll::ReduceScatter => (count * p, count),
        Coll::AllReduce => (count, count),
    }
}

/// Rank `r`'s input of `coll`: `in_len` elements of the deterministic pattern.
fn input_of<T: Element>(r: usize, in_len: usize) -> Vec<T> {
    (0..in_len).map(|i| val::<T>(r, i)).collect()
}

/// Elements of rank `r`'s `output` that differ (bitwise) from the host reference.
fn count_wrong<T: Element>(
    coll: Coll,
    op: ReduceOp,
    p: usize,
    r: usize,
    count: usize,
    output: &[T],
) -> u64 {
    let want = |i: usize| -> T {
        match coll {
            Coll::AllGather => val::<T>(i / count, i % count),
            Coll::ReduceScatter => expected::<T>(p, r * count + i, op),
            Coll::AllReduce => expected::<T>(p, i, op),
        }
    };
    output
        .iter()
        .enumerate()
        .filter(|(i, x)| bytemuck::bytes_of(*x) != bytemuck::bytes_of(&want(*i)))
        .count() as u64
}

/// Timed iterations for a size whose larger buffer holds `total_bytes`.
fn iters_for(args: &Args, total_bytes: usize) -> usize {
    args.iters
        .unwrap_or_else(|| ((1usize << 28) / total_bytes.max(1)).clamp(3, 200))
}

/// What one rank measured of one size.
struct Measured {
    count: usize,
    es: usize,
    total_bytes: usize,
    iters: usize,
    /// This rank's seconds per iteration.
    mine: f64,
    /// This rank's seconds per iteration of MPI's native collective.
    mpi_mine: Option<f64>,
    wrong: u64,
}

/// Combines every rank's [`Measured`] into the row (the same on every rank).
fn finish_row(comm: &Communicator, coll: Coll, op: ReduceOp, m: Measured) -> pccl::Result<Row> {
    let p = comm.size();
    let Measured {
        count,
        es,
        total_bytes,
        iters,
        mine,
        mpi_mine,
        wrong,
    } = m;
    // Min / max / mean across ranks, and the wrong-element total.
    let mut stats = [
        mine,
        -mine,
        mine / p as f64,
        mpi_mine.unwrap_or(0.0) / p as f64,
        wrong as f64,
    ];
    let mut mx = [0f64; 2];
    comm.all_reduce(&stats[..2], &mut mx, ReduceOp::Max)?;
    let mut sums = [0f64; 3];
    comm.all_reduce(&stats[2..], &mut sums, ReduceOp::Sum)?;
    stats = [-mx[1], mx[0], sums[0], sums[1], sums[2]];
    let avg = stats[2];
    // nccl-tests conventions: size = the whole buffer; busbw factor (n-1)/n, 2(n-1)/n for all-reduce.
    let size = total_bytes as f64;
    let algbw = size / avg / 1e9;
    let factor = coll.busbw_factor(p);
    let coll_key = coll.plan_key(op);
    let block_bytes = coll.block_bytes(count, p, es);
    Ok(Row {
        coll,
        bytes: count * es,
        count,
        avg_us: avg * 1e6,
        min_us: stats[0] * 1e6,
        max_us: stats[1] * 1e6,
        iters,
        algbw,
        busbw: algbw * factor,
        algo: comm.algorithm_for(coll_key, block_bytes)?.name(),
        mpi_us: mpi_mine.map(|_| stats[3] * 1e6),
        vendor_us: None,
        floor_us: None,
        scratch: None,
        wrong: stats[4] as u64,
        requested: None,
        median_us: None,
        slowest_us: Some(stats[1] * 1e6),
        model_us: None,
        steal_pct: None,
    })
}

fn run_size<T: Element>(
    comm: &Communicator,
    native: &Native<'_>,
    coll: Coll,
    op: ReduceOp,
    bytes: usize,
    args: &Args,
) -> pccl::Result<Row> {
    let (r, p) = (comm.rank(), comm.size());
    let es = std::mem::size_of::<T>();
    let count = (bytes / es).max(1);
    let (in_len, out_len) = lens(coll, count, p);
    let input: Vec<T> = input_of(r, in_len);
    let mut output: Vec<T> = vec![T::from_i64(0); out_len];
    let run_once = |out: &mut Vec<T>| -> pccl::Result<()> {
        match coll {
            Coll::AllGather => comm.all_gather(&input, out),
            Coll::ReduceScatter => comm.reduce_scatter(&input, out, op),
            Coll::AllReduce => comm.all_reduce(&input, out, op),
        }
    };
    let total_bytes = out_len.max(in_len) * es;
    let iters = iters_for(args, total_bytes);
    list::settle(
        comm,
        coll.plan_key(op),
        coll.block_bytes(count, p, es),
        || run_once(&mut output),
    )?;
    for _ in 0..args.warmup {
        run_once(&mut output)?;
    }
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        run_once(&mut output)?;
    }
    let mine = t0.elapsed().as_secs_f64() / iters as f64;
    let mut wrong = 0u64;
    if args.check {
        wrong = count_wrong(coll, op, p, r, count, &output);
    }
    let mpi_mine =
        if let Some(first) = bounds::mpi_once(native, coll, op, &input, &mut output, count, args) {
            first?;
            for _ in 0..args.warmup {
                bounds::mpi_once(native, coll, op, &input, &mut output, count, args).transpose()?;
            }
            comm.barrier()?;
            let t0 = Instant::now();
            for _ in 0..iters {
                bounds::mpi_once(native, coll, op, &input, &mut output, count, args).transpose()?;
            }
            Some(t0.elapsed().as_secs_f64() / iters as f64)
        } else {
            None
        };
    finish_row(
        comm,
        coll,
        op,
        Measured {
            count,
            es,
            total_bytes,
            iters,
            mine,
            mpi_mine,
            wrong,
        },
    )
}

fn bench_rank(comm: &Communicator, native: &Native<'_>, args: &Args) -> pccl::Result<Vec<Row>> {
    let colls: Vec<Coll> = match args.coll.as_str() {
        "allgather" => vec![Coll::AllGather],
        "reducescatter" => vec![Coll::ReduceScatter],
        "allreduce" => vec![Coll::AllReduce],
        "all" => vec![Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce],
        other => {
            return Err(pccl::Error::invalid(format!(
                "--coll {other}: expected allgather, reducescatter, allreduce or all"
            )))
        }
    };
    let dtype: DType = args.dtype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    dtype.check_op(op)?;
    let szs = sizes(&args.sizes).map_err(pccl::Error::invalid)?;
    if let Some(names) = list::parse_list(&args.algo) {
        return list::bench(comm, native, &names, &colls, dtype, op, &szs, args);
    }
    if args.passes > 1 {
        return Err(pccl::Error::usage(
            "--passes repeats the sweep of a list run (--algo a,b,...); give a list, or \
             one pass",
        ));
    }
    let mpi = native_present(native);
    let mut notes = Vec::new();
    let mut gpu = GpuState::None;
    if args.device != Device::Host {
        if args.floor {
            return Err(pccl::Error::usage(format!(
                "--floor measures host memory copy bandwidth; it is not supported with -d {}",
                args.device.name()
            )));
        }
        // Both buffers hold the largest size's P blocks, whichever collective runs.
        let es = dtype.size();
        let most = szs.iter().max().map_or(1, |&b| (b / es).max(1));
        let most = most
            .checked_mul(comm.size() * es)
            .ok_or_else(|| pccl::Error::invalid(format!("-m {}: too large", args.sizes)))?;
        gpu = GpuState::open(resolve_device(args.device), comm, mpi, most, args)?;
        notes.extend(gpu.notes());
        if mpi && !args.no_mpi_compare {
            notes.push(
                "# MPI native comparison skipped: device buffers, and MPI here is not GPU-aware"
                    .to_string(),
            );
        }
    }
    let copy_bw = if args.floor && args.nic_rate.is_none() {
        Some(machine_copy_bandwidth(comm)?)
    } else {
        None
    };
    if let (Some(bw), 0, false) = (copy_bw, comm.rank(), args.json) {
        println!("# machine copy bandwidth, all {} ranks copying 64 MiB at once: {:.2} GB/s (read + write)", comm.size(), bw / 1e9);
    }
    let mut rows = Vec::new();
    for coll in colls {
        if comm.rank() == 0 && !args.json {
            print_header(comm, coll, args, mpi && gpu.is_host(), gpu.vendor(), &notes);
        }
        for &b in &szs {
            macro_rules! go {
                ($t:ty) => {
                    run_one::<$t>(comm, native, &mut gpu, coll, op, b, args)?
                };
            }
            let mut row = by_dtype!(dtype, go);
            if args.memory {
                row.scratch = Some(comm.scratch_bytes());
            }
            let b = bounds::of_row(comm, coll, op, &row.algo, row.count, dtype.size(), args)?;
            row.model_us = b.model_us;
            if let Some(f) = b.floor_us {
                row.floor_us = Some(f);
            } else if let (Some(bw), Coll::AllGather) = (copy_bw, coll) {
                // All P ranks each read and write P·size bytes of output at least once.
                let p = comm.size() as f64;
                row.floor_us = Some(p * 2.0 * p * row.bytes as f64 / bw * 1e6);
            }
            if comm.rank() == 0 && !args.json {
                print_row(&row, args.check, args.nic_rate.is_some());
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One size of `coll` on host buffers, or on the rank's GPU when `gpu` holds it.
fn run_one<T: Element>(
    comm: &Communicator,
    native: &Native<'_>,
    gpu: &mut GpuState,
    coll: Coll,
    op: ReduceOp,
    bytes: usize,
    args: &Args,
) -> pccl::Result<Row> {
    match gpu {
        GpuState::None => run_size::<T>(comm, native, coll, op, bytes, args),
        #[cfg(feature = "cuda")]
        GpuState::Cuda(g) => gpu::run_size::<T, _>(comm, g, coll, op, bytes, args),
        #[cfg(feature = "rocm")]
        GpuState::Rocm(g) => gpu::run_size::<T, _>(comm, g, coll, op, bytes, args),
    }
}

#[path = "bench_bounds/mod.rs"]
mod bounds;
#[path = "bench_device/mod.rs"]
mod device;
#[cfg(any(feature = "cuda", feature = "rocm"))]
#[path = "bench_gpu/mod.rs"]
mod gpu;
#[path = "bench_launch/mod.rs"]
mod launch;
#[path = "bench_list/mod.rs"]
mod list;
#[path = "bench_output/mod.rs"]
mod output;

use device::{resolve_device, GpuState};
use launch::{launched, on_unique_id, run_mpi, use_mpi};
use output::{print_header, print_row, report};

/// Bytes per second read plus written by all ranks copying 64 MiB at the same time.
fn machine_copy_bandwidth(comm: &Communicator) -> pccl::Result<f64> {
    const N: usize = 64 << 20;
    let src = vec![1u8; N];
    let mut dst = vec![0u8; N];
    dst.copy_from_slice(&src); // fault the pages in
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..5 {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    let rate = 5.0 * 2.0 * N as f64 / t0.elapsed().as_secs_f64();
    let mut total = [0f64];
    comm.all_reduce(&[rate], &mut total, ReduceOp::Sum)?;
    Ok(total[0])
}

fn native_present(native: &Native<'_>) -> bool {
    #[cfg(feature = "mpi")]
    {
        native.mpi.is_some()
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = native;
        false
    }
}

fn config(args: &Args) -> Config {
    let mut cfg = Config::from_env().unwrap_or_else(|e| fail(e));
    if let Some(m) = args.ranks_per_node {
        if m == 0 {
            fail("--ranks-per-node must be at least 1");
        }
        cfg.ranks_per_node = Some(m);
    }
    if args.algo == "auto-online" {
        list::online(&mut cfg);
    } else if args.algo != "auto" && list::parse_list(&args.algo).is_none() {
        cfg.algo = Some(args.algo.parse().unwrap_or_else(|e| fail(e)));
    }
    cfg
}

fn main() {
    let mut args = Args::parse();
    if args.transport == "auto" {
        if let Ok(v) = std::env::var("PCCL_TRANSPORT") {
            args.transport = v.trim().to_ascii_lowercase();
        }
    }
    let cfg = config(&args);
    resolve_device(args.device);
    let wrong = if use_mpi(&args) {
        run_mpi(&args, cfg)
    } else {
        let p = args.ranks.unwrap_or(8);
        if p == 0 {
            fail("--ranks must be at least 1");
        }
        let body = |comm: Communicator| {
            let native = Native {
                #[cfg(feature = "mpi")]
                mpi: None,
                #[cfg(not(feature = "mpi"))]
                _p: std::marker::PhantomData,
            };
            let rows = bench_rank(&comm, &native, &args)?;
            Ok::<u64, pccl::Error>(report(&comm, &rows, &args))
        };
        let launched = match args.transport.as_str() {
            "tcp" | "ofi" => launched(&cfg, &args.transport),
            _ => None,
        };
        let res = match (launched, args.transport.as_str()) {
            (Some(t), _) => Communicator::with_config(t, cfg).map(|c| vec![body(c)]),
            (None, "tcp" | "ofi") => on_unique_id(p, cfg, &args.transport, body),
            (None, _) => Communicator::run_threads(p, cfg, body),
        }
        .unwrap_or_else(|e| fail(e));
        let mut wrong = 0;
        for r in res {
            wrong = r.unwrap_or_else(|e| fail(e));
        }
        wrong
    };
    if wrong > 0 {
        std::process::exit(1);
    }
}
