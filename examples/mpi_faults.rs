//! Run under `mpiexec -n K`: the MPI transport under faults. `mpi_faults SCENARIO`:
//!
//! * `mismatch` (K>=2): rank 0 all-gathers 64 floats while the others all-reduce 128; every
//!   rank fails with a remote error naming both calls (and the others rank 0); the next
//!   all-reduces (1000 floats, 3 MiB) are correct. No message is ever truncated (an MPI abort).
//! * `mismatch-count`: the last rank all-reduces 3 MiB, the others 4000 bytes; the others'
//!   errors name the last rank.
//! * `mismatch-rs-a2a`: the last rank reduce-scatters, the others all-to-all; every error names
//!   both calls.
//! * `mismatch-piece`: a ring of 4 MiB messages on one transport, cut in 64 KiB pieces by the
//!   last rank and 1 MiB elsewhere: the two receives involved fail naming both piece sizes;
//!   then a communicator on the same transport all-reduces correctly.
//! * `refuse` (K>=2): rank 0 passes a wrong output length (4 MiB messages, so the peers'
//!   sends to it are rendezvous ones that only its later waits drain); every other rank fails
//!   with a remote error naming rank 0; the next all-reduce is correct.
//! * `corrupt` (K>=2, `PCCL_FAULT=1:1:corrupt`): every rank fails collective #1 with a remote
//!   error; #2 is correct.
//! * `stall` (K=2, `PCCL_FAULT=1:1:stall`): rank 0 fails collective #1 with a timeout within
//!   `PCCL_TIMEOUT` + 1 s, then exits (rank 1 is still stalled: MPI_Finalize is skipped).
//! * `kill` (`PCCL_FAULT=1:2:kill`): a loop of all-reduces; the job must end (non-zero).
//! * `abort` (K=3): ranks 0 and 1 block in an all-reduce rank 2 joins 3 s late; a thread of
//!   rank 0 aborts the communicator: rank 0's call ends with an invalid-usage error within
//!   1 s, rank 1's and rank 2's with a remote error naming rank 0; ranks 1 and 2 then shrink
//!   the communicator without rank 0 (alive) and all-reduce on it.
//! * `exit` (K=2): rank 0 refuses a call and returns from `main` at once; rank 1 fails the
//!   call and then works for 30 s; the job must end within seconds (no hang in MPI_Finalize).
//! * `nosend` (K=2): rank 1 sends 8 MiB that rank 0 never receives, with a 1 s deadline: the
//!   send cannot be cancelled (MPICH), so the job ends with a clean MPI_Abort naming rank 0.
//! * `late` (K=2): as `nosend`, but rank 0 receives the message 1.5 s after it was sent
//!   (after rank 1's deadline, within its cancel confirmation): rank 1 gets a timeout error,
//!   rank 0 the right bytes, and nobody reads freed memory (run under valgrind).
//!
//! Each rank prints `mpi_faults: rank R ok: ...` or `mpi_faults: rank R FAIL: ...`.

use pccl::config::Config;
use pccl::transport::faults::stamp;
use pccl::transport::mpi::{finalize, MpiTransport};
use pccl::transport::Transport;
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn world(cfg: &Config) -> Communicator {
    let t = Arc::new(MpiTransport::world(cfg.chunk_bytes).expect("MPI world"));
    Communicator::with_config(t, cfg.clone()).expect("communicator")
}

/// An all-reduce of `n` floats that must be correct.
fn good_all_reduce(c: &Communicator, n: usize) -> Result<(), String> {
    let (r, p) = (c.rank(), c.size());
    let mine: Vec<f32> = (0..n).map(|i| (i % 7 + r) as f32).collect();
    let mut out = vec![0f32; n];
    c.all_reduce(&mine, &mut out, ReduceOp::Sum)
        .map_err(|e| format!("all_reduce: {e}"))?;
    let ok = out
        .iter()
        .enumerate()
        .all(|(i, &x)| x == (0..p).map(|q| (i % 7 + q) as f32).sum::<f32>());
    if ok {
        Ok(())
    } else {
        Err("all_reduce: wrong result".into())
    }
}

fn expect(r: Result<(), pccl::Error>, kind: ErrorKind, words: &[&str]) -> Result<String, String> {
    match r {
        Ok(()) => Err(format!("expected a {kind:?} error, got success")),
        Err(e) if e.kind() == kind && words.iter().all(|w| e.message().contains(w)) => {
            Ok(e.to_string())
        }
        Err(e) => Err(format!("expected a {kind:?} error with {words:?}, got {e}")),
    }
}

fn report(rank: usize, r: Result<String, String>) -> bool {
    match r {
        Ok(s) => {
            println!("mpi_faults: rank {rank} ok: {s}");
            true
        }
        Err(s) => {
            println!("mpi_faults: rank {rank} FAIL: {s}");
            false
        }
    }
}

/// A barrier over a fresh world communicator (the tested one may be aborted): no rank
/// leaves, skipping MPI_Finalize and so ending the others, before all have reported.
fn sync(cfg: &Config) {
    let _ = world(cfg).barrier();
}

/// The odd rank of a `mismatch` scenario: rank 0 for `ag-ar`, the last rank otherwise.
fn odd_rank(how: &str, size: usize) -> usize {
    if how == "ag-ar" {
        0
    } else {
        size - 1
    }
}

/// One rank calls something else than the others (see the module documentation); every rank
/// must fail with a remote error naming the odd call (or the odd rank), then all-reduce.
fn mismatch(c: &Communicator, how: &str) -> Result<String, String> {
    let (r, p) = (c.rank(), c.size());
    let odd = odd_rank(how, p);
    let all_reduce = |n: usize| {
        let mut out = vec![0f32; n];
        c.all_reduce(&vec![1f32; n], &mut out, ReduceOp::Sum)
    };
    let (res, words): (_, Vec<String>) = match (how, r == odd) {
        ("ag-ar", true) => {
            let mut out = vec![0f32; 64 * p];
            (c.all_gather(&[1f32; 64], &mut out), vec![])
        }
        ("ag-ar", false) => (all_reduce(128), vec![]),
        // 3 MiB (three 1 MiB pieces, rendezvous) against 4000 bytes.
        ("count", true) => (all_reduce(3 << 18), vec![]),
        ("count", false) => (all_reduce(1000), vec![]),
        ("rs-a2a", true) => {
            let mut out = vec![0f32; 256];
            let res = c.reduce_scatter(&vec![1f32; 256 * p], &mut out, ReduceOp::Sum);
            (res, vec!["reduce-scatter".into(), "all-to-all".into()])
        }
        ("rs-a2a", false) => {
            let mut out = vec![0f32; 512 * p];
            let res = c.all_to_all(&vec![1f32; 512 * p], &mut out);
            (res, vec!["reduce-scatter".into(), "all-to-all".into()])
        }
        _ => return Err(format!("unknown mismatch '{how}'")),
    };
    let mut words = words;
    if how == "ag-ar" {
        words = vec!["all-gather".into(), "all-reduce".into()];
    }
    if r != odd {
        // Every other rank hears of the odd rank, directly or through a refusal.
        words.push(format!("rank {odd}"));
    }
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let msg = expect(res, ErrorKind::Remote, &w)?;
    good_all_reduce(c, 1000)?;
    good_all_reduce(c, 3 << 18)?;
    Ok(msg)
}

/// A ring of 4 MiB messages on one MPI transport, cut in 64 KiB pieces by the last rank and
/// in 1 MiB ones elsewhere: the last rank's receive and its successor's fail naming both
/// piece sizes, the others' succeed; then a communicator on the same transport all-reduces.
fn mismatch_piece(c: &Communicator) -> Result<String, String> {
    let t = Arc::new(MpiTransport::world(1 << 20).map_err(|e| e.to_string())?);
    let (r, p) = (t.rank(), t.size());
    let piece = |q: usize| Some(if q + 1 == p { 64 << 10 } else { 1 << 20 });
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    // Sequence number u32::MAX: the new communicator's collectives (#0 on) come after it, so
    // their success settles the failure (and MPI_Finalize is called).
    let tag = stamp(u32::MAX, 0x5678);
    let len = 4 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: `data` outlives the wait below.
    let op = unsafe { t.isend_pieces(next, tag, data.as_ptr(), len, piece(r)) }
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; len];
    let got = t.recv_into_pieces(prev, tag, &mut buf, piece(r), deadline);
    op.wait(deadline)
        .map_err(|e| format!("send to rank {next}: {e}"))?;
    let msg = if r + 1 == p || prev + 1 == p {
        let words = [
            "pieces of 65536",
            "pieces of 1048576",
            &format!("rank {prev}"),
        ];
        expect(got, ErrorKind::Remote, &words)?
    } else {
        got.map_err(|e| format!("receive from rank {prev}: {e}"))?;
        if buf != data {
            return Err(format!("wrong bytes from rank {prev}"));
        }
        "received intact".to_string()
    };
    let after = Communicator::with_config(t, c.config().clone())
        .map_err(|e| format!("a communicator on the same transport: {e}"))?;
    good_all_reduce(&after, 3 << 18)?;
    Ok(msg)
}

fn refuse(c: &Communicator) -> Result<String, String> {
    let n = 1 << 20;
    let mine = vec![1f32; n];
    let mut out = vec![0f32; if c.rank() == 0 { n - 1 } else { n }];
    let res = c.all_reduce(&mine, &mut out, ReduceOp::Sum);
    let msg = if c.rank() == 0 {
        expect(res, ErrorKind::InvalidArgument, &[])?
    } else {
        expect(res, ErrorKind::Remote, &["rank 0"])?
    };
    good_all_reduce(c, n)?;
    Ok(msg)
}

fn corrupt(c: &Communicator) -> Result<String, String> {
    good_all_reduce(c, 4096)?;
    let mut out = vec![0f32; 4096];
    let msg = expect(
        c.all_reduce(&[1f32; 4096], &mut out, ReduceOp::Sum),
        ErrorKind::Remote,
        &[],
    )?;
    good_all_reduce(c, 4096)?;
    Ok(msg)
}

fn stall(c: &Communicator) -> Result<String, String> {
    good_all_reduce(c, 64)?;
    let t0 = Instant::now();
    let mut out = vec![0f32; 64];
    let res = c.all_reduce(&[1f32; 64], &mut out, ReduceOp::Sum);
    let took = t0.elapsed();
    let limit = c.config().timeout + Duration::from_secs(1);
    let msg = expect(res, ErrorKind::Timeout, &["rank 1"])?;
    if took > limit {
        return Err(format!("timed out after {took:?}, more than {limit:?}"));
    }
    Ok(format!("after {took:.2?}: {msg}"))
}

fn kill(c: &Communicator) -> Result<String, String> {
    for _ in 0..6 {
        good_all_reduce(c, 1000)?;
    }
    Err("the job survived a killed rank".into())
}

fn abort(c: &Communicator) -> Result<String, String> {
    good_all_reduce(c, 64)?;
    let r = c.rank();
    let mut out = vec![0f32; 1 << 16];
    let mine = vec![1f32; 1 << 16];
    let msg = match r {
        0 => {
            let at = Instant::now() + Duration::from_millis(500);
            let (res, late) = std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    c.abort();
                });
                let res = c.all_reduce(&mine, &mut out, ReduceOp::Sum);
                (res, Instant::now().saturating_duration_since(at))
            });
            let m = expect(res, ErrorKind::InvalidUsage, &["aborted"])?;
            if late > Duration::from_secs(1) {
                return Err(format!("the call ended {late:?} after the abort"));
            }
            format!("{late:.2?} after the abort: {m}")
        }
        _ => {
            if r == 2 {
                std::thread::sleep(Duration::from_secs(3));
            }
            let t0 = Instant::now();
            let res = c.all_reduce(&mine, &mut out, ReduceOp::Sum);
            let took = t0.elapsed();
            let m = expect(res, ErrorKind::Remote, &["rank 0 aborted"])?;
            let sub = c
                .shrink(&[0])
                .map_err(|e| format!("shrink without rank 0: {e}"))?;
            good_all_reduce(&sub, 5000).map_err(|e| format!("after shrink: {e}"))?;
            format!("after {took:.2?}: {m}; the shrunk communicator works")
        }
    };
    Ok(msg)
}

fn exit(c: &Communicator) -> Result<String, String> {
    let n = 1 << 18;
    let mut out = vec![0f32; if c.rank() == 0 { 1 } else { n }];
    let res = c.all_reduce(&vec![1f32; n], &mut out, ReduceOp::Sum);
    if c.rank() == 0 {
        let m = expect(res, ErrorKind::InvalidArgument, &[])?;
        report(0, Ok(format!("leaving at once: {m}")));
        std::process::exit(0);
    }
    let m = expect(res, ErrorKind::Remote, &["rank 0"])?;
    report(1, Ok(format!("working on: {m}")));
    std::thread::sleep(Duration::from_secs(30));
    Err("rank 1 was not ended when rank 0 left".into())
}

fn nosend(c: &Communicator, late: bool) -> Result<String, String> {
    let t = MpiTransport::world(1 << 20).map_err(|e| e.to_string())?;
    let tag = stamp(7, 0x1234);
    let len = 8 << 20;
    if c.rank() == 1 {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        // SAFETY: `data` outlives the wait below (and is dropped only after it returned).
        let op = unsafe { t.isend(0, tag, data.as_ptr(), len) }.map_err(|e| e.to_string())?;
        let res = op.wait(Instant::now() + Duration::from_secs(1));
        drop(data);
        let m = expect(res, ErrorKind::Timeout, &["rank 0"])?;
        sync(c.config());
        return Ok(m);
    }
    if !late {
        std::thread::sleep(Duration::from_secs(10));
        return Err("rank 0 was not ended".into());
    }
    std::thread::sleep(Duration::from_millis(1500));
    let mut buf = vec![0u8; len];
    t.recv_into(1, tag, &mut buf, Instant::now() + Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    if buf.iter().enumerate().any(|(i, &b)| b != (i % 251) as u8) {
        return Err("wrong bytes".into());
    }
    sync(c.config());
    Ok("received the late message intact".into())
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let cfg = Config::from_env().expect("PCCL_* settings");
    let ok;
    {
        let c = world(&cfg);
        let rank = c.rank();
        let r = match scenario.as_str() {
            "mismatch" => mismatch(&c, "ag-ar"),
            "mismatch-piece" => mismatch_piece(&c),
            m if m.starts_with("mismatch-") => mismatch(&c, &m["mismatch-".len()..]),
            "refuse" => refuse(&c),
            "corrupt" => corrupt(&c),
            "stall" => stall(&c),
            "kill" => kill(&c),
            "abort" => abort(&c),
            "exit" => exit(&c),
            "nosend" => nosend(&c, false),
            "late" => nosend(&c, true),
            other => Err(format!("unknown scenario '{other}'")),
        };
        ok = report(rank, r);
        if scenario == "late" || scenario == "abort" {
            // A rank that noted a failure skips MPI_Finalize and its exit ends the job: no
            // rank may exit before every rank has printed its report (both seen under load:
            // a barrier before the reports let rank 0 exit while rank 1 was printing).
            sync(&cfg);
        }
    }
    finalize();
    if !ok {
        std::process::exit(1);
    }
}
