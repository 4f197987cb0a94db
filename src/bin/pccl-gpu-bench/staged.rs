//! `pccl-gpu-bench staged`: benchmark of the host-staged device collectives: a reduce-scatter (f32, sum) on device
//! memory between thread-ranks sharing one GPU, and each of its stages alone, all ranks at
//! once as in the collective:
//!
//! - D2H: the bytes a rank sends ((P-1)/P of its input), device -> pinned host;
//! - transfer: the host reduce-scatter of the same size on host buffers (threads transport,
//!   host reduction included);
//! - H2D: the bytes a rank receives, pinned host -> device;
//! - reduce: the device reduction kernel over them (`dst = a + b`);
//! - pure transfer: a host all-gather moving the same bytes per rank with no reduction (the
//!   threads transport's copy alone);
//! - both host collectives again on pinned host buffers (the memory the staging uses);
//! - host memcpy: one pinned-to-pinned copy of the received bytes per rank, the transfer the
//!   threads transport does for the staged path.
//!
//! Times are wall-clock, the slowest rank, median of `--iters` runs after a warm-up. The
//! issue's target: total / slowest stage <= 1.3.
//!
//! ```text
//! pccl-gpu-bench staged [--size-mib 256] [--ranks 2] [--iters 5] [--piece-mib 4] [--algo ring]
//! ```

use pccl::config::Config;
use pccl::device::cuda::{CudaDevice, PinnedBuffer};
use pccl::{Communicator, DType, ReduceOp, Result};

use super::StagedArgs as Args;
use std::time::Instant;

/// Runs `f` `iters` times after one warm-up, all ranks starting together; returns the
/// median over runs of the slowest rank's seconds.
fn timed(c: &Communicator, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        c.barrier()?;
        let t = Instant::now();
        f()?;
        let mut s = [t.elapsed().as_secs_f64()];
        c.all_reduce_in_place(&mut s, ReduceOp::Max)?;
        v.push(s[0]);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

pub fn run(a: &Args) -> Result<()> {
    let p = a.ranks;
    if p < 2 {
        return Err(pccl::Error::invalid("--ranks must be at least 2"));
    }
    let bytes = (a.size_mib << 20) / (4 * p) * (4 * p);
    let n = bytes / 4;
    let count = n / p;
    let moved = count * 4 * (p - 1);
    // H2D lands in the output (one block), so it is timed over at most one block.
    let h2d_len = moved.min(count * 4);
    let mut cfg = Config::from_env()?;
    cfg.ranks_per_node.get_or_insert(1);
    cfg.chunk_bytes = a.piece_mib << 20;
    if a.algo.is_some() {
        cfg.algo = a.algo;
    }
    let results = Communicator::run_threads(p, cfg, |c| -> Result<Option<[f64; 9]>> {
        let dev = CudaDevice::open(0)?;
        let me = c.rank();
        let input = dev.upload(&vec![(me + 1) as f32; n])?;
        let mut out = dev.alloc_zeroed(count * 4)?;
        let total = timed(&c, a.iters, || {
            c.reduce_scatter_device::<f32>(&dev, &input, &mut out, ReduceOp::Sum)
        })?;
        let got = dev.download::<f32>(&out)?;
        let want = (p * (p + 1) / 2) as f32;
        if let Some(i) = got.iter().position(|&x| x != want) {
            return Err(pccl::Error::internal(format!(
                "rank {me}: element {i} is {} instead of {want}",
                got[i]
            )));
        }
        let mut host = PinnedBuffer::new(&dev, moved)?;
        let (src, _g) = cudarc::driver::DevicePtr::device_ptr(&input, dev.stream());
        let (dst, _h) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut out, dev.stream());
        let d2h = timed(&c, a.iters, || {
            // SAFETY: `src` holds `n >= moved / 4` f32 and `host` `moved` bytes; synchronised
            // before either is used again.
            unsafe { dev.copy_dtoh_raw(dev.stream(), host.as_mut_ptr(), src, moved)? };
            dev.synchronize()
        })?;
        let h2d = timed(&c, a.iters, || {
            // SAFETY: `dst` holds `count` f32 and `host` at least `h2d_len` bytes.
            unsafe { dev.copy_htod_raw(dev.stream(), dst, host.as_ptr(), h2d_len)? };
            dev.synchronize()
        })?;
        let reduce = timed(&c, a.iters, || {
            // SAFETY: `dst` holds `count` f32, `src` `n >= 2*count` f32 (p >= 2): two blocks.
            unsafe {
                dev.reduce_raw(
                    ReduceOp::Sum,
                    DType::F32,
                    dst,
                    src,
                    src + (count * 4) as u64,
                    count * 4,
                )?
            };
            dev.synchronize()
        })?;
        let hin = vec![(me + 1) as f32; n];
        let mut hout = vec![0f32; count];
        let transfer = timed(&c, a.iters, || {
            c.reduce_scatter(&hin, &mut hout, ReduceOp::Sum)
        })?;
        drop(hin);
        let mut gathered = vec![0f32; count * p];
        let pure = timed(&c, a.iters, || c.all_gather(&hout, &mut gathered))?;
        // The same two host collectives on pinned host buffers (what the staging uses).
        let mut pin_in = PinnedBuffer::new(&dev, n * 4)?;
        let mut pin_out = PinnedBuffer::new(&dev, count * 4)?;
        let mut pin_all = PinnedBuffer::new(&dev, count * p * 4)?;
        bytemuck::cast_slice_mut::<u8, f32>(pin_in.as_mut_slice()).fill((me + 1) as f32);
        let pin_rs = timed(&c, a.iters, || {
            let i: &[f32] = bytemuck::cast_slice(pin_in.as_mut_slice());
            let o: &mut [f32] = bytemuck::cast_slice_mut(pin_out.as_mut_slice());
            c.reduce_scatter(i, o, ReduceOp::Sum)
        })?;
        let pin_ag = timed(&c, a.iters, || {
            let o: &mut [f32] = bytemuck::cast_slice_mut(pin_all.as_mut_slice());
            c.all_gather(&hout, o)
        })?;
        // The threads transport's part of the staged path: one host copy of the received
        // bytes, pinned to pinned, one thread per rank.
        let memcpy = timed(&c, a.iters, || {
            let src = &pin_in.as_mut_slice()[..moved];
            pin_all.as_mut_slice()[..moved].copy_from_slice(src);
            Ok(())
        })?;
        Ok((me == 0).then_some([
            total, d2h, transfer, h2d, reduce, pure, pin_rs, pin_ag, memcpy,
        ]))
    })?;
    let mut r = None;
    for x in results {
        if let Some(v) = x? {
            r = Some(v);
        }
    }
    let [total, d2h, transfer, h2d, reduce, pure, pin_rs, pin_ag, memcpy] =
        r.ok_or_else(|| pccl::Error::internal("rank 0 returned no timings"))?;
    let dev = CudaDevice::open(0)?;
    println!(
        "# pccl-gpu-bench staged: reduce-scatter f32 sum, {} MiB input per rank, {p} thread-ranks \
         on one {}, pieces of {} MiB, median of {} (slowest rank)",
        bytes >> 20,
        dev.name(),
        a.piece_mib,
        a.iters
    );
    let gbs = |t: f64, b: usize| b as f64 / t / 1e9;
    println!("{:<28} {:>10} {:>12}", "stage", "ms", "GB/s/rank");
    let rows = [
        ("total (device collective)", total, moved),
        ("D2H of sent bytes", d2h, moved),
        ("transfer (host collective)", transfer, moved),
        ("H2D of received bytes", h2d, h2d_len),
        ("reduce kernel", reduce, count * 4),
        ("pure transfer (all-gather)", pure, moved),
        ("transfer, pinned host bufs", pin_rs, moved),
        ("pure transfer, pinned bufs", pin_ag, moved),
        ("host memcpy pinned->pinned", memcpy, moved),
    ];
    for (name, t, b) in rows {
        println!("{name:<28} {:>10.2} {:>12.2}", t * 1e3, gbs(t, b));
    }
    let slowest = d2h.max(transfer).max(h2d).max(reduce);
    println!(
        "total / slowest stage = {:.2} (target <= 1.3); total / sum of stages = {:.2}",
        total / slowest,
        total / (d2h + transfer + h2d + reduce)
    );
    let slowest_pin = d2h.max(pin_ag).max(h2d).max(reduce);
    println!(
        "with the pinned pure transfer as the transfer stage: total / slowest = {:.2}, \
         total / sum = {:.2}",
        total / slowest_pin,
        total / (d2h + pin_ag + h2d + reduce)
    );
    let slowest_copy = d2h.max(memcpy).max(h2d).max(reduce);
    println!(
        "with the host memcpy as the transfer stage: total / slowest = {:.2}, total / sum = {:.2}",
        total / slowest_copy,
        total / (d2h + memcpy + h2d + reduce)
    );
    let slowest_pure = d2h.max(pure).max(h2d).max(reduce);
    println!(
        "with the pure transfer as the transfer stage: total / slowest = {:.2}, \
         total / sum = {:.2}",
        total / slowest_pure,
        total / (d2h + pure + h2d + reduce)
    );
    Ok(())
}
