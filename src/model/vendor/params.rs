//! The vendor libraries' parameters: the `[vendor]` table of a profile (NCCL/RCCL's ring) and
//! its `[mpich]` table (the MPI library's own ring), each number with its source in the
//! presets (`presets/*.toml`).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What one NCCL/RCCL protocol costs (LL, LL128, Simple).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProtoCost {
    /// Fixed cost of a call with this protocol (µs; the library's `baseLat`).
    pub base_us: f64,
    /// Latency of one ring hop between GPUs of a node (µs; `hwLat[intra link][Ring][proto]`).
    pub hop_intra_us: f64,
    /// Latency of one ring hop through the network (µs; `hwLat[NET][Ring][proto]`).
    pub hop_net_us: f64,
    /// CPU time of one network operation (a send or a receive posted and completed) on the
    /// proxy thread that serves a GPU's network connections (µs).
    pub net_op_us: f64,
    /// Data one channel moves per ring step at most (the protocol's chunk, bytes); a larger
    /// share loops, one pass of the ring per chunk.
    pub chunk_bytes: usize,
    /// Bytes per network message: a chunk leaves in slices, one message each.
    pub slice_bytes: usize,
    /// Share of the link bandwidth the protocol's data gets (LL: 8-byte lines with 4 bytes of
    /// data and flags; Simple 1).
    pub bw_factor: f64,
    /// A channel's share of a block is rounded up to this many bytes (the protocol's
    /// alignment): a block smaller than `channels × align_bytes` keeps channels idle.
    pub align_bytes: usize,
    /// The library's own estimate, which decides the protocol it runs: latency of an
    /// intra-node step in its table (µs; NCCL/RCCL take the larger of the link's `hwLat` and
    /// the network post overhead on multi-node rings).
    pub tuner_intra_us: f64,
    /// The library's own estimate: its bus bandwidth for the protocol (GB/s).
    pub tuner_busbw_gbps: f64,
    /// The library's own estimate: its correction of that bandwidth by total size, indexed by
    /// `log2(total bytes / 64)` (RCCL's `ringCorrectionFactor`; empty for none).
    pub tuner_correction: Vec<f64>,
}

impl Default for ProtoCost {
    fn default() -> Self {
        ProtoCost {
            base_us: 0.0,
            hop_intra_us: 1.0,
            hop_net_us: 5.0,
            net_op_us: 0.0,
            chunk_bytes: 2 << 20,
            slice_bytes: 1 << 20,
            bw_factor: 1.0,
            align_bytes: 1,
            tuner_intra_us: 1.0,
            tuner_busbw_gbps: 100.0,
            tuner_correction: Vec::new(),
        }
    }
}

/// NCCL's or RCCL's ring as the library runs it (`[vendor]` in a profile).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VendorRing {
    /// `nccl` or `rccl` (for reports).
    pub library: String,
    /// Channels (rings run side by side, each with its share of every block).
    pub channels: usize,
    /// GPUs of a node whose proxies carry the channels' network connections (the rings enter
    /// and leave a node through these GPUs' NICs).
    pub net_gpus: usize,
    /// Bandwidth one GPU's rings get inside a node, all channels together, each direction
    /// (GB/s): the rings spread over every GPU-to-GPU link. Also what the hierarchy's intra
    /// level gets when PCCL hands it to the vendor library (the simulator's `hier-*`).
    pub intra_ring_gbps: f64,
    /// Extra latency of every network message from the fabric's rendezvous (µs; 0 for none).
    pub rendezvous_us: f64,
    /// Reduction rate of the ring's kernels (GB/s of output).
    pub reduce_gbps: f64,
    /// The protocols the library may choose from, by name (`ll`, `ll128`, `simple`).
    pub protocols: BTreeMap<String, ProtoCost>,
}

impl Default for VendorRing {
    fn default() -> Self {
        let mut protocols = BTreeMap::new();
        protocols.insert("simple".to_string(), ProtoCost::default());
        VendorRing {
            library: "nccl".into(),
            channels: 1,
            net_gpus: 1,
            intra_ring_gbps: 100.0,
            rendezvous_us: 0.0,
            reduce_gbps: 500.0,
            protocols,
        }
    }
}

/// The MPI library's own ring all-gather / reduce-scatter (`[mpich]` in a profile): one
/// message per step between neighbouring ranks, through the NICs the library picks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MpiRing {
    /// Latency of one message between nodes (µs).
    pub alpha_net_us: f64,
    /// Latency of one message inside a node (µs).
    pub alpha_intra_us: f64,
    /// NICs one message's bytes are spread over (Cray MPICH on Frontier: 1 — all writes
    /// through one NIC, all reads through another).
    pub nics_used: usize,
    /// Rate of a GPU-to-GPU message inside a node (GB/s).
    pub intra_gbps: f64,
    /// Where a reduce-scatter reduces: the host's rate (GB/s of output; MPICH reduces on the
    /// CPU, after copying the GPU's bytes to it).
    pub reduce_gbps: f64,
    /// Rate of the copies between GPU and host memory the CPU reduction needs (GB/s).
    pub staging_gbps: f64,
}

impl Default for MpiRing {
    fn default() -> Self {
        MpiRing {
            alpha_net_us: 3.0,
            alpha_intra_us: 1.0,
            nics_used: 1,
            intra_gbps: 50.0,
            reduce_gbps: 10.0,
            staging_gbps: 25.0,
        }
    }
}

fn check(name: &str, v: f64, zero_ok: bool) -> Result<()> {
    let ok = v.is_finite() && if zero_ok { v >= 0.0 } else { v > 0.0 };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "profile: {name} = {v} must be {}",
            if zero_ok {
                "finite and ≥ 0"
            } else {
                "above zero"
            }
        )))
    }
}

impl VendorRing {
    /// Checks counts and rates.
    pub fn validate(&self) -> Result<()> {
        if self.channels == 0 || self.net_gpus == 0 {
            return Err(Error::invalid(
                "profile: vendor.channels and vendor.net_gpus must be at least 1",
            ));
        }
        if self.protocols.is_empty() {
            return Err(Error::invalid("profile: vendor.protocols lists none"));
        }
        check("vendor.intra_ring_gbps", self.intra_ring_gbps, false)?;
        check("vendor.rendezvous_us", self.rendezvous_us, true)?;
        check("vendor.reduce_gbps", self.reduce_gbps, false)?;
        for (n, p) in &self.protocols {
            if !matches!(n.as_str(), "ll" | "ll128" | "simple") {
                return Err(Error::invalid(format!(
                    "profile: vendor.protocols.{n}: expected ll, ll128 or simple"
                )));
            }
            for (f, v) in [
                ("base_us", p.base_us),
                ("hop_intra_us", p.hop_intra_us),
                ("hop_net_us", p.hop_net_us),
                ("net_op_us", p.net_op_us),
            ] {
                check(&format!("vendor.protocols.{n}.{f}"), v, true)?;
            }
            check(
                &format!("vendor.protocols.{n}.bw_factor"),
                p.bw_factor,
                false,
            )?;
            check(
                &format!("vendor.protocols.{n}.tuner_intra_us"),
                p.tuner_intra_us,
                true,
            )?;
            check(
                &format!("vendor.protocols.{n}.tuner_busbw_gbps"),
                p.tuner_busbw_gbps,
                false,
            )?;
            if p.tuner_correction
                .iter()
                .any(|c| !(*c > 0.0 && c.is_finite()))
            {
                return Err(Error::invalid(format!(
                    "profile: vendor.protocols.{n}.tuner_correction: every factor must be above zero"
                )));
            }
            if p.chunk_bytes == 0 || p.slice_bytes == 0 || p.align_bytes == 0 {
                return Err(Error::invalid(format!(
                    "profile: vendor.protocols.{n}: chunk_bytes, slice_bytes and align_bytes must be at least 1"
                )));
            }
        }
        Ok(())
    }
}

impl MpiRing {
    /// Checks counts and rates.
    pub fn validate(&self) -> Result<()> {
        if self.nics_used == 0 {
            return Err(Error::invalid(
                "profile: mpich.nics_used must be at least 1",
            ));
        }
        check("mpich.alpha_net_us", self.alpha_net_us, true)?;
        check("mpich.alpha_intra_us", self.alpha_intra_us, true)?;
        check("mpich.intra_gbps", self.intra_gbps, false)?;
        check("mpich.reduce_gbps", self.reduce_gbps, false)?;
        check("mpich.staging_gbps", self.staging_gbps, false)
    }
}
