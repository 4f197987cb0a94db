//! A device that never finishes its work (a hung kernel or copy) must not hang the ranks: the
//! host-staged device collectives poll their device waits under the collective's deadline
//! and the failure board, so every rank gets an error within the timeout plus a second,
//! naming the rank whose device hung; later device collectives of that communicator are
//! refused. Through the C ABI (queued on the caller's stream) the failure is the
//! communicator's asynchronous error. On the fake ROCm runtime (`tests/fake_rocm/fake_rocm.c`, whose
//! `fake_hip_stall_device_from_now` hook makes every later copy and kernel of one device wait
//! until `fake_hip_release_stalls`), thread ranks through the Rust API and through the C ABI.
//! Each check runs in a child process (see `tests/fake_rocm/harness.rs`); skipped where no C
//! compiler is found.

#![cfg(feature = "rocm")]

mod common;
#[path = "fake_rocm/harness.rs"]
mod harness;

use harness::{fake_hook, is_child, with_fake_runtime};
use pccl::config::{Config, NcclMode};
use pccl::device::api::Device;
use pccl::device::hip::HipDevice;
use pccl::{Communicator, ErrorKind, RawCollective, ReduceOp, ThreadWorld};
use std::time::{Duration, Instant};

const N: usize = 4096;
const TIMEOUT: Duration = Duration::from_secs(2);

/// One device all-reduce of `N` f32 on `dev`; the outcome and how long it took.
fn all_reduce(c: &Communicator, dev: &HipDevice, s: u64, o: u64) -> (pccl::Result<()>, Duration) {
    let t0 = Instant::now();
    // SAFETY: both buffers hold `N` f32 of `dev` and live until the (blocking) call returns.
    let r = unsafe {
        c.collective_on::<f32, HipDevice>(dev, RawCollective::AllReduce(ReduceOp::Sum), s, o, N)
    };
    (r, t0.elapsed())
}

#[test]
fn a_hung_device_fails_every_rank_within_the_timeout() {
    with_fake_runtime("child_hung_device", &[("FAKE_HIP_DEVICES", "3")]);
}

#[test]
fn child_hung_device() {
    if !is_child() {
        return;
    }
    let p = 3;
    let world = ThreadWorld::new(p);
    let cfg = Config {
        nccl: NcclMode::Off,
        timeout: TIMEOUT,
        // Several pieces per message: the hung rank waits for a piece's copy mid-collective.
        chunk_bytes: 1024,
        chunk_explicit: true,
        ..Config::default()
    };
    let seen: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                let cfg = cfg.clone();
                sc.spawn(move || {
                    let c = Communicator::with_config(t, cfg).unwrap();
                    let dev = HipDevice::open(r).unwrap();
                    let sb = dev.upload(&vec![1.0f32; N]).unwrap();
                    let o = dev.alloc_zeroed(N * 4).unwrap();
                    let (s, out) = (sb.device_ptr(), o.device_ptr());
                    // A healthy collective first: every buffer exists before the device hangs.
                    let (warm, _) = all_reduce(&c, &dev, s, out);
                    warm.unwrap();
                    assert_eq!(dev.download::<f32>(&o).unwrap(), vec![p as f32; N]);
                    c.barrier().unwrap();
                    if r == 0 {
                        fake_hook("fake_hip_stall_device_from_now", Some(0));
                    }
                    let hung = all_reduce(&c, &dev, s, out);
                    // The next device collective: refused by rank 0, whose device work may
                    // still be running; the others learn it from rank 0's refusal.
                    let later = all_reduce(&c, &dev, s, out);
                    c.barrier().unwrap();
                    if r == 0 {
                        fake_hook("fake_hip_release_stalls", None);
                    }
                    c.barrier().unwrap();
                    (hung, later)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut hung_msgs = Vec::new();
    let mut laters = Vec::new();
    for (r, ((hung, took), (later, _))) in seen.into_iter().enumerate() {
        let e = hung.expect_err("a collective over a hung device must fail");
        println!("rank {r} after {took:?}: {e}");
        // The deadline, the hung rank's final drain (250 ms) and the report's way to the
        // others, stretched on a loaded machine (common::prompt). Under a load of 6–14 on 2
        // cores a rank has been seen to return ~1.05 s past its deadline, always with a
        // peer's report (not understood yet; docs/DEVICE.md, "Open questions").
        let bound = TIMEOUT + common::prompt(Duration::from_millis(1250));
        assert!(took <= bound, "rank {r} took {took:?} (bound {bound:?})");
        assert_eq!(e.kind(), ErrorKind::Timeout, "rank {r}: {e}");
        if r == 0 {
            // Whether its own device wait or a peer's report ended it first, the hung rank
            // names its device.
            assert!(e.message().contains("HIP device 0"), "{e}");
        }
        hung_msgs.push(e.message().to_string());
        laters.push(later);
    }
    // Every other rank's error leads to rank 0: it names rank 0, or a rank (a ring neighbour
    // whose deadline passed a little later under load) whose own error names rank 0.
    for (r, m) in hung_msgs.iter().enumerate().skip(1) {
        let leads = m.contains("rank 0")
            || (1..p).any(|q| {
                q != r && m.contains(&format!("rank {q}")) && hung_msgs[q].contains("rank 0")
            });
        assert!(
            leads,
            "rank {r}'s error does not lead to rank 0: {m}\nall: {hung_msgs:#?}"
        );
    }
    for (r, later) in laters.into_iter().enumerate() {
        let e = later.expect_err("the hung rank refuses later device collectives");
        println!("rank {r} later: {e}");
        assert!(e.message().contains("never finished"), "rank {r}: {e}");
    }
    println!("child-checked");
}

/// Through the C ABI a call on a stream is queued: it returns at once, and the hung device
/// shows as the communicator's asynchronous error (`pcclCommGetAsyncError`) on every rank
/// within the timeout plus a second, naming rank 0; the next device call fails.
#[test]
fn the_c_abi_returns_from_a_hung_hip_stream() {
    with_fake_runtime(
        "child_capi_hung",
        &[("PCCL_TIMEOUT", "2"), ("PCCL_NCCL", "0")],
    );
}

#[test]
fn child_capi_hung() {
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
    let sync = &std::sync::Barrier::new(p);
    let results: Vec<(pcclResult_t, String, Duration)> = std::thread::scope(|s| {
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
                    let sb = dev.upload(&vec![1.0f32; N]).unwrap();
                    let o = dev.alloc_zeroed(N * 4).unwrap();
                    let call = || {
                        // SAFETY: both buffers hold `N` f32 of the stream's device.
                        unsafe {
                            pcclAllReduce(
                                sb.device_ptr() as *const _,
                                o.device_ptr() as *mut _,
                                N,
                                pcclFloat32,
                                pcclSum,
                                comm,
                                dev.raw_stream(),
                            )
                        }
                    };
                    assert_eq!(call(), pcclSuccess, "rank {r}: the healthy call");
                    assert_eq!(pcclBarrier(comm), pcclSuccess);
                    if r == 0 {
                        fake_hook("fake_hip_stall_device_from_now", Some(0));
                    }
                    // Queued: the call returns at once; the failure comes asynchronously.
                    let t0 = Instant::now();
                    assert_eq!(call(), pcclSuccess, "rank {r}: the queued call");
                    let queued = t0.elapsed();
                    assert!(
                        queued < common::prompt(Duration::from_secs(1)),
                        "rank {r}: took {queued:?}"
                    );
                    let mut rc = pcclSuccess;
                    while rc == pcclSuccess && t0.elapsed() < Duration::from_secs(10) {
                        // SAFETY: `rc` is a writable pcclResult_t.
                        assert_eq!(unsafe { pcclCommGetAsyncError(comm, &mut rc) }, pcclSuccess);
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let took = t0.elapsed();
                    // SAFETY: a NUL-terminated string owned by PCCL.
                    let msg = unsafe { std::ffi::CStr::from_ptr(pcclGetLastError(comm)) }
                        .to_string_lossy()
                        .into_owned();
                    // Every later device call fails, naming what failed; the failed rank
                    // told its peers, so host calls fail at once too (the communicator is
                    // unusable until aborted, as NCCL's after an asynchronous error).
                    assert_ne!(call(), pcclSuccess, "rank {r}: a call after the failure");
                    let t1 = Instant::now();
                    assert_ne!(pcclBarrier(comm), pcclSuccess, "rank {r}: a host call");
                    assert!(
                        t1.elapsed() < Duration::from_secs(1),
                        "rank {r}: {:?}",
                        t1.elapsed()
                    );
                    sync.wait();
                    if r == 0 {
                        fake_hook("fake_hip_release_stalls", None);
                    }
                    sync.wait();
                    pcclCommDestroy(comm);
                    (rc, msg, took)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    pcclThreadWorldDestroy(world);
    for (r, (rc, msg, took)) in results.into_iter().enumerate() {
        println!("rank {r} after {took:?}: {rc} {msg}");
        // Rank 0 timed out; rank 1 learns it from rank 0, or its own deadline (the same
        // length) passes first: either way its error names rank 0.
        let expected: &[pcclResult_t] = if r == 0 {
            &[pcclTimeout]
        } else {
            &[pcclRemoteError, pcclTimeout]
        };
        assert!(expected.contains(&rc), "rank {r}: {rc} {msg}");
        assert!(msg.contains("rank 0"), "rank {r}: {msg}");
        assert!(
            took <= common::prompt(Duration::from_secs(3)),
            "rank {r} took {took:?}"
        );
    }
    println!("child-checked");
}
