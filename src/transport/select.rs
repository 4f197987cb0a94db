//! `PCCL_TRANSPORT`: which transport a communicator created from the environment uses
//! (`pcclCommInitRank`, `pccl-bench --transport`).

use super::tcp::UniqueId;
use super::Transport;
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// A transport choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The front end's default (TCP for unique-id jobs, MPI under mpiexec, threads in-process).
    Auto,
    /// Thread-ranks of one process.
    Threads,
    /// TCP sockets and shared-memory rings.
    Tcp,
    /// MPI.
    Mpi,
    /// libfabric (feature `ofi`).
    Ofi,
}

/// Parses a transport name (`auto`, `threads`, `tcp`, `mpi`, `ofi`).
pub fn parse(v: &str) -> Result<Kind> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(Kind::Auto),
        "threads" => Ok(Kind::Threads),
        "tcp" => Ok(Kind::Tcp),
        "mpi" => Ok(Kind::Mpi),
        "ofi" | "libfabric" => Ok(Kind::Ofi),
        other => Err(Error::invalid(format!(
            "PCCL_TRANSPORT={other}: expected auto, threads, tcp, mpi or ofi"
        ))),
    }
}

/// The choice of `PCCL_TRANSPORT` (auto when unset).
pub fn from_env() -> Result<Kind> {
    parse(&std::env::var("PCCL_TRANSPORT").unwrap_or_default())
}

/// The transport of `rank` of `nranks` in the unique-id job `id`: TCP for `auto`/`tcp`,
/// libfabric for `ofi`; threads and MPI cannot be joined through a unique id. A rank that
/// fails to join withdraws ([`UniqueId::withdraw`]), so the others fail at once naming it.
pub fn join(
    kind: Kind,
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    chunk_bytes: usize,
    timeout: Duration,
) -> Result<Arc<dyn Transport>> {
    let t = match kind {
        Kind::Auto | Kind::Tcp => {
            super::tcp::TcpTransport::connect(id, nranks, rank, chunk_bytes, timeout)
                .map(|t| Arc::new(t) as Arc<dyn Transport>)
        }
        Kind::Ofi => ofi(id, nranks, rank, chunk_bytes, timeout),
        Kind::Threads | Kind::Mpi => Err(Error::usage(format!(
            "PCCL_TRANSPORT={kind:?}: a unique-id job (pcclCommInitRank) runs on tcp or ofi; \
             use pcclCommInitMPIWorld for MPI, thread-ranks in one process for threads"
        ))),
    };
    if let Err(e) = &t {
        id.withdraw(rank, nranks, e.message());
    }
    t
}

#[cfg(feature = "ofi")]
fn ofi(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    chunk_bytes: usize,
    timeout: Duration,
) -> Result<Arc<dyn Transport>> {
    Ok(Arc::new(super::ofi::OfiTransport::connect(
        id,
        nranks,
        rank,
        chunk_bytes,
        timeout,
    )?))
}

#[cfg(not(feature = "ofi"))]
fn ofi(_: &UniqueId, _: usize, _: usize, _: usize, _: Duration) -> Result<Arc<dyn Transport>> {
    Err(Error::usage(
        "PCCL_TRANSPORT=ofi: this libpccl was built without libfabric; rebuild it with \
         `cargo build --features ofi`",
    ))
}

/// The transport of this rank of the MPI world (`pcclCommInitMPIWorld`, `pccl-bench` under
/// mpiexec): libfabric for `ofi`, its addresses exchanged through MPI; TCP for `tcp`, rank 0's
/// unique id broadcast through MPI; MPI for every other choice.
#[cfg(feature = "mpi")]
pub fn world(kind: Kind, chunk_bytes: usize, timeout: Duration) -> Result<Arc<dyn Transport>> {
    match kind {
        Kind::Ofi => ofi_world(chunk_bytes, timeout),
        Kind::Tcp => tcp_world(chunk_bytes, timeout),
        _ => Ok(Arc::new(super::mpi::MpiTransport::world(chunk_bytes)?)),
    }
}

/// TCP between the ranks of the MPI world, MPI used only to hand rank 0's unique id around.
#[cfg(feature = "mpi")]
fn tcp_world(chunk_bytes: usize, timeout: Duration) -> Result<Arc<dyn Transport>> {
    use super::tcp::UNIQUE_ID_BYTES;
    let ctl = crate::Communicator::new(Arc::new(super::mpi::MpiTransport::world(chunk_bytes)?))?;
    let mut bytes = [0u8; UNIQUE_ID_BYTES];
    if ctl.rank() == 0 {
        // The rendezvous thread lives on after the id value is dropped.
        bytes = UniqueId::new(timeout)?.to_bytes();
    }
    ctl.broadcast(&mut bytes[..], 0)?;
    let id = UniqueId::from_bytes(&bytes)?;
    join(Kind::Tcp, &id, ctl.size(), ctl.rank(), chunk_bytes, timeout)
}

#[cfg(all(feature = "mpi", feature = "ofi"))]
fn ofi_world(chunk_bytes: usize, timeout: Duration) -> Result<Arc<dyn Transport>> {
    Ok(Arc::new(super::ofi::OfiTransport::on_mpi_world(
        chunk_bytes,
        timeout,
    )?))
}

#[cfg(all(feature = "mpi", not(feature = "ofi")))]
fn ofi_world(_: usize, _: Duration) -> Result<Arc<dyn Transport>> {
    Err(Error::usage(
        "PCCL_TRANSPORT=ofi: this libpccl was built without libfabric; rebuild it with \
         `cargo build --features ofi`",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_ones_are_refused() {
        assert_eq!(parse("").unwrap(), Kind::Auto);
        assert_eq!(parse(" OFI ").unwrap(), Kind::Ofi);
        assert_eq!(parse("tcp").unwrap(), Kind::Tcp);
        let e = parse("verbs").unwrap_err();
        assert!(e.message().contains("PCCL_TRANSPORT=verbs"), "{e}");
    }

    #[test]
    fn threads_and_mpi_cannot_join_a_unique_id_job() {
        let id = UniqueId::new(Duration::from_millis(200)).unwrap();
        for k in [Kind::Threads, Kind::Mpi] {
            let e = join(k, &id, 2, 0, 1 << 20, Duration::from_millis(200))
                .err()
                .unwrap();
            assert_eq!(e.kind(), crate::error::ErrorKind::InvalidUsage, "{e}");
        }
    }
}
