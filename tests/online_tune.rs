//! The online trials (`PCCL_TUNE_ONLINE`) on thread-ranks: the first calls of a collective
//! and size try the model's close candidates, every result right; the ranks then keep one
//! algorithm, the same everywhere; a peer that is slow at one candidate's trials makes the
//! ranks keep another; a peer that dies during the trials or the agreement fails the call on
//! every rank, promptly and naming it; ranks that disagree on trying fail instead of pairing;
//! queued (non-blocking) calls are timed as trials too; any rank count settles.

mod common;

use common::{input, prompt, run_checked, same_bits};
use pccl::config::Config;
use pccl::fault::{Fault, FaultKind};
use pccl::plan::Collective;
use pccl::transport::threads::ThreadWorld;
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::time::{Duration, Instant};

/// Timed calls per candidate in these tests.
const TRIALS: usize = 2;

fn cfg(tune_online: usize, faults: Vec<Fault>) -> Config {
    Config {
        ranks_per_node: Some(2),
        tune_online,
        timeout: Duration::from_secs(30),
        faults,
        ..Config::default()
    }
}

/// The collectives tried, by index, with their tuner key for `n` f32 elements per block.
fn key(which: usize, n: usize, p: usize) -> (Collective, usize) {
    match which {
        0 => (Collective::AllGather, n * 4),
        1 => (Collective::ReduceScatter { average: false }, n * 4),
        _ => (Collective::AllReduce { average: false }, n.div_ceil(p) * 4),
    }
}

/// A size (elements) at which the model leaves collective `which` more than one candidate
/// on 4 ranks in nodes of 2, with the calls the trials take: found on a communicator that
/// never calls.
fn trying_size(which: usize) -> Option<(usize, usize)> {
    let found = Communicator::run_threads(4, cfg(TRIALS, vec![]), |comm| {
        [64, 256, 1024, 4096, 16384, 65536]
            .into_iter()
            .find_map(|n| {
                let (c, b) = key(which, n, 4);
                let left = comm.online_calls_left(c, b).unwrap();
                (left > 0).then_some((n, left))
            })
    })
    .unwrap();
    assert!(
        found.windows(2).all(|w| w[0] == w[1]),
        "ranks differ: {found:?}"
    );
    found[0]
}

/// Rank 1 sleeps before every timed trial of the model's choice: calls 1..=TRIALS (its calls
/// come first, in a row, after one that warms up).
fn slow_model_trials() -> Vec<Fault> {
    (1..=TRIALS)
        .map(|i| Fault {
            rank: 1,
            seq: i as u32,
            kind: FaultKind::Slow,
        })
        .collect()
}

#[test]
fn the_trials_end_in_one_algorithm_on_every_rank_and_every_result_is_right() {
    let mut tried = 0;
    for which in 0..3 {
        let Some((n, left)) = trying_size(which) else {
            continue;
        };
        tried += 1;
        let k = (left - 1) / (TRIALS + 1);
        assert!(
            (2..=3).contains(&k) && left == k * (TRIALS + 1) + 1,
            "collective {which}: {left} calls"
        );
        let out = Communicator::run_threads(4, cfg(TRIALS, vec![]), |comm| {
            let (c, b) = key(which, n, 4);
            let model = comm.algorithm_for(c, b).unwrap();
            for call in 0..left + 2 {
                run_checked(&comm, which, n).unwrap_or_else(|e| panic!("call {call}: {e}"));
                let now = comm.online_calls_left(c, b).unwrap();
                assert_eq!(now, left.saturating_sub(call + 1), "after call {call}");
            }
            // Another size of the same bucket runs the choice too.
            run_checked(&comm, which, n + 4).unwrap();
            (model, comm.algorithm_for(c, b).unwrap())
        })
        .unwrap();
        assert!(
            out.windows(2).all(|w| w[0] == w[1]),
            "ranks differ: {out:?}"
        );
    }
    assert!(
        tried > 0,
        "the model left no collective more than one candidate"
    );
}

#[test]
fn a_candidate_whose_trials_a_slow_peer_holds_up_is_not_kept() {
    let (n, left) = trying_size(0).expect("an all-gather size with candidates to try");
    let out = Communicator::run_threads(4, cfg(TRIALS, slow_model_trials()), |comm| {
        let (c, b) = key(0, n, 4);
        let model = comm.algorithm_for(c, b).unwrap();
        for _ in 0..left {
            run_checked(&comm, 0, n).unwrap();
        }
        (model, comm.algorithm_for(c, b).unwrap())
    })
    .unwrap();
    assert!(
        out.windows(2).all(|w| w[0] == w[1]),
        "ranks differ: {out:?}"
    );
    let (model, kept) = out[0];
    assert_ne!(model, kept, "the slowed candidate {model} was kept");
}

#[test]
fn a_peer_that_dies_during_the_trials_or_the_agreement_fails_the_call_on_every_rank() {
    let (n, left) = trying_size(0).expect("an all-gather size with candidates to try");
    // A trial call, and the agreement (the collective number after the deciding call's).
    for seq in [1, left as u32] {
        let kill = vec![Fault {
            rank: 1,
            seq,
            kind: FaultKind::Kill,
        }];
        let out = Communicator::run_threads(4, cfg(TRIALS, kill), |comm| {
            let mut calls = 0;
            loop {
                let t0 = Instant::now();
                match run_checked(&comm, 0, n) {
                    Ok(()) => calls += 1,
                    Err(e) => return (comm.rank(), calls, e, t0.elapsed()),
                }
                assert!(calls <= left, "rank {}: no call failed", comm.rank());
            }
        })
        .unwrap();
        for (r, calls, e, took) in out {
            let what = format!("kill at #{seq}, rank {r} after {calls} calls");
            assert!(calls as u32 <= seq, "{what}: {e}");
            if r == 1 {
                continue;
            }
            assert_eq!(e.kind(), ErrorKind::Remote, "{what}: {e}");
            assert!(e.message().contains("rank 1"), "{what}: {e}");
            assert!(took < prompt(Duration::from_secs(1)), "{what}: {took:?}");
        }
    }
}

#[test]
fn ranks_that_disagree_on_trying_fail_the_call_instead_of_pairing() {
    let (n, _) = trying_size(0).expect("an all-gather size with candidates to try");
    let world = ThreadWorld::new(4);
    let transports: Vec<_> = (0..4).map(|r| world.transport(r).unwrap()).collect();
    let out: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(r, t)| {
                s.spawn(move || {
                    // Rank 0 tries candidates; the others keep the model's choice.
                    let comm =
                        Communicator::with_config(t, cfg(if r == 0 { TRIALS } else { 0 }, vec![]))
                            .unwrap();
                    for call in 0..TRIALS + 3 {
                        if let Err(e) = run_checked(&comm, 0, n) {
                            return Some((call, e));
                        }
                    }
                    None
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The first TRIALS + 1 calls run the model's choice; the next another candidate on rank
    // 0 alone.
    for (r, o) in out.iter().enumerate() {
        let (call, e) = o
            .as_ref()
            .unwrap_or_else(|| panic!("rank {r}: every call passed"));
        assert_eq!(*call, TRIALS + 1, "rank {r}: {e}");
        assert_eq!(e.kind(), ErrorKind::Remote, "rank {r}: {e}");
    }
}

#[test]
fn pccl_tune_online_parses_counts_and_switches_and_refuses_the_rest() {
    use pccl::config::parse_tune_online;
    assert_eq!(parse_tune_online("0").unwrap(), 0);
    assert_eq!(parse_tune_online("5").unwrap(), 5);
    assert_eq!(parse_tune_online("on").unwrap(), 8);
    assert_eq!(parse_tune_online("OFF").unwrap(), 0);
    for bad in ["-1", "33", "fast", ""] {
        let e = parse_tune_online(bad).unwrap_err();
        assert!(e.message().contains("PCCL_TUNE_ONLINE"), "{bad}: {e}");
    }
}

#[test]
fn the_trials_settle_at_any_rank_count_including_one_and_odd_ones() {
    for p in [1usize, 3, 5] {
        let cfg = Config {
            ranks_per_node: Some(1),
            ..cfg(TRIALS, vec![])
        };
        let out = Communicator::run_threads(p, cfg, |comm| {
            let mut settled = Vec::new();
            for which in 0..3 {
                for n in [16, 1000, 40000] {
                    let (c, b) = key(which, n, p);
                    let left = comm.online_calls_left(c, b).unwrap();
                    for call in 0..left {
                        run_checked(&comm, which, n)
                            .unwrap_or_else(|e| panic!("p{p} coll {which} n {n} call {call}: {e}"));
                    }
                    assert_eq!(comm.online_calls_left(c, b).unwrap(), 0);
                    run_checked(&comm, which, n).unwrap();
                    settled.push((left, comm.algorithm_for(c, b).unwrap()));
                }
            }
            settled
        })
        .unwrap();
        assert!(
            out.windows(2).all(|w| w[0] == w[1]),
            "p{p}: ranks differ: {out:?}"
        );
        assert!(
            out[0].iter().any(|s| s.0 > 0),
            "p{p}: nothing was tried: {out:?}"
        );
    }
}

#[test]
fn queued_calls_take_part_in_the_trials_and_the_decision_waits_for_them() {
    let (n, left) = trying_size(0).expect("an all-gather size with candidates to try");
    // The queued calls' times must count for the slowed candidate to lose.
    let out = Communicator::run_threads(4, cfg(TRIALS, slow_model_trials()), |comm| {
        let (p, r) = (comm.size(), comm.rank());
        let (c, b) = key(0, n, p);
        let model = comm.algorithm_for(c, b).unwrap();
        // Every call of the trials and the deciding one queued before any is waited for.
        let reqs: Vec<_> = (0..left)
            .map(|_| {
                comm.all_gather_async(input::<f32>(r, n, ReduceOp::Sum), vec![0f32; n * p])
                    .unwrap()
            })
            .collect();
        assert_eq!(comm.online_calls_left(c, b).unwrap(), 0);
        for (i, req) in reqs.into_iter().enumerate() {
            let (_, out) = req.wait().unwrap_or_else(|e| panic!("call {i}: {e}"));
            for q in 0..p {
                let want: Vec<f32> = input(q, n, ReduceOp::Sum);
                assert!(
                    same_bits(&out[q * n..(q + 1) * n], &want),
                    "call {i} block {q}"
                );
            }
        }
        (model, comm.algorithm_for(c, b).unwrap())
    })
    .unwrap();
    assert!(
        out.windows(2).all(|w| w[0] == w[1]),
        "ranks differ: {out:?}"
    );
    assert_ne!(out[0].0, out[0].1, "the slowed candidate was kept");
}

#[test]
fn a_damaged_agreement_fails_the_deciding_call_everywhere_and_the_next_call_decides() {
    let (n, left) = trying_size(0).expect("an all-gather size with candidates to try");
    // The agreement takes the collective number after the deciding call's (call left - 1).
    let corrupt = vec![Fault {
        rank: 1,
        seq: left as u32,
        kind: FaultKind::Corrupt,
    }];
    let out = Communicator::run_threads(4, cfg(TRIALS, corrupt), |comm| {
        let (c, b) = key(0, n, comm.size());
        for call in 0..left - 1 {
            run_checked(&comm, 0, n).unwrap_or_else(|e| panic!("trial {call}: {e}"));
        }
        let failed = run_checked(&comm, 0, n).err();
        // Retried: a new agreement, then the call with its winner.
        run_checked(&comm, 0, n).expect("the call after the failed agreement");
        run_checked(&comm, 0, n).expect("and the one after");
        (
            failed.map(|e| e.kind()),
            comm.online_calls_left(c, b).unwrap(),
            comm.algorithm_for(c, b).unwrap(),
        )
    })
    .unwrap();
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.0, Some(ErrorKind::Remote), "rank {r}: {out:?}");
        assert_eq!(o.1, 0, "rank {r}: not settled");
    }
    assert!(
        out.windows(2).all(|w| w[0].2 == w[1].2),
        "ranks differ: {out:?}"
    );
}
