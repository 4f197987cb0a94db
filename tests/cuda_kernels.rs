//! Checks of the CUDA kernels (`csrc/*.cu` through `pccl::device::cuda`) against the host
//! reference in `src/device/host.rs`, on random data, with outputs poisoned before every run.
//!
//! Built without the `cuda` feature this file is one test that says it was skipped; built
//! with it on a machine without a GPU or driver, every test prints
//! `skipped: no CUDA driver (reason)` and passes. `scripts/gpu-check.sh` runs it on a GPU.

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_kernels_skipped() {
    println!("skipped: built without the cuda feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use half::{bf16, f16};
    use pccl::device::cuda::{self, CudaDevice};
    use pccl::{DType, Element, ErrorKind, ReduceOp};

    /// SplitMix64: small, fast, good enough for test data.
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Self {
            Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
        }
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    /// Random finite values that exercise wrapping (integers) and rounding (floats).
    trait Random: Element {
        fn random(r: &mut Rng) -> Self;
    }
    macro_rules! random_int {
        ($($t:ty),*) => {$(
            impl Random for $t {
                fn random(r: &mut Rng) -> Self {
                    r.next() as $t
                }
            }
        )*};
    }
    random_int!(i8, u8, i32, u32, i64, u64);
    impl Random for f32 {
        fn random(r: &mut Rng) -> Self {
            (r.unit() * 1000.0) as f32
        }
    }
    impl Random for f64 {
        fn random(r: &mut Rng) -> Self {
            r.unit() * 1.0e6
        }
    }
    impl Random for f16 {
        fn random(r: &mut Rng) -> Self {
            f16::from_f32((r.unit() * 200.0) as f32)
        }
    }
    impl Random for bf16 {
        fn random(r: &mut Rng) -> Self {
            bf16::from_f32((r.unit() * 1000.0) as f32)
        }
    }

    fn random_vec<T: Random>(r: &mut Rng, n: usize) -> Vec<T> {
        (0..n).map(|_| T::random(r)).collect()
    }

    /// The device, or `None` (after printing why) where CUDA is not available. When the driver
    /// is there, failing to open the device is a test failure, not a skip; with
    /// `PCCL_REQUIRE_CUDA=1` (set by scripts/gpu-check.sh where a GPU is visible) so is a
    /// missing driver or NVRTC.
    fn device() -> Option<CudaDevice> {
        if let Err(e) = cuda::ensure_available() {
            assert_eq!(e.kind(), ErrorKind::System, "unexpected error kind: {e}");
            if std::env::var("PCCL_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("PCCL_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
            }
            println!("skipped: no CUDA driver ({})", e.message());
            return None;
        }
        match CudaDevice::count() {
            Ok(0) => {
                println!("skipped: no CUDA driver (the driver reports no CUDA device)");
                None
            }
            Ok(_) => Some(
                CudaDevice::open(0)
                    .unwrap_or_else(|e| panic!("CUDA is available but device 0 failed: {e}")),
            ),
            Err(e) => panic!("CUDA is available but counting devices failed: {e}"),
        }
    }

    const POISONS: [u8; 2] = [0xa5, 0x5a];

    fn assert_same_bits<T: Element>(what: &str, got: &[T], want: &[T]) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let gb: &[u8] = bytemuck::cast_slice(got);
        let wb: &[u8] = bytemuck::cast_slice(want);
        if gb != wb {
            let i = got
                .iter()
                .zip(want)
                .position(|(g, w)| bytemuck::bytes_of(g) != bytemuck::bytes_of(w))
                .unwrap_or(0);
            let bad = got
                .iter()
                .zip(want)
                .filter(|(g, w)| bytemuck::bytes_of(*g) != bytemuck::bytes_of(*w))
                .count();
            panic!(
                "{what}: {bad} of {} elements differ; first at {i}: got {:?}, want {:?}",
                got.len(),
                got[i],
                want[i]
            );
        }
    }

    /// Element offsets of (dst, a, b) inside larger buffers: aligned, equally misaligned (the
    /// kernel peels a scalar head), and differently misaligned (the kernel runs scalar).
    const OFFSETS: [(usize, usize, usize); 3] = [(0, 0, 0), (1, 1, 1), (2, 1, 0)];

    fn check_reduce<T: Random>(dev: &CudaDevice, rng: &mut Rng) {
        let lens = [1usize, 15, 17, 1000, 65_537, (1 << 20) + 7];
        let es = std::mem::size_of::<T>();
        for op in ReduceOp::ALL {
            if !T::DTYPE.is_float() && op == ReduceOp::Avg {
                let a = dev.upload(&[T::from_i64(1)]).unwrap();
                let b = dev.upload(&[T::from_i64(2)]).unwrap();
                let mut d = dev.alloc_zeroed(es).unwrap();
                let e = dev.reduce(op, T::DTYPE, &mut d, &a, &b).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                continue;
            }
            for &n in &lens {
                for &(od, oa, ob) in &OFFSETS {
                    if n < 1000 && (od, oa, ob) != (0, 0, 0) && n != 17 {
                        continue;
                    }
                    let a: Vec<T> = random_vec(rng, n);
                    let b: Vec<T> = random_vec(rng, n);
                    let mut want = vec![T::from_i64(0); n];
                    T::reduce3(op, &mut want, &a, &b);
                    if op == ReduceOp::Avg {
                        T::divide(&mut want, 3);
                    }
                    let bytes = n * es;
                    let mut ba = dev.alloc_zeroed(bytes + 64).unwrap();
                    let mut bb = dev.alloc_zeroed(bytes + 64).unwrap();
                    let mut bd = dev.alloc_zeroed(bytes + 64).unwrap();
                    dev.upload_into(&a, &mut ba.slice_mut(oa * es..oa * es + bytes))
                        .unwrap();
                    dev.upload_into(&b, &mut bb.slice_mut(ob * es..ob * es + bytes))
                        .unwrap();
                    for poison in POISONS {
                        let va = ba.slice(oa * es..oa * es + bytes);
                        let vb = bb.slice(ob * es..ob * es + bytes);
                        let mut vd = bd.slice_mut(od * es..od * es + bytes);
                        dev.fill(&mut vd, poison).unwrap();
                        dev.reduce(op, T::DTYPE, &mut vd, &va, &vb).unwrap();
                        if op == ReduceOp::Avg {
                            dev.divide(T::DTYPE, &mut vd, 3).unwrap();
                        }
                        let got: Vec<T> = dev.download(&vd).unwrap();
                        let what = format!(
                            "{} {op} n={n} offsets(dst,a,b)=({od},{oa},{ob}) poison={poison:#x}",
                            T::DTYPE
                        );
                        assert_same_bits(&what, &got, &want);
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_matches_host_for_every_dtype_and_op() {
        let Some(dev) = device() else { return };
        let mut rng = Rng::new(1);
        check_reduce::<i8>(&dev, &mut rng);
        check_reduce::<u8>(&dev, &mut rng);
        check_reduce::<i32>(&dev, &mut rng);
        check_reduce::<u32>(&dev, &mut rng);
        check_reduce::<i64>(&dev, &mut rng);
        check_reduce::<u64>(&dev, &mut rng);
        check_reduce::<f16>(&dev, &mut rng);
        check_reduce::<bf16>(&dev, &mut rng);
        check_reduce::<f32>(&dev, &mut rng);
        check_reduce::<f64>(&dev, &mut rng);
        println!(
            "checked {} dtypes x {} ops",
            DType::ALL.len(),
            ReduceOp::ALL.len()
        );
    }

    fn check_reduce_into<T: Random>(dev: &CudaDevice, rng: &mut Rng) {
        let n = 100_003;
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let a: Vec<T> = random_vec(rng, n);
            let b: Vec<T> = random_vec(rng, n);
            let mut want = a.clone();
            T::reduce_into(op, &mut want, &b);
            let mut da = dev.upload(&a).unwrap();
            let db = dev.upload(&b).unwrap();
            dev.reduce_into(op, T::DTYPE, &mut da, &db).unwrap();
            let got: Vec<T> = dev.download(&da).unwrap();
            assert_same_bits(&format!("{} {op} in place", T::DTYPE), &got, &want);
        }
    }

    #[test]
    fn reduce_into_matches_host_in_place() {
        let Some(dev) = device() else { return };
        let mut rng = Rng::new(2);
        check_reduce_into::<i8>(&dev, &mut rng);
        check_reduce_into::<u64>(&dev, &mut rng);
        check_reduce_into::<f16>(&dev, &mut rng);
        check_reduce_into::<bf16>(&dev, &mut rng);
        check_reduce_into::<f32>(&dev, &mut rng);
    }

    fn check_divide<T: Random>(dev: &CudaDevice, rng: &mut Rng) {
        for &len in &[1usize, 9, 4099, 300_001] {
            for ranks in [1usize, 2, 3, 7, 1000] {
                let x: Vec<T> = random_vec(rng, len);
                let mut want = x.clone();
                T::divide(&mut want, ranks);
                let mut d = dev.upload(&x).unwrap();
                dev.divide(T::DTYPE, &mut d, ranks).unwrap();
                let got: Vec<T> = dev.download(&d).unwrap();
                assert_same_bits(
                    &format!("{} divide by {ranks} n={len}", T::DTYPE),
                    &got,
                    &want,
                );
            }
        }
    }

    #[test]
    fn divide_matches_host() {
        let Some(dev) = device() else { return };
        let mut rng = Rng::new(3);
        check_divide::<f16>(&dev, &mut rng);
        check_divide::<bf16>(&dev, &mut rng);
        check_divide::<f32>(&dev, &mut rng);
        check_divide::<f64>(&dev, &mut rng);
        check_divide::<i32>(&dev, &mut rng);
        let mut d = dev.upload(&[1.0f32]).unwrap();
        assert_eq!(
            dev.divide(DType::F32, &mut d, 0).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    fn host_transpose(src: &[u8], m: usize, n: usize, s: usize) -> Vec<u8> {
        let mut d = vec![0u8; m * n * s];
        for i in 0..m {
            for j in 0..n {
                d[(j * m + i) * s..][..s].copy_from_slice(&src[(i * n + j) * s..][..s]);
            }
        }
        d
    }

    #[test]
    fn transpose_matches_host_for_many_shapes() {
        let Some(dev) = device() else { return };
        let mut rng = Rng::new(4);
        // (m, n, block bytes, source offset, destination offset)
        let shapes: &[(usize, usize, usize, usize, usize)] = &[
            (8, 256, 32768, 0, 0),
            (8, 256, 4096, 0, 0),
            (8, 256, 64, 0, 0),
            (8, 256, 63, 0, 0),
            (3, 5, 1, 0, 0),
            (5, 3, 2, 0, 0),
            (7, 3, 12, 0, 0),
            (2, 9, 6, 0, 0),
            (4, 4, 100, 0, 0),
            (1, 17, 8, 0, 0),
            (17, 1, 33, 0, 0),
            (6, 10, 48, 0, 0),
            (9, 13, 1000, 0, 0),
            (64, 33, 16, 0, 0),
            (13, 300, 2, 0, 0),
            (300, 13, 4, 0, 0),
            (3, 1000, 3, 0, 0),
            (33, 65, 8, 0, 0),
            (16, 16, 4097, 0, 0),
            (8, 4, 20000, 0, 0),
            (2, 3, 65_536 + 48, 0, 0),
            (5, 7, 256, 1, 0),
            (5, 7, 256, 0, 8),
            (5, 7, 32, 4, 4),
            (11, 6, 24, 8, 0),
            (4, 1025, 4, 2, 6),
        ];
        for &(m, n, s, os, od) in shapes {
            let total = m * n * s;
            let src: Vec<u8> = (0..total).map(|_| rng.next() as u8).collect();
            let want = host_transpose(&src, m, n, s);
            let mut bs = dev.alloc_zeroed(total + 16).unwrap();
            let mut bd = dev.alloc_zeroed(total + 16).unwrap();
            let mut back = dev.alloc_zeroed(total).unwrap();
            dev.upload_into(&src, &mut bs.slice_mut(os..os + total))
                .unwrap();
            for poison in POISONS {
                let vs = bs.slice(os..os + total);
                let mut vd = bd.slice_mut(od..od + total);
                dev.fill(&mut vd, poison).unwrap();
                dev.transpose_blocks(&vs, &mut vd, m, n, s).unwrap();
                let got: Vec<u8> = dev.download(&vd).unwrap();
                assert_same_bits(
                    &format!("transpose {m}x{n} of {s} B (offsets {os},{od}) poison={poison:#x}"),
                    &got,
                    &want,
                );
                dev.fill(&mut back, poison).unwrap();
                dev.untranspose_blocks(&vd, &mut back, m, n, s).unwrap();
                let round: Vec<u8> = dev.download(&back).unwrap();
                assert_same_bits(
                    &format!("inverse transpose {m}x{n} of {s} B poison={poison:#x}"),
                    &round,
                    &src,
                );
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let Some(dev) = device() else { return };
        let a = dev.upload(&[1.0f32; 8]).unwrap();
        let b = dev.upload(&[1.0f32; 7]).unwrap();
        let mut d = dev.alloc_zeroed(32).unwrap();
        let e = dev
            .reduce(ReduceOp::Sum, DType::F32, &mut d, &a, &b)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let mut odd = dev.alloc_zeroed(6).unwrap();
        let x = dev.alloc_zeroed(6).unwrap();
        let e = dev
            .reduce(ReduceOp::Sum, DType::F32, &mut odd, &x, &x)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let small = dev.alloc_zeroed(10).unwrap();
        let e = dev.transpose_blocks(&small, &mut d, 2, 2, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let big = dev.alloc_zeroed(64).unwrap();
        let mut view = d.slice_mut(1..9);
        let e = dev
            .reduce(
                ReduceOp::Sum,
                DType::F32,
                &mut view,
                &big.slice(0..8),
                &big.slice(8..16),
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "misaligned f32: {e}");
        let e = CudaDevice::open(1 << 20).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }

    #[test]
    fn timing_events_measure_device_work() {
        let Some(dev) = device() else { return };
        let a = dev.upload(&vec![1.0f32; 1 << 22]).unwrap();
        let mut d = dev.alloc_zeroed(4 << 22).unwrap();
        let ms = dev
            .time_ms(|dev| dev.reduce(ReduceOp::Sum, DType::F32, &mut d, &a, &a))
            .unwrap();
        assert!(ms > 0.0 && ms < 10_000.0, "{ms} ms");
        let got: Vec<f32> = dev.download(&d).unwrap();
        assert!(got.iter().all(|&x| x == 2.0));
    }

    #[test]
    fn without_a_driver_open_is_a_system_error() {
        match CudaDevice::open(0) {
            Ok(dev) => println!("CUDA present: {dev:?}"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::System, "{e}");
                println!("skipped: no CUDA driver ({})", e.message());
            }
        }
    }

    #[test]
    fn kernels_compile_with_nvrtc() {
        if let Err(e) = cuda::ensure_nvrtc() {
            println!("skipped: no CUDA driver ({})", e.message());
            return;
        }
        for (major, minor) in [(8, 0), (9, 0)] {
            let images = cuda::compile_kernels(major, minor)
                .unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
            assert!(!images.reduce.is_empty() && !images.transpose.is_empty());
            // The quantization kernels are compiled into the reduction module.
            let bytes: &[u8] = match &images.reduce {
                cuda::KernelImage::Cubin(b) => b,
                cuda::KernelImage::Ptx(s) => s.as_bytes(),
            };
            for name in [
                "pccl_quantize_bf16_4",
                "pccl_dequantize_f64_8",
                "pccl_from_f32_f16",
            ] {
                assert!(
                    bytes.windows(name.len()).any(|w| w == name.as_bytes()),
                    "sm_{major}{minor}: {name} missing from the reduction module"
                );
            }
        }
    }
}
