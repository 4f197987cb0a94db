//! Separate non-blocking point-to-point requests progress together: a ring of separate
//! `send_async` / `recv_async` (sends first or receives first) completes on thread-ranks and
//! over TCP with messages far larger than any buffering, mixed with collectives and blocking
//! calls; a receiver that never posts its receive costs the sender one deadline; a dead peer
//! fails the requests that wait on it.

mod common;

use pccl::config::Config;
use pccl::fault::{Fault, FaultKind};
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::sync::Barrier;
use std::time::{Duration, Instant};

fn cfg(timeout: f64) -> Config {
    Config {
        ranks_per_node: Some(1),
        timeout: Duration::from_secs_f64(timeout),
        ..Config::default()
    }
}

/// Element `i` of the message from `src` to `dst` in round `k`.
fn val(src: usize, dst: usize, k: usize, i: usize) -> u32 {
    (src as u32 * 7919) ^ (dst as u32 * 104_729) ^ (k as u32 * 31) ^ (i as u32)
}

/// Three rounds of a ring: separate `send_async` to the right and `recv_async` from the left
/// (in both orders), then a blocking all-reduce, a blocking send/recv pair behind a pending
/// async send, and the requests waited for in reverse order.
fn ring(c: &Communicator, n: usize) -> pccl::Result<()> {
    let (p, r) = (c.size(), c.rank());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    for k in 0..3 {
        let mine: Vec<u32> = (0..n).map(|i| val(r, right, k, i)).collect();
        let (s, g) = if (k + r) % 2 == 0 {
            let s = c.send_async(mine, right)?;
            (s, c.recv_async(vec![0u32; n], left)?)
        } else {
            let g = c.recv_async(vec![0u32; n], left)?;
            (c.send_async(mine, right)?, g)
        };
        let got = g.wait()?;
        s.wait()?;
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &x)| x == val(left, r, k, i)),
            "P={p} n={n} round {k} rank {r}: wrong data from rank {left}"
        );
    }
    // A collective behind requests still in flight, and one request kept across it.
    let s = c.send_async(vec![r as u32; n], right)?;
    let g = c.recv_async(vec![0u32; n], left)?;
    let mut x = [r as u64];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    assert_eq!(x[0], (p * (p - 1) / 2) as u64);
    // A blocking receive behind a pending async send (the ring of `isend` then `recv`).
    let s2 = c.send_async(vec![(r + 100) as u32; n], right)?;
    let mut b = vec![0u32; n];
    c.recv(&mut b, left)?;
    assert!(g.wait()?.iter().all(|&v| v == left as u32));
    assert!(b.iter().all(|&v| v == (left + 100) as u32));
    s2.wait()?;
    s.wait()?;
    Ok(())
}

#[test]
fn a_ring_of_separate_async_sends_and_receives_completes_on_threads() {
    for p in 2..=8usize {
        for n in [1usize, 16 * 1024, 2 * 1024 * 1024] {
            let res = Communicator::run_threads(p, cfg(30.0), |c| ring(&c, n)).unwrap();
            for (r, x) in res.into_iter().enumerate() {
                x.unwrap_or_else(|e| panic!("P={p} n={n} rank {r}: {e}"));
            }
        }
    }
}

fn on_tcp<R: Send>(p: usize, timeout: f64, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    common::on_tcp_ranks(
        p,
        64 * 1024,
        Duration::from_secs(30),
        false,
        &cfg(timeout),
        f,
    )
}

#[test]
fn a_ring_of_separate_async_sends_and_receives_completes_over_tcp() {
    // 8 MiB messages: more than the socket buffers and the transport's queues hold.
    for (p, n) in [
        (2usize, 1usize),
        (3, 2 * 1024 * 1024),
        (4, 1000),
        (5, 2 * 1024 * 1024),
    ] {
        let res = on_tcp(p, 30.0, |c| ring(&c, n));
        for (r, x) in res.into_iter().enumerate() {
            x.unwrap_or_else(|e| panic!("tcp P={p} n={n} rank {r}: {e}"));
        }
    }
}

#[test]
fn a_send_nobody_receives_times_out_and_later_calls_work() {
    let bar = Barrier::new(2);
    let res = Communicator::run_threads(2, cfg(1.0), |c| {
        let t0 = Instant::now();
        let out = if c.rank() == 0 {
            // 8 MiB to a rank that never posts the receive, then one it does receive.
            let lost = c.send_async(vec![1u32; 2 * 1024 * 1024], 1)?;
            let e = lost.wait().expect_err("nobody received it");
            Some((e, t0.elapsed()))
        } else {
            None
        };
        bar.wait();
        let mut x = [1u32];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        assert_eq!(x[0], 2);
        pccl::Result::Ok(out)
    })
    .unwrap();
    let (e, took) = res[0].as_ref().unwrap().clone().unwrap();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("send to rank 1"), "{e}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    res[1].as_ref().unwrap();
}

#[test]
fn a_receive_from_a_silent_peer_times_out() {
    let bar = Barrier::new(3);
    let res = Communicator::run_threads(3, cfg(1.0), |c| {
        let r = c.rank();
        let t0 = Instant::now();
        let out = if r == 0 {
            // From rank 1 (silent), while rank 2's message arrives and completes.
            let silent = c.recv_async(vec![0u8; 64], 1)?;
            let fine = c.recv_async(vec![0u8; 64], 2)?;
            assert_eq!(fine.wait()?, vec![2u8; 64]);
            Some((silent.wait().expect_err("rank 1 never sent"), t0.elapsed()))
        } else {
            if r == 2 {
                c.send_async(vec![2u8; 64], 0)?.wait()?;
            }
            None
        };
        bar.wait();
        pccl::Result::Ok(out)
    })
    .unwrap();
    let (e, took) = res[0].as_ref().unwrap().clone().unwrap();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("receive from rank 1"), "{e}");
    assert!(took < common::prompt(Duration::from_secs(3)), "{took:?}");
}

#[test]
fn a_dead_peer_fails_the_requests_waiting_on_it_within_a_second() {
    let faults = vec![Fault {
        rank: 2,
        seq: 0,
        kind: FaultKind::Kill,
    }];
    let config = Config {
        faults,
        ..cfg(30.0)
    };
    let res = Communicator::run_threads(3, config, |c| {
        let r = c.rank();
        if r == 2 {
            // Collective #0 kills this rank (fault injection).
            assert!(c.barrier().is_err());
            return None;
        }
        let t0 = Instant::now();
        let g = c.recv_async(vec![0u32; 1000], 2).unwrap();
        let s = c.send_async(vec![0u32; 4 << 20], 2).unwrap();
        let eg = g.wait().expect_err("rank 2 is dead");
        let es = s.wait().expect_err("rank 2 is dead");
        Some((eg, es, t0.elapsed()))
    })
    .unwrap();
    for (r, o) in res.into_iter().enumerate().take(2) {
        let (eg, es, took) = o.unwrap();
        for e in [&eg, &es] {
            assert_eq!(e.kind(), ErrorKind::Remote, "rank {r}: {e}");
            assert!(e.message().contains("rank 2"), "rank {r}: {e}");
        }
        assert!(
            took < common::prompt(Duration::from_secs(2)),
            "rank {r}: {took:?}"
        );
    }
}

#[test]
fn hundreds_of_requests_in_flight_at_once() {
    // Every rank posts 200 receives from each neighbour before any send: each needs its own
    // thread to wait on, and the pool must not stall on them.
    let res = Communicator::run_threads(4, cfg(30.0), |c| {
        let (p, r) = (c.size(), c.rank());
        let (right, left) = ((r + 1) % p, (r + p - 1) % p);
        let recvs: Vec<_> = (0..200)
            .map(|k| c.recv_async(vec![0u32; 8], left).map(|q| (k, q)))
            .collect::<pccl::Result<_>>()?;
        let sends: Vec<_> = (0..200u32)
            .map(|k| c.send_async(vec![k; 8], right))
            .collect::<pccl::Result<_>>()?;
        for (k, q) in recvs {
            assert_eq!(q.wait()?, vec![k as u32; 8], "rank {r} message {k}");
        }
        for s in sends {
            s.wait()?;
        }
        pccl::Result::Ok(())
    })
    .unwrap();
    res.into_iter().for_each(|r| r.unwrap());
}
