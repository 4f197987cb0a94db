//! Survives the loss of a node: every rank (one process each, started by a launcher such as
//! `scripts/cluster.sh run`, over TCP) loops checked all-reduces; the ranks of node `--lose`
//! exit abruptly (no goodbye, as a crashed node's would) after `--after` calls; every other
//! rank must see its call fail, find the lost ranks in `dead_ranks()` within `PCCL_TIMEOUT`,
//! shrink them out, and go on with `--then` more all-reduces on the shrunk communicator, each
//! result checked against the sum over the surviving ranks.
//!
//! ```text
//! scripts/cluster.sh run -- target/release/examples/survive --lose 2 --after 20 --then 20
//! ```
//! Prints one line per rank (`survived: …` or what went wrong) and exits non-zero on a wrong
//! result, a hang past the timeout or a failed shrink.
//!
//! With `--partition 1` nobody exits: the ranks loop checked all-reduces until the network
//! is cut under them (`scripts/cluster.sh partition A B cut`, from outside), then agree on
//! who goes on (`shrink_to_survivors`): the majority side prints `survived the partition: …`
//! and runs `--then` more checked all-reduces among itself; a rank on the minority side must
//! be refused (`stopped: … not a majority …`) and exits 0 — any other outcome is a failure.

#[path = "../tests/common.rs"]
mod common;

use common::arg;
use pccl::config::Config;
use pccl::transport::{launch, select};
use pccl::{Communicator, ReduceOp};
use std::time::{Duration, Instant};

fn fail(rank: usize, msg: String) -> ! {
    println!("rank {rank}: FAILED: {msg}");
    std::process::exit(1);
}

/// One checked all-reduce: each member contributes `original rank + 1` in every element.
fn checked(comm: &Communicator, me: usize, members: &[usize], n: usize) -> pccl::Result<()> {
    let mut v = vec![(me + 1) as f64; n];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
    let want: f64 = members.iter().map(|&r| (r + 1) as f64).sum();
    if let Some(i) = v.iter().position(|&x| x != want) {
        fail(me, format!("element {i} is {} instead of {want}", v[i]));
    }
    Ok(())
}

fn main() {
    let (lose, after, then) = (arg("--lose", 2), arg("--after", 20), arg("--then", 20));
    let n = arg("--elems", 16 << 10);
    let cfg = Config::from_env().unwrap_or_else(|e| fail(0, e.to_string()));
    let kind = select::parse("tcp").unwrap_or_else(|e| fail(0, e.to_string()));
    let Some((l, t)) = launch::join_launched(kind, cfg.chunk_bytes, cfg.timeout)
        .unwrap_or_else(|e| fail(0, e.to_string()))
    else {
        fail(
            0,
            "no launcher variables (PCCL_RANK, PCCL_WORLD_SIZE)".into(),
        );
    };
    let me = l.rank;
    let timeout = cfg.timeout;
    let mut comm = Communicator::with_config(t, cfg).unwrap_or_else(|e| fail(me, e.to_string()));
    let (node, _) = comm.topology().position(me);
    let lost: Vec<usize> = comm
        .topology()
        .nodes()
        .get(lose)
        .cloned()
        .unwrap_or_default();
    let mut members: Vec<usize> = (0..l.size).collect();
    if arg("--partition", 0) != 0 {
        partition(comm, me, members, n, then, timeout);
        return;
    }
    for _ in 0..after {
        if let Err(e) = checked(&comm, me, &members, n) {
            fail(me, format!("before the loss: {e}"));
        }
    }
    // Every rank is past the calls before the loss (a rank may return from a collective
    // while its last messages are still on their way: a crash right then would fail its
    // peers' call before the loss, which is not what this checks).
    if let Err(e) = comm.barrier() {
        fail(me, format!("the barrier before the loss: {e}"));
    }
    std::thread::sleep(Duration::from_millis(300));
    if node == lose {
        // A crashed node: no goodbye, no destructors.
        println!("rank {me}: node {node} goes down");
        std::process::exit(0);
    }
    // The survivors: calls fail once the lost ranks are gone (a call may still complete if it
    // finished before they left; keep calling until one fails).
    let t0 = Instant::now();
    let err = loop {
        match checked(&comm, me, &members, n) {
            Ok(()) if t0.elapsed() < timeout * 3 => continue,
            Ok(()) => fail(me, "the calls kept succeeding with a node gone".into()),
            Err(e) => break e,
        }
    };
    let failed_after = t0.elapsed();
    // Detection: the lost ranks' connections closed without a goodbye.
    let mut dead = comm.dead_ranks();
    while !lost.iter().all(|r| dead.contains(r)) && t0.elapsed() < timeout * 2 {
        std::thread::sleep(Duration::from_millis(20));
        dead = comm.dead_ranks();
    }
    dead.sort_unstable();
    if dead != lost {
        fail(
            me,
            format!("dead ranks {dead:?}, expected node {lose}'s {lost:?} (call failed: {err})"),
        );
    }
    comm = comm
        .shrink(&dead)
        .unwrap_or_else(|e| fail(me, format!("shrink: {e}")));
    members.retain(|r| !dead.contains(r));
    for i in 0..then {
        if let Err(e) = checked(&comm, me, &members, n) {
            fail(me, format!("all-reduce {i} after the shrink: {e}"));
        }
    }
    println!(
        "rank {me}: survived: the first call after the loss failed in {:.2} s ({:?}), ranks \
         {dead:?} shrunk out, {then} checked all-reduces on {} ranks",
        failed_after.as_secs_f64(),
        err.kind(),
        comm.size()
    );
}

/// `--partition`: loop until a call fails (the cut), agree on the survivors, go on or stop.
fn partition(
    comm: Communicator,
    me: usize,
    mut members: Vec<usize>,
    n: usize,
    then: usize,
    timeout: Duration,
) {
    let t0 = Instant::now();
    let mut calls = 0usize;
    let err = loop {
        match checked(&comm, me, &members, n) {
            Ok(()) if t0.elapsed() < timeout * 12 => calls += 1,
            Ok(()) => fail(me, "the calls kept succeeding: no partition came".into()),
            Err(e) => break e,
        }
    };
    let t1 = Instant::now();
    let alive = match comm.survivors() {
        Ok(a) => a,
        Err(e) if e.message().contains("not a majority") || e.message().contains("counted") => {
            println!(
                "rank {me}: stopped: after {calls} calls, the call failed ({:?}), then the \
                 agreement in {:.2} s: {e}",
                err.kind(),
                t1.elapsed().as_secs_f64()
            );
            return;
        }
        Err(e) => fail(me, format!("survivors: {e} (the call failed: {err})")),
    };
    let agreed_in = t1.elapsed();
    let excluded: Vec<usize> = members
        .iter()
        .copied()
        .filter(|r| alive.binary_search(r).is_err())
        .collect();
    let comm = comm
        .shrink(&excluded)
        .unwrap_or_else(|e| fail(me, format!("shrink to {alive:?}: {e}")));
    members = alive;
    for i in 0..then {
        if let Err(e) = checked(&comm, me, &members, n) {
            fail(me, format!("all-reduce {i} after the shrink: {e}"));
        }
    }
    println!(
        "rank {me}: survived the partition: after {calls} calls the call failed ({:?}), the \
         survivors agreed on {members:?} in {:.2} s, {then} checked all-reduces on {} ranks",
        err.kind(),
        agreed_in.as_secs_f64(),
        comm.size()
    );
}
