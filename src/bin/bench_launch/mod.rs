//! How `pccl-bench`'s ranks start: under `mpiexec` (MPI's world, MPI's own collective
//! beside PCCL's), one process per rank launched by environment, or thread-ranks.

use super::{fail, Args};
use pccl::config::Config;
use pccl::Communicator;

pub(super) fn use_mpi(args: &Args) -> bool {
    match args.transport.as_str() {
        "threads" => false,
        // Under mpiexec, TCP and libfabric bootstrap through the MPI world (MPI's own
        // collectives are then measured beside them); otherwise one process launched by
        // environment, or thread-ranks, join through a unique id.
        "tcp" | "ofi" => {
            #[cfg(feature = "mpi")]
            {
                pccl::transport::mpi::launched_by_mpiexec()
            }
            #[cfg(not(feature = "mpi"))]
            {
                false
            }
        }
        "mpi" => true,
        "auto" => {
            #[cfg(feature = "mpi")]
            {
                pccl::transport::mpi::launched_by_mpiexec()
            }
            #[cfg(not(feature = "mpi"))]
            {
                false
            }
        }
        other => fail(format!(
            "--transport {other}: expected auto, threads, mpi, tcp or ofi"
        )),
    }
}

#[cfg(feature = "mpi")]
pub(super) fn run_mpi(args: &Args, cfg: Config) -> u64 {
    use super::{bench_rank, report, Native};
    use pccl::transport::mpi::{init, MpiTransport};
    init().unwrap_or_else(|e| fail(e));
    let wrong = {
        // `--transport ofi`: libfabric with its addresses exchanged through MPI.
        let kind = pccl::transport::select::parse(&args.transport).unwrap_or_else(|e| fail(e));
        let t = pccl::transport::select::world(kind, cfg.chunk_bytes, cfg.timeout)
            .unwrap_or_else(|e| fail(e));
        // A second duplicate of the world for MPI's own collectives.
        let native_t = MpiTransport::world(cfg.chunk_bytes).unwrap_or_else(|e| fail(e));
        let comm = Communicator::with_config(t, cfg).unwrap_or_else(|e| fail(e));
        let native = Native {
            mpi: Some(&native_t),
        };
        let rows = bench_rank(&comm, &native, args)
            .unwrap_or_else(|e| fail(format!("rank {}: {e}", comm.rank())));
        let wrong = report(&comm, &rows, args);
        // Nobody reaches the finalize guard before rank 0 printed: a rank that ends itself
        // there has hydra kill every other process (see pccl-tune's closing barrier).
        if let Err(e) = comm.barrier() {
            eprintln!("pccl-bench: the closing barrier failed: {e}");
        }
        wrong
    };
    finalize_guarded(if wrong > 0 { 1 } else { 0 });
    wrong
}

/// `MPI_Finalize`, with a watchdog: across network namespaces UCX's TCP progress sometimes never
/// returns from it (a known UCX issue). The results are printed by then, so after 10 s the
/// process ends with the status it would have had, without running exit handlers (one of them
/// would finalise again).
#[cfg(feature = "mpi")]
fn finalize_guarded(status: i32) {
    use std::io::Write;
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(10));
        eprintln!("pccl-bench: MPI_Finalize did not return within 10 s; exiting without it");
        let _ = std::io::stdout().flush();
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(status) };
    });
    pccl::transport::mpi::finalize();
}

#[cfg(not(feature = "mpi"))]
pub(super) fn run_mpi(_args: &Args, _cfg: Config) -> u64 {
    fail("this pccl-bench was built without the `mpi` feature (cargo build --features mpi)")
}

/// This process's transport when a launcher started one process per rank (`PCCL_RANK` /
/// `PCCL_WORLD_SIZE` or a launcher's variables, with `PCCL_UNIQUE_ID(_FILE)`; see
/// `pccl::transport::launch`); `None` to run thread-ranks.
pub(super) fn launched(
    cfg: &Config,
    kind: &str,
) -> Option<std::sync::Arc<dyn pccl::transport::Transport>> {
    use pccl::transport::{launch, select};
    let kind = select::parse(kind).unwrap_or_else(|e| fail(e));
    launch::join_launched(kind, cfg.chunk_bytes, cfg.timeout)
        .unwrap_or_else(|e| fail(e))
        .map(|(_, t)| t)
}

/// Runs `f` on `p` thread-ranks, each with its own `tcp` or `ofi` transport joined through
/// a unique id (as separate processes would).
pub(super) fn on_unique_id<R: Send>(
    p: usize,
    cfg: Config,
    kind: &str,
    f: impl Fn(Communicator) -> pccl::Result<R> + Sync,
) -> pccl::Result<Vec<pccl::Result<R>>> {
    use pccl::transport::{select, tcp::UniqueId};
    let kind = select::parse(kind)?;
    let id = UniqueId::new(cfg.timeout)?;
    Ok(std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let (cfg, id, f) = (cfg.clone(), id.clone(), &f);
                s.spawn(move || {
                    let t = select::join(kind, &id, p, r, cfg.chunk_bytes, cfg.timeout)?;
                    f(Communicator::with_config(t, cfg)?)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| fail("a rank thread panicked")))
            .collect()
    }))
}
