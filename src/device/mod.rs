//! Device kernels: reductions and block copies. Only the host (CPU) device exists so far.

pub mod host;
