//! `-d cuda|rocm|gpu`: which vendor runs here, and each rank's GPU with its device buffers.

#[cfg(any(feature = "cuda", feature = "rocm"))]
use super::gpu;
use super::{fail, Args, Device};
use pccl::Communicator;

/// The rank's GPU and device buffers under `-d cuda|rocm|gpu`.
pub(super) enum GpuState {
    None,
    #[cfg(feature = "cuda")]
    Cuda(Box<gpu::Gpu<pccl::device::cuda::CudaDevice>>),
    #[cfg(feature = "rocm")]
    Rocm(Box<gpu::Gpu<pccl::device::hip::HipDevice>>),
}

impl GpuState {
    /// Opens the rank's GPU of `kind` (cuda or rocm, resolved) on every rank.
    #[allow(unused_variables)]
    pub(super) fn open(
        kind: Device,
        comm: &Communicator,
        mpi: bool,
        bytes: usize,
        args: &Args,
    ) -> pccl::Result<GpuState> {
        let vendor = !args.no_vendor_compare;
        match kind {
            #[cfg(feature = "cuda")]
            Device::Cuda => {
                gpu::Gpu::open_all(comm, mpi, bytes, vendor).map(|g| GpuState::Cuda(Box::new(g)))
            }
            #[cfg(feature = "rocm")]
            Device::Rocm => {
                gpu::Gpu::open_all(comm, mpi, bytes, vendor).map(|g| GpuState::Rocm(Box::new(g)))
            }
            other => Err(pccl::Error::usage(no_feature(other))),
        }
    }

    pub(super) fn is_host(&self) -> bool {
        matches!(self, GpuState::None)
    }

    /// The vendor library whose column is timed.
    pub(super) fn vendor(&self) -> Option<&'static str> {
        match self {
            GpuState::None => None,
            #[cfg(feature = "cuda")]
            GpuState::Cuda(g) => g.vendor_name(),
            #[cfg(feature = "rocm")]
            GpuState::Rocm(g) => g.vendor_name(),
        }
    }

    /// The header's lines about the devices.
    pub(super) fn notes(&self) -> Vec<String> {
        #[cfg(any(feature = "cuda", feature = "rocm"))]
        fn of<D: gpu::BenchDevice>(g: &gpu::Gpu<D>) -> Vec<String> {
            let mut v = vec![format!(
                "# device {}: rank 0 on GPU {} of {} ({}), each rank on GPU (local rank % {}); \
                 blocking calls timed on the host",
                D::FLAG,
                g.ordinal,
                g.devices,
                g.dev.label(),
                g.devices
            )];
            v.extend(g.vendor_note.as_ref().map(|n| format!("# {n}")));
            v
        }
        match self {
            GpuState::None => Vec::new(),
            #[cfg(feature = "cuda")]
            GpuState::Cuda(g) => of(g),
            #[cfg(feature = "rocm")]
            GpuState::Rocm(g) => of(g),
        }
    }
}

/// The message for `-d kind` in a build without its feature.
fn no_feature(kind: Device) -> String {
    let feature = match kind {
        Device::Rocm => "rocm",
        _ => "cuda",
    };
    format!(
        "-d {}: this pccl-bench was built without the `{feature}` feature; rebuild with \
         --features {feature} (cargo build --release --features {feature} --bin pccl-bench)",
        kind.name()
    )
}

/// Devices of `kind` (cuda or rocm) this process sees, or why none.
fn device_count(kind: Device) -> Result<usize, String> {
    let vendor = if kind == Device::Rocm { "HIP" } else { "CUDA" };
    let counted = match kind {
        #[cfg(feature = "cuda")]
        Device::Cuda => pccl::device::cuda::CudaDevice::count(),
        #[cfg(feature = "rocm")]
        Device::Rocm => pccl::device::hip::HipDevice::count(),
        other => Err(pccl::Error::usage(no_feature(other))),
    };
    counted.map_err(|e| match e.kind() {
        pccl::ErrorKind::InvalidUsage => e.message().to_string(),
        _ => format!("no {vendor} device: {}", e.message()),
    })
}

/// `-d gpu` as the vendor whose runtime reports devices (CUDA first); cuda and rocm as they
/// are. Exits with a clear message when the kind cannot run here.
pub(super) fn resolve_device(kind: Device) -> Device {
    let kinds: &[Device] = match kind {
        Device::Gpu => &[Device::Cuda, Device::Rocm],
        Device::Host => return Device::Host,
        _ => std::slice::from_ref(&kind),
    };
    let mut why = Vec::new();
    for &k in kinds {
        match device_count(k) {
            Ok(0) => why.push(format!(
                "no {} device: the runtime reports none",
                if k == Device::Rocm { "HIP" } else { "CUDA" }
            )),
            Ok(_) => return k,
            Err(e) => why.push(e),
        }
    }
    match why.as_slice() {
        [one] => fail(one),
        _ => fail(format!(
            "-d {}: no device ({})",
            kind.name(),
            why.join("; ")
        )),
    }
}
