//! The quantized collectives on device memory (`csrc/quant.cu` through the HIP back end) on
//! the fake ROCm runtime, whose kernels are C versions of the CUDA/HIP sources: every result
//! equals the host form's bit for bit (same encoding, same order of the f32 partial sums),
//! over dtypes × bits × blocks × node shapes; a NaN on one rank's device, a rank that passes
//! another block size and a kernel that fails each end the call on every rank, named, and
//! nothing hangs. Each check runs in a child process (tests/fake_rocm/harness.rs); skipped
//! without a C compiler.

#![cfg(feature = "rocm")]

mod common;
#[path = "fake_rocm/harness.rs"]
mod harness;

use half::{bf16, f16};
use harness::{fake_batch_launches, fake_hook, is_child, with_fake_runtime};
use pccl::config::Config;
use pccl::device::hip::HipDevice;
use pccl::quant::QuantFloat;
use pccl::{Communicator, ErrorKind, Quant, QuantScheme, ThreadWorld};
use std::time::{Duration, Instant};

/// Runs `body(rank, comm, device)` on 4 thread ranks in nodes of `m`, rank `r` on fake GPU
/// `r`.
fn on_nodes<R: Send>(
    m: usize,
    body: impl Fn(usize, &Communicator, &HipDevice) -> R + Sync,
) -> Vec<R> {
    on_world(4, (m, None), body)
}

/// Runs `body(rank, comm, device)` on `p` thread ranks in nodes of `m` (groups of `g` inside
/// each where given), rank `r` on fake GPU `r`.
fn on_world<R: Send>(
    p: usize,
    (m, g): (usize, Option<usize>),
    body: impl Fn(usize, &Communicator, &HipDevice) -> R + Sync,
) -> Vec<R> {
    let world = ThreadWorld::new(p);
    let body = &body;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                s.spawn(move || {
                    let cfg = Config {
                        ranks_per_node: Some(m),
                        group_size: g,
                        timeout: Duration::from_secs(30),
                        ..Config::default()
                    };
                    let c = Communicator::with_config(t, cfg).unwrap();
                    let dev = HipDevice::open(r).unwrap();
                    body(r, &c, &dev)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s data: mixed scales, a heavy tail, exact zeros, a block of zeros.
fn data<T: QuantFloat>(r: usize, n: usize) -> Vec<T> {
    (0..n)
        .map(|i| {
            let x = ((i * 7919 + r * 104_729) % 2003) as f32 / 1001.0 - 1.0;
            T::from_f32(match i % 13 {
                0 => 0.0,
                1 => x * 3e3,
                _ if (40..72).contains(&i) => 0.0,
                _ => x * (1 + r) as f32,
            })
        })
        .collect()
}

fn bits_of<T: QuantFloat>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| f64::from(x.to_f32())).collect()
}

/// The device all-gather and reduce-scatter against the host forms on the same ranks.
fn check_type<T: QuantFloat>(r: usize, c: &Communicator, dev: &HipDevice) {
    let p = c.size();
    for (bits, block, n) in [(8, 32, 100), (4, 32, 101), (8, 64, 257), (4, 128, 64)] {
        let q = Quant {
            bits,
            block,
            allow_nonfinite: false,
        };
        let tag = format!("rank {r} {} {bits} bits block {block} n {n}", T::DTYPE);
        // All-gather.
        let input = data::<T>(r, n);
        let mut want = vec![T::from_f32(0.0); n * p];
        c.all_gather_quantized(&input, &mut want, q).unwrap();
        let sb = dev.upload(&input).unwrap();
        let ob = dev.upload(&vec![T::from_f32(-7.0); n * p]).unwrap();
        // SAFETY: both buffers live on `dev` until the call returns (it blocks).
        unsafe {
            c.all_gather_quantized_on::<T, HipDevice>(
                dev,
                (sb.device_ptr(), ob.device_ptr()),
                (n, n * p),
                q,
            )
        }
        .unwrap_or_else(|e| panic!("{tag}: all-gather: {e}"));
        let got: Vec<T> = dev.download(&ob).unwrap();
        assert_eq!(bits_of(&got), bits_of(&want), "{tag}: all-gather");
        // Reduce-scatter, sum and average.
        for average in [false, true] {
            let input = data::<T>(r, n * p);
            let mut want = vec![T::from_f32(0.0); n];
            c.reduce_scatter_quantized(&input, &mut want, q, average)
                .unwrap();
            let sb = dev.upload(&input).unwrap();
            let ob = dev.upload(&vec![T::from_f32(-7.0); n]).unwrap();
            // SAFETY: as above.
            unsafe {
                c.reduce_scatter_quantized_on::<T, HipDevice>(
                    dev,
                    (sb.device_ptr(), ob.device_ptr()),
                    (n, n * p),
                    (q, average, QuantScheme::TwoHop),
                )
            }
            .unwrap_or_else(|e| panic!("{tag}: reduce-scatter: {e}"));
            let got: Vec<T> = dev.download(&ob).unwrap();
            assert_eq!(
                bits_of(&got),
                bits_of(&want),
                "{tag}: reduce-scatter (average {average})"
            );
        }
    }
}

#[test]
fn quantized_collectives_on_device_memory_equal_the_host_forms() {
    // Host-staged records, then the fake RCCL inside the node.
    for nccl in ["0", "1"] {
        with_fake_runtime(
            "child_device_equals_host",
            &[("FAKE_HIP_DEVICES", "4"), ("PCCL_NCCL", nccl)],
        );
    }
}

/// Nodes of 2 (two hops), 4 (one node: one hop) and 1 (one rank per node: one hop).
#[test]
fn child_device_equals_host() {
    if !is_child() {
        return;
    }
    for m in [2, 4, 1] {
        on_nodes(m, |r, c, dev| {
            check_type::<f32>(r, c, dev);
            check_type::<bf16>(r, c, dev);
            check_type::<f16>(r, c, dev);
            check_type::<f64>(r, c, dev);
        });
        println!("nodes of {m}: equal");
    }
    // The all-gather decodes every rank's record in one launch: 4 per call in all (one on
    // each rank's device), not 16.
    let before = fake_batch_launches();
    on_nodes(2, |r, c, dev| {
        let n = 100;
        let sb = dev.upload(&data::<f32>(r, n)).unwrap();
        let ob = dev.upload(&vec![0f32; n * 4]).unwrap();
        // SAFETY: both buffers live on `dev` until the call returns (it blocks).
        unsafe {
            c.all_gather_quantized_on::<f32, HipDevice>(
                dev,
                (sb.device_ptr(), ob.device_ptr()),
                (n, n * 4),
                Quant::INT8,
            )
        }
        .unwrap();
    });
    assert_eq!(
        fake_batch_launches() - before,
        4,
        "batched decodes of one all-gather"
    );
    println!("child-checked");
}

#[test]
fn a_bad_rank_fails_a_device_quantized_call_on_every_rank() {
    with_fake_runtime("child_bad_rank", &[("FAKE_HIP_DEVICES", "4")]);
}

/// A NaN on rank 2's device, then rank 1 with another block: every rank fails each call
/// naming the rank, before any record moves; the communicator goes on working. The halving
/// scheme on device memory (the host form on host copies) equals the host form, and refuses a
/// short input on every rank.
#[test]
fn child_bad_rank() {
    if !is_child() {
        return;
    }
    let n = 96;
    on_nodes(2, |r, c, dev| {
        let q = Quant::INT8;
        let mut input = data::<f32>(r, n);
        if r == 2 {
            input[50] = f32::NAN;
        }
        let sb = dev.upload(&input).unwrap();
        let ob = dev.upload(&vec![0f32; n * 4]).unwrap();
        let ag = |q: Quant| {
            // SAFETY: both buffers live on `dev` until the call returns.
            unsafe {
                c.all_gather_quantized_on::<f32, HipDevice>(
                    dev,
                    (sb.device_ptr(), ob.device_ptr()),
                    (n, n * 4),
                    q,
                )
            }
        };
        let e = ag(q).expect_err("a NaN on rank 2");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "rank {r}: {e}");
        assert!(e.message().contains("rank(s) 2 holds NaN"), "rank {r}: {e}");
        // Rank 2 opts in: its NaN block arrives as NaN, the others decode.
        let allow = Quant {
            allow_nonfinite: true,
            ..q
        };
        ag(allow).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let got: Vec<f32> = dev.download(&ob).unwrap();
        assert!(got[2 * n + 50].is_nan() && got[2 * n].is_nan(), "rank {r}");
        assert!(got[..2 * n].iter().all(|v| !v.is_nan()), "rank {r}");
        // Rank 1 passes blocks of 64: every rank names it.
        let mine = if r == 1 {
            Quant { block: 64, ..allow }
        } else {
            allow
        };
        let e = ag(mine).expect_err("a disagreeing block");
        assert!(
            e.message().contains("rank 1: 8 bits, block 64"),
            "rank {r}: {e}"
        );
        // Rank 0 passes blocks of 0 (no record size): every rank names it, none panics.
        let zero = if r == 0 {
            Quant { block: 0, ..allow }
        } else {
            allow
        };
        let e = ag(zero).expect_err("a block of 0 on rank 0");
        assert!(
            e.message().contains("rank(s) 0 passed unsound"),
            "rank {r}: {e}"
        );
        // Rank 3's output is one element short: every rank names it, nothing is written.
        let short = if r == 3 { n * 4 - 1 } else { n * 4 };
        // SAFETY: as above (rank 3's buffer is in fact whole; the call must not use it).
        let e = unsafe {
            c.all_gather_quantized_on::<f32, HipDevice>(
                dev,
                (sb.device_ptr(), ob.device_ptr()),
                (n, short),
                allow,
            )
        }
        .expect_err("a short output on rank 3");
        assert!(
            e.message().contains("rank(s) 3 passed unsound"),
            "rank {r}: {e}"
        );
        // The halving scheme runs the host form on host copies of the buffers: equal to it.
        // A short input on rank 1 there is refused on every rank, naming it.
        let rs_data = data::<f32>(r, n * 4);
        let rs = dev.upload(&rs_data).unwrap();
        let rso = dev.upload(&vec![0f32; n]).unwrap();
        let mut want = vec![0f32; n];
        c.reduce_scatter_quantized_with(&rs_data, &mut want, q, false, QuantScheme::Halving)
            .unwrap();
        let halving = |elems: usize| {
            // SAFETY: as above.
            unsafe {
                c.reduce_scatter_quantized_on::<f32, HipDevice>(
                    dev,
                    (rs.device_ptr(), rso.device_ptr()),
                    (n, elems),
                    (q, false, QuantScheme::Halving),
                )
            }
        };
        halving(n * 4).unwrap_or_else(|e| panic!("rank {r}: halving on device: {e}"));
        let got: Vec<f32> = dev.download(&rso).unwrap();
        assert_eq!(bits_of(&got), bits_of(&want), "rank {r}: halving on device");
        let e = halving(if r == 1 { n * 4 - 1 } else { n * 4 }).expect_err("a short input");
        assert!(
            e.message().contains("rank(s) 1 passed unsound"),
            "rank {r}: {e}"
        );
        // Still in step.
        ag(q).expect_err("rank 2's NaN is still there");
        // SAFETY: as above.
        unsafe {
            c.reduce_scatter_quantized_on::<f32, HipDevice>(
                dev,
                (rs.device_ptr(), sb.device_ptr()),
                (n, n * 4),
                (q, true, QuantScheme::TwoHop),
            )
        }
        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
    });
    println!("child-checked");
}

/// The queued reduce-scatter against the host form, every scheme, sum and average, twice
/// each (the host form's first call of a scheme splits its sub-communicators; the queued
/// form never needs them).
fn queued_reduce_scatter(r: usize, c: &Communicator, dev: &HipDevice) {
    let (n, p) = (160, c.size());
    let q = Quant::INT8;
    for scheme in [
        QuantScheme::TwoHop,
        QuantScheme::Halving,
        QuantScheme::PerLevel,
    ] {
        for average in [false, true] {
            for round in 0..2 {
                let input = data::<f16>(r + round, n * p);
                let mut want = vec![f16::from_f32(0.0); n];
                c.reduce_scatter_quantized_with(&input, &mut want, q, average, scheme)
                    .unwrap();
                let sb = dev.upload(&input).unwrap();
                let ob = dev.upload(&vec![f16::from_f32(-7.0); n]).unwrap();
                // SAFETY: both buffers live on `dev` until the download below synchronised it.
                unsafe {
                    c.enqueue_reduce_scatter_quantized_on::<f16, HipDevice>(
                        dev,
                        (sb.device_ptr(), ob.device_ptr()),
                        (n, n * p),
                        (q, average, scheme),
                    )
                }
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                let got: Vec<f16> = dev.download(&ob).unwrap();
                assert_eq!(
                    bits_of(&got),
                    bits_of(&want),
                    "rank {r}: queued reduce-scatter ({scheme:?}, average {average}, round \
                     {round})"
                );
            }
        }
    }
}

#[test]
fn a_queued_device_all_gather_quantized_returns_at_once_and_equals_the_host_form() {
    with_fake_runtime("child_queued", &[("FAKE_HIP_DEVICES", "8")]);
}

/// `enqueue_all_gather_quantized_on` with every device stalled: each rank's call returns
/// without waiting for the device or a peer; released, the output equals the host form's bit
/// for bit, and so does the queued reduce-scatter's — the communicator's first, so nothing was
/// split for it (two hops in nodes of 2) — and every scheme's on every shape after. Then a NaN on rank 2: the calls are queued alike, the agreement refuses on every rank,
/// naming rank 2, before any record moves, and a later call returns that error.
#[test]
fn child_queued() {
    if !is_child() {
        return;
    }
    let n = 300;
    let sync = std::sync::Barrier::new(4);
    on_nodes(2, |r, c, dev| {
        let q = Quant {
            bits: 4,
            block: 64,
            allow_nonfinite: false,
        };
        let input = data::<bf16>(r, n);
        let mut want = vec![bf16::from_f32(0.0); n * 4];
        c.all_gather_quantized(&input, &mut want, q).unwrap();
        let sb = dev.upload(&input).unwrap();
        let ob = dev.upload(&vec![bf16::from_f32(-7.0); n * 4]).unwrap();
        let call = |q: Quant| {
            // SAFETY: both buffers live on `dev` until its stream has passed the call (the
            // download below synchronises it; the failed call's stream is released by the
            // abort).
            unsafe {
                c.enqueue_all_gather_quantized_on::<bf16, HipDevice>(
                    dev,
                    (sb.device_ptr(), ob.device_ptr()),
                    (n, n * 4),
                    q,
                )
            }
        };
        // The communicator's first reduce-scatter, queued: nothing split beforehand.
        let rs_in = data::<bf16>(r + 1, n * 4);
        let rsb = dev.upload(&rs_in).unwrap();
        let rob = dev.upload(&vec![bf16::from_f32(-7.0); n]).unwrap();
        sync.wait();
        if r == 0 {
            fake_hook("fake_hip_stall_device_from_now", Some(-1));
        }
        sync.wait();
        let t0 = Instant::now();
        call(q).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        // SAFETY: both buffers live on `dev` until the download below synchronised it.
        unsafe {
            c.enqueue_reduce_scatter_quantized_on::<bf16, HipDevice>(
                dev,
                (rsb.device_ptr(), rob.device_ptr()),
                (n, n * 4),
                (q, false, QuantScheme::TwoHop),
            )
        }
        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let took = t0.elapsed();
        assert!(
            took < common::prompt(Duration::from_secs(1)),
            "rank {r}: the queued calls took {took:?} with the device stalled"
        );
        sync.wait();
        if r == 0 {
            fake_hook("fake_hip_release_stalls", None);
        }
        let got: Vec<bf16> = dev.download(&ob).unwrap();
        assert_eq!(bits_of(&got), bits_of(&want), "rank {r}: queued all-gather");
        let got: Vec<bf16> = dev.download(&rob).unwrap();
        let mut rs_want = vec![bf16::from_f32(0.0); n];
        c.reduce_scatter_quantized(&rs_in, &mut rs_want, q, false)
            .unwrap();
        assert_eq!(
            bits_of(&got),
            bits_of(&rs_want),
            "rank {r}: queued reduce-scatter"
        );
        queued_reduce_scatter(r, c, dev);
        // A NaN on rank 2's device.
        let mut bad = input.clone();
        if r == 2 {
            bad[7] = bf16::from_f32(f32::NAN);
        }
        let sb2 = dev.upload(&bad).unwrap();
        // SAFETY: as above; this call's stream stays held until the abort below.
        unsafe {
            c.enqueue_all_gather_quantized_on::<bf16, HipDevice>(
                dev,
                (sb2.device_ptr(), ob.device_ptr()),
                (n, n * 4),
                q,
            )
        }
        .unwrap_or_else(|e| panic!("rank {r}: queued: {e}"));
        let t1 = Instant::now();
        let e = loop {
            match call(q) {
                Err(e) => break e,
                Ok(()) if t1.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(()) => panic!("rank {r}: no call failed after rank 2's NaN"),
            }
        };
        assert!(e.message().contains("rank(s) 2 holds NaN"), "rank {r}: {e}");
        c.abort();
    });
    // One node of 4: the reduce-scatter takes one hop (two per level in groups of 2); two
    // nodes of 4 in groups of 2: three per level.
    on_nodes(4, queued_reduce_scatter);
    on_world(4, (4, Some(2)), queued_reduce_scatter);
    on_world(8, (4, Some(2)), queued_reduce_scatter);
    println!("child-checked");
}

#[test]
fn a_peer_that_leaves_fails_the_queued_quantized_calls_of_the_others() {
    with_fake_runtime("child_queued_peer_leaves", &[("FAKE_HIP_DEVICES", "4")]);
}

/// Rank 3 destroys its communicator instead of joining a queued all-gather: the other
/// ranks' calls were queued (they returned), their streams stay held, and a later call
/// returns the error naming rank 3 within seconds, not after the timeout (30 s).
#[test]
fn child_queued_peer_leaves() {
    if !is_child() {
        return;
    }
    let n = 128;
    on_nodes(2, |r, c, dev| {
        let q = Quant::INT8;
        let sb = dev.upload(&data::<f32>(r, n)).unwrap();
        let ob = dev.upload(&vec![0f32; n * 4]).unwrap();
        let call = || {
            // SAFETY: both buffers live on `dev` until the abort below releases its stream.
            unsafe {
                c.enqueue_all_gather_quantized_on::<f32, HipDevice>(
                    dev,
                    (sb.device_ptr(), ob.device_ptr()),
                    (n, n * 4),
                    q,
                )
            }
        };
        call().unwrap_or_else(|e| panic!("rank {r}: the healthy call: {e}"));
        let _: Vec<f32> = dev.download(&ob).unwrap();
        if r == 3 {
            return; // leaves: its communicator is destroyed when the body returns
        }
        let t0 = Instant::now();
        let e = loop {
            match call() {
                Err(e) => break e,
                Ok(()) if t0.elapsed() < Duration::from_secs(25) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(()) => panic!("rank {r}: no call failed after rank 3 left"),
            }
        };
        let took = t0.elapsed();
        assert!(e.message().contains("rank 3"), "rank {r}: {e}");
        assert!(
            took < common::prompt(Duration::from_secs(5)),
            "rank {r}: {took:?} to fail: {e}"
        );
        c.abort();
    });
    println!("child-checked");
}

#[test]
fn a_queued_quantized_reduce_scatter_with_a_disagreeing_or_leaving_peer_fails_every_rank() {
    with_fake_runtime("child_queued_rs_misbehaves", &[("FAKE_HIP_DEVICES", "8")]);
}

/// Waits (bounded) until a call on `c` fails, returning the error and how long it took.
fn next_failure(r: usize, call: impl Fn() -> pccl::Result<()>) -> (pccl::Error, Duration) {
    let t0 = Instant::now();
    loop {
        match call() {
            Err(e) => return (e, t0.elapsed()),
            Ok(()) if t0.elapsed() < Duration::from_secs(25) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(()) => panic!("rank {r}: no call failed"),
        }
    }
}

/// Queued reduce-scatters whose hops address their members directly: (1) on 2 nodes of 4 in
/// groups of 2, rank 5 passes the two-hop scheme where the others pass per level (2 hops
/// against 3): every rank's call was queued, and a later call fails on every rank with the
/// disagreement, naming rank 5's scheme — no rank runs a hop the others do not; (2) after the
/// communicator's first queued reduce-scatter rank 3 leaves instead of joining the next: the
/// others' calls fail within seconds naming rank 3. Between them, a queued all-gather whose
/// output is short on rank 1 (encoded on the host there, by the device elsewhere) fails on
/// every rank, naming rank 1.
#[test]
fn child_queued_rs_misbehaves() {
    if !is_child() {
        return;
    }
    let n = 96;
    let q = Quant::INT8;
    let rs = |c: &Communicator, dev: &HipDevice, sb: u64, ob: u64, scheme| {
        // SAFETY: both buffers live on `dev` until the abort releases its stream.
        unsafe {
            c.enqueue_reduce_scatter_quantized_on::<f32, HipDevice>(
                dev,
                (sb, ob),
                (n, n * c.size()),
                (q, false, scheme),
            )
        }
    };
    on_world(8, (4, Some(2)), |r, c, dev| {
        let sb = dev.upload(&data::<f32>(r, n * 8)).unwrap();
        let ob = dev.upload(&vec![0f32; n]).unwrap();
        let (sp, op) = (sb.device_ptr(), ob.device_ptr());
        let scheme = if r == 5 {
            QuantScheme::TwoHop
        } else {
            QuantScheme::PerLevel
        };
        rs(c, dev, sp, op, scheme).unwrap_or_else(|e| panic!("rank {r}: queued: {e}"));
        let (e, _) = next_failure(r, || rs(c, dev, sp, op, QuantScheme::PerLevel));
        assert!(
            e.message().contains("disagree")
                && e.message().contains("scheme per-level; rank 5: ")
                && e.message().contains("scheme two-hop"),
            "rank {r}: {e}"
        );
        c.abort();
    });
    // A short buffer on one rank: that rank's call takes the host-encoded form (its arguments
    // go to the agreement unsound), the others the device-encoded one; they meet in the
    // agreement, which refuses on every rank, naming it.
    on_nodes(2, |r, c, dev| {
        let sb = dev.upload(&data::<f32>(r, n * 4)).unwrap();
        let ob = dev.upload(&vec![0f32; n * 4]).unwrap();
        let short = if r == 1 { n * 4 - 1 } else { n * 4 };
        // SAFETY: both buffers live on `dev` until the abort releases its stream.
        unsafe {
            c.enqueue_all_gather_quantized_on::<f32, HipDevice>(
                dev,
                (sb.device_ptr(), ob.device_ptr()),
                (n, short),
                q,
            )
        }
        .unwrap_or_else(|e| panic!("rank {r}: queued: {e}"));
        let ag = || {
            // SAFETY: as above.
            unsafe {
                c.enqueue_all_gather_quantized_on::<f32, HipDevice>(
                    dev,
                    (sb.device_ptr(), ob.device_ptr()),
                    (n, n * 4),
                    q,
                )
            }
        };
        let (e, _) = next_failure(r, ag);
        assert!(
            e.message().contains("rank(s) 1 passed unsound"),
            "rank {r}: {e}"
        );
        c.abort();
    });
    on_nodes(2, |r, c, dev| {
        let sb = dev.upload(&data::<f32>(r, n * 4)).unwrap();
        let ob = dev.upload(&vec![0f32; n]).unwrap();
        let (sp, op) = (sb.device_ptr(), ob.device_ptr());
        rs(c, dev, sp, op, QuantScheme::TwoHop).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let _: Vec<f32> = dev.download(&ob).unwrap();
        if r == 3 {
            return; // leaves: its communicator is destroyed when the body returns
        }
        let (e, took) = next_failure(r, || rs(c, dev, sp, op, QuantScheme::TwoHop));
        assert!(e.message().contains("rank 3"), "rank {r}: {e}");
        assert!(
            took < common::prompt(Duration::from_secs(5)),
            "rank {r}: {took:?} to fail: {e}"
        );
        c.abort();
    });
    println!("child-checked");
}

#[test]
fn a_failing_kernel_ends_a_device_quantized_call_on_every_rank() {
    // The 4 ranks' first launches are the quantize kernels of the first call (one each);
    // rank order is not fixed, so some rank's decode fails after the exchange started.
    with_fake_runtime(
        "child_failing_kernel",
        &[
            ("FAKE_HIP_DEVICES", "4"),
            ("FAKE_HIP_FAIL_LAUNCH_AFTER", "6"),
        ],
    );
}

/// Launches fail from the 7th on: the first all-gather's decoding fails on some rank; every
/// rank's call ends in an error within the timeout (the peers are told), none hangs.
#[test]
fn child_failing_kernel() {
    if !is_child() {
        return;
    }
    let n = 64;
    let results = on_nodes(2, |r, c, dev| {
        let sb = dev.upload(&data::<f32>(r, n)).unwrap();
        let ob = dev.upload(&vec![0f32; n * 4]).unwrap();
        let t = std::time::Instant::now();
        let mut last = Ok(());
        for _ in 0..3 {
            // SAFETY: both buffers live on `dev` until the call returns.
            last = unsafe {
                c.all_gather_quantized_on::<f32, HipDevice>(
                    dev,
                    (sb.device_ptr(), ob.device_ptr()),
                    (n, n * 4),
                    Quant::INT8,
                )
            };
            if last.is_err() {
                break;
            }
        }
        (last, t.elapsed())
    });
    for (r, (res, took)) in results.iter().enumerate() {
        let e = res.as_ref().expect_err("launches fail");
        assert!(
            took < &Duration::from_secs(20),
            "rank {r} took {took:?}: {e}"
        );
        println!("rank {r}: {e} ({took:?})");
    }
    println!("child-checked");
}

#[test]
fn the_c_abi_takes_device_memory_for_the_quantized_calls() {
    with_fake_runtime("child_c_abi", &[("FAKE_HIP_DEVICES", "3")]);
}

/// `pcclAllGatherQuantized` / `pcclReduceScatterQuantized` with a HIP stream on 3 thread ranks
/// give the host calls' results (stream NULL) bit for bit (the all-gather queued on the
/// stream); a rank passing an integer dtype on its device fails the call on every rank: on
/// the others, whose all-gather was queued, as the communicator's asynchronous error.
#[test]
fn child_c_abi() {
    use pccl::capi::*;
    use pccl::device::api::Device;
    if !is_child() {
        return;
    }
    let p = 3usize;
    let n = 300usize;
    let mut world: pcclThreadWorld_t = std::ptr::null_mut();
    // SAFETY: `world` is a writable handle.
    assert_eq!(
        unsafe { pcclThreadWorldCreate(p as i32, &mut world) },
        pcclSuccess
    );
    let world_addr = world as usize;
    std::thread::scope(|s| {
        for r in 0..p {
            s.spawn(move || {
                let mut comm: pcclComm_t = std::ptr::null_mut();
                // SAFETY: `comm` is a writable handle; the world lives until all joined.
                let rc = unsafe {
                    pcclCommInitThreads(&mut comm, world_addr as pcclThreadWorld_t, r as i32)
                };
                assert_eq!(rc, pcclSuccess);
                assert_eq!(pcclCommSetDeviceRuntime(comm, pcclRuntimeHip), pcclSuccess);
                let dev = HipDevice::open(r).unwrap();
                let st = dev.raw_stream();
                let x = data::<bf16>(r, n * p);
                let sb = dev.upload(&x).unwrap();
                let ob = dev.upload(&vec![bf16::from_f32(0.0); n * p]).unwrap();
                let (sp, op) = (sb.device_ptr() as *const _, ob.device_ptr() as *mut _);
                let mut host = vec![bf16::from_f32(0.0); n * p];
                let hp = host.as_mut_ptr() as *mut _;
                let xp = x.as_ptr() as *const _;
                // SAFETY: host and device buffers of n (send) and n × p (receive) bf16.
                unsafe {
                    for (stream, out) in [(std::ptr::null_mut(), hp), (st, op)] {
                        let rc = pcclAllGatherQuantized(
                            if stream.is_null() { xp } else { sp },
                            out,
                            n,
                            pcclBfloat16,
                            4,
                            64,
                            0,
                            comm,
                            stream,
                        );
                        assert_eq!(rc, pcclSuccess, "rank {r}");
                    }
                }
                let got: Vec<bf16> = dev.download(&ob).unwrap();
                assert_eq!(bits_of(&got), bits_of(&host), "rank {r}: all-gather");
                let flags = PCCL_QUANT_AVERAGE;
                // SAFETY: as above, n × p in and n out.
                unsafe {
                    for (stream, out) in [(std::ptr::null_mut(), hp), (st, op)] {
                        let rc = pcclReduceScatterQuantized(
                            if stream.is_null() { xp } else { sp },
                            out,
                            n,
                            pcclBfloat16,
                            8,
                            32,
                            flags,
                            comm,
                            stream,
                        );
                        assert_eq!(rc, pcclSuccess, "rank {r}");
                    }
                }
                let got: Vec<bf16> = dev.download(&ob).unwrap();
                assert_eq!(bits_of(&got[..n]), bits_of(&host[..n]), "rank {r}: RS");
                // Rank 1 passes int32 on its device: it fails at once; the others' calls are
                // queued on their streams (the all-gather is), where the agreement refuses
                // the call naming rank 1 before any record moves: their communicator's
                // asynchronous error, returned by their next call (NCCL's). None hangs.
                let dt = if r == 1 { pcclInt32 } else { pcclBfloat16 };
                // SAFETY: as above.
                let rc = unsafe { pcclAllGatherQuantized(sp, op, n, dt, 8, 64, 0, comm, st) };
                if r == 1 {
                    assert_ne!(rc, pcclSuccess, "rank {r}");
                } else {
                    assert_eq!(rc, pcclSuccess, "rank {r}: queued");
                }
                // The refusal is found on the progress threads after the calls returned:
                // a later call returns it (rank 1 hears of it from the peers' abort).
                let failed = (0..10).any(|_| {
                    // SAFETY: as above.
                    let rc = unsafe {
                        pcclAllGatherQuantized(sp, op, n, pcclBfloat16, 8, 64, 0, comm, st)
                    };
                    if rc == pcclSuccess {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    rc != pcclSuccess
                });
                assert!(failed, "rank {r}: a later call fails");
                // SAFETY: `comm` is a live handle; the message is copied at once.
                let msg = unsafe { std::ffi::CStr::from_ptr(pcclGetLastError(comm)) }
                    .to_string_lossy()
                    .into_owned();
                assert!(msg.contains("rank(s) 1 passed unsound"), "rank {r}: {msg}");
                let mut a = pcclSuccess;
                // SAFETY: `a` is writable.
                assert_eq!(unsafe { pcclCommGetAsyncError(comm, &mut a) }, pcclSuccess);
                if r != 1 {
                    assert_ne!(a, pcclSuccess, "rank {r}: the asynchronous error");
                }
                // The abort releases the held streams and frees the communicator.
                assert_eq!(pcclCommAbort(comm), pcclSuccess);
            });
        }
    });
    assert_eq!(pcclThreadWorldDestroy(world), pcclSuccess);
    println!("child-checked");
}
