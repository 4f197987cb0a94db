//! Device kernels: reductions and block copies. `host` runs on the CPU (the host executor's
//! kernels); `cuda` (feature `cuda`) has the NVRTC-compiled GPU kernels the device executor
//! drives, `nccl` the NCCL library loaded at run time; `hip` (feature `rocm`) loads HIP and
//! hipRTC for AMD GPUs.

#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod api;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod dl;
#[cfg(feature = "rocm")]
pub mod hip;
pub mod host;
// Pure launch arithmetic shared by the GPU back ends.
#[cfg(any(feature = "cuda", feature = "rocm", test))]
pub(crate) mod launch;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod nccl_abi;
// The quantization kernels' names and checks.
#[cfg(any(feature = "cuda", feature = "rocm", test))]
pub(crate) mod quant_launch;
/// NCCL: the CUDA build of [`nccl_abi`] (the same module, under its old name).
#[cfg(feature = "cuda")]
pub use nccl_abi as nccl;
