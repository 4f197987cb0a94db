//! The executor: runs a [`crate::plan::Plan`] on a transport and the host kernels.

#[cfg(feature = "cuda")]
pub mod device;
pub mod executor;
pub mod memory;
mod segments;

pub use executor::{abandon, execute, ExecOptions};
pub use memory::{BlockLayout, Memory};
