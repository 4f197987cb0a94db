//! Checks of a profile's values: every rate positive, every count at least one, every
//! latency finite, the protocol's limits in order.

use super::{Profile, MAX_RATE_SHARE};
use crate::error::{Error, Result};

fn positive(name: &str, v: f64) -> Result<()> {
    if v > 0.0 && !v.is_nan() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "profile: {name} = {v} must be above zero"
        )))
    }
}

impl Profile {
    /// Checks every rate is positive and counts are at least one.
    pub fn validate(&self) -> Result<()> {
        positive("intra.bandwidth_gbps", self.intra.bandwidth_gbps)?;
        positive("inter.nic_bandwidth_gbps", self.inter.nic_bandwidth_gbps)?;
        positive("inter.taper", self.inter.taper)?;
        positive("copy_gbps", self.copy_gbps)?;
        positive("efficiency", self.efficiency)?;
        if self.efficiency > 1.0 {
            return Err(Error::invalid("profile: efficiency must be at most 1"));
        }
        if self.cache.bytes > 0 {
            positive("cache.copy_gbps", self.cache.copy_gbps)?;
        }
        if !(1.0..=64.0).contains(&self.cache.sharpness) {
            return Err(Error::invalid("profile: cache.sharpness must be in 1 … 64"));
        }
        if !(0.0..=1.0).contains(&self.cache.link_share) {
            return Err(Error::invalid("profile: cache.link_share must be in 0 … 1"));
        }
        if !(1.0..=100.0).contains(&self.protocol.eager_slowdown) {
            return Err(Error::invalid(
                "profile: protocol.eager_slowdown must be in 1 … 100",
            ));
        }
        if self.protocol.rendezvous_us < 0.0 || !self.protocol.rendezvous_us.is_finite() {
            return Err(Error::invalid(
                "profile: protocol.rendezvous_us must be finite and ≥ 0",
            ));
        }
        if self.protocol.small_step_us < 0.0 || !self.protocol.small_step_us.is_finite() {
            return Err(Error::invalid(
                "profile: protocol.small_step_us must be finite and ≥ 0",
            ));
        }
        let pr = &self.protocol;
        if pr.small_bytes > 0 && pr.eager_bytes > 0 && pr.small_bytes >= pr.eager_bytes {
            return Err(Error::invalid(format!(
                "profile: protocol.small_bytes ({}) must be below protocol.eager_bytes ({})",
                pr.small_bytes, pr.eager_bytes
            )));
        }
        if self.oversub.per_message_us < 0.0 || !self.oversub.per_message_us.is_finite() {
            return Err(Error::invalid(
                "profile: oversub.per_message_us must be finite and ≥ 0",
            ));
        }
        for (what, v) in [
            ("oversub.inter_cpu_us", self.oversub.inter_cpu_us),
            ("oversub.intra_cpu_us", self.oversub.intra_cpu_us),
        ] {
            if v < 0.0 || !v.is_finite() {
                return Err(Error::invalid(format!(
                    "profile: {what} must be finite and ≥ 0"
                )));
            }
        }
        if self.oversub.nodes_per_host == 0 {
            return Err(Error::invalid(
                "profile: oversub.nodes_per_host must be at least 1",
            ));
        }
        if !(0.0..=MAX_RATE_SHARE).contains(&self.oversub.rate_share) {
            return Err(Error::invalid(format!(
                "profile: oversub.rate_share must be in 0 … {MAX_RATE_SHARE}"
            )));
        }
        if self.intra.pair_size > 1 {
            positive("intra.pair_bandwidth_gbps", self.intra.pair_bandwidth_gbps)?;
        }
        if self.inter.global_hop_us < 0.0 || !self.inter.global_hop_us.is_finite() {
            return Err(Error::invalid(
                "profile: inter.global_hop_us must be finite and ≥ 0",
            ));
        }
        if let Some(v) = &self.vendor {
            v.validate()?;
        }
        if let Some(m) = &self.mpich {
            m.validate()?;
        }
        if self.intra.node_bandwidth_gbps < 0.0 {
            return Err(Error::invalid(
                "profile: intra.node_bandwidth_gbps must be 0 (none) or above",
            ));
        }
        if self.inter.nics == 0 || self.intra.pair_size == 0 {
            return Err(Error::invalid(
                "profile: inter.nics and intra.pair_size must be at least 1",
            ));
        }
        if self.intra.alpha_us < 0.0
            || self.inter.alpha_us < 0.0
            || self.piece_overhead_us < 0.0
            || !(self.intra.alpha_us + self.inter.alpha_us + self.piece_overhead_us).is_finite()
        {
            return Err(Error::invalid("profile: latencies must be finite and ≥ 0"));
        }
        if self.piece_bytes < 64 {
            return Err(Error::invalid("profile: piece_bytes must be at least 64"));
        }
        if let Some(p) = self.piece_candidates.iter().find(|&&p| p < 4096) {
            return Err(Error::invalid(format!(
                "profile: piece_candidates holds {p}, below the transports' 4096-byte minimum"
            )));
        }
        for (k, v) in self.reduce_host_gbps.iter().chain(&self.reduce_device_gbps) {
            positive(&format!("reduce rate {k}"), *v)?;
        }
        Ok(())
    }
}
