//! `pccl-gpu-bench`: the small CUDA benchmarks behind one argument parser.
//!
//! ```text
//! pccl-gpu-bench [kernels] [--size-mib 256] [--transpose-mib 64] [--iters 30] [--sweep]
//! pccl-gpu-bench staged [--size-mib 256] [--ranks 2] [--iters 5] [--piece-mib 4] [--algo NAME]
//! pccl-gpu-bench queue [--size-kib 4] [--ranks 2] [--iters 200] [--hip] [--quantized [--reduce-scatter]]
//! ```
//! `kernels` (the default): copy ceiling, reductions and transposes ([`kernels`]); `staged`:
//! the host-staged reduce-scatter and each of its stages ([`staged`]); `queue`: host time per
//! call of a queued device collective against a blocking one ([`queue`]).

use clap::{Parser, Subcommand};
use pccl::Algorithm;

mod kernels;
mod queue;
mod staged;

#[derive(Parser, Debug)]
#[command(
    name = "pccl-gpu-bench",
    about = "CUDA kernel and host-staged collective benchmarks",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    kernels: KernelArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Device copy ceiling, reduction kernels and block transposes, in GB/s (the default).
    Kernels(KernelArgs),
    /// The host-staged device reduce-scatter on thread-ranks sharing one GPU, and its stages.
    Staged(StagedArgs),
    /// Host time per call of a device all-reduce (or quantized all-gather) queued on the
    /// stream vs a blocking one.
    Queue(QueueArgs),
}

/// Arguments of `queue`.
#[derive(clap::Args, Debug)]
pub struct QueueArgs {
    /// KiB of the all-reduced vector.
    #[arg(long, default_value_t = 4, value_parser = positive)]
    pub size_kib: usize,
    /// Thread-ranks (rank r on GPU r % GPUs).
    #[arg(long, default_value_t = 2, value_parser = positive)]
    pub ranks: usize,
    /// Timed calls of each kind.
    #[arg(long, default_value_t = 200, value_parser = positive)]
    pub iters: usize,
    /// HIP devices (a build with --features rocm; PCCL_HIP_LIBRARY may name the fake runtime).
    #[arg(long)]
    pub hip: bool,
    /// Time the INT8 quantized all-gather of `--size-kib` per rank (blocks of 256) instead:
    /// queued (`enqueue_all_gather_quantized_on`) against blocking (`all_gather_quantized_on`).
    #[arg(long)]
    pub quantized: bool,
    /// With `--quantized`: the INT8 quantized reduce-scatter (two-hop scheme, the sum)
    /// instead of the all-gather (`enqueue_reduce_scatter_quantized_on` against
    /// `reduce_scatter_quantized_on`).
    #[arg(long, requires = "quantized")]
    pub reduce_scatter: bool,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!("'{s}' is not a positive number")),
    }
}

/// Arguments of `kernels`.
#[derive(clap::Args, Debug)]
pub struct KernelArgs {
    /// MiB per buffer of the copy and reductions.
    #[arg(long, default_value_t = 256, value_parser = positive)]
    pub size_mib: usize,
    /// MiB of the transposed grid.
    #[arg(long, default_value_t = 64, value_parser = positive)]
    pub transpose_mib: usize,
    /// Timed runs per kernel (the median is reported).
    #[arg(long, default_value_t = 30, value_parser = positive)]
    pub iters: usize,
    /// Also time the reduction and transpose under several launch shapes.
    #[arg(long)]
    pub sweep: bool,
}

/// Arguments of `staged`.
#[derive(clap::Args, Debug)]
pub struct StagedArgs {
    /// MiB of each rank's input.
    #[arg(long, default_value_t = 256, value_parser = positive)]
    pub size_mib: usize,
    /// Thread-ranks sharing the GPU.
    #[arg(long, default_value_t = 2, value_parser = positive)]
    pub ranks: usize,
    /// Timed runs (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = positive)]
    pub iters: usize,
    /// MiB per pipelined piece (PCCL_CHUNK_BYTES).
    #[arg(long, default_value_t = 4, value_parser = positive)]
    pub piece_mib: usize,
    /// Algorithm (ring, rd, hier-...), or the tuner's choice.
    #[arg(long)]
    pub algo: Option<Algorithm>,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        None => kernels::run(&cli.kernels),
        Some(Cmd::Kernels(a)) => kernels::run(&a),
        Some(Cmd::Staged(a)) => {
            if let Err(e) = pccl::device::cuda::ensure_available() {
                println!("skipped: no CUDA driver ({})", e.message());
                return;
            }
            staged::run(&a)
        }
        Some(Cmd::Queue(a)) => queue::run(&a),
    };
    if let Err(e) = r {
        eprintln!("pccl-gpu-bench: {e}");
        std::process::exit(1);
    }
}
