//! Collectives on device memory (`Communicator::*_device`, the host-staged device executor)
//! against the host reference, for every dtype x op, several node shapes and every
//! algorithm, with thread-ranks sharing one GPU (each rank its own stream and buffers) and
//! outputs poisoned before every run.
//!
//! Built without the `cuda` feature this file is one test that says it was skipped; built
//! with it on a machine without a GPU or driver, every test prints
//! `skipped: no CUDA driver (reason)` and passes. `direct_device_path_every_dtype_and_op`
//! runs the same checks on the direct path (thread world in device mode, no host staging).
//! `scripts/gpu-check.sh` runs it on a GPU.

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_collectives_skipped() {
    println!("skipped: built without the cuda feature");
}

#[cfg(feature = "cuda")]
#[path = "common.rs"]
mod common;

#[cfg(feature = "cuda")]
mod gpu {
    use super::common::{input, reduced, same_bits, value};
    use cudarc::driver::DevicePtrMut;
    use half::{bf16, f16};
    use pccl::config::{Config, NcclMode};
    use pccl::device::cuda::{self, CudaDevice};
    use pccl::device::nccl;
    use pccl::ThreadWorld;
    use pccl::{Algorithm, Communicator, Element, ErrorKind, RawCollective, ReduceOp};

    /// Whether CUDA can run here (after printing why not); with `PCCL_REQUIRE_CUDA=1` a
    /// missing driver is a failure.
    fn cuda_ok() -> bool {
        if let Err(e) = cuda::ensure_available() {
            assert_eq!(e.kind(), ErrorKind::System, "unexpected error kind: {e}");
            if std::env::var("PCCL_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("PCCL_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
            }
            println!("skipped: no CUDA driver ({})", e.message());
            return false;
        }
        match CudaDevice::count() {
            Ok(0) => {
                println!("skipped: no CUDA driver (the driver reports no CUDA device)");
                false
            }
            Ok(_) => true,
            Err(e) => panic!("CUDA is available but counting devices failed: {e}"),
        }
    }

    const SIZES: [usize; 4] = [0, 1, 7, 300_001];
    const POISON: u8 = 0xa5;

    fn check<T: Element>(what: &str, got: &[T], want: &[T]) {
        if !same_bits(got, want) {
            let i = got
                .iter()
                .zip(want)
                .position(|(g, w)| bytemuck::bytes_of(g) != bytemuck::bytes_of(w))
                .unwrap_or(0);
            panic!(
                "{what}: results differ (len {} vs {}); first at {i}: got {:?}, want {:?}",
                got.len(),
                want.len(),
                got.get(i),
                want.get(i)
            );
        }
    }

    fn poisoned(dev: &CudaDevice, bytes: usize) -> cudarc::driver::CudaSlice<u8> {
        let mut b = dev.alloc_zeroed(bytes).unwrap();
        dev.fill(&mut b, POISON).unwrap();
        b
    }

    /// Every collective for one dtype on one rank.
    fn run_dtype<T: Element>(c: &Communicator, dev: &CudaDevice, tag: &str) {
        let (p, me) = (c.size(), c.rank());
        let es = std::mem::size_of::<T>();
        for &n in &SIZES {
            let ctx = |coll: &str, op: Option<ReduceOp>| {
                format!("{tag} {} {coll} {op:?} n={n} rank {me}/{p}", T::DTYPE)
            };
            // all-gather
            let inp = dev.upload(&input::<T>(me, n, ReduceOp::Sum)).unwrap();
            let mut out = poisoned(dev, n * p * es);
            c.all_gather_device::<T>(dev, &inp, &mut out)
                .unwrap_or_else(|e| panic!("{}: {e}", ctx("all_gather", None)));
            let want: Vec<T> = (0..p)
                .flat_map(|r| input::<T>(r, n, ReduceOp::Sum))
                .collect();
            check(
                &ctx("all_gather", None),
                &dev.download::<T>(&out).unwrap(),
                &want,
            );
            // broadcast from the last rank
            let root = p - 1;
            let mut buf = if me == root {
                dev.upload(&input::<T>(root, n, ReduceOp::Sum)).unwrap()
            } else {
                poisoned(dev, n * es)
            };
            c.broadcast_device::<T>(dev, &mut buf, root)
                .unwrap_or_else(|e| panic!("{}: {e}", ctx("broadcast", None)));
            check(
                &ctx("broadcast", None),
                &dev.download::<T>(&buf).unwrap(),
                &input::<T>(root, n, ReduceOp::Sum),
            );
            for op in ReduceOp::ALL {
                if T::DTYPE.check_op(op).is_err() {
                    continue;
                }
                // reduce-scatter (global element index j = r*n + i)
                let inp: Vec<T> = (0..n * p).map(|j| value::<T>(me, j, op)).collect();
                let dinp = dev.upload(&inp).unwrap();
                let mut out = poisoned(dev, n * es);
                c.reduce_scatter_device::<T>(dev, &dinp, &mut out, op)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("reduce_scatter", Some(op))));
                let want: Vec<T> = (0..n).map(|i| reduced::<T>(p, me * n + i, op)).collect();
                check(
                    &ctx("reduce_scatter", Some(op)),
                    &dev.download::<T>(&out).unwrap(),
                    &want,
                );
                // all-reduce, out of place and in place
                let dinp = dev.upload(&input::<T>(me, n, op)).unwrap();
                let mut out = poisoned(dev, n * es);
                c.all_reduce_device::<T>(dev, &dinp, &mut out, op)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("all_reduce", Some(op))));
                let want: Vec<T> = (0..n).map(|i| reduced::<T>(p, i, op)).collect();
                check(
                    &ctx("all_reduce", Some(op)),
                    &dev.download::<T>(&out).unwrap(),
                    &want,
                );
                let mut buf = dev.upload(&input::<T>(me, n, op)).unwrap();
                c.all_reduce_device_in_place::<T>(dev, &mut buf, op)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("all_reduce_in_place", Some(op))));
                check(
                    &ctx("all_reduce_in_place", Some(op)),
                    &dev.download::<T>(&buf).unwrap(),
                    &want,
                );
            }
        }
    }

    fn run_shape(p: usize, m: usize, algo: Option<&str>, chunk: usize) {
        run_shape_with(p, m, algo, chunk, NcclMode::Off);
    }

    fn run_shape_with(p: usize, m: usize, algo: Option<&str>, chunk: usize, nccl: NcclMode) {
        if !cuda_ok() {
            return;
        }
        let cfg = Config {
            ranks_per_node: Some(m),
            algo: algo.map(|a| a.parse::<Algorithm>().unwrap()),
            chunk_bytes: chunk,
            chunk_explicit: true,
            nccl,
            ..Config::default()
        };
        let tag = format!("{}x{} {} nccl {nccl:?}", p / m, m, algo.unwrap_or("tuned"));
        Communicator::run_threads(p, cfg, |c| {
            let dev = CudaDevice::open(0).expect("open device 0");
            run_dtype::<i8>(&c, &dev, &tag);
            run_dtype::<u8>(&c, &dev, &tag);
            run_dtype::<i32>(&c, &dev, &tag);
            run_dtype::<u32>(&c, &dev, &tag);
            run_dtype::<i64>(&c, &dev, &tag);
            run_dtype::<u64>(&c, &dev, &tag);
            run_dtype::<f16>(&c, &dev, &tag);
            run_dtype::<bf16>(&c, &dev, &tag);
            run_dtype::<f32>(&c, &dev, &tag);
            run_dtype::<f64>(&c, &dev, &tag);
        })
        .expect("thread world");
        println!("ok: {tag}");
    }

    #[test]
    fn shape_2x2_every_algorithm() {
        for algo in ["ring", "rd", "hier-rd", "hier-ring", "hier-rd-rd"] {
            run_shape(4, 2, Some(algo), 1 << 16);
        }
    }

    #[test]
    fn shape_3x1_every_algorithm() {
        for algo in ["ring", "rd", "hier-ring"] {
            run_shape(3, 1, Some(algo), 1 << 20);
        }
    }

    #[test]
    fn shape_1x3_and_unequal_tuned() {
        run_shape(3, 3, None, 1 << 18);
        // 5 ranks on nodes of 2, 2, 1: the hierarchical algorithm falls back to flat.
        run_shape(5, 2, Some("hier-rd"), 1 << 16);
    }

    /// The direct device path: a thread world in device mode moves device memory itself
    /// (`ThreadWorld::with_device_direct`), so the device executor hands it device pointers
    /// (contiguous spans in place, strided ones packed / landed in device temporaries)
    /// instead of staging through pinned host memory.
    fn run_shape_direct(p: usize, m: usize, algo: &str, chunk: usize) {
        if !cuda_ok() {
            return;
        }
        let cfg = Config {
            ranks_per_node: Some(m),
            algo: Some(algo.parse::<Algorithm>().unwrap()),
            chunk_bytes: chunk,
            chunk_explicit: true,
            nccl: NcclMode::Off,
            device_direct: true,
            timeout: std::time::Duration::from_secs(120),
            ..Config::default()
        };
        let tag = format!("{}x{} {algo} direct", p.div_ceil(m), m);
        let world = ThreadWorld::new(p).with_device_direct(true);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..p)
                .map(|r| {
                    let t = world.transport(r).expect("transport");
                    assert!(t.moves_device_memory(), "device mode is on");
                    let (cfg, tag) = (cfg.clone(), &tag);
                    s.spawn(move || {
                        let c = Communicator::with_config(t, cfg).expect("communicator");
                        let dev = CudaDevice::open(0).expect("open device 0");
                        run_dtype::<i8>(&c, &dev, tag);
                        run_dtype::<u8>(&c, &dev, tag);
                        run_dtype::<i32>(&c, &dev, tag);
                        run_dtype::<u32>(&c, &dev, tag);
                        run_dtype::<i64>(&c, &dev, tag);
                        run_dtype::<u64>(&c, &dev, tag);
                        run_dtype::<f16>(&c, &dev, tag);
                        run_dtype::<bf16>(&c, &dev, tag);
                        run_dtype::<f32>(&c, &dev, tag);
                        run_dtype::<f64>(&c, &dev, tag);
                    })
                })
                .collect();
            for h in handles {
                if let Err(e) = h.join() {
                    std::panic::resume_unwind(e);
                }
            }
        });
        println!("ok: {tag}");
    }

    #[test]
    fn direct_device_path_every_dtype_and_op() {
        for algo in ["ring", "rd"] {
            run_shape_direct(3, 1, algo, 1 << 20);
        }
        // Strided spans: packed sends and landed receives.
        run_shape_direct(4, 2, "hier-rd", 1 << 16);
        // 5 ranks on nodes of 2, 2, 1: the hierarchical algorithm falls back to flat.
        run_shape_direct(5, 2, "hier-rd", 1 << 16);
    }

    /// Ranks that disagree on the path (one direct, one staged) fail with an error naming
    /// both kinds of memory instead of hanging or copying out of a device address — which
    /// also shows that `device_direct` really takes the direct path.
    #[test]
    fn direct_and_staged_ranks_disagree_with_an_error() {
        if !cuda_ok() {
            return;
        }
        let world = ThreadWorld::new(2).with_device_direct(true);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let t = world.transport(r).expect("transport");
                    let cfg = Config {
                        ranks_per_node: Some(1),
                        nccl: NcclMode::Off,
                        device_direct: r == 0,
                        timeout: std::time::Duration::from_secs(30),
                        ..Config::default()
                    };
                    s.spawn(move || {
                        let c = Communicator::with_config(t, cfg).expect("communicator");
                        let dev = CudaDevice::open(0).expect("open device 0");
                        let mut d = dev.upload(&[1.0f32; 64]).unwrap();
                        c.all_reduce_device_in_place::<f32>(&dev, &mut d, ReduceOp::Sum)
                            .unwrap_err()
                    })
                })
                .collect();
            for h in handles {
                let e = h.join().expect("rank thread");
                assert!(e.message().contains("memory from rank"), "{e}");
            }
        });
    }

    /// Whether NCCL can be loaded (after printing why not); with `PCCL_REQUIRE_NCCL=1` a
    /// missing NCCL is a failure.
    fn nccl_ok() -> bool {
        match nccl::version() {
            Ok(v) => {
                println!("NCCL {v} from {}", nccl::library_path().unwrap_or("?"));
                true
            }
            Err(e) => {
                if std::env::var("PCCL_REQUIRE_NCCL").is_ok_and(|v| v == "1") {
                    panic!("PCCL_REQUIRE_NCCL=1 but NCCL is not usable: {e}");
                }
                println!("skipped: no NCCL ({})", e.message());
                false
            }
        }
    }

    /// The two-level path: NCCL communicators of one rank per node (one GPU cannot hold two
    /// ranks of an NCCL communicator), the inter-node level host-staged between thread-ranks.
    #[test]
    fn nccl_level_every_dtype_and_op() {
        if !cuda_ok() || !nccl_ok() {
            return;
        }
        for p in [1, 2, 3, 4] {
            run_shape_with(p, 1, None, 1 << 18, NcclMode::On);
        }
        run_shape_with(3, 1, Some("ring"), 1 << 16, NcclMode::On);
    }

    /// Two ranks of one node on one GPU cannot share an NCCL communicator: `PCCL_NCCL=1` says
    /// so; `auto` runs host-staged instead.
    #[test]
    fn nccl_level_refuses_ranks_sharing_a_gpu() {
        if !cuda_ok() || !nccl_ok() {
            return;
        }
        for mode in [NcclMode::On, NcclMode::Auto] {
            let cfg = Config {
                ranks_per_node: Some(2),
                nccl: mode,
                ..Config::default()
            };
            Communicator::run_threads(2, cfg, |c| {
                let dev = CudaDevice::open(0).expect("open device 0");
                let mut d = dev.upload(&[c.rank() as f32 + 1.0; 64]).unwrap();
                let r = c.all_reduce_device_in_place::<f32>(&dev, &mut d, ReduceOp::Sum);
                match mode {
                    NcclMode::On => {
                        let e = r.unwrap_err();
                        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
                        assert!(e.message().contains("share one GPU"), "{e}");
                    }
                    _ => {
                        r.unwrap();
                        assert!(dev.download::<f32>(&d).unwrap().iter().all(|&x| x == 3.0));
                    }
                }
            })
            .expect("thread world");
        }
    }

    /// Enqueued (stream-ordered) collectives: several in a row on the rank's stream with no
    /// host wait between them, then host collectives, then one synchronisation; staged
    /// (ranks sharing the GPU) and with the NCCL level (one rank per node).
    #[test]
    fn enqueued_collectives_are_stream_ordered() {
        if !cuda_ok() {
            return;
        }
        for m in [2, 1] {
            let cfg = Config {
                ranks_per_node: Some(m),
                ..Config::default()
            };
            Communicator::run_threads(2, cfg, |c| {
                let dev = CudaDevice::open(0).expect("open device 0");
                let me = c.rank();
                let n = 1 << 18;
                let mut buf = dev.upload(&vec![me as f32 + 1.0; n]).unwrap();
                let mut out = dev.alloc_zeroed(2 * n * 4).unwrap();
                let mut want = 3.0f32;
                // The first collective of each shape runs blocking (it sizes the buffers);
                // the second round is all enqueued.
                for round in 0..2 {
                    let (b, g) = buf.device_ptr_mut(dev.stream());
                    let (o, go) = out.device_ptr_mut(dev.stream());
                    for i in 0..3 {
                        // SAFETY: both buffers outlive the synchronisation below.
                        unsafe {
                            c.enqueue_collective_device::<f32>(
                                &dev,
                                RawCollective::AllReduce(ReduceOp::Sum),
                                b,
                                b,
                                n,
                            )
                        }
                        .unwrap();
                        if round + i > 0 {
                            want *= 2.0;
                        }
                    }
                    // SAFETY: as above.
                    unsafe {
                        c.enqueue_collective_device::<f32>(&dev, RawCollective::AllGather, b, o, n)
                    }
                    .unwrap();
                    let mut host = vec![me as u32; 4];
                    c.all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap();
                    assert_eq!(host, [1; 4]);
                    dev.synchronize().unwrap();
                    drop((g, go));
                    let got = dev.download::<f32>(&out).unwrap();
                    assert!(
                        got.iter().all(|&x| x == want),
                        "m={m} round {round}: want {want}, got {:?}",
                        &got[..4]
                    );
                }
            })
            .expect("thread world");
        }
    }

    #[test]
    fn host_and_device_collectives_interleave() {
        if !cuda_ok() {
            return;
        }
        let cfg = Config {
            ranks_per_node: Some(1),
            ..Config::default()
        };
        Communicator::run_threads(2, cfg, |c| {
            let dev = CudaDevice::open(0).expect("open device 0");
            let me = c.rank();
            for round in 0..3 {
                let mut host = vec![me as f32 + round as f32; 1000];
                c.all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap();
                assert!(host.iter().all(|&x| x == 1.0 + 2.0 * round as f32));
                let mut d = dev.upload(&vec![me as f32; 1000]).unwrap();
                c.all_reduce_device_in_place::<f32>(&dev, &mut d, ReduceOp::Sum)
                    .unwrap();
                assert!(dev.download::<f32>(&d).unwrap().iter().all(|&x| x == 1.0));
                let req = c.barrier_async().unwrap();
                let g = dev.upload(&[me as u32; 5]).unwrap();
                let mut out = dev.alloc_zeroed(40).unwrap();
                c.all_gather_device::<u32>(&dev, &g, &mut out).unwrap();
                assert_eq!(
                    dev.download::<u32>(&out).unwrap(),
                    [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
                );
                req.wait().unwrap();
                // In-place reduce-scatter and all-gather.
                let mut rs = dev.upload(&[1u32, 2, 3, 4]).unwrap();
                c.reduce_scatter_device_in_place::<u32>(&dev, &mut rs, ReduceOp::Sum)
                    .unwrap();
                let got = dev.download::<u32>(&rs).unwrap();
                assert_eq!(
                    &got[me * 2..me * 2 + 2],
                    &[2 * (me as u32 * 2 + 1), 2 * (me as u32 * 2 + 2)]
                );
                let mut ag = dev.upload(&[9u32, 9, 9, 9]).unwrap();
                let mine = dev.upload(&[me as u32 + 10; 2]).unwrap();
                let mut view = ag.slice_mut(me * 8..me * 8 + 8);
                dev.copy(&mine, &mut view).unwrap();
                c.all_gather_device_in_place::<u32>(&dev, &mut ag).unwrap();
                assert_eq!(dev.download::<u32>(&ag).unwrap(), [10, 10, 11, 11]);
            }
        })
        .expect("thread world");
    }

    /// The quantized all-gather and reduce-scatter on CUDA memory (csrc/quant.cu) equal the
    /// host forms bit for bit, on 4 thread ranks as 2 nodes of 2 (two hops) sharing the GPU.
    #[test]
    fn quantized_collectives_on_cuda_memory_equal_the_host_forms() {
        if !cuda_ok() {
            return;
        }
        let cfg = Config {
            ranks_per_node: Some(2),
            ..Config::default()
        };
        Communicator::run_threads(4, cfg, |c| {
            let dev = CudaDevice::open(0).expect("open device 0");
            let (me, p) = (c.rank(), c.size());
            for (bits, block, n) in [(8u32, 2048usize, 5000usize), (4, 64, 777)] {
                let q = pccl::Quant {
                    bits,
                    block,
                    allow_nonfinite: false,
                };
                let x: Vec<half::bf16> = (0..n * p)
                    .map(|i| half::bf16::from_f32(((i * 31 + me * 7) % 201) as f32 / 10.0 - 10.0))
                    .collect();
                let mut want = vec![half::bf16::ZERO; n * p];
                c.all_gather_quantized(&x[..n], &mut want, q).unwrap();
                let input = dev.upload(&x[..n]).unwrap();
                let mut out = poisoned(&dev, n * p * 2);
                c.all_gather_quantized_device::<half::bf16>(&dev, &input, &mut out, q)
                    .unwrap();
                check("all_gather_quantized", &dev.download(&out).unwrap(), &want);
                let mut want = vec![half::bf16::ZERO; n];
                c.reduce_scatter_quantized(&x, &mut want, q, true).unwrap();
                let input = dev.upload(&x).unwrap();
                let mut out = poisoned(&dev, n * 2);
                c.reduce_scatter_quantized_device::<half::bf16>(&dev, &input, &mut out, q, true)
                    .unwrap();
                check(
                    "reduce_scatter_quantized",
                    &dev.download(&out).unwrap(),
                    &want,
                );
            }
        })
        .expect("thread world");
    }

    #[test]
    fn bad_device_arguments_are_errors() {
        if !cuda_ok() {
            return;
        }
        let cfg = Config {
            ranks_per_node: Some(1),
            ..Config::default()
        };
        Communicator::run_threads(1, cfg, |c| {
            let dev = CudaDevice::open(0).expect("open device 0");
            let a = dev.alloc_zeroed(6).unwrap();
            let mut b = dev.alloc_zeroed(8).unwrap();
            let e = c.all_gather_device::<f32>(&dev, &a, &mut b).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let a = dev.alloc_zeroed(8).unwrap();
            let e = c
                .reduce_scatter_device::<i32>(&dev, &a, &mut b, ReduceOp::Avg)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let e = c.broadcast_device::<f32>(&dev, &mut b, 3).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        })
        .expect("thread world");
    }
}
