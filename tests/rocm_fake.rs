//! The ROCm path of the device collectives, end to end on the CPU: `tests/fake_rocm/fake_rocm.c`
//! (a stand-in for libamdhip64, hipRTC and RCCL) is built with the system C compiler and
//! loaded through the same dlopen path as the real libraries (`PCCL_HIP_LIBRARY`, ...), and
//! thread ranks run every collective, dtype and op through the staged and the direct
//! executors on `HipDevice`s, checked bit for bit against the host collectives of the same
//! communicator. A runtime that starts failing kernel launches must make the collective fail.
//!
//! The checks run in a child process (the libraries are loaded once per process, from the
//! environment); skipped where no C compiler is found.

#![cfg(feature = "rocm")]

mod common;

use common::input;
use half::{bf16, f16};
use pccl::config::{Config, NcclMode};
use pccl::device::api::Device;
use pccl::device::hip::{HipBuffer, HipDevice};
use pccl::{Communicator, Element, RawCollective, ReduceOp, ThreadWorld};
use std::process::Command;

#[path = "fake_rocm/harness.rs"]
mod harness;
use harness::{build_fake, is_child, real_runtime, with_fake_runtime};

fn upload<T: Element>(dev: &HipDevice, data: &[T], bytes: usize) -> HipBuffer {
    let mut b = dev.alloc_zeroed(bytes.max(16)).unwrap();
    if !data.is_empty() {
        let mut whole = bytemuck::cast_slice::<T, u8>(data).to_vec();
        whole.resize(b.len(), 0);
        dev.upload_into(&whole, &mut b).unwrap();
    }
    b
}

/// Runs the three reducing/gathering collectives of `T` on device and host, and compares.
fn run_dtype<T: Element>(c: &Communicator, dev: &HipDevice, tag: &str) {
    let (p, r) = (c.size(), c.rank());
    let es = std::mem::size_of::<T>();
    let ops: Vec<ReduceOp> = ReduceOp::ALL
        .iter()
        .copied()
        .filter(|&o| T::DTYPE.check_op(o).is_ok())
        .collect();
    for n in [1usize, 7, 1000] {
        for &op in &ops {
            let x: Vec<T> = input(r, n * p, op);
            // all-reduce
            let mut want = vec![T::zeroed(); n * p];
            c.all_reduce(&x, &mut want, op).unwrap();
            let s = upload(dev, &x, n * p * es);
            let o = dev.alloc_zeroed((n * p * es).max(16)).unwrap();
            // SAFETY: both buffers hold the counts the collective implies and live until it
            // returns.
            unsafe {
                c.collective_on::<T, HipDevice>(
                    dev,
                    RawCollective::AllReduce(op),
                    s.device_ptr(),
                    o.device_ptr(),
                    n * p,
                )
            }
            .unwrap();
            let got: Vec<u8> = dev.download(&o).unwrap();
            assert_eq!(
                &got[..n * p * es],
                bytemuck::cast_slice::<T, u8>(&want),
                "{tag} all_reduce {} {op} n={n}",
                T::DTYPE
            );
            // reduce-scatter
            let mut want = vec![T::zeroed(); n];
            c.reduce_scatter(&x, &mut want, op).unwrap();
            let o = dev.alloc_zeroed((n * es).max(16)).unwrap();
            // SAFETY: as above.
            unsafe {
                c.collective_on::<T, HipDevice>(
                    dev,
                    RawCollective::ReduceScatter(op),
                    s.device_ptr(),
                    o.device_ptr(),
                    n,
                )
            }
            .unwrap();
            let got: Vec<u8> = dev.download(&o).unwrap();
            assert_eq!(
                &got[..n * es],
                bytemuck::cast_slice::<T, u8>(&want),
                "{tag} reduce_scatter {} {op} n={n}",
                T::DTYPE
            );
        }
        // all-gather
        let x: Vec<T> = input(r, n, ReduceOp::Sum);
        let mut want = vec![T::zeroed(); n * p];
        c.all_gather(&x, &mut want).unwrap();
        let s = upload(dev, &x, n * es);
        let o = dev.alloc_zeroed((n * p * es).max(16)).unwrap();
        // SAFETY: as above.
        unsafe {
            c.collective_on::<T, HipDevice>(
                dev,
                RawCollective::AllGather,
                s.device_ptr(),
                o.device_ptr(),
                n,
            )
        }
        .unwrap();
        let got: Vec<u8> = dev.download(&o).unwrap();
        assert_eq!(
            &got[..n * p * es],
            bytemuck::cast_slice::<T, u8>(&want),
            "{tag} all_gather {} n={n}",
            T::DTYPE
        );
    }
}

/// How a world's ranks run their device collectives.
#[derive(Clone, Copy)]
struct Setup {
    direct: bool,
    /// The RCCL intra-node level (`PCCL_NCCL=1`) instead of host staging (`PCCL_NCCL=0`).
    rccl: bool,
    /// Nodes of this many ranks (`PCCL_RANKS_PER_NODE`), or one node.
    per_node: Option<usize>,
}

const STAGED: Setup = Setup {
    direct: false,
    rccl: false,
    per_node: None,
};

fn run_world(p: usize, direct: bool, algo: &str) {
    run_world_with(p, algo, Setup { direct, ..STAGED }, |r| r % 2);
}

/// Runs every dtype on `p` thread ranks, rank `r` on fake device `gpu(r)`.
fn run_world_with(p: usize, algo: &str, setup: Setup, gpu: impl Fn(usize) -> usize + Sync) {
    let direct = setup.direct;
    let cfg = Config {
        nccl: if setup.rccl {
            NcclMode::On
        } else {
            NcclMode::Off
        },
        ranks_per_node: setup.per_node,
        algo: if algo == "auto" {
            None
        } else {
            Some(algo.parse().unwrap())
        },
        device_direct: direct,
        // Many pieces per message, whatever the tuner would cut.
        chunk_bytes: 256,
        chunk_explicit: true,
        timeout: std::time::Duration::from_secs(60),
        ..Config::default()
    };
    let world = ThreadWorld::new(p).with_device_direct(direct);
    let tag = format!(
        "p={p} {algo} direct={direct} rccl={} per_node={:?}",
        setup.rccl, setup.per_node
    );
    let gpu = &gpu;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                let (cfg, tag) = (cfg.clone(), &tag);
                s.spawn(move || {
                    let c = Communicator::with_config(t, cfg).unwrap();
                    let dev = HipDevice::open(gpu(r)).unwrap();
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
        for h in hs {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
    println!("ok: {tag}");
}

#[test]
fn rocm_device_collectives_match_the_host_on_the_fake_runtime() {
    with_fake_runtime("child_collectives", &[]);
}

#[test]
fn child_collectives() {
    if !is_child() {
        return;
    }
    // Distinct fake GPUs have distinct UUIDs (the identity "same GPU" decisions use).
    let (d0, d1) = (HipDevice::open(0).unwrap(), HipDevice::open(1).unwrap());
    assert_ne!(d0.uuid().unwrap(), d1.uuid().unwrap());
    assert_eq!(
        d0.uuid().unwrap(),
        HipDevice::open(0).unwrap().uuid().unwrap()
    );
    for (p, algo) in [(3, "ring"), (4, "rd"), (2, "auto")] {
        run_world(p, false, algo);
        run_world(p, true, algo);
    }
    // RCCL through the shared NCCL ABI, a world of one rank.
    let rccl = HipDevice::collectives().unwrap();
    assert_eq!(rccl.name(), "RCCL");
    if !real_runtime() {
        assert_eq!(rccl.version(), 21804);
    }
    let id = rccl.unique_id().unwrap();
    let comm = pccl::device::nccl_abi::NcclComm::init_with(rccl, &id, 1, 0).unwrap();
    let x: Vec<f32> = (0..10).map(|i| i as f32).collect();
    let s = d0.upload(&x).unwrap();
    let o = d0.alloc_zeroed(40).unwrap();
    // SAFETY: both buffers hold 10 f32 and live until the (synchronous) call returns.
    unsafe {
        comm.all_reduce(
            s.device_ptr(),
            o.device_ptr(),
            10,
            pccl::DType::F32,
            ReduceOp::Sum,
            d0.raw_stream(),
        )
    }
    .unwrap();
    assert_eq!(d0.download::<f32>(&o).unwrap(), x);
    // Joining that world with another size is refused by the fake: an RCCL error.
    if real_runtime() {
        println!("child-checked");
        return;
    }
    assert!(pccl::device::nccl_abi::NcclComm::init_with(rccl, &id, 2, 1).is_err());
    println!("child-checked");
}

#[test]
fn a_failing_kernel_launch_fails_the_collective() {
    with_fake_runtime(
        "child_launch_failure",
        &[("FAKE_HIP_FAIL_LAUNCH_AFTER", "0")],
    );
}

#[test]
fn child_launch_failure() {
    if !is_child() {
        return;
    }
    let p = 2;
    let world = ThreadWorld::new(p);
    let cfg = Config {
        timeout: std::time::Duration::from_secs(10),
        nccl: NcclMode::Off,
        ..Config::default()
    };
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                let cfg = cfg.clone();
                s.spawn(move || {
                    let c = Communicator::with_config(t, cfg).unwrap();
                    let dev = HipDevice::open(r).unwrap();
                    let x = vec![1.5f32; 64];
                    let sb = dev.upload(&x).unwrap();
                    let o = dev.alloc_zeroed(256).unwrap();
                    // SAFETY: both buffers hold 64 f32 and live until the call returns.
                    let r = unsafe {
                        c.collective_on::<f32, HipDevice>(
                            &dev,
                            RawCollective::AllReduce(ReduceOp::Sum),
                            sb.device_ptr(),
                            o.device_ptr(),
                            64,
                        )
                    };
                    match r {
                        Ok(()) => String::new(),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every rank reduces on the device, so every rank's launch fails and says so.
    for e in &errors {
        assert!(e.contains("fake launch failure"), "rank error: {e:?}");
    }
    println!("child-checked");
}

#[test]
fn the_rccl_level_matches_the_host_on_the_fake_runtime() {
    with_fake_runtime("child_rccl_level", &[("FAKE_HIP_DEVICES", "4")]);
}

#[test]
fn child_rccl_level() {
    if !is_child() {
        return;
    }
    let rccl = Setup {
        rccl: true,
        ..STAGED
    };
    // One node of 2-4 ranks (RCCL does the whole collective), and 2 nodes x 2 ranks (RCCL
    // inside each node, the transport between them, staged and direct; transposed grids).
    for p in [2, 3, 4] {
        run_world_with(p, "auto", rccl, |r| r);
    }
    for direct in [false, true] {
        let two_nodes = Setup {
            direct,
            per_node: Some(2),
            ..rccl
        };
        run_world_with(4, "ring", two_nodes, |r| r);
    }
    println!("child-checked");
}

/// Runs one f32 all-reduce of 64 elements on `p` thread ranks with `cfg`, rank `r` on fake
/// device `gpu(r)`; returns each rank's outcome (the sum, or the error's text).
fn all_reduce_outcomes(
    p: usize,
    cfg: Config,
    gpu: impl Fn(usize) -> usize + Sync,
) -> Vec<Result<Vec<f32>, String>> {
    let world = ThreadWorld::new(p);
    let gpu = &gpu;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                let cfg = cfg.clone();
                s.spawn(move || {
                    let c = Communicator::with_config(t, cfg).map_err(|e| e.to_string())?;
                    let dev = HipDevice::open(gpu(r)).unwrap();
                    let x = vec![r as f32 + 0.5; 64];
                    let sb = dev.upload(&x).unwrap();
                    let o = dev.alloc_zeroed(256).unwrap();
                    // SAFETY: both buffers hold 64 f32 and live until the call returns.
                    unsafe {
                        c.collective_on::<f32, HipDevice>(
                            &dev,
                            RawCollective::AllReduce(ReduceOp::Sum),
                            sb.device_ptr(),
                            o.device_ptr(),
                            64,
                        )
                    }
                    .map_err(|e| e.to_string())?;
                    Ok(dev.download::<f32>(&o).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn ranks_sharing_a_gpu_are_told_apart_by_uuid() {
    with_fake_runtime("child_shared_gpu", &[("FAKE_HIP_DEVICES", "1")]);
}

#[test]
fn child_shared_gpu() {
    if !is_child() {
        return;
    }
    let cfg = |nccl, per_node| Config {
        nccl,
        ranks_per_node: per_node,
        timeout: std::time::Duration::from_secs(10),
        ..Config::default()
    };
    let want = vec![0.5f32 + 1.5 + 2.5; 64];
    // Three ranks of one node on the one fake GPU: RCCL cannot run them, and PCCL_NCCL=1
    // says which ranks share it.
    for out in all_reduce_outcomes(3, cfg(NcclMode::On, None), |_| 0) {
        let e = out.unwrap_err();
        assert!(e.contains("ranks 0 and 1 share one GPU"), "{e}");
        assert!(e.contains("RCCL"), "{e}");
    }
    // `auto` falls back to host staging and still computes the sum.
    for out in all_reduce_outcomes(3, cfg(NcclMode::Auto, None), |_| 0) {
        assert_eq!(out.unwrap(), want);
    }
    // Each rank its own node: sharing the GPU across nodes is fine (one RCCL world each).
    for out in all_reduce_outcomes(3, cfg(NcclMode::On, Some(1)), |_| 0) {
        assert_eq!(out.unwrap(), want);
    }
    println!("child-checked");
}

#[test]
fn a_failing_rccl_call_fails_the_collective_on_every_rank() {
    with_fake_runtime(
        "child_rccl_failure",
        &[("FAKE_HIP_DEVICES", "3"), ("FAKE_RCCL_FAIL_RANK", "1")],
    );
}

#[test]
fn child_rccl_failure() {
    if !is_child() {
        return;
    }
    let cfg = Config {
        nccl: NcclMode::On,
        timeout: std::time::Duration::from_secs(10),
        ..Config::default()
    };
    let outs = all_reduce_outcomes(3, cfg, |r| r);
    for (r, out) in outs.into_iter().enumerate() {
        let e = out.unwrap_err();
        if r == 1 {
            // The failing call itself.
            assert!(e.contains("RCCL ncclReduceScatter failed"), "rank {r}: {e}");
            assert!(e.contains("FAKE_RCCL_FAIL_RANK"), "rank {r}: {e}");
        } else {
            // The peers' calls were queued; the failure shows as RCCL's asynchronous error.
            assert!(
                e.contains("RCCL") && e.contains("peer failed"),
                "rank {r}: {e}"
            );
        }
    }
    println!("child-checked");
}

/// Runs `pccl-bench` on the fake runtime with `args` and `env`.
fn bench(so: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pccl-bench"));
    cmd.args(args)
        .env("PCCL_HIP_LIBRARY", so)
        .env("PCCL_HIPRTC_LIBRARY", so)
        .env("PCCL_RCCL_LIBRARY", so)
        .env_remove("PCCL_HIP_ARCH")
        .env_remove("PCCL_NCCL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("pccl-bench runs");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn pccl_bench_runs_rocm_and_times_rccl_beside_pccl() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: scripts/gpu-check.sh --rocm runs pccl-bench");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pccl-rocm-fake-{}-bench", std::process::id()));
    let Some(so) = build_fake(&dir) else {
        return;
    };
    let common = ["--ranks", "2", "-m", "1K:8K", "-i", "3", "--check"];
    // Every collective, checked, with the RCCL column and its ratio.
    let (ok, text) = bench(
        &so,
        &[&["-d", "rocm", "--coll", "all"], &common[..]].concat(),
        &[],
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("# device rocm: rank 0 on GPU 0 of 2 (Fake Instinct"),
        "{text}"
    );
    assert!(
        text.contains("RCCL Avg(us)") && text.contains("PCCL/RCCL"),
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 12, "{text}");
    for row in &rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        // ... algo, RCCL Avg(us), PCCL/RCCL, #wrong
        let n = cols.len();
        let vendor: f64 = cols[n - 3].parse().unwrap();
        let ratio: f64 = cols[n - 2].parse().unwrap();
        let avg: f64 = cols[1].parse().unwrap();
        assert!(vendor > 0.0 && (ratio - avg / vendor).abs() < 0.01, "{row}");
        assert_eq!(cols[n - 1], "0", "{row}");
        // Two ranks on two GPUs of one node: the RCCL level ran, and the algo column says so.
        assert_eq!(cols[n - 4], "rccl-level", "{row}");
    }
    // Two nodes of one rank: the RCCL level and the host-staged inter-node algorithm.
    let (ok, text) = bench(
        &so,
        &[&["-d", "rocm", "--coll", "allreduce"], &common[..]].concat(),
        &[("PCCL_RANKS_PER_NODE", "1")],
    );
    assert!(ok, "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 4, "{text}");
    for row in &rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        let algo = cols[cols.len() - 4];
        assert!(
            algo.starts_with("rccl-level+") && algo.len() > "rccl-level+".len(),
            "{row}"
        );
    }
    // Host-staged (PCCL_NCCL=0): the host plan's algorithm.
    let (ok, text) = bench(
        &so,
        &[&["-d", "rocm", "--coll", "allgather"], &common[..]].concat(),
        &[("PCCL_NCCL", "0")],
    );
    assert!(ok, "{text}");
    assert!(!text.contains("rccl-level"), "{text}");
    // -d gpu picks ROCm here; ranks sharing the one GPU get no RCCL column, and say why.
    let (ok, text) = bench(
        &so,
        &[&["-d", "gpu", "--coll", "allreduce"], &common[..]].concat(),
        &[("FAKE_HIP_DEVICES", "1")],
    );
    assert!(ok, "{text}");
    assert!(text.contains("# device rocm"), "{text}");
    assert!(
        text.contains("no RCCL column: ranks 0 and 1 share one GPU"),
        "{text}"
    );
    assert!(!text.contains("PCCL/RCCL"), "{text}");
    // JSON carries the vendor figures.
    let (ok, text) = bench(
        &so,
        &[
            &["-d", "rocm", "--json", "--coll", "reducescatter"],
            &common[..],
        ]
        .concat(),
        &[],
    );
    assert!(ok, "{text}");
    assert!(text.contains("\"vendor_avg_us\"") && text.contains("\"ratio_vs_vendor\""));
    // A failing RCCL call fails the benchmark with RCCL's message (PCCL itself host-staged).
    let (ok, text) = bench(
        &so,
        &[&["-d", "rocm", "--coll", "allgather"], &common[..]].concat(),
        &[("FAKE_RCCL_FAIL_RANK", "1"), ("PCCL_NCCL", "0")],
    );
    assert!(!ok, "{text}");
    // The failing rank's call, or the peer's queued one (RCCL's asynchronous error).
    assert!(
        text.contains("RCCL ncclAllGather failed")
            || text.contains("RCCL asynchronous operation failed"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_c_abi_runs_collectives_on_a_hip_stream() {
    with_fake_runtime("child_capi_hip_stream", &[]);
}

#[test]
fn child_capi_hip_stream() {
    use pccl::capi::*;
    if !is_child() {
        return;
    }
    let p = 2usize;
    let mut world: pcclThreadWorld_t = std::ptr::null_mut();
    // SAFETY: `world` is a writable handle.
    assert_eq!(
        unsafe { pcclThreadWorldCreate(p as i32, &mut world) },
        pcclSuccess
    );
    let world_addr = world as usize;
    let results: Vec<(Vec<f32>, pcclResult_t, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                s.spawn(move || {
                    let mut comm: pcclComm_t = std::ptr::null_mut();
                    // SAFETY: `comm` is a writable handle; the world lives until all joined.
                    let rc = unsafe {
                        pcclCommInitThreads(&mut comm, world_addr as pcclThreadWorld_t, r as i32)
                    };
                    assert_eq!(rc, pcclSuccess);
                    let dev = HipDevice::open(r).unwrap();
                    let x = vec![r as f32 + 1.0; 64];
                    let sb = dev.upload(&x).unwrap();
                    let o = dev.alloc_zeroed(256).unwrap();
                    // SAFETY: both buffers hold 64 f32 of the stream's device.
                    let rc = unsafe {
                        pcclAllReduce(
                            sb.device_ptr() as *const _,
                            o.device_ptr() as *mut _,
                            64,
                            pcclFloat32,
                            pcclSum,
                            comm,
                            dev.raw_stream(),
                        )
                    };
                    assert_eq!(rc, pcclSuccess, "rank {r}");
                    let sum = dev.download::<f32>(&o).unwrap();
                    // A misaligned f32 buffer on the HIP path: an invalid argument, named.
                    // SAFETY: rejected before any memory is touched.
                    let bad = unsafe {
                        pcclAllReduce(
                            (sb.device_ptr() + 1) as *const _,
                            o.device_ptr() as *mut _,
                            8,
                            pcclFloat32,
                            pcclSum,
                            comm,
                            dev.raw_stream(),
                        )
                    };
                    // SAFETY: a NUL-terminated string owned by PCCL.
                    let msg = unsafe { std::ffi::CStr::from_ptr(pcclGetLastError(comm)) }
                        .to_string_lossy()
                        .into_owned();
                    pcclCommDestroy(comm);
                    (sum, bad, msg)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    pcclThreadWorldDestroy(world);
    for (sum, bad, msg) in results {
        assert_eq!(sum, vec![3.0f32; 64]);
        assert_eq!(bad, pcclInvalidArgument, "{msg}");
        assert!(msg.contains("aligned"), "{msg}");
    }
    println!("child-checked");
}
