//! Real processes under `mpiexec -n K`, K = 1..=8, with `PCCL_RANKS_PER_NODE` in {1, 2, 4}
//! where it divides K: every algorithm on the MPI transport (examples/mpi_check.rs), and the
//! benchmark's `--check` mode; MPI's CUDA-awareness detection and its override; the online
//! trials across processes.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::Command;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf()
}

fn mpiexec(k: usize, m: usize, prog: &str, args: &[&str]) {
    mpiexec_env(k, m, prog, args, None);
}

/// Runs `prog` under `mpiexec -n k` with `PCCL_MPI_CUDA_AWARE` set to `aware` (unset for
/// `None`); fails unless it succeeds; returns its stdout.
fn mpiexec_env(k: usize, m: usize, prog: &str, args: &[&str], aware: Option<&str>) -> String {
    let mut cmd = Command::new("mpiexec");
    cmd.arg("-n")
        .arg(k.to_string())
        .arg(prog)
        .args(args)
        .env("PCCL_RANKS_PER_NODE", m.to_string())
        .env("PCCL_TIMEOUT", "60");
    match aware {
        Some(v) => cmd.env("PCCL_MPI_CUDA_AWARE", v),
        None => cmd.env_remove("PCCL_MPI_CUDA_AWARE"),
    };
    let out = cmd.output().expect("mpiexec runs (install mpich)");
    assert!(
        out.status.success(),
        "mpiexec -n {k} (PCCL_RANKS_PER_NODE={m}) {prog} {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_algorithm_is_correct_on_1_to_8_mpi_processes_in_every_node_shape() {
    let prog = target_dir().join("examples").join("mpi_check");
    assert!(
        prog.exists(),
        "{} is built by `cargo test --features mpi`",
        prog.display()
    );
    for k in 1..=8usize {
        for m in [1usize, 2, 4].into_iter().filter(|m| k % m == 0) {
            mpiexec(k, m, prog.to_str().unwrap(), &[]);
        }
    }
}

/// The MPI here (MPICH without CUDA) is not CUDA-aware: the transport says it cannot move
/// device memory (so device collectives stage through host memory), unless
/// `PCCL_MPI_CUDA_AWARE=1` asserts it can; `0` forces it off. mpi_check also checks that
/// sub-communicators keep the parent's answer.
#[test]
fn mpi_cuda_awareness_is_detected_and_overridable() {
    let prog = target_dir().join("examples").join("mpi_check");
    assert!(
        prog.exists(),
        "{} is built by `cargo test --features mpi`",
        prog.display()
    );
    let prog = prog.to_str().unwrap();
    for (aware, want) in [(None, false), (Some("0"), false), (Some("1"), true)] {
        let out = mpiexec_env(2, 1, prog, &[], aware);
        let line = format!("mpi_check: MPI moves device memory: {want}");
        assert!(
            out.contains(&line),
            "PCCL_MPI_CUDA_AWARE={aware:?}: expected '{line}' in:\n{out}"
        );
    }
}

#[test]
fn benchmark_check_mode_passes_under_mpiexec() {
    let bench = env!("CARGO_BIN_EXE_pccl-bench");
    mpiexec(
        4,
        2,
        bench,
        &[
            "--coll", "all", "-m", "1K:64K", "-i", "3", "--check", "--algo", "hier-rd",
        ],
    );
    mpiexec(
        3,
        1,
        bench,
        &[
            "--coll",
            "reducescatter",
            "-m",
            "4K:8K",
            "-i",
            "2",
            "--check",
            "--dtype",
            "bf16",
            "--op",
            "avg",
        ],
    );
}

/// The tuner's piece size reaches the MPI transport per call (a profile whose only piece
/// candidate is 16 KiB: 1 MiB messages in 64 pieces, whose headers every receiver checks),
/// and a rank cutting at another size (`PCCL_CHUNK_SIZE` on one rank only) makes the
/// collective fail with an error naming both piece sizes instead of hanging or corrupting.
/// Runs `n` processes of `prog args` with `cmd` (`mpiexec` and its environment); with
/// `rank0 = Some((VAR, value))` rank 0 alone gets VAR=value (MPMD: `-n 1 -env VAR value prog
/// args : -n n-1 prog args`).
fn mpmd(
    mut cmd: Command,
    n: usize,
    prog: &str,
    args: &[&str],
    rank0: Option<(&str, &str)>,
) -> std::process::Output {
    if let Some((var, value)) = rank0 {
        cmd.args(["-n", "1", "-env", var, value, prog])
            .args(args)
            .args([":", "-n", &(n - 1).to_string(), prog]);
    } else {
        cmd.args(["-n", &n.to_string(), prog]);
    }
    cmd.args(args)
        .output()
        .expect("mpiexec runs (install mpich)")
}

#[test]
fn the_tuners_piece_reaches_mpi_and_a_mismatched_rank_fails_clearly() {
    let bench = env!("CARGO_BIN_EXE_pccl-bench");
    let dir = std::env::temp_dir().join(format!("pccl-piece-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let prof = dir.join("small-piece.toml");
    std::fs::write(
        &prof,
        "name = \"small pieces\"\npiece_bytes = 16384\npiece_candidates = [16384]\n",
    )
    .expect("profile written");
    let args = [
        "--coll",
        "reducescatter",
        "-m",
        "1M:1M",
        "-i",
        "2",
        "-x",
        "0",
        "--check",
        "--no-mpi-compare",
    ];
    let run = |chunk_on_rank0: Option<&str>| {
        let mut cmd = Command::new("mpiexec");
        cmd.env("PCCL_TUNE_FILE", &prof)
            .env("PCCL_TIMEOUT", "30")
            .env("PCCL_DEBUG", "INFO")
            .env_remove("PCCL_CHUNK_SIZE")
            .env_remove("PCCL_RANKS_PER_NODE");
        mpmd(
            cmd,
            3,
            bench,
            &args,
            chunk_on_rank0.map(|c| ("PCCL_CHUNK_SIZE", c)),
        )
    };
    let out = run(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("pieces of 16384 B applied"), "{err}");
    let out = run(Some("65536"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a mismatched piece size went unnoticed: {err}"
    );
    assert!(
        err.contains("in pieces of 16384") || err.contains("in pieces of 65536"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The online trials (`PCCL_TUNE_ONLINE`) across processes: the benchmark's `auto-online`
/// settles every size (the agreement runs, every result checked), and a rank that does not
/// try while the others do fails the run with an error instead of pairing different
/// algorithms or hanging.
#[test]
fn online_trials_agree_across_processes_and_a_rank_that_does_not_try_fails_the_run() {
    let bench = env!("CARGO_BIN_EXE_pccl-bench");
    let args = [
        "--coll",
        "all",
        "-m",
        "1K:64K",
        "-i",
        "3",
        "--check",
        "--no-mpi-compare",
        "--algo",
        "auto-online",
    ];
    let run = |lone: Option<&str>| {
        let mut cmd = Command::new("mpiexec");
        cmd.env("PCCL_TIMEOUT", "30")
            .env("PCCL_DEBUG", "INFO")
            .env("PCCL_RANKS_PER_NODE", "2")
            .env("PCCL_TUNE_ONLINE", "2");
        mpmd(cmd, 4, bench, &args, lone.map(|v| ("PCCL_TUNE_ONLINE", v)))
    };
    let out = run(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("PCCL_TUNE_ONLINE keeps"),
        "no trials settled:\n{err}"
    );
    let t0 = std::time::Instant::now();
    let out = run(Some("0"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a rank without trials went unnoticed: {err}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(25),
        "it took {:?}: {err}",
        t0.elapsed()
    );
}
