//! `pccl-gpu-bench [kernels]`: GPU kernel benchmark: device-to-device copy bandwidth (the ceiling), the reduction kernels
//! and the hierarchical block transpose, timed with CUDA events (median of many runs after a
//! warm-up), each reported in GB/s and as a share of the measured copy bandwidth.
//!
//! Bytes count what must move through device memory: a copy reads and writes the buffer
//! (2 x size), a reduction reads two inputs and writes one output (3 x size), a transpose reads
//! and writes the grid (2 x size), a quantize reads the elements and writes the record, a
//! dequantize the reverse. Targets (issues "GPU path", "quantized"): reductions >= 85% of
//! copy, transpose and (de)quantization >= 80%.
//!
//! ```text
//! pccl-gpu-bench [kernels] [--size-mib 256] [--transpose-mib 64] [--iters 30] [--sweep]
//! ```
//! `--sweep` also times the reduction and the transpose under several launch shapes.

use half::bf16;
use pccl::device::api::Device;
use pccl::device::cuda::{self, CudaDevice, LaunchShape};
use pccl::quant::{self as quant, Quant};
use pccl::{DType, Element, ReduceOp, Result};

use super::KernelArgs as Args;

/// Median of `iters` event-timed runs of `work`, after three warm-up runs, in milliseconds.
fn median_ms(
    dev: &CudaDevice,
    iters: usize,
    mut work: impl FnMut(&CudaDevice) -> Result<()>,
) -> Result<(f64, f64, f64)> {
    for _ in 0..3 {
        work(dev)?;
    }
    dev.synchronize()?;
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        t.push(dev.time_ms(&mut work)?);
    }
    t.sort_by(|a, b| a.total_cmp(b));
    Ok((t[t.len() / 2], t[0], t[t.len() - 1]))
}

fn random_u32(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 16) as u32
        })
        .collect()
}

fn mismatches<T: Element>(got: &[T], a: &[T], b: &[T]) -> usize {
    let mut want = a.to_vec();
    T::reduce3(ReduceOp::Sum, &mut want, a, b);
    got.iter()
        .zip(&want)
        .filter(|(g, w)| bytemuck::bytes_of(*g) != bytemuck::bytes_of(*w))
        .count()
        + got.len().abs_diff(want.len())
}

struct Row {
    name: String,
    bytes: f64,
    ms: (f64, f64, f64),
}

impl Row {
    fn gbps(&self) -> f64 {
        self.bytes / (self.ms.0 * 1e-3) / 1e9
    }
}

fn print_row(r: &Row, copy_gbps: f64, target: Option<f64>) {
    let pct = 100.0 * r.gbps() / copy_gbps;
    let verdict = match target {
        Some(t) if pct >= t => format!("  target >= {t:.0}%: met"),
        Some(t) => format!("  target >= {t:.0}%: MISSED by {:.1} points", t - pct),
        None => String::new(),
    };
    println!(
        "{:<44} {:>9.3} ms (min {:.3}, max {:.3})  {:>8.1} GB/s  {:>6.1}% of copy{}",
        r.name,
        r.ms.0,
        r.ms.1,
        r.ms.2,
        r.gbps(),
        pct,
        verdict
    );
}

pub fn run(args: &Args) -> Result<()> {
    let mut dev = CudaDevice::open(0)?;
    let (dmaj, dmin) = cuda::driver_version()?;
    let (nmaj, nmin) = cuda::nvrtc_version()?;
    let (cmaj, cmin) = dev.compute_capability();
    println!("# pccl-gpu-bench");
    println!(
        "# device 0: {} (sm_{cmaj}{cmin}, {} SMs), driver CUDA {dmaj}.{dmin}, NVRTC {nmaj}.{nmin}",
        dev.name(),
        dev.multiprocessors()
    );
    println!(
        "# launch shape {:?}, median of {} event-timed runs after 3 warm-ups",
        dev.launch_shape(),
        args.iters
    );

    let size = args.size_mib << 20;
    let host_a = random_u32(size / 4, 0x1234_5678);
    let host_b = random_u32(size / 4, 0x9abc_def1);
    let a = dev.upload(&host_a)?;
    let mut d = dev.alloc_zeroed(size)?;

    // The ceiling: cuMemcpyDtoDAsync of the whole buffer.
    let copy = Row {
        name: format!("copy D2D {} MiB", args.size_mib),
        bytes: 2.0 * size as f64,
        ms: median_ms(&dev, args.iters, |dev| dev.copy(&a, &mut d))?,
    };
    let copy_gbps = copy.gbps();
    print_row(&copy, copy_gbps, None);

    // Reductions on random finite data.
    let to_f32 =
        |v: Vec<u32>| -> Vec<f32> { v.into_iter().map(|x| x as f32 * 1e-6 - 2000.0).collect() };
    let to_bf16 = |v: Vec<u32>| -> Vec<bf16> {
        v.into_iter()
            .map(|x| bf16::from_f32(x as f32 * 1e-6 - 2000.0))
            .collect()
    };
    let (hfa, hfb) = (to_f32(host_a), to_f32(host_b));
    let (hba, hbb) = (
        to_bf16(random_u32(size / 2, 7)),
        to_bf16(random_u32(size / 2, 11)),
    );
    let (fa, fb) = (dev.upload(&hfa)?, dev.upload(&hfb)?);
    let (ba, bb) = (dev.upload(&hba)?, dev.upload(&hbb)?);
    let mut rows = Vec::new();
    for dt in [DType::F32, DType::BF16] {
        let (x, y) = if dt == DType::F32 {
            (&fa, &fb)
        } else {
            (&ba, &bb)
        };
        let row = Row {
            name: format!("reduce {dt} sum {} MiB", args.size_mib),
            bytes: 3.0 * size as f64,
            ms: median_ms(&dev, args.iters, |dev| {
                dev.reduce(ReduceOp::Sum, dt, &mut d, x, y)
            })?,
        };
        print_row(&row, copy_gbps, Some(85.0));
        rows.push(row);
        // The timed result, checked against the host kernels bit for bit.
        let bad = if dt == DType::F32 {
            mismatches(&dev.download::<f32>(&d)?, &hfa, &hfb)
        } else {
            mismatches(&dev.download::<bf16>(&d)?, &hba, &hbb)
        };
        if bad != 0 {
            return Err(pccl::Error::internal(format!(
                "{dt} sum differs from the host in {bad} elements"
            )));
        }
        println!("# {dt} sum result identical to the host reduction");
    }

    rows.extend(quant_rows(&dev, args, copy_gbps, (&ba, &hba), &mut d)?);

    // Transpose of the hierarchical layout: M = 8 local ranks, N = 256 nodes.
    let tsize = args.transpose_mib << 20;
    let (m, n) = (8usize, 256usize);
    let block = tsize / (m * n);
    let ta = dev.upload(&random_u32(tsize / 4, 0x5555))?;
    let mut td = dev.alloc_zeroed(tsize)?;
    let tcopy = Row {
        name: format!(
            "copy D2D {} MiB (same size as the transpose)",
            args.transpose_mib
        ),
        bytes: 2.0 * tsize as f64,
        ms: median_ms(&dev, args.iters, |dev| dev.copy(&ta, &mut td))?,
    };
    print_row(&tcopy, copy_gbps, None);
    let tr = Row {
        name: format!(
            "transpose {m}x{n} blocks of {} KiB ({} MiB)",
            block >> 10,
            args.transpose_mib
        ),
        bytes: 2.0 * tsize as f64,
        ms: median_ms(&dev, args.iters, |dev| {
            dev.transpose_blocks(&ta, &mut td, m, n, block)
        })?,
    };
    print_row(&tr, copy_gbps, Some(80.0));
    let inv = Row {
        name: format!("inverse transpose {n}x{m} ({} MiB)", args.transpose_mib),
        bytes: 2.0 * tsize as f64,
        ms: median_ms(&dev, args.iters, |dev| {
            dev.untranspose_blocks(&ta, &mut td, m, n, block)
        })?,
    };
    print_row(&inv, copy_gbps, Some(80.0));
    // Small blocks (shared-memory tiles), for information.
    for s in [4usize, 16, 48, 128, 1024] {
        let nn = tsize / (m * s);
        let row = Row {
            name: format!("transpose {m}x{nn} blocks of {s} B"),
            bytes: 2.0 * (m * nn * s) as f64,
            ms: median_ms(&dev, args.iters, |dev| {
                dev.transpose_blocks(&ta, &mut td, m, nn, s)
            })?,
        };
        print_row(&row, copy_gbps, None);
    }

    if args.sweep {
        println!(
            "# sweep of launch shapes (threads per block x grid cap in blocks per SM; \
             0 = uncapped, one block per piece of work)"
        );
        let default = dev.launch_shape();
        for threads in [256u32, 512, 1024] {
            for bps in [1u32, 2, 4, 8, 0] {
                if bps as u64 * threads as u64 > 2048 {
                    continue;
                }
                dev.set_launch_shape(LaunchShape {
                    threads,
                    blocks_per_sm: bps,
                })?;
                let r = Row {
                    name: format!("  reduce f32 sum  threads={threads} bps={bps}"),
                    bytes: 3.0 * size as f64,
                    ms: median_ms(&dev, args.iters / 2 + 1, |dev| {
                        dev.reduce(ReduceOp::Sum, DType::F32, &mut d, &fa, &fb)
                    })?,
                };
                print_row(&r, copy_gbps, None);
                let r = Row {
                    name: format!("  reduce bf16 sum threads={threads} bps={bps}"),
                    bytes: 3.0 * size as f64,
                    ms: median_ms(&dev, args.iters / 2 + 1, |dev| {
                        dev.reduce(ReduceOp::Sum, DType::BF16, &mut d, &ba, &bb)
                    })?,
                };
                print_row(&r, copy_gbps, None);
                let r = Row {
                    name: format!("  transpose 8x256 threads={threads} bps={bps}"),
                    bytes: 2.0 * tsize as f64,
                    ms: median_ms(&dev, args.iters / 2 + 1, |dev| {
                        dev.transpose_blocks(&ta, &mut td, m, n, block)
                    })?,
                };
                print_row(&r, copy_gbps, None);
            }
        }
        dev.set_launch_shape(default)?;
    }

    println!("# summary (GB/s counts bytes read + written; % of the measured D2D copy)");
    println!("copy_gbps {:.1}", copy_gbps);
    for r in rows.iter().chain([&tcopy, &tr, &inv]) {
        println!(
            "{:<44} {:>8.1} GB/s {:>6.1}%",
            r.name,
            r.gbps(),
            100.0 * r.gbps() / copy_gbps
        );
    }
    Ok(())
}

/// Block quantization of the bf16 buffer `src` (its host copy `host`) into INT8 and INT4
/// records (blocks of 2048, ZeRO++'s weights) and back into `out`, timed, each result
/// checked against the host kernels byte for byte.
fn quant_rows(
    dev: &CudaDevice,
    args: &Args,
    copy_gbps: f64,
    (src, host): (&cudarc::driver::CudaSlice<u8>, &[bf16]),
    out: &mut cudarc::driver::CudaSlice<u8>,
) -> Result<Vec<Row>> {
    let size = host.len() * 2;
    let mut rows = Vec::new();
    for bits in [8u32, 4] {
        let q = Quant {
            bits,
            block: 2048,
            allow_nonfinite: false,
        };
        let rb = q.record_bytes(host.len());
        let rec = dev.alloc_zeroed(rb)?;
        let (x, r) = (
            Device::span_of(dev, src),
            Device::span_of(dev, &rec).sub(0, rb)?,
        );
        let o = Device::span_of(dev, out).sub(0, size)?;
        let enc = Row {
            name: format!("quantize bf16 -> int{bits} B=2048 {} MiB", args.size_mib),
            bytes: (size + rb) as f64,
            // SAFETY: `src` and `rec` live to the end of this function, past the timing's
            // synchronisation.
            ms: median_ms(dev, args.iters, |dev| unsafe {
                dev.quantize(DType::BF16, &q, x, r)
            })?,
        };
        print_row(&enc, copy_gbps, Some(80.0));
        let mut want = vec![0u8; rb];
        quant::quantize(&q, host, &mut want)?;
        let got: Vec<u8> = dev.download(&rec)?;
        let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        let dec = Row {
            name: format!("dequantize int{bits} -> bf16 B=2048 {} MiB", args.size_mib),
            bytes: (size + rb) as f64,
            // SAFETY: as above, `out` holds `size` bytes.
            ms: median_ms(dev, args.iters, |dev| unsafe {
                dev.dequantize(DType::BF16, &q, r, o, false)
            })?,
        };
        print_row(&dec, copy_gbps, Some(80.0));
        let mut back = vec![bf16::ZERO; host.len()];
        quant::dequantize(&q, &want, &mut back)?;
        let got: Vec<bf16> = dev.download(out)?;
        let bad_dec = got
            .iter()
            .zip(&back)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if bad + bad_dec != 0 {
            return Err(pccl::Error::internal(format!(
                "int{bits}: {bad} record bytes and {bad_dec} decoded elements differ from the host"
            )));
        }
        println!("# int{bits} records and decoded values identical to the host kernels");
        rows.push(enc);
        rows.push(dec);
    }
    Ok(rows)
}
