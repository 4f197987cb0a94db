//! The quantized collectives in the model (`pccl-sim --quantize`). The all-gather: the plan
//! moves the records (codes and scales, [`crate::quant::Quant::record_bytes`]) instead of the
//! data, after a header all-gather of 48 bytes per rank, and each rank runs two kernels — the
//! encoding of its shard and the decoding of every rank's record — at the profile's copy rate
//! (bytes read plus written; issue 29's device target is 80% of that rate). The
//! reduce-scatter: its two all-to-alls (pairwise), the one inside a node on the node's links,
//! the one between nodes among the ranks of one local index on their share of the node's NICs
//! (every local index runs its own at once), plus the kernels; or, by recursive halving
//! (`--qscheme halving`), quantized recursive halving inside the node and between nodes
//! ([`reduce_scatter_halving_seconds`]). The tuner never picks a
//! quantized form: the numerics are the caller's choice.

use super::profile::Profile;
use super::sim::{Cluster, Engine, Job};
use crate::error::Result;
use crate::plan::{Algorithm, Collective, LevelAlgo};
use crate::quant::Quant;
use crate::topology::Topology;

/// Bytes of one rank's header (six `u64`).
const HEADER_BYTES: f64 = 48.0;

/// The header all-gather of a quantized reduce-scatter on `n_nodes` nodes of `m` ranks: the
/// communicator's own all-gather of a few bytes, which the tuner runs in `log` steps
/// (hierarchical recursive doubling, or flat where there is one level).
fn header_seconds(prof: &Profile, (n_nodes, m): (usize, usize)) -> Result<f64> {
    let topo = Topology::uniform(n_nodes * m, m);
    let algo = if n_nodes > 1 && m > 1 {
        Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Rd,
        }
    } else {
        Algorithm::Flat(LevelAlgo::Rd)
    };
    Ok(Cluster::new(&topo, prof)
        .simulate(
            &Job::new(Collective::AllGather, algo, HEADER_BYTES),
            Engine::Auto,
        )?
        .seconds)
}

/// The kernels of one quantized all-to-all hop: quantize every one of `pieces` pieces of
/// `len` f32 values (f32 in, record out) and dequantize as many received ones.
fn hop_kernels(prof: &Profile, q: &Quant, pieces: usize, len: usize) -> f64 {
    let rec = q.record_bytes(len) as f64;
    2.0 * pieces as f64 * ((len * 4) as f64 + rec) / (prof.copy_gbps * 1e9)
}

/// The conversions around a quantized reduce-scatter on `p` ranks of `n` elements of
/// `elem_bytes` each: the input to f32, the f32 sum back to the output's type.
fn convert_seconds(prof: &Profile, p: usize, n: usize, elem_bytes: usize) -> f64 {
    let input = (p * n * elem_bytes) as f64;
    ((input + (p * n * 4) as f64) + (n * 4 + n * elem_bytes) as f64) / (prof.copy_gbps * 1e9)
}

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

/// What the two-hop quantized reduce-scatter of `n` elements per rank (output) costs on `n_nodes`
/// nodes of `m` ranks, in seconds: (the whole call, of which the kernels). One node or one rank
/// per node: one all-to-all over every rank.
pub fn reduce_scatter_seconds(
    prof: &Profile,
    (n_nodes, m): (usize, usize),
    n: usize,
    elem_bytes: usize,
    q: &Quant,
) -> Result<(f64, f64)> {
    let a2a = Collective::AllToAll { direct: false };
    let ring = Algorithm::Flat(LevelAlgo::Ring);
    let t_header = header_seconds(prof, (n_nodes, m))?;
    let p = n_nodes * m;
    let kernels = |pieces, len| hop_kernels(prof, q, pieces, len);
    let convert = convert_seconds(prof, p, n, elem_bytes);
    if n_nodes == 1 || m == 1 {
        let topo = Topology::uniform(p, m);
        let t = Cluster::new(&topo, prof)
            .simulate(&Job::new(a2a, ring, q.record_bytes(n) as f64), Engine::Auto)?
            .seconds;
        let k = kernels(p, n) + convert;
        return Ok((t_header + t + k, k));
    }
    // Hop 1: the node's ranks, pieces of N·n elements.
    let node = Topology::uniform(m, m);
    let t1 = Cluster::new(&node, prof)
        .simulate(
            &Job::new(a2a, ring, q.record_bytes(n_nodes * n) as f64),
            Engine::Auto,
        )?
        .seconds;
    // Hop 2: one rank per node, each local index on its share of the node's NICs.
    let mut share = prof.clone();
    share.inter.nic_bandwidth_gbps *= prof.inter.nics as f64 / m as f64;
    share.inter.nics = 1;
    let net = Topology::uniform(n_nodes, 1);
    let t2 = Cluster::new(&net, &share)
        .simulate(&Job::new(a2a, ring, q.record_bytes(n) as f64), Engine::Auto)?
        .seconds;
    let k = kernels(m, n_nodes * n) + kernels(n_nodes, n) + convert;
    Ok((t_header + t1 + t2 + k, k))
}

/// What the per-level quantized reduce-scatter ([`crate::QuantScheme::PerLevel`]) of `n`
/// elements per rank costs on `n_nodes` nodes of `m` ranks in groups of the profile's
/// `pair_size` (`g`), in seconds: (the whole call, of which the kernels). Three all-to-alls:
/// inside the group on the pair links (pieces of `(m/g)·N·n` elements), among the node's
/// groups (one rank per group, pieces of `N·n`; the `g` such all-to-alls of a node share its
/// total bandwidth where the profile has one), between nodes as in the two-hop scheme. Without
/// groups that divide the node, the two-hop cost ([`reduce_scatter_seconds`]).
pub fn reduce_scatter_per_level_seconds(
    prof: &Profile,
    (n_nodes, m): (usize, usize),
    n: usize,
    elem_bytes: usize,
    q: &Quant,
) -> Result<(f64, f64)> {
    let g = prof.intra.pair_size;
    if g <= 1 || g >= m || m % g != 0 {
        return reduce_scatter_seconds(prof, (n_nodes, m), n, elem_bytes, q);
    }
    let groups = m / g;
    let a2a = Collective::AllToAll { direct: false };
    let ring = Algorithm::Flat(LevelAlgo::Ring);
    let t_header = header_seconds(prof, (n_nodes, m))?;
    let kernels = |pieces, len| hop_kernels(prof, q, pieces, len);
    let convert = convert_seconds(prof, n_nodes * m, n, elem_bytes);
    let a2a_on = |topo: &Topology, prof: &Profile, len: usize| -> Result<f64> {
        Ok(Cluster::new(topo, prof)
            .simulate(
                &Job::new(a2a, ring, q.record_bytes(len) as f64),
                Engine::Auto,
            )?
            .seconds)
    };
    // Hop 1: a group of g ranks on its pair links.
    let t1 = a2a_on(&Topology::uniform(g, g), prof, groups * n_nodes * n)?;
    // Hop 2: one rank per group on the node's links, g of them at once.
    let mut mid = prof.clone();
    mid.intra.pair_size = 1;
    if mid.intra.node_bandwidth_gbps > 0.0 {
        mid.intra.node_bandwidth_gbps /= g as f64;
    }
    let t2 = a2a_on(&Topology::uniform(groups, groups), &mid, n_nodes * n)?;
    // Hop 3: between nodes, each local index on its share of the node's NICs.
    let t3 = if n_nodes > 1 {
        let mut share = prof.clone();
        share.inter.nic_bandwidth_gbps *= prof.inter.nics as f64 / m as f64;
        share.inter.nics = 1;
        a2a_on(&Topology::uniform(n_nodes, 1), &share, n)?
    } else {
        0.0
    };
    let mut k = kernels(g, groups * n_nodes * n) + kernels(groups, n_nodes * n) + convert;
    if n_nodes > 1 {
        k += kernels(n_nodes, n);
    }
    Ok((t_header + t1 + t2 + t3 + k, k))
}

/// What the quantized reduce-scatter by recursive halving ([`crate::QuantScheme::Halving`])
/// of `n` elements per rank costs on `n_nodes` nodes of `m` ranks, in seconds: (the whole call,
/// of which the kernels). Inside the node recursive halving over units of `N·n` elements,
/// between nodes (among the ranks of one local index, on their share of the node's NICs)
/// over blocks of `n`, every message a record of the partial sums: the simulator's
/// recursive-halving reduce-scatter with the record's bytes per block, at each level. One
/// node, or one rank per node: halving over every rank.
pub fn reduce_scatter_halving_seconds(
    prof: &Profile,
    (n_nodes, m): (usize, usize),
    n: usize,
    elem_bytes: usize,
    q: &Quant,
) -> Result<(f64, f64)> {
    let rs = Collective::ReduceScatter { average: false };
    let rd = Algorithm::Flat(LevelAlgo::Rd);
    let p = n_nodes * m;
    let t_header = header_seconds(prof, (n_nodes, m))?;
    let rate = prof.copy_gbps * 1e9;
    // The input to f32 and into the node's unit order; the output back.
    let input = (p * n * elem_bytes) as f64;
    let convert = (input + 2.0 * (p * n * 4) as f64 + (n * (4 + elem_bytes)) as f64) / rate;
    // A level of `members` over blocks of `len`: each step encodes the half it sends and
    // decodes and adds the half it receives, (members − 1) blocks in all each way.
    let kernels = |members: usize, len: usize| {
        let blocks = members.saturating_sub(1) as f64;
        let rec = q.record_bytes(len) as f64;
        2.0 * blocks * ((len * 4) as f64 + rec) / rate
    };
    let level = |topo: &Topology, pr: &Profile, len: usize| -> Result<f64> {
        Ok(Cluster::new(topo, pr)
            .simulate(&Job::new(rs, rd, q.record_bytes(len) as f64), Engine::Auto)?
            .seconds)
    };
    if n_nodes == 1 || m == 1 {
        let t = level(&Topology::uniform(p, m), prof, n)?;
        let k = convert + kernels(p, n);
        return Ok((t_header + t + k, k));
    }
    let t1 = level(&Topology::uniform(m, m), prof, n_nodes * n)?;
    let mut share = prof.clone();
    share.inter.nic_bandwidth_gbps *= prof.inter.nics as f64 / m as f64;
    share.inter.nics = 1;
    let t2 = level(&Topology::uniform(n_nodes, 1), &share, n)?;
    let k = convert + kernels(m, n_nodes * n) + kernels(n_nodes, n);
    Ok((t_header + t1 + t2 + k, k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets;
    use crate::topology::Topology;

    #[test]
    fn per_level_pays_off_only_where_the_pair_links_beat_the_node_links() {
        let q = Quant {
            bits: 4,
            ..Quant::INT8
        };
        let n = 1 << 20;
        // No pairs: exactly the two-hop cost.
        let perl = presets::named("perlmutter").unwrap();
        let m = perl.ranks_per_node;
        assert_eq!(
            reduce_scatter_per_level_seconds(&perl, (16, m), n, 2, &q).unwrap(),
            reduce_scatter_seconds(&perl, (16, m), n, 2, &q).unwrap()
        );
        // Node links 20× slower than the pair links: the third hop keeps most bytes on the
        // pairs and wins; with node links as fast as the pairs it only adds a hop.
        let mut slow = presets::named("frontier").unwrap();
        slow.intra.pair_size = 2;
        slow.intra.pair_bandwidth_gbps = 200.0;
        slow.intra.bandwidth_gbps = 10.0;
        let m = 8;
        let two = reduce_scatter_seconds(&slow, (4, m), n, 2, &q).unwrap().0;
        let per = reduce_scatter_per_level_seconds(&slow, (4, m), n, 2, &q)
            .unwrap()
            .0;
        assert!(per < two * 0.8, "per-level {per} s vs two-hop {two} s");
        let mut flat = slow.clone();
        flat.intra.bandwidth_gbps = 200.0;
        let two = reduce_scatter_seconds(&flat, (4, m), n, 2, &q).unwrap().0;
        let per = reduce_scatter_per_level_seconds(&flat, (4, m), n, 2, &q)
            .unwrap()
            .0;
        assert!(per > two, "per-level {per} s vs two-hop {two} s");
    }

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

    /// The plain hier-rd reduce-scatter of `n` bf16 elements per rank on `topo`, in seconds.
    fn plain_hier_rd(prof: &Profile, topo: &Topology, n: usize) -> f64 {
        let rs = Collective::ReduceScatter { average: false };
        let job = Job::new(rs, "hier-rd".parse().unwrap(), (2 * n) as f64);
        Cluster::new(topo, prof)
            .simulate(&job, Engine::Auto)
            .unwrap()
            .seconds
    }

    #[test]
    fn the_quantized_reduce_scatter_gains_on_the_network_and_pays_its_kernels() {
        let prof = presets::named("frontier").unwrap();
        let n = 1 << 20;
        let topo = Topology::uniform(256, 8);
        let plain = plain_hier_rd(&prof, &topo, n);
        let q4 = Quant {
            bits: 4,
            ..Quant::INT8
        };
        let (t, k) = reduce_scatter_seconds(&prof, (32, 8), n, 2, &q4).unwrap();
        assert!(k > 0.0 && t > k);
        assert!(
            plain / t > 1.0,
            "INT4 two-hop {t} s vs plain hier-rd {plain} s"
        );
        // One node: one all-to-all.
        let (t1, _) = reduce_scatter_seconds(&prof, (1, 8), n, 2, &q4).unwrap();
        assert!(t1 > 0.0);
    }

    /// At 2048 ranks and 16 MiB of input per rank the two-hop scheme is latency-bound (its
    /// all-to-alls take `M − 1 + N − 1` steps); recursive halving keeps `log` steps, so its
    /// INT4 form beats both the plain hier-rd and the two-hop one.
    #[test]
    fn halving_keeps_log_steps_where_the_two_hop_scheme_is_latency_bound() {
        let prof = presets::named("frontier").unwrap();
        let (nn, m) = (256, 8);
        let n = (16 << 20) / (nn * m) / 2; // bf16 elements per rank's output
        let plain = plain_hier_rd(&prof, &Topology::uniform(nn * m, m), n);
        let q4 = Quant {
            bits: 4,
            ..Quant::INT8
        };
        let (two_hop, _) = reduce_scatter_seconds(&prof, (nn, m), n, 2, &q4).unwrap();
        let (halving, k) = reduce_scatter_halving_seconds(&prof, (nn, m), n, 2, &q4).unwrap();
        assert!(k > 0.0 && halving > k);
        assert!(
            halving < plain,
            "INT4 halving {halving} s vs plain {plain} s"
        );
        assert!(
            halving * 1.5 < two_hop,
            "INT4 halving {halving} s vs two-hop {two_hop} s"
        );
    }
}
