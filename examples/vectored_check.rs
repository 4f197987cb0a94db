//! Run under `mpiexec -n K`: the vectored message contract on the MPI transport (the body
//! shared with `tests/vectored.rs`). Each rank prints `vectored_check: rank R ok` or exits 1.

#[path = "../tests/shared/vectored.rs"]
mod vectored;

use pccl::transport::mpi::{finalize, MpiTransport};

fn main() {
    let ok = {
        let t = MpiTransport::world(1 << 20).expect("MPI world");
        let rank = pccl::transport::Transport::rank(&t);
        match vectored::run(&t) {
            Ok(()) => {
                println!("vectored_check: rank {rank} ok");
                true
            }
            Err(e) => {
                println!("vectored_check: rank {rank} FAIL: {e}");
                false
            }
        }
    };
    finalize();
    if !ok {
        std::process::exit(1);
    }
}
