//! The public face: communicators, requests, and the per-communicator progress worker.

pub mod communicator;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod nccl_level;
pub mod progress;
pub mod request;
