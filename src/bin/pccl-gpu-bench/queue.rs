//! `queue`: the host time of one device all-reduce call queued on the caller's stream
//! (`Communicator::enqueue_on`, what the C ABI and torch do) against the blocking call
//! (`collective_on`, what `PCCL_DEVICE_ASYNC=0` does), or with `--quantized` of the INT8
//! quantized all-gather (`enqueue_all_gather_quantized_on` against
//! `all_gather_quantized_on`; with `--reduce-scatter` the quantized reduce-scatter's pair),
//! on thread-ranks each on GPU
//! `rank % GPUs`: CUDA, or HIP with `--hip` (the fake ROCm runtime included, whose streams run
//! on threads: the queued call's host time is then the host cost of queueing a stream program).

use crate::QueueArgs;
use pccl::device::api::Device;
use pccl::{Communicator, RawCollective, ReduceOp, Result, ThreadWorld};
use std::time::{Duration, Instant};

/// One rank's host times of the queued and blocking calls, and the queued calls' drain time.
type Times = (Vec<Duration>, Vec<Duration>, Duration);

/// Median and mean of `v` in microseconds.
fn stats(v: &mut [Duration]) -> (f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = v.iter().map(|&d| us(d)).sum::<f64>() / v.len().max(1) as f64;
    (us(v[v.len() / 2]), mean)
}

/// One rank: host times of `iters` queued calls, then of `iters` blocking calls.
fn rank_times<D: Device>(c: &Communicator, dev: &D, a: &QueueArgs) -> Result<Times> {
    let n = (a.size_kib * 1024 / 4).max(1);
    let p = c.size();
    let buf = dev.alloc_zeroed(n * 4 * (p + 1))?;
    let addr = dev.span_of(&buf).addr();
    // The quantized all-gather's output follows its shard; the reduce-scatter's its input.
    let out = addr + (n * 4) as u64;
    let rs_out = addr + (n * p * 4) as u64;
    let rs = (pccl::QuantScheme::TwoHop, false);
    let sum = RawCollective::AllReduce(ReduceOp::Sum);
    let q = pccl::Quant {
        block: 256,
        ..pccl::Quant::INT8
    };
    // SAFETY: `buf` holds n × (p + 1) f32 of `dev` and lives until the stream is synchronised
    // below.
    let queued = || unsafe {
        if a.reduce_scatter {
            let how = (q, rs.1, rs.0);
            c.enqueue_reduce_scatter_quantized_on::<f32, D>(dev, (addr, rs_out), (n, n * p), how)
        } else if a.quantized {
            c.enqueue_all_gather_quantized_on::<f32, D>(dev, (addr, out), (n, n * p), q)
        } else {
            c.enqueue_on::<f32, D>(dev, sum, addr, addr, n)
        }
    };
    // SAFETY: as above; the call returns when done.
    let blocking = || unsafe {
        if a.reduce_scatter {
            let how = (q, rs.1, rs.0);
            c.reduce_scatter_quantized_on::<f32, D>(dev, (addr, rs_out), (n, n * p), how)
        } else if a.quantized {
            c.all_gather_quantized_on::<f32, D>(dev, (addr, out), (n, n * p), q)
        } else {
            c.collective_on::<f32, D>(dev, sum, addr, addr, n)
        }
    };
    for _ in 0..3 {
        queued()?;
    }
    dev.synchronize()?;
    let mut q = Vec::with_capacity(a.iters);
    let t_all = Instant::now();
    for _ in 0..a.iters {
        let t0 = Instant::now();
        queued()?;
        q.push(t0.elapsed());
    }
    dev.synchronize()?;
    let device_time = t_all.elapsed();
    let mut b = Vec::with_capacity(a.iters);
    for _ in 0..a.iters {
        let t0 = Instant::now();
        blocking()?;
        b.push(t0.elapsed());
    }
    Ok((q, b, device_time))
}

fn bench<D: Device>(
    a: &QueueArgs,
    gpus: usize,
    open: impl Fn(usize) -> Result<D> + Sync,
) -> Result<()> {
    let world = ThreadWorld::new(a.ranks);
    let results: Vec<Result<Times>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.ranks)
            .map(|r| {
                let t = world.transport(r);
                let open = &open;
                s.spawn(move || {
                    let c = Communicator::new(t?)?;
                    let dev = open(r % gpus.max(1))?;
                    rank_times(&c, &dev, a)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(pccl::Error::internal("a rank panicked")))
            })
            .collect()
    });
    let mut rows = Vec::new();
    for r in results {
        rows.push(r?);
    }
    let (mut q, mut b, device) = rows.swap_remove(0);
    let (qm, qa) = stats(&mut q);
    let (bm, ba) = stats(&mut b);
    let (what, qn, bn) = if a.reduce_scatter {
        (
            "INT8 quantized reduce-scatter (blocks of 256)",
            "queued (enqueue_reduce_scatter_q..._on)",
            "blocking (reduce_scatter_quantized_on)",
        )
    } else if a.quantized {
        (
            "INT8 quantized all-gather (blocks of 256)",
            "queued (enqueue_all_gather_quantized_on)",
            "blocking (all_gather_quantized_on)",
        )
    } else {
        (
            "all-reduce",
            "queued (enqueue_on)",
            "blocking (collective_on)",
        )
    };
    println!(
        "# host time per {} KiB f32 {what} call, rank 0 of {} thread-ranks on {} {} GPU(s), {} calls",
        a.size_kib, a.ranks, gpus, D::VENDOR, a.iters
    );
    println!("{:<40} {:>12} {:>12}", "call", "median(us)", "mean(us)");
    println!("{:<40} {:>12.1} {:>12.1}", qn, qm, qa);
    println!("{:<40} {:>12.1} {:>12.1}", bn, bm, ba);
    println!(
        "# queued calls until their stream drained: {:.1} us per call",
        device.as_secs_f64() * 1e6 / a.iters as f64
    );
    Ok(())
}

pub fn run(a: &QueueArgs) -> Result<()> {
    if a.hip {
        #[cfg(feature = "rocm")]
        {
            use pccl::device::hip::HipDevice;
            let gpus = HipDevice::count()?;
            return bench::<HipDevice>(a, gpus, HipDevice::open);
        }
        #[cfg(not(feature = "rocm"))]
        return Err(pccl::Error::usage(
            "--hip needs a build with --features rocm",
        ));
    }
    use pccl::device::cuda::CudaDevice;
    pccl::device::cuda::ensure_available()?;
    let gpus = CudaDevice::count()?;
    bench::<CudaDevice>(a, gpus, CudaDevice::open)
}
