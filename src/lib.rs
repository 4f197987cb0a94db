//! PCCL: hierarchical collectives for sharded training.
//!
//! Layers, top to bottom: the [`Communicator`] (front end), the planner ([`plan`]: algorithms
//! as data), the executor ([`exec`]), the transports ([`transport`]), the device kernels
//! ([`device`]), the [`topology`] and the cost [`model`].

pub mod capi;
pub mod comm;
pub mod config;
pub mod device;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod fault;
pub mod model;
pub mod plan;
pub mod quant;
pub mod topology;
pub mod transport;

pub use comm::communicator::{
    Communicator, Dir, Group, P2pOp, QuantScheme, RawCollective, RawRooted,
};
pub use comm::request::Request;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub use comm::DeviceWork;
pub use dtype::{DType, Element, ReduceOp};
pub use error::{Error, ErrorKind, Result};
pub use plan::{Algorithm, LevelAlgo};
pub use quant::Quant;
pub use topology::Topology;
pub use transport::threads::ThreadWorld;

/// The optional parts this build of PCCL has, in a fixed order (`mpi`, `cuda`, `rocm`,
/// `hwloc`, `ofi`; each only if built in): what `pccl-info` and `pcclGetFeatures` report.
pub fn features() -> Vec<&'static str> {
    [
        ("mpi", cfg!(feature = "mpi")),
        ("cuda", cfg!(feature = "cuda")),
        ("rocm", cfg!(feature = "rocm")),
        ("hwloc", cfg!(feature = "hwloc")),
        ("ofi", cfg!(feature = "ofi")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

/// The README's Rust examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
