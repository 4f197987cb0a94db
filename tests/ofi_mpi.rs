//! The libfabric transport bootstrapped through the MPI world: `pccl-bench --transport ofi`
//! under `mpiexec` exchanges endpoint addresses over MPI (no unique id), runs every
//! collective with checked results, and times MPI's own collectives beside it.
#![cfg(all(feature = "ofi", feature = "mpi"))]

use std::process::Command;

/// Runs the benchmark under `mpiexec -n k` with `FI_PROVIDER=prov`; returns its output.
fn bench(k: usize, prov: &str, args: &[&str]) -> String {
    let out = Command::new("mpiexec")
        .arg("-n")
        .arg(k.to_string())
        .arg(env!("CARGO_BIN_EXE_pccl-bench"))
        .args(["--transport", "ofi"])
        .args(args)
        .env("FI_PROVIDER", prov)
        .env("PCCL_TIMEOUT", "60")
        .env_remove("PCCL_TRANSPORT")
        .output()
        .expect("mpiexec runs (install mpich)");
    // The table goes to stdout, the check's verdict to stderr.
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpiexec -n {k} pccl-bench --transport ofi {args:?} on {prov} failed:\n{text}"
    );
    text
}

#[test]
fn ofi_bench_under_mpiexec_bootstraps_through_mpi_beside_mpi_collectives() {
    for prov in ["tcp;ofi_rxm", "shm"] {
        for k in [2usize, 4] {
            let out = bench(
                k,
                prov,
                &["--coll", "all", "-m", "1K:256K", "-i", "2", "--check"],
            );
            // One communicator of the whole world (not thread-ranks in each process) ...
            assert!(
                out.contains(&format!("# {k} ranks over ofi")),
                "{prov}, {k} ranks:\n{out}"
            );
            // ... with MPI's own collectives timed beside it, and every result right.
            assert!(out.contains("MPI Avg(us)"), "{prov}, {k} ranks:\n{out}");
            assert!(out.contains("# check: all results correct"), "{out}");
        }
        println!("pccl-bench --transport ofi under mpiexec -n 2, 4 on {prov}: correct");
    }
}
