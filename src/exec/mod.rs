//! The executor: runs a [`crate::plan::Plan`] on a transport and the host kernels.

#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod device;
pub mod executor;
mod local;
pub mod memory;
mod segments;

pub use executor::{abandon, execute, ExecOptions};
pub use memory::{BlockLayout, Memory};
