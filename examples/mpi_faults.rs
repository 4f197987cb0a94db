//! Run under `mpiexec -n K`: the MPI transport under faults. `mpi_faults SCENARIO`:
//!
//! * `mismatch` (K=2): rank 0 all-gathers 64 floats while rank 1 all-reduces 128; both fail
//!   with a remote error naming both calls; the next all-reduce is correct.
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

fn mismatch(c: &Communicator) -> Result<String, String> {
    let r = c.rank();
    let res = if r == 0 {
        let mut out = vec![0f32; 64 * c.size()];
        c.all_gather(&[1f32; 64], &mut out)
    } else {
        let mut out = vec![0f32; 128];
        c.all_reduce(&[1f32; 128], &mut out, ReduceOp::Sum)
    };
    let msg = expect(res, ErrorKind::Remote, &["all-gather", "all-reduce"])?;
    good_all_reduce(c, 1000)?;
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

fn abort(c: &Communicator, cfg: &Config) -> Result<String, String> {
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
    sync(cfg);
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
            "mismatch" => mismatch(&c),
            "refuse" => refuse(&c),
            "corrupt" => corrupt(&c),
            "stall" => stall(&c),
            "kill" => kill(&c),
            "abort" => abort(&c, &cfg),
            "exit" => exit(&c),
            "nosend" => nosend(&c, false),
            "late" => nosend(&c, true),
            other => Err(format!("unknown scenario '{other}'")),
        };
        ok = report(rank, r);
    }
    finalize();
    if !ok {
        std::process::exit(1);
    }
}
