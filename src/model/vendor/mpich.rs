//! The MPI library's own ring (Cray MPICH's `MPI_Allgather` and `MPI_Reduce_scatter` for large
//! messages on GPU buffers), the third baseline of `pccl-sim --vs`.
//!
//! One message per step between neighbouring ranks (`MPI_Sendrecv`), every rank in lockstep:
//! a step lasts as long as its slowest message. Per node one of those crosses the network, and
//! it leaves through the NIC the library picks — on Frontier all writes through one NIC and
//! all reads through another (measured with the NICs' counters in the Big Send-off study), so
//! the node's other NICs idle: [`MpiRing::nics_used`]. A reduce-scatter reduces on the CPU,
//! after copying the GPU's bytes to the host and back.

use super::params::MpiRing;
use super::ring::Estimate;
use crate::error::{Error, Result};
use crate::plan::Collective;

/// The MPI ring for `coll` on `p` ranks in `nodes` equal nodes, `block` bytes per rank and
/// step; `nic_rate` one NIC's achieved rate (bytes/s).
pub fn ring(
    m: &MpiRing,
    nic_rate: f64,
    coll: Collective,
    (p, nodes): (usize, usize),
    block: f64,
) -> Result<Estimate> {
    if p == 0 || nodes == 0 || p % nodes != 0 {
        return Err(Error::invalid(format!(
            "the MPI ring needs equal nodes: {p} ranks on {nodes} nodes"
        )));
    }
    let (pass, reduce) = match coll {
        Collective::AllGather => (1, false),
        Collective::ReduceScatter { .. } => (1, true),
        Collective::AllReduce { .. } => (2, true),
        o => {
            return Err(Error::invalid(format!(
                "the MPI ring model covers all-gather, reduce-scatter and all-reduce, not {o:?}"
            )))
        }
    };
    let steps = pass * p.saturating_sub(1);
    let intra = m.alpha_intra_us * 1e-6 + block / (m.intra_gbps * 1e9);
    // One message per node crosses the network each step (rank order), its bytes through the
    // NICs the library spreads one message over.
    let net = if nodes > 1 {
        m.alpha_net_us * 1e-6 + block / (nic_rate * m.nics_used as f64)
    } else {
        0.0
    };
    let cpu = if reduce {
        block / (m.reduce_gbps * 1e9) + 2.0 * block / (m.staging_gbps * 1e9)
    } else {
        0.0
    };
    let (slow, bound) = if net > intra {
        (net, "nic")
    } else {
        (intra, "intra")
    };
    let step = slow + cpu;
    Ok(Estimate {
        seconds: steps as f64 * step,
        protocol: "mpi".into(),
        channels: 1,
        steps,
        fill: 0.0,
        step,
        bound: if cpu > slow { "reduce" } else { bound },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_waits_for_the_single_network_message_and_reductions_add_cpu_time() {
        let m = MpiRing {
            alpha_net_us: 3.0,
            alpha_intra_us: 1.0,
            nics_used: 1,
            intra_gbps: 50.0,
            reduce_gbps: 10.0,
            staging_gbps: 20.0,
        };
        let b = 1e6;
        let e = ring(&m, 25e9, Collective::AllGather, (16, 2), b).unwrap();
        let step = 3e-6 + b / 25e9;
        assert!((e.seconds - 15.0 * step).abs() < 1e-12, "{e:?}");
        assert_eq!(e.bound, "nic");
        let r = ring(
            &m,
            25e9,
            Collective::ReduceScatter { average: false },
            (16, 2),
            b,
        )
        .unwrap();
        let cpu = b / 10e9 + 2.0 * b / 20e9;
        assert!((r.seconds - 15.0 * (step + cpu)).abs() < 1e-12);
        // One node: the intra-node link decides.
        let one = ring(&m, 25e9, Collective::AllGather, (8, 1), b).unwrap();
        assert!((one.seconds - 7.0 * (1e-6 + b / 50e9)).abs() < 1e-12);
    }
}
