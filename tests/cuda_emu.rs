//! The GPU kernel sources of block quantization (`csrc/quant.cu`, compiled with
//! `csrc/reduce.cu` as on the GPU) run on the CPU by `tests/cuda_emu/emu.cpp` (each thread
//! block's threads as OS threads meeting at `__syncthreads`), against the host kernels of
//! `pccl::quant`: records byte for byte and decoded values bit for bit, over dtypes × bits ×
//! blocks × lengths × launch shapes (one and several units per thread, grid strides, tails,
//! zero blocks, NaN and infinity). The fake ROCm runtime runs C ports of these kernels; this
//! runs the sources themselves. Skipped without a C++ compiler.

#![cfg(any(feature = "cuda", feature = "rocm"))]

use half::{bf16, f16};
use pccl::quant::{self, Quant, QuantFloat};
use std::ffi::{c_char, c_void, CString};
use std::process::Command;

type Quantize = unsafe extern "C" fn(
    *const c_char,
    i32,
    *const c_void,
    *mut c_void,
    u64,
    u32,
    u64,
    u32,
    u32,
) -> i32;
type Dequantize =
    unsafe extern "C" fn(*const c_char, i32, *const c_void, *mut c_void, u64, u32, u32, u32) -> i32;
type DequantizeMany = unsafe extern "C" fn(
    *const c_char,
    i32,
    *const c_void,
    *mut c_void,
    u64,
    u32,
    u64,
    u32,
    u32,
    u32,
) -> i32;
type DequantizeSum =
    unsafe extern "C" fn(i32, *const c_void, *mut f32, u64, u32, u64, u32, u32, u32, u32) -> i32;
type FromF32 =
    unsafe extern "C" fn(*const c_char, *const f32, *mut c_void, u64, f32, u32, u32) -> i32;

/// The emulator, built once for every test of this file; None (skipped) without a C++
/// compiler.
fn emulator() -> Option<&'static libloading::Library> {
    static LIB: std::sync::OnceLock<Option<libloading::Library>> = std::sync::OnceLock::new();
    LIB.get_or_init(build).as_ref()
}

fn build() -> Option<libloading::Library> {
    let dir = std::env::temp_dir().join(format!("pccl-cuda-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let so = dir.join("libemu.so");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cuda_emu/emu.cpp");
    let built = Command::new("c++")
        .args([
            "-std=c++17",
            "-O1",
            "-Wno-unknown-pragmas",
            "-shared",
            "-fPIC",
            "-pthread",
            "-o",
        ])
        .arg(&so)
        .arg(src)
        .status();
    if !matches!(built, Ok(s) if s.success()) {
        println!("skipped: no C++ compiler for the kernel emulator ({built:?})");
        return None;
    }
    // SAFETY: our own library, whose initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Some(lib)
}

/// Data with mixed scales, a heavy tail, zeros, an all-zero stretch, and (with `bad`) a NaN
/// and an infinity.
fn data<T: QuantFloat>(n: usize, seed: usize, bad: bool) -> Vec<T> {
    (0..n)
        .map(|i| {
            let x = ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0;
            let v = match i % 13 {
                0 => 0.0,
                1 => x * 3e3,
                _ if (64..160).contains(&i) => 0.0,
                _ => x * (1 + seed % 5) as f32,
            };
            T::from_f32(match i {
                // A block of tiny values (blocks of 32): its step's reciprocal overflows.
                192..=223 => 1e-38 * (i % 3) as f32,
                300 if bad => f32::NAN,
                2500 if bad => f32::NEG_INFINITY,
                _ => v,
            })
        })
        .collect()
}

fn bits<T: QuantFloat>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

fn check<T: QuantFloat>(lib: &libloading::Library) {
    // SAFETY: the emulator's exported functions, with the signatures above.
    let (enc, dec, conv) = unsafe {
        (
            *lib.get::<Quantize>(b"emu_quantize").unwrap(),
            *lib.get::<Dequantize>(b"emu_dequantize").unwrap(),
            *lib.get::<FromF32>(b"emu_from_f32").unwrap(),
        )
    };
    let dt = CString::new(T::DTYPE.name()).unwrap();
    let add = CString::new("add").unwrap();
    let mut cases = 0;
    for (bits_, block) in [(8u32, 32usize), (4, 32), (8, 2048), (4, 128), (4, 8192)] {
        // Small blocks on short data (each block is a round of barriers of OS threads).
        let lengths: &[usize] = if block < 2048 {
            &[31, 257, 2600]
        } else {
            &[257, 2600, 8192 + 7]
        };
        for &n in lengths {
            for (grid, threads) in [(1u32, 32u32), (3, 64)] {
                // NaN at 300 and infinity at 2500, where there are such elements.
                for bad in [false, true].into_iter().filter(|&b| !b || n > 2500) {
                    let q = Quant {
                        bits: bits_,
                        block,
                        allow_nonfinite: bad,
                    };
                    let tag = format!(
                        "{} int{bits_} block {block} n {n} grid {grid}x{threads} bad {bad}",
                        T::DTYPE
                    );
                    let x = data::<T>(n, n + block, bad);
                    let rb = q.record_bytes(n);
                    let mut want = vec![0u8; rb];
                    quant::quantize(&q, &x, &mut want).unwrap();
                    // Poisoned: the kernel must write every byte, padding included.
                    let mut got = vec![0xa5u8; rb];
                    // SAFETY: `x` holds n elements, `got` rb bytes.
                    let rc = unsafe {
                        enc(
                            dt.as_ptr(),
                            bits_ as i32,
                            x.as_ptr().cast(),
                            got.as_mut_ptr().cast(),
                            n as u64,
                            block as u32,
                            rb as u64,
                            grid,
                            threads,
                        )
                    };
                    assert_eq!(rc, 0, "{tag}");
                    assert_eq!(got, want, "{tag}: record");
                    let mut back = vec![T::from_f32(0.0); n];
                    quant::dequantize(&q, &want, &mut back).unwrap();
                    let mut out = vec![T::from_f32(-9.0); n];
                    // SAFETY: `want` holds the record, `out` n elements.
                    let rc = unsafe {
                        dec(
                            dt.as_ptr(),
                            bits_ as i32,
                            want.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            n as u64,
                            block as u32,
                            grid,
                            threads,
                        )
                    };
                    assert_eq!(rc, 0, "{tag}");
                    assert_eq!(super_bits(&out), super_bits(&back), "{tag}: decoded");
                    // Accumulating into f32 sums: the host's order of rounding.
                    let mut sums: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 5.0).collect();
                    let mut piece = vec![0f32; n];
                    quant::dequantize(&q, &want, &mut piece).unwrap();
                    let host: Vec<f32> = sums.iter().zip(&piece).map(|(a, b)| a + b).collect();
                    // SAFETY: as above, `sums` n f32.
                    let rc = unsafe {
                        dec(
                            add.as_ptr(),
                            bits_ as i32,
                            want.as_ptr().cast(),
                            sums.as_mut_ptr().cast(),
                            n as u64,
                            block as u32,
                            grid,
                            threads,
                        )
                    };
                    assert_eq!(rc, 0, "{tag}");
                    assert_eq!(bits(&sums), bits(&host), "{tag}: accumulated");
                    cases += 1;
                }
            }
        }
    }
    cases += check_batched::<T>(lib);
    // The conversion of the sums (the average's multiply and one rounding).
    let src: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1.37e-3).collect();
    let mut out = vec![T::from_f32(0.0); src.len()];
    // SAFETY: both hold 1000 elements.
    let rc = unsafe {
        conv(
            dt.as_ptr(),
            src.as_ptr(),
            out.as_mut_ptr().cast(),
            1000,
            0.25,
            3,
            64,
        )
    };
    assert_eq!(rc, 0);
    let want: Vec<T> = src.iter().map(|v| T::from_f32(v * 0.25)).collect();
    assert_eq!(super_bits(&out), super_bits(&want), "{}: convert", T::DTYPE);
    println!("{}: {cases} cases identical to the host kernels", T::DTYPE);
}

/// The batched decodes (one launch for the records of every rank): `count` records end to
/// end decode into `count` blocks exactly as the host decodes each, and sum into f32 in
/// record order exactly as the host adds them (the first stored, or added to what the sums
/// held) — the same bits as one launch per record. Returns the cases checked.
fn check_batched<T: QuantFloat>(lib: &libloading::Library) -> usize {
    // SAFETY: the emulator's exported functions, with the signatures above.
    let (many, sum) = unsafe {
        (
            *lib.get::<DequantizeMany>(b"emu_dequantize_many").unwrap(),
            *lib.get::<DequantizeSum>(b"emu_dequantize_sum").unwrap(),
        )
    };
    let dt = CString::new(T::DTYPE.name()).unwrap();
    let mut cases = 0;
    // n = 40 × 5 records on 3 × 64 threads: a thread's elements cross records (several
    // records per grid stride).
    for (bits_, block, n) in [
        (8u32, 32usize, 257usize),
        (4, 32, 31),
        (8, 32, 40),
        (4, 128, 2600),
        (8, 2048, 2600),
    ] {
        for count in [1usize, 3, 5] {
            let q = Quant {
                bits: bits_,
                block,
                allow_nonfinite: false,
            };
            let rb = q.record_bytes(n);
            let mut recs = vec![0u8; rb * count];
            let mut decoded: Vec<Vec<T>> = Vec::new();
            let mut decoded_f32: Vec<Vec<f32>> = Vec::new();
            for (d, rec) in recs.chunks_mut(rb).enumerate() {
                quant::quantize(&q, &data::<T>(n, n + 17 * d, false), rec).unwrap();
                let mut back = vec![T::from_f32(0.0); n];
                quant::dequantize(&q, rec, &mut back).unwrap();
                decoded.push(back);
                let mut back32 = vec![0f32; n];
                quant::dequantize(&q, rec, &mut back32).unwrap();
                decoded_f32.push(back32);
            }
            for (grid, threads) in [(1u32, 32u32), (3, 64)] {
                let tag = format!(
                    "{} int{bits_} block {block} n {n} x {count} grid {grid}x{threads}",
                    T::DTYPE
                );
                let mut out = vec![T::from_f32(-9.0); n * count];
                // SAFETY: `recs` holds `count` records `rb` apart, `out` count × n elements.
                let rc = unsafe {
                    many(
                        dt.as_ptr(),
                        bits_ as i32,
                        recs.as_ptr().cast(),
                        out.as_mut_ptr().cast(),
                        n as u64,
                        block as u32,
                        rb as u64,
                        count as u32,
                        grid,
                        threads,
                    )
                };
                assert_eq!(rc, 0, "{tag}");
                assert_eq!(
                    super_bits(&out),
                    super_bits(&decoded.concat()),
                    "{tag}: batched"
                );
                for add_first in [false, true] {
                    let start: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 5.0).collect();
                    let mut host = if add_first {
                        start.clone()
                    } else {
                        decoded_f32[0].clone()
                    };
                    for piece in decoded_f32.iter().skip(usize::from(!add_first)) {
                        for (h, x) in host.iter_mut().zip(piece) {
                            *h += *x;
                        }
                    }
                    let mut acc = start;
                    // SAFETY: as above, `acc` n f32.
                    let rc = unsafe {
                        sum(
                            bits_ as i32,
                            recs.as_ptr().cast(),
                            acc.as_mut_ptr(),
                            n as u64,
                            block as u32,
                            rb as u64,
                            count as u32,
                            u32::from(add_first),
                            grid,
                            threads,
                        )
                    };
                    assert_eq!(rc, 0, "{tag}");
                    assert_eq!(
                        bits(&acc),
                        bits(&host),
                        "{tag}: summed (add_first {add_first})"
                    );
                }
                cases += 1;
            }
        }
    }
    cases
}

/// Bit patterns of the values as stored (NaN payloads included: the host's and the kernels'
/// NaNs must agree too).
fn super_bits<T: QuantFloat>(v: &[T]) -> Vec<u64> {
    v.iter()
        .map(|x| {
            // SAFETY: T is a plain float type of at most 8 bytes.
            let mut b = [0u8; 8];
            let s = std::mem::size_of::<T>();
            unsafe {
                std::ptr::copy_nonoverlapping((x as *const T).cast::<u8>(), b.as_mut_ptr(), s)
            };
            u64::from_le_bytes(b)
        })
        .collect()
}

macro_rules! per_type {
    ($($name:ident: $t:ty),*) => {$(
        #[test]
        fn $name() {
            if let Some(lib) = emulator() {
                check::<$t>(lib);
            }
        }
    )*};
}

per_type!(
    the_f32_quantization_kernels_match_the_host: f32,
    the_bf16_quantization_kernels_match_the_host: bf16,
    the_f16_quantization_kernels_match_the_host: f16,
    the_f64_quantization_kernels_match_the_host: f64
);
