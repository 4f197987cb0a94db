//! The quantized all-gather in the model (`pccl-sim --quantize`): the plan moves the records
//! (codes and scales, [`crate::quant::Quant::record_bytes`]) instead of the data, after a
//! header all-gather of 48 bytes per rank, and each rank runs two kernels — the encoding of
//! its shard and the decoding of every rank's record — at the profile's copy rate (bytes read
//! plus written; issue 29's device target is 80% of that rate). The tuner never picks a
//! quantized form: the numerics are the caller's choice.

use super::sim::{Cluster, Engine, Job};
use crate::error::Result;
use crate::plan::{Algorithm, Collective};
use crate::quant::Quant;

/// Bytes of one rank's header (six `u64`).
const HEADER_BYTES: f64 = 48.0;

/// What the quantized all-gather of `n` elements of `elem_bytes` per rank costs, in seconds:
/// (the whole call, of which the kernels).
pub fn all_gather_seconds(
    cl: &Cluster<'_>,
    algo: Algorithm,
    n: usize,
    elem_bytes: usize,
    q: &Quant,
    ranks: usize,
    copy_gbps: f64,
) -> Result<(f64, f64)> {
    let rec = q.record_bytes(n) as f64;
    let t = |block: f64| -> Result<f64> {
        Ok(cl
            .simulate(&Job::new(Collective::AllGather, algo, block), Engine::Auto)?
            .seconds)
    };
    let data = (n * elem_bytes) as f64;
    let p = ranks as f64;
    // Encode: read the shard, write its record; decode: read P records, write P shards.
    let kernels = ((data + rec) + p * (rec + data)) / (copy_gbps * 1e9);
    Ok((t(HEADER_BYTES)? + t(rec)? + kernels, kernels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets;
    use crate::topology::Topology;

    #[test]
    fn quantizing_gains_at_most_the_wire_ratio_and_pays_its_kernels() {
        let prof = presets::named("frontier").unwrap();
        let topo = Topology::uniform(256, 8);
        let cl = Cluster::new(&topo, &prof);
        let algo: Algorithm = "hier-rd".parse().unwrap();
        let n = 1 << 20; // 2 MiB of bf16 per rank
        let plain = cl
            .simulate(
                &Job::new(Collective::AllGather, algo, (2 * n) as f64),
                Engine::Auto,
            )
            .unwrap()
            .seconds;
        for (bits, wire) in [(8, 2.0), (4, 4.0)] {
            let q = Quant {
                bits,
                ..Quant::INT8
            };
            let (t, k) = all_gather_seconds(&cl, algo, n, 2, &q, 256, prof.copy_gbps).unwrap();
            let gain = plain / t;
            assert!(k > 0.0 && t > k, "{bits}: {t} s, kernels {k} s");
            assert!(
                gain > 1.2 && gain < wire,
                "{bits}-bit: gain {gain} (wire {wire}x)"
            );
        }
    }
}
