//! Sends, receives and the uneven all-to-all on device memory, queued on the caller's stream
//! (src/comm/device_exchange.rs) on the fake ROCm runtime: each call returns while the
//! caller's stream is held shut, the results are exact once it moves, each pair's messages
//! keep their order across device and host calls, only receive blocks are written; a peer
//! that sends the wrong count or nothing fails the receive (the communicator's asynchronous
//! error, naming the pair) and the work queued behind it stays held. Each check runs in a
//! child process (tests/fake_rocm/harness.rs); skipped without a C compiler.

#![cfg(feature = "rocm")]

#[path = "fake_rocm/harness.rs"]
mod harness;
#[path = "fake_rocm/streams.rs"]
mod streams;

use harness::{is_child, real_runtime, with_fake_runtime};
use pccl::device::api::Device;
use pccl::device::hip::HipDevice;
use pccl::{Communicator, DType, Dir, Error, P2pOp, RawCollective, ReduceOp};
use std::time::{Duration, Instant};
use streams::{copy_back, on_ranks, Held};

fn env(timeout: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("FAKE_HIP_IMPLICIT_SYNC", "1"),
        ("PCCL_NCCL", "0"),
        ("PCCL_TIMEOUT", timeout),
        ("FAKE_HIP_DEVICES", "3"),
    ]
}

fn op(dir: Dir, peer: usize, addr: u64, count: usize) -> P2pOp {
    P2pOp {
        peer,
        dir,
        addr: addr as usize,
        count,
        dtype: DType::F32,
    }
}

/// A device all-reduce of one element: the communicator's first device collective, which
/// decides (collectively) how device calls run.
fn first_collective(c: &Communicator, dev: &HipDevice) {
    let b = dev.upload(&[1.0f32]).unwrap();
    // SAFETY: `b` holds one f32 and outlives the synchronisation below.
    unsafe {
        c.enqueue_on::<f32, HipDevice>(
            dev,
            RawCollective::AllReduce(ReduceOp::Sum),
            b.device_ptr(),
            b.device_ptr(),
            1,
        )
    }
    .unwrap();
    dev.synchronize().unwrap();
}

/// Waits up to `limit` for the communicator's asynchronous error.
fn async_error_within(c: &Communicator, limit: Duration) -> Option<Error> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(e) = c.async_error() {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

#[test]
fn sends_receives_and_uneven_all_to_all_are_queued_on_device_memory() {
    with_fake_runtime("child_p2p_on_device", &env("20"));
}

/// 3 thread ranks on 3 fake GPUs: a ring of grouped sends and receives and a lone send /
/// receive, each queued while the caller's stream is held; a device send followed by a host
/// send to the same peer arrive in that order; an uneven all-to-all with gaps between the
/// receive blocks.
#[test]
fn child_p2p_on_device() {
    if !is_child() {
        return;
    }
    const C: usize = 6;
    let p = 3usize;
    on_ranks(p, false, |r, c, dev, barrier| {
        first_collective(&c, &dev);
        let val = |rank: usize, i: usize| (rank * 100 + i) as f32;
        let mine: Vec<f32> = (0..C).map(|i| val(r, i)).collect();
        let sb = dev.upload(&mine).unwrap();
        let out = dev.upload(&[-1.0f32; C]).unwrap();
        // Queues `ops` while the stream is held; the call must return before it moves.
        let queued = |ops: &[P2pOp], what: &str| -> Vec<f32> {
            barrier.wait();
            let held = Held::new(&dev);
            // SAFETY: every buffer holds its op's count and lives until synchronised below.
            let (rc, took) = held.during(|| unsafe { c.enqueue_p2p_on(&dev, ops) });
            rc.unwrap_or_else(|e| panic!("rank {r} {what}: {e}"));
            assert!(
                took < Duration::from_millis(1500),
                "rank {r} {what}: the call took {took:?} (it waited for the held stream)"
            );
            let mut back = vec![f32::NAN; C];
            let ev = copy_back(&dev, out.device_ptr(), &mut back);
            held.release();
            dev.sync_event(&ev).unwrap();
            back
        };
        // A ring: send right, receive from the left, in one batch.
        let (right, left) = ((r + 1) % p, (r + p - 1) % p);
        let got = queued(
            &[
                op(Dir::Send, right, sb.device_ptr(), C),
                op(Dir::Recv, left, out.device_ptr(), C),
            ],
            "ring",
        );
        let want: Vec<f32> = (0..C).map(|i| val(left, i)).collect();
        assert_eq!(got, want, "rank {r}: ring receive from rank {left}");
        // A lone send 0 -> 2 (rank 1 takes no part).
        let ops: Vec<P2pOp> = match r {
            0 => vec![op(Dir::Send, 2, sb.device_ptr(), C)],
            2 => vec![op(Dir::Recv, 0, out.device_ptr(), C)],
            _ => vec![],
        };
        let got = queued(&ops, "lone send");
        if r == 2 {
            let want: Vec<f32> = (0..C).map(|i| val(0, i)).collect();
            assert_eq!(got, want, "lone receive from rank 0");
        }
        // Order across device and host calls: rank 0 sends on the device, then on the host;
        // rank 1 receives on the device, then on the host.
        barrier.wait();
        let twice: Vec<f32> = mine.iter().map(|v| v * 2.0).collect();
        if r == 0 {
            // SAFETY: `sb` lives until synchronised below.
            unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Send, 1, sb.device_ptr(), C)]) }.unwrap();
            c.send(&twice, 1).unwrap();
            dev.synchronize().unwrap();
        } else if r == 1 {
            // SAFETY: `out` lives until synchronised below.
            unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Recv, 0, out.device_ptr(), C)]) }.unwrap();
            let mut host = vec![0.0f32; C];
            c.recv(&mut host, 0).unwrap();
            dev.synchronize().unwrap();
            let first: Vec<f32> = (0..C).map(|i| val(0, i)).collect();
            assert_eq!(
                dev.download::<f32>(&out).unwrap(),
                first,
                "device message first"
            );
            let second: Vec<f32> = first.iter().map(|v| v * 2.0).collect();
            assert_eq!(host, second, "then the host message");
        }
        // Uneven all-to-all: rank r sends r + j + 1 elements to rank j; receive blocks have a
        // one-element gap before each, which must keep its value.
        let sc: Vec<usize> = (0..p).map(|j| r + j + 1).collect();
        let sd: Vec<usize> = (0..p).map(|j| sc[..j].iter().sum()).collect();
        let rc: Vec<usize> = (0..p).map(|i| i + r + 1).collect();
        let rd: Vec<usize> = (0..p)
            .map(|i| rc[..i].iter().sum::<usize>() + i + 1)
            .collect();
        let rlen = rd[p - 1] + rc[p - 1];
        let send: Vec<f32> = (0..p)
            .flat_map(|j| (0..sc[j]).map(move |k| (r * 1000 + j * 100 + k) as f32))
            .collect();
        let sbuf = dev.upload(&send).unwrap();
        let rbuf = dev.upload(&vec![-7.0f32; rlen]).unwrap();
        barrier.wait();
        let held = Held::new(&dev);
        let (rc_, took) = held.during(|| {
            // SAFETY: the buffers hold every block and live until synchronised below.
            unsafe {
                c.enqueue_all_to_all_v_on::<f32, HipDevice>(
                    &dev,
                    sbuf.device_ptr(),
                    &sc,
                    &sd,
                    rbuf.device_ptr(),
                    &rc,
                    &rd,
                )
            }
        });
        rc_.unwrap_or_else(|e| panic!("rank {r} all_to_all_v: {e}"));
        assert!(
            took < Duration::from_millis(1500),
            "rank {r}: took {took:?}"
        );
        held.release();
        dev.synchronize().unwrap();
        let got = dev.download::<f32>(&rbuf).unwrap();
        let mut want = vec![-7.0f32; rlen];
        for i in 0..p {
            for k in 0..rc[i] {
                want[rd[i] + k] = (i * 1000 + r * 100 + k) as f32;
            }
        }
        assert_eq!(got, want, "rank {r}: all_to_all_v (gaps keep -7)");
    });
    println!("child-checked");
}

#[test]
fn a_device_receive_from_a_disagreeing_or_silent_peer_fails_and_holds_the_stream() {
    if real_runtime() {
        println!("skipped on the real ROCm runtime: the same checks need no fault injection, but the timeouts are tuned for the fake");
    }
    with_fake_runtime("child_p2p_disagreeing_peer", &env("20"));
    with_fake_runtime("child_p2p_silent_peer", &env("2"));
}

/// Rank 0 sends one element fewer than rank 1's device receive expects: the receive fails
/// (the communicator's asynchronous error names the pair), a copy of its output queued
/// behind it stays held until abort, and the next device call fails at once.
#[test]
fn child_p2p_disagreeing_peer() {
    if is_child() {
        check_failing_receive(true);
    }
}

/// Rank 0 never sends: rank 1's device receive fails within PCCL_TIMEOUT (2 s), naming
/// rank 0, with the work behind it held.
#[test]
fn child_p2p_silent_peer() {
    if is_child() {
        check_failing_receive(false);
    }
}

#[test]
fn a_receive_from_a_rank_whose_earlier_device_call_failed_fails_at_once() {
    with_fake_runtime("child_p2p_failed_sender", &env("20"));
}

/// Rank 0's device receive from rank 1 fails (rank 1 sends one element too few), so rank 0
/// refuses its next device send, to rank 2. Rank 2's receive from rank 0 fails within a few
/// seconds naming rank 0 (rank 0 told its peers), not at PCCL_TIMEOUT (20 s); so does a host
/// call of rank 1.
#[test]
fn child_p2p_failed_sender() {
    if !is_child() {
        return;
    }
    const N: usize = 64;
    on_ranks(3, false, |r, c, dev, barrier| {
        first_collective(&c, &dev);
        let sb = dev.upload(&vec![3.0f32; N]).unwrap();
        let out = dev.upload(&vec![-1.0f32; N]).unwrap();
        barrier.wait();
        let t0 = Instant::now();
        let sent = match r {
            // SAFETY (all three): the buffers hold `N` f32 and live until the communicator
            // is aborted and the stream synchronised below.
            0 => {
                unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Recv, 1, out.device_ptr(), N)]) }
                    .unwrap();
                async_error_within(&c, Duration::from_secs(10)).expect("the receive fails");
                let e = unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Send, 2, sb.device_ptr(), N)]) }
                    .expect_err("a send after the failure is refused");
                assert!(
                    e.to_string()
                        .contains("an earlier queued collective failed"),
                    "{e}"
                );
                None
            }
            1 => {
                unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Send, 0, sb.device_ptr(), N - 1)]) }
                    .unwrap();
                let mut host = [0f32; 4];
                let mut waited = Err(pccl::Error::internal("not yet"));
                while t0.elapsed() < Duration::from_secs(10) {
                    waited = c.all_reduce(&[1f32; 4], &mut host, ReduceOp::Sum);
                    if waited.is_err() {
                        break;
                    }
                }
                Some(waited.expect_err("a host call on the revoked communicator"))
            }
            _ => {
                unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Recv, 0, out.device_ptr(), N)]) }
                    .unwrap();
                Some(
                    async_error_within(&c, Duration::from_secs(15))
                        .expect("the receive from rank 0 fails"),
                )
            }
        };
        let took = t0.elapsed();
        barrier.wait();
        c.abort();
        dev.synchronize().unwrap();
        if let Some(e) = sent {
            let msg = e.to_string();
            assert!(msg.contains("rank 0"), "rank {r}: {msg}");
            assert!(
                took < Duration::from_secs(8),
                "rank {r}: the failure reached it after {took:?} (PCCL_TIMEOUT=20): {msg}"
            );
        }
    });
    println!("child-checked");
}

fn check_failing_receive(disagree: bool) {
    const N: usize = 64;
    on_ranks(2, false, |r, c, dev, barrier| {
        first_collective(&c, &dev);
        let sb = dev.upload(&vec![3.0f32; N]).unwrap();
        let out = dev.upload(&vec![-1.0f32; N]).unwrap();
        barrier.wait();
        let t0 = Instant::now();
        if r == 0 {
            if disagree {
                // SAFETY: `sb` lives until the communicator is aborted below.
                let sent =
                    unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Send, 1, sb.device_ptr(), N - 1)]) };
                sent.unwrap();
            }
            barrier.wait();
            c.abort();
            dev.synchronize().unwrap();
            return;
        }
        // SAFETY: `out` lives until the stream is synchronised after abort below.
        unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Recv, 0, out.device_ptr(), N)]) }.unwrap();
        let mut back = vec![f32::NAN; N];
        let ev = copy_back(&dev, out.device_ptr(), &mut back);
        let err = async_error_within(&c, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no asynchronous error after {:?}", t0.elapsed()));
        let took = t0.elapsed();
        std::thread::sleep(Duration::from_millis(200));
        let held = !dev.event_done(&ev).unwrap() && back.iter().all(|v| v.is_nan());
        // SAFETY: as above.
        let later = unsafe { c.enqueue_p2p_on(&dev, &[op(Dir::Recv, 0, out.device_ptr(), N)]) };
        barrier.wait();
        c.abort();
        dev.sync_event(&ev).unwrap();
        let msg = err.to_string();
        assert!(held, "the copy behind the failed receive ran: {msg}");
        assert!(msg.contains("receive from rank 0"), "{msg}");
        if !disagree {
            assert!(
                took < Duration::from_secs(6),
                "the silent peer was found after {took:?} with PCCL_TIMEOUT=2: {msg}"
            );
        }
        let later = later.expect_err("a device call after the failure succeeded");
        assert!(
            later
                .to_string()
                .contains("an earlier queued collective failed"),
            "{later}"
        );
    });
    println!("child-checked");
}
