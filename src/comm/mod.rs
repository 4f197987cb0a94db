//! The public face: communicators, requests, and the per-communicator progress worker.

pub mod communicator;
#[cfg(feature = "cuda")]
mod device;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod device_events;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod device_exchange;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod device_program;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod device_queue;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub use device_queue::DeviceWork;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod device_run;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod nccl_level;
pub mod progress;
pub mod request;
mod scratch_pool;
