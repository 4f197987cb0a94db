//! The vendor baselines: NCCL's and RCCL's ring ([`ring`]) and the MPI library's own ring
//! ([`mpich`]), modelled from their documented mechanisms with the parameters of a profile's
//! `[vendor]` and `[mpich]` tables ([`params`]) — what `pccl-sim --vs rccl|nccl|mpich`
//! compares PCCL's plans against.
//!
//! PCCL's own plans are replayed message by message by [`super::sim`]; the vendor rings are
//! closed forms, because what decides their time at scale is not the bytes on the links but
//! costs per step that the libraries pay the same way in every step.

pub mod mpich;
pub mod params;
pub mod ring;

use super::profile::Profile;
use crate::error::{Error, Result};
use crate::plan::Collective;
pub use ring::{Estimate, Mechanisms, MECHANISMS};

/// A vendor baseline by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The profile's NCCL or RCCL ring (`[vendor]`).
    Vendor,
    /// The profile's MPI ring (`[mpich]`).
    Mpich,
}

/// The names `pccl-sim` accepts for a baseline.
pub const BASELINES: &[&str] = &["rccl", "nccl", "mpich"];

impl Baseline {
    /// `rccl` / `nccl` (the profile's vendor library, which must be that one) or `mpich`;
    /// `None` for any other name (an algorithm of PCCL's).
    pub fn parse(name: &str, prof: &Profile) -> Option<Result<Self>> {
        match name {
            "mpich" => Some(match prof.mpich {
                Some(_) => Ok(Baseline::Mpich),
                None => Err(Error::invalid(format!(
                    "profile {} has no [mpich] table: no MPI ring to compare with",
                    prof.name
                ))),
            }),
            "rccl" | "nccl" => Some(match &prof.vendor {
                Some(v) if v.library == name => Ok(Baseline::Vendor),
                Some(v) => Err(Error::invalid(format!(
                    "profile {} models {}, not {name}",
                    prof.name, v.library
                ))),
                None => Err(Error::invalid(format!(
                    "profile {} has no [vendor] table: no {name} ring to compare with",
                    prof.name
                ))),
            }),
            _ => None,
        }
    }

    /// The baseline's time for `coll` on `p` ranks, `m` per node, `block` bytes per rank and
    /// step (all-gather input, reduce-scatter output, all-reduce buffer ÷ `p`).
    pub fn estimate(
        self,
        prof: &Profile,
        mech: Mechanisms,
        coll: Collective,
        (p, m): (usize, usize),
        block: f64,
    ) -> Result<Estimate> {
        let m = m.clamp(1, p.max(1));
        if p % m != 0 {
            return Err(Error::invalid(format!(
                "the vendor baselines need equal nodes: {p} ranks, {m} per node"
            )));
        }
        let nodes = p / m;
        match self {
            Baseline::Vendor => {
                let v = prof
                    .vendor
                    .as_ref()
                    .ok_or_else(|| Error::invalid("the profile has no [vendor] table"))?;
                let mach = ring::Machine {
                    nics: prof.inter.nics,
                    nic_rate: prof.nic_rate(),
                    alpha_us: (prof.intra.alpha_us, prof.inter.alpha_us),
                    group: (prof.inter.group_nodes, prof.inter.global_hop_us),
                };
                ring::ring(v, &mach, mech, coll, (p, nodes), block)
            }
            Baseline::Mpich => {
                let mp = prof
                    .mpich
                    .as_ref()
                    .ok_or_else(|| Error::invalid("the profile has no [mpich] table"))?;
                mpich::ring(mp, prof.nic_rate(), coll, (p, nodes), block)
            }
        }
    }
}
