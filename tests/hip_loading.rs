//! The ROCm back end without ROCm: loading errors, the RCCL enum mapping and the hipRTC
//! options; on a machine with an AMD GPU the last test also runs the kernels.
//!
//! Environment variables are process-wide, so the test that points `PCCL_*_LIBRARY` at a
//! file that is not a library runs in a child process (this same test binary, filtered to
//! `child_bad_library_paths`).
#![cfg(feature = "rocm")]

use pccl::device::hip::{self, HipDevice};
use pccl::{DType, Element, ErrorKind, ReduceOp};
use std::process::Command;

/// Set in the child process only.
const CHILD_ENV: &str = "PCCL_HIP_LOADING_CHILD";

fn assert_missing_library(e: &pccl::Error, library: &str, env: &str) {
    assert_eq!(e.kind(), ErrorKind::System, "{e}");
    assert!(e.message().contains(library), "{e}");
    assert!(e.message().contains(env), "{e}");
}

#[test]
fn device_roundtrip_or_skip() {
    let count = match HipDevice::count() {
        Err(e) => {
            assert_missing_library(&e, "libamdhip64.so", "PCCL_HIP_LIBRARY");
            // open() reports the same, never panics.
            let o = HipDevice::open(0).unwrap_err();
            assert_missing_library(&o, "libamdhip64.so", "PCCL_HIP_LIBRARY");
            println!("skipped: no ROCm runtime ({e})");
            return;
        }
        Ok(n) => n,
    };
    if count == 0 {
        let e = HipDevice::open(0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        println!("skipped: ROCm runtime found but no AMD GPU");
        return;
    }
    // Real hardware from here on.
    let dev = HipDevice::open(0).expect("open HIP device 0");
    println!(
        "HIP device 0: {} ({}, {} CUs, {} bytes of code)",
        dev.name(),
        dev.arch(),
        dev.compute_units(),
        dev.code_bytes()
    );
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let mut dd = dev.alloc_zeroed(n * 4).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
        dev.reduce(op, DType::F32, &mut dd, &da, &db, n).unwrap();
        let got: Vec<f32> = dev.download(&dd).unwrap();
        let mut want = vec![0f32; n];
        f32::reduce3(op, &mut want, &a, &b);
        assert_eq!(got, want, "{op}");
    }
    dev.divide(DType::F32, &mut dd, n, 3).unwrap();
    // Short buffers are refused before any launch.
    assert!(dev
        .reduce(ReduceOp::Sum, DType::F32, &mut dd, &da, &db, n + 1)
        .is_err());
    // Transpose 3 x 5 blocks of 12 bytes and back.
    let src: Vec<u8> = (0..180u32).map(|i| i as u8).collect();
    let ds = dev.upload(&src).unwrap();
    let mut dt = dev.alloc(180).unwrap();
    dev.transpose_blocks(&ds, &mut dt, 3, 5, 12).unwrap();
    let mut back = dev.alloc(180).unwrap();
    dev.untranspose_blocks(&dt, &mut back, 3, 5, 12).unwrap();
    assert_eq!(dev.download::<u8>(&back).unwrap(), src);
    let t: Vec<u8> = dev.download(&dt).unwrap();
    assert_eq!(&t[12..24], &src[5 * 12..6 * 12]);
    dev.free(back).unwrap();
}

#[test]
fn hiprtc_and_rccl_missing_are_errors() {
    match hip::compile_kernels("gfx90a:sramecc+:xnack-") {
        Err(e) if e.kind() == ErrorKind::System && e.message().contains("hipRTC is not") => {
            assert_missing_library(&e, "libhiprtc.so", "PCCL_HIPRTC_LIBRARY");
            println!("skipped: no hipRTC ({e})");
        }
        Err(e) => panic!("hipRTC is present but compiling failed: {e}"),
        Ok(images) => {
            assert!(!images.reduce.is_empty() && !images.transpose.is_empty());
        }
    }
    // A bad architecture is refused before anything is loaded.
    assert_eq!(
        hip::compile_kernels("sm_90").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    match hip::rccl_api() {
        Err(e) => {
            assert_missing_library(&e, "librccl.so", "PCCL_RCCL_LIBRARY");
            println!("skipped: no RCCL ({e})");
        }
        Ok(api) => println!("RCCL {} at {}", api.version(), api.path()),
    }
}

#[test]
fn rccl_enum_mapping() {
    use hip::{rccl_dtype, rccl_op};
    let want = [
        (DType::I8, 0),
        (DType::U8, 1),
        (DType::I32, 2),
        (DType::U32, 3),
        (DType::I64, 4),
        (DType::U64, 5),
        (DType::F16, 6),
        (DType::F32, 7),
        (DType::F64, 8),
        (DType::BF16, 9),
    ];
    for (d, v) in want {
        assert_eq!(rccl_dtype(d), v, "{d}");
    }
    let ops = [
        (ReduceOp::Sum, 0),
        (ReduceOp::Prod, 1),
        (ReduceOp::Max, 2),
        (ReduceOp::Min, 3),
        (ReduceOp::Avg, 4),
    ];
    for (o, v) in ops {
        assert_eq!(rccl_op(o), v, "{o}");
    }
    assert_eq!(hip::NCCL_BFLOAT16, 9);
    assert_eq!(std::mem::size_of::<hip::NcclUniqueId>(), 128);
}

#[test]
fn compile_option_builder() {
    let o = hip::compile_options("gfx90a:sramecc+:xnack-").unwrap();
    assert_eq!(o[0], "--offload-arch=gfx90a:sramecc+:xnack-");
    assert!(o.iter().any(|x| x == "-DPCCL_UNROLL=4"), "{o:?}");
    assert_eq!(
        hip::compile_options(" gfx1100\0").unwrap()[0],
        "--offload-arch=gfx1100"
    );
    assert_eq!(hip::parse_arch("gfx942:xnack+").unwrap(), "gfx942:xnack+");
    for bad in ["", "gfx", "sm_80", "gfx90a:xnack", "gfx90a --foo"] {
        assert_eq!(
            hip::compile_options(bad).unwrap_err().kind(),
            ErrorKind::InvalidArgument,
            "{bad:?}"
        );
    }
    let src = hip::hip_source("transpose.cu", hip::TRANSPOSE_SOURCE);
    assert!(src.starts_with(hip::HIP_PRELUDE));
    assert!(src.contains("#line 1 \"transpose.cu\"\n"));
}

/// A stand-in for libamdhip64 + libhiprtc, in C: "device" memory is host memory, and kernel
/// launches run the few kernels the test uses on the CPU from the argument array they get,
/// so that the loading, the symbol table, the property scan, the compile flow and the kernel
/// argument marshalling run end to end without an AMD GPU.
const FAKE_HIP_C: &str = r##"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef int E;
E hipInit(unsigned f) { return f == 0 ? 0 : 1; }
E hipRuntimeGetVersion(int* v) { *v = 60200000; return 0; }
E hipGetDeviceCount(int* n) { *n = 1; return 0; }
E hipSetDevice(int d) { return d == 0 ? 0 : 101; }
E hipDeviceGet(int* d, int o) { *d = o; return 0; }
E hipDeviceGetAttribute(int* v, int a, int d) { *v = a == 63 ? 104 : 0; return d == 0 ? 0 : 101; }
E hipDeviceGetName(char* s, int len, int d) { strncpy(s, "Fake Instinct", len); return 0; }
E hipGetDevicePropertiesR0600(void* p, int d) {
    memset(p, 0, 1472); strcpy((char*)p, "Fake Instinct");
    strcpy((char*)p + 1160, "gfx90a:sramecc+:xnack-"); return 0;
}
E hipStreamCreate(void** s) { *s = (void*)0x5157; return 0; }
E hipStreamDestroy(void* s) { return s == (void*)0x5157 ? 0 : 1; }
E hipStreamSynchronize(void* s) { return s == (void*)0x5157 ? 0 : 1; }
E hipMalloc(void** p, size_t n) { *p = aligned_alloc(256, (n + 255) / 256 * 256); return 0; }
E hipFree(void* p) { free(p); return 0; }
E hipMemcpyAsync(void* d, const void* s, size_t n, int k, void* st) { memcpy(d, s, n); return 0; }
E hipMemsetAsync(void* d, int v, size_t n, void* st) { memset(d, v, n); return 0; }
E hipModuleLoadData(void** m, const void* img) { *m = (void*)img; return memcmp(img, "CODE", 4) ? 1 : 0; }
E hipModuleGetFunction(void** f, void* m, const char* name) { *f = strdup(name); return 0; }
E hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void* st, void** a, void** extra) {
    const char* k = (const char*)f;
    if (gx == 0 || bx == 0 || bx > 1024 || extra) return 1;
    if (!strcmp(k, "pccl_reduce_f32_sum") || !strcmp(k, "pccl_reduce_f32_min")) {
        float* d = *(float**)a[0]; float* x = *(float**)a[1]; float* y = *(float**)a[2];
        uint64_t n = *(uint64_t*)a[3];
        for (uint64_t i = 0; i < n; i++)
            d[i] = k[16] == 's' ? x[i] + y[i] : (y[i] < x[i] ? y[i] : x[i]);
        return 0;
    }
    if (!strcmp(k, "pccl_divide_f32")) {
        float* d = *(float**)a[0]; uint64_t n = *(uint64_t*)a[1]; float v = *(float*)a[3];
        for (uint64_t i = 0; i < n; i++) d[i] /= v;
        return 0;
    }
    if (!strncmp(k, "pccl_transpose_", 15)) {
        int tile = k[15] == 't';
        size_t u = (size_t)atoi(strrchr(k, '_') + 1);
        const char* s = *(const char**)a[0]; char* d = *(char**)a[1];
        uint64_t M = *(uint64_t*)a[2], N = *(uint64_t*)a[3];
        uint64_t kk = tile ? *(uint32_t*)a[4] : *(uint64_t*)a[4];
        if (tile && (*(uint32_t*)a[5] == 0 || *(uint32_t*)a[6] == 0 || smem == 0)) return 1;
        size_t b = kk * u;
        for (uint64_t i = 0; i < M; i++)
            for (uint64_t j = 0; j < N; j++) memcpy(d + (j * M + i) * b, s + (i * N + j) * b, b);
        return 0;
    }
    return 98;
}
const char* hipGetErrorString(E e) { return "fake HIP error"; }
E hipEventCreate(void** e) { *e = malloc(1); return 0; }
E hipEventRecord(void* e, void* s) { return 0; }
E hipEventSynchronize(void* e) { return 0; }
E hipEventElapsedTime(float* ms, void* a, void* b) { *ms = 0.25f; return 0; }
E hipEventDestroy(void* e) { free(e); return 0; }
E hipEventQuery(void* e) { return 0; }
E hipStreamWaitEvent(void* s, void* e, unsigned f) { return 0; }
E hipHostMalloc(void** p, size_t n, unsigned f) { *p = malloc(n ? n : 1); return 0; }
E hipHostFree(void* p) { free(p); return 0; }
static int arch_ok;
E hiprtcCreateProgram(void** p, const char* src, const char* name, int nh, const char** h,
                      const char** hn) {
    *p = malloc(1);
    return strstr(src, "#line 1") && strstr(src, "pccl_") ? 0 : 1;
}
E hiprtcCompileProgram(void* p, int n, const char** o) {
    arch_ok = 0;
    for (int i = 0; i < n; i++) arch_ok |= !strcmp(o[i], "--offload-arch=gfx90a:sramecc+:xnack-");
    return arch_ok ? 0 : 6;
}
E hiprtcGetProgramLogSize(void* p, size_t* n) { *n = 9; return 0; }
E hiprtcGetProgramLog(void* p, char* s) { strcpy(s, "fake log"); return 0; }
E hiprtcGetCodeSize(void* p, size_t* n) { *n = 4; return 0; }
E hiprtcGetCode(void* p, char* c) { memcpy(c, "CODE", 4); return 0; }
E hiprtcDestroyProgram(void** p) { free(*p); return 0; }
const char* hiprtcGetErrorString(E e) { return "fake hipRTC error"; }
"##;

/// Builds [`FAKE_HIP_C`] with the system C compiler and runs the device API against it in a
/// child process (skipped where no `cc` is found).
#[test]
fn device_api_against_a_fake_runtime() {
    let dir = std::env::temp_dir().join(format!("pccl-hip-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("fakehip.c");
    let so = dir.join("libfakehip.so");
    std::fs::write(&c, FAKE_HIP_C).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(&c)
        .status();
    if !matches!(built, Ok(s) if s.success()) {
        println!("skipped: no C compiler to build the fake HIP runtime ({built:?})");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_fake_runtime",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("PCCL_HIP_LIBRARY", &so)
        .env("PCCL_HIPRTC_LIBRARY", &so)
        .env_remove("PCCL_HIP_ARCH")
        .output()
        .expect("run the child test process");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("child-checked"),
        "child did not run:\n{stdout}\n{stderr}"
    );
}

/// The child half of [`device_api_against_a_fake_runtime`].
#[test]
fn child_fake_runtime() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    assert_eq!(HipDevice::count().unwrap(), 1);
    assert_eq!(
        HipDevice::open(1).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let dev = HipDevice::open(0).unwrap();
    assert_eq!(dev.name(), "Fake Instinct");
    assert_eq!(dev.arch(), "gfx90a:sramecc+:xnack-");
    assert_eq!(dev.compute_units(), 104);
    assert_eq!(hip::hip_api().unwrap().runtime_version().unwrap(), 60200000);
    let n = 300;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n).map(|i| 40.0 - i as f32).collect();
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let mut dd = dev.alloc_zeroed(n * 4).unwrap();
    assert_eq!(dev.download::<f32>(&dd).unwrap(), vec![0f32; n]);
    for op in [ReduceOp::Sum, ReduceOp::Min] {
        dev.reduce(op, DType::F32, &mut dd, &da, &db, n).unwrap();
        let mut want = vec![0f32; n];
        f32::reduce3(op, &mut want, &a, &b);
        assert_eq!(dev.download::<f32>(&dd).unwrap(), want, "{op}");
    }
    // In place, then the average's division.
    dev.reduce_into(ReduceOp::Sum, DType::F32, &mut dd, &da, n)
        .unwrap();
    dev.divide(DType::F32, &mut dd, n, 4).unwrap();
    let mut want = vec![0f32; n];
    f32::reduce3(ReduceOp::Min, &mut want, &a, &b);
    f32::reduce_into(ReduceOp::Sum, &mut want, &a);
    f32::divide(&mut want, 4);
    assert_eq!(dev.download::<f32>(&dd).unwrap(), want);
    // Validation happens before any launch (the fake would fail an unknown kernel).
    let e = dev
        .reduce(ReduceOp::Prod, DType::F32, &mut dd, &da, &db, n + 1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // Transposes through both kernels (large and small blocks) and the copy.
    for (m, k, bb) in [(3usize, 5usize, 12usize), (2, 3, 256), (1, 4, 8)] {
        let total = m * k * bb;
        let src: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
        let ds = dev.upload(&src).unwrap();
        let mut dt = dev.alloc(total).unwrap();
        dev.transpose_blocks(&ds, &mut dt, m, k, bb).unwrap();
        let t: Vec<u8> = dev.download(&dt).unwrap();
        for i in 0..m {
            for j in 0..k {
                assert_eq!(
                    &t[(j * m + i) * bb..][..bb],
                    &src[(i * k + j) * bb..][..bb],
                    "{m}x{k}x{bb} block ({i},{j})"
                );
            }
        }
        let mut back = dev.alloc(total).unwrap();
        dev.untranspose_blocks(&dt, &mut back, m, k, bb).unwrap();
        assert_eq!(dev.download::<u8>(&back).unwrap(), src);
        dev.free(back).unwrap();
    }
    let short = dev.alloc(10).unwrap();
    let mut dst = dev.alloc(180).unwrap();
    assert!(dev.transpose_blocks(&short, &mut dst, 3, 5, 12).is_err());
    assert_eq!(dev.time_ms(|d| d.synchronize()).unwrap(), 0.25);
    // The kernels compile for any valid architecture the fake accepts only this one.
    let e = hip::compile_kernels("gfx1100").unwrap_err();
    assert!(e.message().contains("fake log"), "{e}");
    assert!(hip::compile_kernels("gfx90a:sramecc+:xnack-").is_ok());
    println!("child-checked");
}

/// Points the three `PCCL_*_LIBRARY` variables at a file that is not a library and checks,
/// in a child process, that every loader reports it cleanly.
#[test]
fn bad_library_paths_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("pccl-hip-loading-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("libamdhip64-not-a-library.so");
    std::fs::write(&fake, b"this is not an ELF shared object\n").unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_bad_library_paths",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("PCCL_HIP_LIBRARY", &fake)
        .env("PCCL_HIPRTC_LIBRARY", &fake)
        .env("PCCL_RCCL_LIBRARY", &fake)
        .output()
        .expect("run the child test process");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("child-checked"),
        "child did not run:\n{stdout}\n{stderr}"
    );
    // A loadable library that is not HIP (glibc's libm, found by the loader).
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_bad_library_paths",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("PCCL_HIP_LIBRARY", "libm.so.6")
        .output()
        .expect("run the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("child-checked"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The child half of [`bad_library_paths_are_clear_errors`]; does nothing unless
/// `PCCL_HIP_LOADING_CHILD` is set.
#[test]
fn child_bad_library_paths() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let fake = std::env::var("PCCL_HIP_LIBRARY").unwrap();
    if fake == "libm.so.6" {
        // A real library without the HIP symbols: the first missing one is named.
        let e = HipDevice::count().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::System, "{e}");
        assert!(e.message().contains("has no symbol hip"), "{e}");
        assert!(e.message().contains("PCCL_HIP_LIBRARY"), "{e}");
        println!("HIP: {e}");
        println!("child-checked");
        return;
    }
    match HipDevice::count() {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::System, "{e}");
            // The explicit path was tried first, and the error says why it failed.
            assert!(e.message().contains(&fake), "{e}");
            assert!(e.message().contains("PCCL_HIP_LIBRARY"), "{e}");
            let again = HipDevice::open(0).unwrap_err();
            assert_eq!(again.message(), e.message());
            println!("HIP: {e}");
        }
        Ok(n) => println!("a real HIP runtime was found after the bad path ({n} devices)"),
    }
    if let Err(e) = hip::hiprtc_api() {
        assert_eq!(e.kind(), ErrorKind::System, "{e}");
        assert!(e.message().contains(&fake), "{e}");
        assert!(e.message().contains("PCCL_HIPRTC_LIBRARY"), "{e}");
        println!("hipRTC: {e}");
    }
    if let Err(e) = hip::rccl_api() {
        assert_eq!(e.kind(), ErrorKind::System, "{e}");
        assert!(e.message().contains(&fake), "{e}");
        assert!(e.message().contains("PCCL_RCCL_LIBRARY"), "{e}");
        println!("RCCL: {e}");
    }
    println!("child-checked");
}
