//! Device kernels: reductions and block copies. `host` runs on the CPU (used by the executor
//! today); `cuda` (feature `cuda`) has the NVRTC-compiled GPU kernels, not yet driven by the
//! executor.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
