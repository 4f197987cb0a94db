//! Device collectives queued on a caller's HIP stream without blocking (the stream gate on
//! HIP, through the C ABI), and the NCCL-shaped level following `set_timeout`, on the fake
//! ROCm runtime (`tests/fake_rocm/fake_rocm.c`, whose streams run their work on threads of
//! their own, so a call that blocked on the stream would be seen). Each check runs in a child
//! process (see `tests/fake_rocm/harness.rs`); skipped where no C compiler is found.

#![cfg(feature = "rocm")]

#[path = "fake_rocm/harness.rs"]
mod harness;

use harness::{is_child, real_runtime, with_fake_runtime};
use pccl::capi::*;
use pccl::config::{Config, NcclMode};
use pccl::device::api::Device;
use pccl::device::hip::HipDevice;
use pccl::{Communicator, ErrorKind, RawCollective, ReduceOp, ThreadWorld};
use std::time::{Duration, Instant};

const N: usize = 64;

/// What one rank saw: the sum it read back, whether its stream was still held when the call
/// returned, how long the call took, and the outcome of the call after a fault (if any).
struct Seen {
    sum: Vec<f32>,
    untouched_while_held: bool,
    call_time: Duration,
}

fn last_error(comm: pcclComm_t) -> String {
    // SAFETY: a NUL-terminated string owned by PCCL.
    unsafe { std::ffi::CStr::from_ptr(pcclGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

/// Two thread ranks over the C ABI, each on its own fake GPU: a first all-reduce (which
/// decides the level with every rank), then one queued on a stream held shut by a gate of the
/// test, with a device-to-host copy queued behind it; the stream is released only after the
/// call returned, and the copy must then hold the sum. With `shared`, both ranks use fake GPU
/// 0 and communicate over TCP (`pcclCommInitRank`): ranks of one process on one GPU, which
/// block (see docs/DEVICE.md; processes sharing a GPU queue).
fn queued_on_a_held_stream(shared: bool) -> Vec<Seen> {
    let p = 2usize;
    let mut world: pcclThreadWorld_t = std::ptr::null_mut();
    // SAFETY: `world` is a writable handle.
    assert_eq!(
        unsafe { pcclThreadWorldCreate(p as i32, &mut world) },
        pcclSuccess
    );
    let world_addr = world as usize;
    let mut id = pcclUniqueId {
        internal: [0; PCCL_UNIQUE_ID_BYTES],
    };
    if shared {
        // SAFETY: `id` is a writable pcclUniqueId.
        assert_eq!(unsafe { pcclGetUniqueId(&mut id) }, pcclSuccess);
    }
    let barrier = std::sync::Barrier::new(p);
    let barrier = &barrier;
    let seen = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                s.spawn(move || {
                    let mut comm: pcclComm_t = std::ptr::null_mut();
                    // SAFETY: `comm` is a writable handle; the world lives until all joined.
                    let rc = unsafe {
                        if shared {
                            pcclCommInitRank(&mut comm, p as i32, id, r as i32)
                        } else {
                            pcclCommInitThreads(
                                &mut comm,
                                world_addr as pcclThreadWorld_t,
                                r as i32,
                            )
                        }
                    };
                    assert_eq!(rc, pcclSuccess);
                    assert_eq!(pcclCommSetDeviceRuntime(comm, pcclRuntimeHip), pcclSuccess);
                    let dev = HipDevice::open(if shared { 0 } else { r }).unwrap();
                    let x = vec![r as f32 + 1.0; N];
                    let mut sb = dev.upload(&x).unwrap();
                    let mut o = dev.alloc_zeroed(N * 4).unwrap();
                    let (sp, op) = (sb.device_ptr(), o.device_ptr());
                    let all_reduce = || {
                        // SAFETY: both buffers hold N f32 of the stream's device and live
                        // until the stream is synchronised below.
                        unsafe {
                            pcclAllReduce(
                                sp as *const _,
                                op as *mut _,
                                N,
                                pcclFloat32,
                                pcclSum,
                                comm,
                                dev.raw_stream(),
                            )
                        }
                    };
                    // The first call decides the level with every rank.
                    assert_eq!(all_reduce(), pcclSuccess, "rank {r}: {}", last_error(comm));
                    assert_eq!(dev.download::<f32>(&o).unwrap(), vec![3.0f32; N]);
                    // New inputs (sum 21) and a cleared output for the queued call.
                    dev.upload_into(&vec![r as f32 + 10.0; N], &mut sb).unwrap();
                    dev.upload_into(&vec![0.0f32; N], &mut o).unwrap();
                    barrier.wait();
                    // Hold the caller's stream shut: nothing queued after this runs until
                    // the test releases ticket 1.
                    let mut gate = dev.new_gate().unwrap();
                    let ticket = dev.gate_hold(&mut gate).unwrap();
                    let release = HipDevice::gate_releaser(&gate);
                    let t0 = Instant::now();
                    // A call that waited for the stream would wait forever: a watchdog lets
                    // the stream go after 3 s, and the call's duration tells.
                    let called = std::sync::atomic::AtomicBool::new(false);
                    let called = &called;
                    let rc = std::thread::scope(|w| {
                        w.spawn(move || {
                            let t = Instant::now();
                            while !called.load(std::sync::atomic::Ordering::SeqCst)
                                && t.elapsed() < Duration::from_secs(3)
                            {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            if !called.load(std::sync::atomic::Ordering::SeqCst) {
                                release.release(ticket);
                            }
                        });
                        let rc = all_reduce();
                        called.store(true, std::sync::atomic::Ordering::SeqCst);
                        rc
                    });
                    let call_time = t0.elapsed();
                    assert_eq!(rc, pcclSuccess, "rank {r}: {}", last_error(comm));
                    let mut back = vec![f32::NAN; N];
                    let out = dev.span_of(&o);
                    // SAFETY: `back` holds N f32 and outlives the synchronisation below.
                    unsafe { dev.copy_dtoh(None, back.as_mut_ptr() as *mut u8, out) }.unwrap();
                    std::thread::sleep(Duration::from_millis(50));
                    let untouched_while_held = back.iter().all(|v| v.is_nan());
                    release.release(ticket);
                    dev.synchronize().unwrap();
                    barrier.wait();
                    pcclCommDestroy(comm);
                    drop(gate);
                    Seen {
                        sum: back,
                        untouched_while_held,
                        call_time,
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    pcclThreadWorldDestroy(world);
    seen
}

fn env_for(rccl: bool) -> Vec<(&'static str, &'static str)> {
    vec![
        ("PCCL_DEVICE_ASYNC", "1"),
        ("PCCL_NCCL", if rccl { "1" } else { "0" }),
        // A rank that routed to CUDA would fail: the communicator says HIP.
        ("PCCL_DEVICE_RUNTIME", "cuda"),
        ("PCCL_TIMEOUT", "30"),
    ]
}

#[test]
fn a_hip_stream_collective_is_queued_without_blocking_the_caller() {
    with_fake_runtime("child_queued_staged", &env_for(false));
    with_fake_runtime("child_queued_rccl", &env_for(true));
}

fn check_queued() {
    for (r, s) in queued_on_a_held_stream(false).into_iter().enumerate() {
        assert!(
            s.untouched_while_held,
            "rank {r}: the copy queued after the collective ran before the stream was released"
        );
        assert!(
            s.call_time < Duration::from_millis(2000),
            "rank {r}: the call took {:?} on a held stream",
            s.call_time
        );
        assert_eq!(s.sum, vec![21.0f32; N], "rank {r}");
    }
    println!("child-checked");
}

#[test]
fn child_queued_staged() {
    if is_child() {
        check_queued();
    }
}

#[test]
fn child_queued_rccl() {
    if is_child() {
        check_queued();
    }
}

/// Ranks of one process sharing one GPU (here over TCP) block instead of queueing: under
/// CUDA's implicit synchronisation one rank's allocation would order the other's program
/// behind its own pending collective. The call waits for the held stream (released by the
/// watchdog after 3 s) and the result is exact.
#[test]
fn ranks_sharing_a_gpu_block_instead_of_gating_the_stream() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: two ranks of one process on GPU 0");
        return;
    }
    // The staged check's settings, with PCCL_DEVICE_ASYNC left to its default.
    let env: Vec<_> = env_for(false)
        .into_iter()
        .filter(|(k, _)| *k != "PCCL_DEVICE_ASYNC")
        .collect();
    with_fake_runtime("child_shared_gpu_blocks", &env);
}

#[test]
fn child_shared_gpu_blocks() {
    if !is_child() {
        return;
    }
    for (r, s) in queued_on_a_held_stream(true).into_iter().enumerate() {
        assert!(
            s.call_time >= Duration::from_millis(2500),
            "rank {r}: the call returned after {:?}, before its held stream was released: it \
             was queued although another rank of this process uses the same GPU",
            s.call_time
        );
        assert_eq!(s.sum, vec![21.0f32; N], "rank {r}");
    }
    println!("child-checked");
}

#[test]
fn the_rccl_level_follows_set_timeout() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: needs a peer that never calls");
        return;
    }
    with_fake_runtime(
        "child_rccl_set_timeout",
        &[
            ("FAKE_RCCL_TIMEOUT_S", "60"),
            ("PCCL_DEVICE_RUNTIME", "hip"),
        ],
    );
}

#[test]
fn child_rccl_set_timeout() {
    if !is_child() {
        return;
    }
    let p = 2usize;
    let cfg = Config {
        nccl: NcclMode::On,
        timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let world = ThreadWorld::new(p);
    let barrier = std::sync::Barrier::new(p);
    let barrier = &barrier;
    let outcomes: Vec<Option<(ErrorKind, String, Duration)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                let cfg = cfg.clone();
                s.spawn(move || {
                    let c = Communicator::with_config(t, cfg).unwrap();
                    let dev = HipDevice::open(r).unwrap();
                    let sb = dev.upload(&vec![1.0f32; N]).unwrap();
                    let o = dev.alloc_zeroed(N * 4).unwrap();
                    let call = || {
                        // SAFETY: both buffers hold N f32 and live until the call returns.
                        unsafe {
                            c.collective_on::<f32, HipDevice>(
                                &dev,
                                RawCollective::AllReduce(ReduceOp::Sum),
                                sb.device_ptr(),
                                o.device_ptr(),
                                N,
                            )
                        }
                    };
                    // Sets the RCCL level up on both ranks.
                    call().unwrap();
                    let out = if r == 0 {
                        // Rank 1 never joins this one: the shortened timeout must end it.
                        c.set_timeout(Duration::from_millis(1500)).unwrap();
                        let t0 = Instant::now();
                        let e = call().unwrap_err();
                        Some((e.kind(), e.to_string(), t0.elapsed()))
                    } else {
                        None
                    };
                    barrier.wait();
                    drop(c);
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (kind, msg, took) = outcomes[0].clone().unwrap();
    assert_eq!(kind, ErrorKind::Timeout, "{msg}");
    assert!(msg.contains("RCCL") && msg.contains("1.5s"), "{msg}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(10),
        "the call took {took:?} with a 1.5 s timeout (60 s at creation)"
    );
    println!("child-checked");
}
