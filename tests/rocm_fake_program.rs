//! Queued device collectives as stream programs (src/comm/device_program.rs) on the fake ROCm
//! runtime, whose streams run on threads of their own: the cycle behind the FSDP2 hang
//! (CUDA's implicit synchronisation of allocations, reproduced by the fake with
//! `FAKE_HIP_IMPLICIT_SYNC=1`) and how queued collectives now survive it; no host block on the
//! first call of a shape or with ranks sharing a GPU; an `async_op=True`-style collective
//! leaving the caller's stream free until waited for; a failed collective holding the work
//! behind it until abort; a stuck one timing out; graph capture refused; one rank as one copy.
//! Each check runs in a child process (tests/fake_rocm/harness.rs); skipped without a C
//! compiler.

#![cfg(feature = "rocm")]

#[path = "fake_rocm/harness.rs"]
mod harness;
#[path = "fake_rocm/streams.rs"]
mod streams;

use harness::{fake_hook, is_child, real_runtime, with_fake_runtime};
use pccl::device::api::Device;
use pccl::device::hip::HipDevice;
use pccl::{DeviceWork, ErrorKind, RawCollective, ReduceOp};
use std::time::{Duration, Instant};
use streams::{copy_back, on_ranks, Held};

const SUM: RawCollective = RawCollective::AllReduce(ReduceOp::Sum);

// ---- the cycle, on the fake runtime alone -------------------------------------------------

#[test]
fn an_allocation_orders_later_work_behind_a_held_stream() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: the fake's implicit-synchronisation rule");
        return;
    }
    with_fake_runtime("child_allocation_rule", &[("FAKE_HIP_IMPLICIT_SYNC", "1")]);
}

/// What the old design did: the caller's stream held by a gate the progress thread releases
/// after its own device copy, and an allocation made meanwhile by another thread. The copy,
/// queued after the allocation, waits behind the held stream: were its release waiting for
/// that copy, nothing would ever move again.
#[test]
fn child_allocation_rule() {
    if !is_child() {
        return;
    }
    let dev = HipDevice::open(0).unwrap();
    let progress = dev.open_own().unwrap();
    let src = dev.upload(&[7.0f32; 16]).unwrap();
    let held = Held::new(&dev);
    let _torch_allocates = dev.alloc_zeroed(1 << 20).unwrap();
    let mut out = [0.0f32; 16];
    let ev = copy_back(&progress, src.device_ptr(), &mut out);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !progress.event_done(&ev).unwrap(),
        "a copy queued after an allocation ran while an earlier stream was held"
    );
    held.release();
    progress.sync_event(&ev).unwrap();
    assert_eq!(out, [7.0f32; 16]);
    println!("child-checked");
}

// ---- queued collectives under the rule ------------------------------------------------------

fn env(rccl: bool) -> Vec<(&'static str, &'static str)> {
    vec![
        ("FAKE_HIP_IMPLICIT_SYNC", "1"),
        ("PCCL_NCCL", if rccl { "1" } else { "0" }),
        ("PCCL_TIMEOUT", "20"),
    ]
}

#[test]
fn queued_collectives_never_block_the_host_and_survive_allocations() {
    with_fake_runtime("child_no_block_staged", &env(false));
    with_fake_runtime("child_no_block_rccl", &env(true));
    if !real_runtime() {
        // Without the implicit-synchronisation rule: these ranks block, and a stream the test
        // holds while the other rank allocates would order that rank's blocking work behind
        // it (the watchdog ends it, but under load the two ranks' watchdogs can interlock).
        let plain: Vec<_> = env(false)
            .into_iter()
            .filter(|(k, _)| *k != "FAKE_HIP_IMPLICIT_SYNC")
            .collect();
        with_fake_runtime("child_no_block_shared_gpu", &plain);
    }
}

/// Interleaved shapes (each first of its kind once): every call returns while the caller's
/// stream is held (a call that waited for the device would return after the 3 s watchdog),
/// device and page-locked memory are allocated while the collective is queued, and every
/// result is exact. With `shared` (two thread ranks on one GPU, which must block: one's
/// allocation would order the other's program behind its own pending collective) the calls
/// wait for the held stream and the results are exact.
fn check_no_block(shared: bool) {
    let shapes: &[usize] = if shared {
        &[64, 1000]
    } else {
        &[64, 1000, 64, 4096, 1000, 77]
    };
    let got = on_ranks(2, shared, |r, c, dev, barrier| {
        let mut worst = Duration::ZERO;
        for (i, &n) in shapes.iter().enumerate() {
            let x = vec![(r + 1 + i) as f32; n];
            let sb = dev.upload(&x).unwrap();
            let o = dev.alloc_zeroed(n * 4).unwrap();
            barrier.wait();
            let held = Held::new(&dev);
            let (rc, took) = held.during(|| {
                // SAFETY: both buffers hold n f32 and live until the stream is synchronised.
                unsafe {
                    c.enqueue_on::<f32, HipDevice>(&dev, SUM, sb.device_ptr(), o.device_ptr(), n)
                }
            });
            rc.unwrap_or_else(|e| panic!("rank {r} shape {n}: {e}"));
            worst = worst.max(took);
            // What torch's allocator does between calls: new device and pinned memory.
            let _a = dev.alloc_zeroed(n * 8).unwrap();
            let _b = dev.pinned(n * 8).unwrap();
            let mut back = vec![f32::NAN; n];
            let _ev = copy_back(&dev, o.device_ptr(), &mut back);
            held.release();
            dev.synchronize().unwrap();
            let want = (1 + i) as f32 + (2 + i) as f32;
            assert!(
                back.iter().all(|&v| v == want),
                "rank {r} shape {n}: got {:?}, want {want}",
                &back[..4.min(n)]
            );
        }
        worst
    });
    for (r, worst) in got.into_iter().enumerate() {
        if shared {
            assert!(
                worst >= Duration::from_millis(2500),
                "rank {r}: a call returned after {worst:?} with its held stream: it was queued \
                 although another thread rank uses the same GPU"
            );
        } else {
            assert!(
                worst < Duration::from_millis(1500),
                "rank {r}: a queued call took {worst:?} while its stream was held"
            );
        }
    }
    println!("child-checked");
}

#[test]
fn child_no_block_staged() {
    if is_child() {
        check_no_block(false);
    }
}

#[test]
fn child_no_block_rccl() {
    if is_child() {
        check_no_block(false);
    }
}

#[test]
fn child_no_block_shared_gpu() {
    if is_child() {
        check_no_block(true);
    }
}

// ---- async_op=True: the caller's stream stays free until waited for -------------------------

#[test]
fn an_async_collective_leaves_the_stream_free_until_waited_for() {
    with_fake_runtime("child_async_overlap", &env(false));
}

#[test]
fn child_async_overlap() {
    if !is_child() {
        return;
    }
    const N: usize = 256;
    on_ranks(2, false, |r, c, dev, barrier| {
        let sb = dev.upload(&[(r + 1) as f32; N]).unwrap();
        let o = dev.alloc_zeroed(N * 4).unwrap();
        let other = dev.upload(&vec![5.0f32; N]).unwrap();
        // The first device call decides the level with every rank (host collectives, once).
        // SAFETY: both buffers hold N f32 and live until the work ended.
        unsafe {
            c.enqueue_async_on::<f32, HipDevice>(&dev, SUM, sb.device_ptr(), o.device_ptr(), N)
        }
        .unwrap()
        .synchronize(&dev)
        .unwrap();
        barrier.wait();
        if r == 1 {
            // The peer joins late: rank 0's collective cannot end before.
            std::thread::sleep(Duration::from_millis(800));
        }
        // SAFETY: both buffers hold N f32 and live until the work ended (synchronised below).
        let work: DeviceWork<HipDevice> = unsafe {
            c.enqueue_async_on::<f32, HipDevice>(&dev, SUM, sb.device_ptr(), o.device_ptr(), N)
        }
        .unwrap();
        if r == 0 {
            // Work queued on the caller's stream after the call runs while it is in flight.
            let mut mine = vec![0.0f32; N];
            let ev = copy_back(&dev, other.device_ptr(), &mut mine);
            let t0 = Instant::now();
            while !dev.event_done(&ev).unwrap() {
                assert!(
                    t0.elapsed() < Duration::from_millis(600),
                    "the caller's stream was held"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(
                !work.is_completed(&dev).unwrap(),
                "ended before the peer joined"
            );
            assert_eq!(mine, vec![5.0f32; N]);
            // wait() on another stream orders that stream after the collective.
            let side = dev.open_own().unwrap();
            work.wait_on(&side).unwrap();
            let mut out = vec![f32::NAN; N];
            let ev = copy_back(&side, o.device_ptr(), &mut out);
            side.sync_event(&ev).unwrap();
            assert!(work.is_completed(&dev).unwrap());
            assert_eq!(out, vec![3.0f32; N]);
        }
        work.synchronize(&dev).unwrap();
        assert_eq!(dev.download::<f32>(&o).unwrap(), vec![3.0f32; N]);
    });
    println!("child-checked");
}

// ---- failures: the dependent work stays held; a stuck collective times out ---------------

#[test]
fn a_failed_queued_collective_holds_the_work_behind_it_until_abort() {
    if real_runtime() {
        println!(
            "skipped on the real ROCm runtime: needs a disagreeing peer and the fake's faults"
        );
        return;
    }
    with_fake_runtime("child_failure_holds_staged", &env(false));
    with_fake_runtime("child_failure_holds_rccl", &env(true));
}

/// Rank 1 disagrees (staged: another count) or its RCCL calls fail: every rank's collective
/// fails, raised by `synchronize` with the collective's name and number; a copy of the output
/// queued behind it has not run when the error is known, and runs after abort.
fn check_failure_holds(rccl: bool) {
    const N: usize = 128;
    let got = on_ranks(2, false, |r, c, dev, barrier| {
        let sb = dev.upload(&vec![1.0f32; N]).unwrap();
        let o = dev.alloc_zeroed(N * 4).unwrap();
        // SAFETY: both buffers hold N f32 and outlive every use below.
        let call = |n: usize| unsafe {
            c.enqueue_async_on::<f32, HipDevice>(&dev, SUM, sb.device_ptr(), o.device_ptr(), n)
        };
        call(N).unwrap().synchronize(&dev).unwrap(); // sets the RCCL level up
        barrier.wait();
        if rccl && r == 0 {
            fake_hook("fake_rccl_fail_rank_from_now", Some(1));
        }
        barrier.wait();
        let n = if !rccl && r == 1 { N - 1 } else { N };
        let mut back = vec![f32::NAN; N];
        let (err, held, ev) = match call(n) {
            // The peer's failure can arrive before this rank waits: `wait_on` then refuses to
            // order the stream behind a failed collective (nothing was released).
            Ok(work) if work.wait_on(&dev).is_err() => {
                (work.synchronize(&dev).unwrap_err(), true, None)
            }
            Ok(work) => {
                let ev = copy_back(&dev, o.device_ptr(), &mut back);
                let err = work.synchronize(&dev).unwrap_err();
                std::thread::sleep(Duration::from_millis(200));
                let held = !dev.event_done(&ev).unwrap() && back.iter().all(|v| v.is_nan());
                (err, held, Some(ev))
            }
            // RCCL's failing rank: its call fails when queued, nothing was held.
            Err(e) => (e, true, None),
        };
        let later = call(N).unwrap_err();
        barrier.wait();
        c.abort();
        if let Some(ev) = ev {
            dev.sync_event(&ev).unwrap();
        }
        (err.to_string(), held, later.to_string())
    });
    for (r, (err, held, later)) in got.into_iter().enumerate() {
        assert!(
            held,
            "rank {r}: the copy behind the failed collective ran ({err})"
        );
        assert!(err.contains("all_reduce #"), "rank {r}: {err}");
        assert!(
            later.contains("an earlier queued collective failed"),
            "rank {r}: {later}"
        );
    }
    println!("child-checked");
}

#[test]
fn child_failure_holds_staged() {
    if is_child() {
        check_failure_holds(false);
    }
}

#[test]
fn child_failure_holds_rccl() {
    if is_child() {
        check_failure_holds(true);
    }
}

#[test]
fn a_stuck_queued_collective_times_out_on_every_rank() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: needs the fake's stalls");
        return;
    }
    let mut e = env(false);
    e.retain(|(k, _)| *k != "PCCL_TIMEOUT");
    e.push(("PCCL_TIMEOUT", "2"));
    e.push(("FAKE_HIP_DEVICES", "3"));
    with_fake_runtime("child_stuck_times_out", &e);
}

#[test]
fn child_stuck_times_out() {
    if !is_child() {
        return;
    }
    const N: usize = 64;
    let got = on_ranks(3, false, |r, c, dev, barrier| {
        let sb = dev.upload(&vec![1.0f32; N]).unwrap();
        let o = dev.alloc_zeroed(N * 4).unwrap();
        barrier.wait();
        if r == 0 {
            // Device 0 hangs from here on (a stuck kernel): its input never reaches the host.
            fake_hook("fake_hip_stall_device_from_now", Some(0));
        }
        barrier.wait();
        let t0 = Instant::now();
        // SAFETY: both buffers hold N f32 and outlive the work (aborted below).
        let work = unsafe {
            c.enqueue_async_on::<f32, HipDevice>(&dev, SUM, sb.device_ptr(), o.device_ptr(), N)
        }
        .unwrap();
        let err = work.synchronize(&dev).unwrap_err();
        let took = t0.elapsed();
        barrier.wait();
        if r == 0 {
            fake_hook("fake_hip_release_stalls", None);
        }
        c.abort();
        (err.kind(), err.to_string(), took)
    });
    for (r, (kind, msg, took)) in got.into_iter().enumerate() {
        assert!(
            took < Duration::from_secs(6),
            "rank {r}: the stuck collective was raised after {took:?} with PCCL_TIMEOUT=2: {msg}"
        );
        if r == 0 {
            assert_eq!(kind, ErrorKind::Timeout, "{msg}");
            assert!(msg.contains("did not finish within"), "{msg}");
        } else {
            assert!(msg.contains("rank 0"), "rank {r}: {msg}");
        }
    }
    println!("child-checked");
}

// ---- graph capture; one rank ----------------------------------------------------------------

#[test]
fn a_collective_during_graph_capture_is_refused_and_ranks_stay_in_step() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: the fake's capture switch");
        return;
    }
    with_fake_runtime("child_capture_refused", &env(false));
}

#[test]
fn child_capture_refused() {
    if !is_child() {
        return;
    }
    const N: usize = 32;
    on_ranks(2, false, |r, c, dev, barrier| {
        let sb = dev.upload(&[(r + 1) as f32; N]).unwrap();
        let o = dev.alloc_zeroed(N * 4).unwrap();
        // SAFETY: both buffers hold N f32 and outlive the calls (synchronised below).
        let call = || unsafe {
            c.enqueue_on::<f32, HipDevice>(&dev, SUM, sb.device_ptr(), o.device_ptr(), N)
        };
        if r == 0 {
            fake_hook("fake_hip_capture_all", Some(1));
        }
        barrier.wait();
        let e = call().unwrap_err();
        assert!(e.to_string().contains("capturing a graph"), "rank {r}: {e}");
        barrier.wait();
        if r == 0 {
            fake_hook("fake_hip_capture_all", Some(0));
        }
        barrier.wait();
        call().unwrap();
        dev.synchronize().unwrap();
        assert_eq!(dev.download::<f32>(&o).unwrap(), vec![3.0f32; N]);
    });
    println!("child-checked");
}

#[test]
fn one_rank_is_one_device_copy() {
    with_fake_runtime("child_one_rank", &env(false));
}

#[test]
fn child_one_rank() {
    if !is_child() {
        return;
    }
    on_ranks(1, false, |_, c, dev, _| {
        let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let sb = dev.upload(&x).unwrap();
        let mut o = dev.alloc_zeroed(400).unwrap();
        for coll in [
            RawCollective::AllGather,
            RawCollective::ReduceScatter(ReduceOp::Avg),
            SUM,
            RawCollective::Broadcast(0),
        ] {
            dev.upload_into(&[0.0f32; 100], &mut o).unwrap();
            // SAFETY: both buffers hold 100 f32 and live until the downloads below.
            unsafe {
                c.enqueue_on::<f32, HipDevice>(&dev, coll, sb.device_ptr(), o.device_ptr(), 100)
            }
            .unwrap();
            assert_eq!(dev.download::<f32>(&o).unwrap(), x, "{coll:?}");
            // In place: nothing to do, nothing changes.
            // SAFETY: as above.
            unsafe {
                c.enqueue_on::<f32, HipDevice>(&dev, coll, o.device_ptr(), o.device_ptr(), 100)
            }
            .unwrap();
            assert_eq!(dev.download::<f32>(&o).unwrap(), x, "{coll:?} in place");
        }
    });
    println!("child-checked");
}

// ---- rooted collectives and all-to-all on device memory -------------------------------------

#[test]
fn rooted_collectives_and_all_to_all_are_queued_on_device_memory() {
    let mut e = env(false);
    e.push(("FAKE_HIP_DEVICES", "3"));
    with_fake_runtime("child_rooted_on_device", &e);
}

/// Reduce, gather and scatter (out of place and in place at the root) and all-to-all, queued
/// on a held stream (each call returns before the stream moves), on 3 thread ranks; every
/// result exact, buffers a rank does not use untouched.
#[test]
fn child_rooted_on_device() {
    use pccl::RawRooted;
    if !is_child() {
        return;
    }
    const C: usize = 5;
    let p = 3usize;
    on_ranks(p, false, |r, c, dev, barrier| {
        let val = |rank: usize, i: usize| (rank * 100 + i) as f32;
        let mine: Vec<f32> = (0..p * C).map(|i| val(r, i)).collect();
        let run = |coll: RawRooted, send: u64, recv: u64| -> Vec<f32> {
            barrier.wait();
            let held = Held::new(&dev);
            let (rc, took) = held.during(|| {
                // SAFETY: the buffers hold what `coll` uses on this rank and live until the
                // stream is synchronised below.
                unsafe { c.enqueue_rooted_on::<f32, HipDevice>(&dev, coll, send, recv, C) }
            });
            rc.unwrap_or_else(|e| panic!("rank {r} {coll:?}: {e}"));
            assert!(
                took < Duration::from_millis(1500),
                "rank {r} {coll:?}: took {took:?}"
            );
            // A copy queued on the caller's stream after the call must see the result.
            let mut back = vec![f32::NAN; 3 * C];
            let ev = copy_back(&dev, recv, &mut back);
            held.release();
            dev.sync_event(&ev).unwrap();
            dev.synchronize().unwrap();
            back
        };
        // Reduce to root 1: sum over ranks of element i of the first C.
        let sb = dev.upload(&mine).unwrap();
        let mut out = dev.upload(&[-1.0f32; 3 * C]).unwrap();
        let got = run(
            RawRooted::Reduce(ReduceOp::Sum, 1),
            sb.device_ptr(),
            out.device_ptr(),
        );
        if r == 1 {
            let want: Vec<f32> = (0..C).map(|i| (0..p).map(|q| val(q, i)).sum()).collect();
            assert_eq!(&got[..C], &want[..], "reduce at the root");
        } else {
            assert!(
                got.iter().all(|&v| v == -1.0),
                "rank {r}: reduce wrote off the root"
            );
        }
        // Gather to root 2 (each sends its first C).
        dev.upload_into(&[-1.0f32; 3 * C], &mut out).unwrap();
        let got = run(RawRooted::Gather(2), sb.device_ptr(), out.device_ptr());
        let gathered: Vec<f32> = (0..p)
            .flat_map(|q| (0..C).map(move |i| val(q, i)))
            .collect();
        if r == 2 {
            assert_eq!(got, gathered, "gather at the root");
        }
        // Gather in place at the root: its block already at block `root` of the output.
        let mut inplace: Vec<f32> = vec![-1.0; p * C];
        inplace[2 * C..3 * C].copy_from_slice(&mine[..C]);
        dev.upload_into(&inplace, &mut out).unwrap();
        let send = if r == 2 {
            out.device_ptr() + (2 * C * 4) as u64
        } else {
            sb.device_ptr()
        };
        let got = run(RawRooted::Gather(2), send, out.device_ptr());
        if r == 2 {
            assert_eq!(got, gathered, "gather in place");
        }
        // Scatter from root 2: rank q receives block q of the root's buffer.
        dev.upload_into(&[-1.0f32; 3 * C], &mut out).unwrap();
        let got = run(RawRooted::Scatter(2), sb.device_ptr(), out.device_ptr());
        let want: Vec<f32> = (0..C).map(|i| val(2, r * C + i)).collect();
        assert_eq!(&got[..C], &want[..], "rank {r}: scatter");
        // All-to-all: rank r receives block r of every rank, in rank order.
        let got = run(RawRooted::AllToAll, sb.device_ptr(), out.device_ptr());
        let want: Vec<f32> = (0..p)
            .flat_map(|q| (0..C).map(move |i| val(q, r * C + i)))
            .collect();
        assert_eq!(got, want, "rank {r}: all-to-all");
    });
    println!("child-checked");
}

// ---- events reused ---------------------------------------------------------------------------

#[test]
fn queued_collectives_reuse_their_events() {
    with_fake_runtime("child_events_reused_staged", &env(false));
    with_fake_runtime("child_events_reused_rccl", &env(true));
}

#[test]
fn child_events_reused_staged() {
    if is_child() {
        check_events_reused();
    }
}

#[test]
fn child_events_reused_rccl() {
    if is_child() {
        check_events_reused();
    }
}

/// After a warm-up, each queued collective makes one new event (its end, which the caller
/// may keep); the caller stream's point, the host sections' and the vendor steps' events
/// come back from the pool (three per call before).
fn check_events_reused() {
    const CALLS: i64 = 40;
    let made = on_ranks(2, false, |r, c, dev, barrier| {
        let b = dev.upload(&[r as f32 + 1.0; 256]).unwrap();
        let call = || {
            // SAFETY: `b` holds 256 f32 and outlives the synchronisation below.
            unsafe {
                c.enqueue_on::<f32, HipDevice>(&dev, SUM, b.device_ptr(), b.device_ptr(), 256)
            }
            .unwrap()
        };
        for _ in 0..3 {
            call();
        }
        dev.synchronize().unwrap();
        barrier.wait();
        let before = harness::fake_events_created();
        barrier.wait();
        for _ in 0..CALLS {
            call();
            dev.synchronize().unwrap();
        }
        barrier.wait();
        let made = harness::fake_events_created() - before;
        barrier.wait();
        made
    });
    // Both ranks' events: one end event per call each, a few more while the pools fill.
    assert!(
        made[0] <= 2 * CALLS + 8,
        "{} events for {} calls on 2 ranks",
        made[0],
        2 * CALLS
    );
    println!("child-checked");
}
