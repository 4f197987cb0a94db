//! `Communicator::set_timeout` (torch's `set_timeout`, `pcclCommSetTimeout`): a changed
//! timeout bounds every kind of call, not only collectives, and a split inherits it.

use pccl::config::Config;
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::time::{Duration, Instant};

/// A world whose configured timeout (60 s) would outlast the test: only a `set_timeout`
/// can end the calls below in time.
fn cfg() -> Config {
    Config {
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// Rank 1 stays silent until rank 0's call has failed (then makes the same call, so both
/// have used the same calls); rank 0 must fail with a timeout after about `t`, for each kind
/// of call.
#[test]
fn set_timeout_bounds_every_kind_of_call() {
    let t = Duration::from_millis(300);
    let kinds = [
        "all_reduce",
        "all_to_all",
        "gather",
        "recv",
        "all_reduce_async",
    ];
    let met = std::sync::Barrier::new(2);
    let out = Communicator::run_threads(2, cfg(), |c| {
        let mut took = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            if c.rank() == 1 {
                met.wait();
                // Rank 0 gave up on this collective: it fails here too. (The receive is
                // left unanswered: point-to-point numbers are per pair, not per call.)
                let _ = match *kind {
                    "all_reduce" => c.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum),
                    "all_to_all" => c.all_to_all(&[1f32; 4], &mut [0f32; 4]),
                    "gather" => c.gather(&[1f32; 2], &mut [0f32; 4], 0),
                    "recv" => Ok(()),
                    _ => c
                        .all_reduce_async(vec![1f32; 4], ReduceOp::Sum)
                        .and_then(|req| req.wait().map(|_| ())),
                };
            } else {
                c.set_timeout(t).unwrap();
                assert_eq!(c.timeout(), t);
                let t0 = Instant::now();
                let r = match *kind {
                    "all_reduce" => c.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum),
                    "all_to_all" => c.all_to_all(&[1f32; 4], &mut [0f32; 4]),
                    "gather" => c.gather(&[1f32; 2], &mut [0f32; 4], 0),
                    "recv" => c.recv(&mut [0f32; 4], 1),
                    _ => c
                        .all_reduce_async(vec![1f32; 4], ReduceOp::Sum)
                        .and_then(|req| req.wait().map(|_| ())),
                };
                let e = r.expect_err(kind);
                assert_eq!(e.kind(), ErrorKind::Timeout, "{kind}: {e}");
                took.push(t0.elapsed());
                met.wait();
            }
            // Both ranks meet again on a fresh split (the failed call abandoned its number).
            let sub = c.split(Some(i as u32), 0).unwrap().unwrap();
            if c.rank() == 0 {
                assert_eq!(sub.timeout(), t, "a split inherits the current timeout");
            }
        }
        took
    })
    .unwrap();
    for (kind, took) in kinds.iter().zip(&out[0]) {
        assert!(
            *took >= Duration::from_millis(250) && *took < Duration::from_secs(5),
            "{kind}: failed after {took:?}, timeout 300 ms"
        );
    }
}

#[test]
fn zero_timeout_is_refused() {
    Communicator::run_threads(1, cfg(), |c| {
        let e = c.set_timeout(Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(c.timeout(), Duration::from_secs(60));
    })
    .unwrap();
}
