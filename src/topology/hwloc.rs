//! Discovery through hwloc (`hwlocality`, feature `hwloc`): the host's GPUs and NICs with
//! their places in the PCI tree, from the live machine or an hwloc XML file.

use super::hardware::{Gpu, GpuVendor, Nic, NicKind, NodeHardware};
use crate::error::{Error, Result};
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::Topology as HwTopology;
use std::path::Path;

/// Components left out of live discovery: they initialise GPU runtimes (CUDA, OpenCL, Level
/// Zero) or talk to a display, which a library must not do behind the application's back.
const SKIPPED_COMPONENTS: [&str; 4] = ["cuda", "opencl", "levelzero", "gl"];

/// Loads the topology of this host, or of the hwloc XML file `file`.
pub fn load(file: Option<&Path>) -> Result<NodeHardware> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        let place = file.map_or("this host".to_string(), |f| {
            format!("hwloc XML file {}", f.display())
        });
        Error::system(format!("hwloc could not {what} {place}: {e}"))
    };
    let mut b = HwTopology::builder();
    b = match file {
        Some(f) => {
            // Read it here: hwlocality panics on a file that hwloc cannot open.
            let xml = std::fs::read_to_string(f).map_err(|e| err("read", &e))?;
            b.from_xml(&xml)
                .map_err(|e| err("parse the topology of", &e))?
        }
        None => {
            // hwloc refuses to skip a component it does not have (no CUDA plugin here):
            // skip only those a fresh builder accepts.
            for c in SKIPPED_COMPONENTS {
                if HwTopology::builder().without_component(c).is_ok() {
                    b = b.without_component(c).map_err(|e| err("configure", &e))?;
                }
            }
            b
        }
    };
    let topo = b
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| err("configure", &e))?
        .build()
        .map_err(|e| err("discover the topology of", &e))?;
    let mut hw = from_topology(&topo);
    hw.source = match file {
        Some(f) => format!("hwloc XML file {}", f.display()),
        None => "hwloc".to_string(),
    };
    Ok(hw.normalise())
}

/// Ancestor ids from the root down to `obj` itself.
fn path_of(obj: &TopologyObject) -> Vec<u64> {
    let mut p: Vec<u64> = obj
        .ancestors()
        .map(TopologyObject::global_persistent_index)
        .collect();
    p.reverse();
    p.push(obj.global_persistent_index());
    p
}

fn name_of(obj: &TopologyObject) -> String {
    obj.name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn osdev_type(obj: &TopologyObject) -> Option<OSDeviceType> {
    match obj.attributes() {
        Some(ObjectAttributes::OSDevice(a)) => Some(a.device_type()),
        _ => None,
    }
}

/// First verbs port in state 4 (active), else port 1.
fn active_port(obj: &TopologyObject) -> u32 {
    (1..=8)
        .find(|p| {
            obj.info(&format!("Port{p}State"))
                .is_some_and(|v| v.to_bytes() == b"4")
        })
        .unwrap_or(1)
}

fn from_topology(topo: &HwTopology) -> NodeHardware {
    let mut hw = NodeHardware::default();
    for pci in topo.objects_with_type(ObjectType::PCIDevice) {
        let Some(ObjectAttributes::PCIDevice(a)) = pci.attributes() else {
            continue;
        };
        let bus_id = format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            a.domain(),
            a.bus_id(),
            a.bus_device(),
            a.function()
        );
        let osdevs: Vec<&TopologyObject> = pci
            .io_children()
            .filter(|c| c.object_type() == ObjectType::OSDevice)
            .collect();
        let class = a.class_id() >> 8;
        let gpu_osdev = osdevs.iter().any(|o| {
            matches!(
                osdev_type(o),
                Some(OSDeviceType::GPU | OSDeviceType::CoProcessor)
            )
        });
        if let Some(vendor) = GpuVendor::from_pci_vendor(a.vendor_id()) {
            // Display controllers (0x03xx) and processing accelerators (0x12xx).
            if class == 0x03 || class == 0x12 || gpu_osdev {
                let uuid = osdevs.iter().find_map(|o| {
                    o.infos().iter().find_map(|i| {
                        i.name()
                            .to_bytes()
                            .ends_with(b"UUID")
                            .then(|| i.value().to_string_lossy().into_owned())
                    })
                });
                hw.gpus.push(Gpu {
                    vendor,
                    pci_bus_id: bus_id,
                    uuid,
                    os_devices: osdevs.iter().map(|o| name_of(o)).collect(),
                    path: path_of(pci),
                });
                continue;
            }
        }
        let mut fabric: Option<&TopologyObject> = None;
        let mut netdev: Option<String> = None;
        for o in &osdevs {
            let n = name_of(o);
            match osdev_type(o) {
                Some(OSDeviceType::OpenFabrics) => fabric = fabric.or(Some(o)),
                Some(OSDeviceType::Network) => netdev = netdev.or(Some(n)),
                _ if n.starts_with("cxi") => fabric = fabric.or(Some(o)),
                _ => {}
            }
        }
        let (name, kind, port) = match (fabric, &netdev) {
            (Some(f), _) => {
                let n = name_of(f);
                if n.starts_with("cxi") {
                    (n, NicKind::Slingshot, None)
                } else {
                    (n, NicKind::Infiniband, Some(active_port(f)))
                }
            }
            (None, Some(d)) if d.starts_with("hsn") => (d.clone(), NicKind::Slingshot, None),
            (None, Some(d)) if d.starts_with("ib") => (d.clone(), NicKind::Infiniband, None),
            (None, Some(d)) => (d.clone(), NicKind::Ethernet, None),
            (None, None) => continue,
        };
        hw.nics.push(Nic {
            name,
            netdev,
            kind,
            port,
            pci_bus_id: bus_id,
            path: path_of(pci),
        });
    }
    hw
}
