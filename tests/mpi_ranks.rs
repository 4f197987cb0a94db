//! Real processes under `mpiexec -n K`, K = 1..=8, with `PCCL_RANKS_PER_NODE` in {1, 2, 4}
//! where it divides K: every algorithm on the MPI transport (examples/mpi_check.rs), and the
//! benchmark's `--check` mode.
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
    let out = Command::new("mpiexec")
        .arg("-n")
        .arg(k.to_string())
        .arg(prog)
        .args(args)
        .env("PCCL_RANKS_PER_NODE", m.to_string())
        .env("PCCL_TIMEOUT", "60")
        .output()
        .expect("mpiexec runs (install mpich)");
    assert!(
        out.status.success(),
        "mpiexec -n {k} (PCCL_RANKS_PER_NODE={m}) {prog} {args:?} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
