//! AMD GPU kernels through HIP and hipRTC, and the RCCL library, all loaded at run time.
//!
//! The counterpart of [`cuda`](super) for ROCm: the same kernel sources (`csrc/reduce.cu`
//! and `csrc/transpose.cu`) are compiled by hipRTC for the device's architecture
//! (`gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`), once per device per process, and driven
//! with the same kernel names, arguments and launch arithmetic (shared with the CUDA back end
//! in `device::launch`).
//!
//! Nothing is linked at build time: `libamdhip64`, `libhiprtc` and `librccl` are opened with
//! `dlopen` (through [`libloading`]) the first time they are needed, into tables of typed
//! function pointers ([`HipApi`], [`HiprtcApi`], [`RcclApi`]). Each library is looked for
//! first at the path in an environment variable, then under its usual names:
//!
//! | library | environment variable | names tried |
//! | --- | --- | --- |
//! | HIP runtime | `PCCL_HIP_LIBRARY` | `libamdhip64.so`, `libamdhip64.so.6`, `libamdhip64.so.5` |
//! | hipRTC | `PCCL_HIPRTC_LIBRARY` | `libhiprtc.so`, `libhiprtc.so.6`, `libhiprtc.so.5`, then the HIP runtime itself (ROCm 5 before the split) |
//! | RCCL | `PCCL_RCCL_LIBRARY` | `librccl.so`, `librccl.so.1` |
//!
//! A missing library or symbol is an [`ErrorKind::System`](crate::ErrorKind::System) error
//! that names what was searched and the variable to set; nothing here panics for want of
//! ROCm. `PCCL_HIP_ARCH` overrides the architecture the kernels are compiled for.
//!
//! Device attributes are read with `hipDeviceGetAttribute` (values of `hipDeviceAttribute_t`
//! as laid out since ROCm 5.0, unchanged through 6.x). The one property no attribute gives,
//! `gcnArchName`, is found in the `hipDeviceProp_t` that `hipGetDeviceProperties` fills, by
//! scanning an oversized buffer for the architecture string rather than relying on the
//! struct's layout, which changed between ROCm 5 and 6.
//!
//! Buffers are [`HipBuffer`]s (device memory, freed on drop); every operation of a
//! [`HipDevice`] is ordered on the stream the handle owns, and [`HipDevice::download`]
//! synchronizes. Results are meant to be bit-identical to the host kernels, as on CUDA.

mod buffer;
mod check;
mod device;
mod gate;
mod gpu;
mod quant;
mod rtc;
mod shared;
mod sys;
#[cfg(test)]
mod tests;

/// RCCL: the NCCL-shaped library ABI shared with NCCL ([`crate::device::nccl_abi`]).
pub use super::nccl_abi::{
    nccl_dtype as rccl_dtype, nccl_op as rccl_op, rccl as rccl_api, NcclApi as RcclApi,
    NcclDataType, NcclRedOp, NcclUniqueId, NCCL_AVG, NCCL_BFLOAT16, NCCL_FLOAT16, NCCL_FLOAT32,
    NCCL_FLOAT64, NCCL_INT32, NCCL_INT64, NCCL_INT8, NCCL_MAX, NCCL_MIN, NCCL_PROD, NCCL_SUM,
    NCCL_UINT32, NCCL_UINT64, NCCL_UINT8,
};
pub use buffer::HipBuffer;
pub(crate) use check::*;
pub use device::HipDevice;
pub use gate::HipGate;
pub use gpu::{HipOwnedEvent, HipOwnedStream, HipPinned};
pub use rtc::*;
pub use shared::device_count;
pub use sys::*;
#[allow(unused_imports)]
use {buffer::*, device::*, shared::*};

#[cfg(test)]
use super::dl::library_candidates;
use super::dl::{open_library, optional_symbol, symbol, LibrarySpec};
pub use super::launch::LaunchShape;
use super::launch::{self, Elementwise, TransposePlan, UNROLL};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use libloading::Library;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex, OnceLock};

/// Source of the reduction kernels (`csrc/reduce.cu`).
pub const REDUCE_SOURCE: &str = include_str!("../../../csrc/reduce.cu");
/// Source of the block-transpose kernels (`csrc/transpose.cu`).
pub const TRANSPOSE_SOURCE: &str = include_str!("../../../csrc/transpose.cu");

/// Prepended to each source for hipRTC. hipRTC predefines the HIP device API (`blockIdx`,
/// `__syncthreads`, `__fadd_rn`, `__forceinline__`, ...); the sources' only CUDA-only part,
/// the PTX of the half-precision conversions, has a `__HIP__` branch in `reduce.cu`. The
/// `#line` directive keeps compiler messages on the lines of the `.cu` file.
pub const HIP_PRELUDE: &str = "// PCCL: hipRTC prelude (src/device/hip.rs)\n\
#define PCCL_HIP 1\n\
#ifndef __forceinline__\n\
#define __forceinline__ inline __attribute__((always_inline))\n\
#endif\n";

/// Environment variable with an explicit path of the HIP runtime library.
pub const HIP_LIBRARY_ENV: &str = "PCCL_HIP_LIBRARY";
/// Environment variable with an explicit path of the hipRTC library.
pub const HIPRTC_LIBRARY_ENV: &str = "PCCL_HIPRTC_LIBRARY";
/// Environment variable with an explicit path of the RCCL library.
pub const RCCL_LIBRARY_ENV: &str = "PCCL_RCCL_LIBRARY";
/// Environment variable that overrides the architecture the kernels are compiled for.
pub const HIP_ARCH_ENV: &str = "PCCL_HIP_ARCH";

/// Names the HIP runtime is looked for under, after [`HIP_LIBRARY_ENV`].
pub const HIP_LIBRARY_NAMES: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];
/// Names hipRTC is looked for under, after [`HIPRTC_LIBRARY_ENV`].
pub const HIPRTC_LIBRARY_NAMES: [&str; 3] = ["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"];
/// Names RCCL is looked for under, after [`RCCL_LIBRARY_ENV`].
pub const RCCL_LIBRARY_NAMES: [&str; 2] = ["librccl.so", "librccl.so.1"];

const ROCM_HINT: &str = "install ROCm and add its lib folder (/opt/rocm/lib) to LD_LIBRARY_PATH";
/// Where the HIP runtime is looked for.
pub const HIP_SPEC: LibrarySpec = LibrarySpec {
    what: "the HIP runtime",
    env: HIP_LIBRARY_ENV,
    names: &HIP_LIBRARY_NAMES,
    hint: ROCM_HINT,
};
/// Where hipRTC is looked for.
pub const HIPRTC_SPEC: LibrarySpec = LibrarySpec {
    what: "hipRTC",
    env: HIPRTC_LIBRARY_ENV,
    names: &HIPRTC_LIBRARY_NAMES,
    hint: ROCM_HINT,
};
/// Where RCCL is looked for.
pub const RCCL_SPEC: LibrarySpec = LibrarySpec {
    what: "RCCL",
    env: RCCL_LIBRARY_ENV,
    names: &RCCL_LIBRARY_NAMES,
    hint: ROCM_HINT,
};
