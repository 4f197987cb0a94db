//! The network's terms from timings taken on the network itself (`pccl-tune --transport tcp`
//! under a launcher, one process per rank: the emulated cluster of `scripts/cluster.sh`, or
//! a real one).
//!
//! What is measured ([`NetworkTimings`]): the 2-rank all-gather between the first ranks of
//! two nodes and between two ranks of one node, each over a range of sizes, with every other
//! rank idle; and small all-gathers of the whole world with fixed algorithms (flat ring,
//! hierarchical ring, flat recursive doubling), the slowest rank's time, at a size whose
//! messages take about as long on the wire as their overheads (1 KiB on 200 Mbit/s NICs)
//! and at one where only the overheads are left (64 B); and the world's small all-reduces
//! (flat and hierarchical ring, 1 KiB).
//!
//! What is fitted ([`fit`]):
//! * each level's bandwidth from the pair's three largest sizes (the median of their three
//!   slopes), its latency from the smallest (less its bytes at that bandwidth);
//! * the core time a message costs, between nodes and inside one (LogP's overhead `o`,
//!   [`super::profile::Oversub::inter_cpu_us`]), from the whole world's small all-gathers:
//!   there every rank sends at once and the messages' overheads share the host's cores
//!   (on one machine emulating the cluster, all nodes' ranks share its cores; on a real
//!   cluster each node's). The two overheads are found by the model itself: the pair of
//!   values whose predictions of the world's all-gathers are closest (relative least
//!   squares over a grid), the latency being the pair's time less the overhead (a pair's
//!   lone message pays both once: `t = α + max(o, s/β)`);
//! * the bandwidth a node's intra-node messages share (`intra.node_bandwidth_gbps`), from
//!   every node's large all-gather inside the node run at once, where the pairs' links do
//!   not already explain its time: the model's own prediction of it brought to the
//!   measurement (on one machine emulating the cluster, the nodes' copies share its memory
//!   and cores, and the hierarchy's intra-node phases took 4–5× what the pair's link gives);
//! * with them, the wake-up latency each message pays in the busy world, where ranks
//!   outnumber the cores and wait to be scheduled ([`super::profile::Oversub::per_message_us`];
//!   beside MPI's busy-polling progress under `mpiexec`, the flat ring's 1 KiB all-gather
//!   took 3.2× its time without it);
//! * last, the core time a *reduced* message costs its receiver beyond a stored one
//!   ([`super::profile::Oversub::reduce_cpu_us`]), from the world's 1 KiB all-reduces (the
//!   all-gathers reduce nothing, so it is fitted alone, the terms above held).

use super::profile::Profile;
use super::sim::{Cluster, Engine, Job};
use crate::error::{Error, Result};
use crate::plan::{Algorithm, Collective};
use crate::topology::{NicMap, Topology};
use serde::{Deserialize, Serialize};

/// Timings of one `pccl-tune` run on the network (seconds; sizes in bytes per rank). Kept in
/// the profile it wrote ([`Profile::measured_network`]), so `pccl-tune --refit` can fit them
/// again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkTimings {
    /// Nodes of the world.
    pub nodes: usize,
    /// Ranks per node.
    pub ranks_per_node: usize,
    /// NICs per node.
    pub nics: usize,
    /// Cores of one host.
    pub cores: usize,
    /// Nodes whose ranks share one host's cores (all of them on one machine emulating the
    /// cluster, 1 on a real one).
    pub nodes_per_host: usize,
    /// The 2-rank all-gather between two nodes: (bytes, seconds), sizes ascending.
    pub inter_pair: Vec<(usize, f64)>,
    /// The 2-rank all-gather inside one node.
    pub intra_pair: Vec<(usize, f64)>,
    /// The whole world's small all-gathers: (algorithm, bytes, seconds of the slowest rank).
    #[serde(with = "by_name")]
    pub world: Vec<(Algorithm, usize, f64)>,
    /// The whole world's small all-reduces (`f32` sums), likewise: what a reduced message
    /// costs beyond one that is only stored. Empty in profiles written before 2026-12-02
    /// (no reduction term fitted).
    #[serde(default, with = "by_name", skip_serializing_if = "Vec::is_empty")]
    pub world_reduce: Vec<(Algorithm, usize, f64)>,
    /// Every node's ring all-gather inside the node, all nodes at once: (bytes per rank,
    /// seconds of the slowest rank). Where several nodes share a machine their copies share
    /// its memory and cores: the node's share of them bounds what its intra-node phases move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_all: Option<(usize, f64)>,
}

/// The world's timings with each algorithm by its name (`ring`, `hier-ring`, `rd`, ...).
mod by_name {
    use crate::plan::Algorithm;
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        v: &[(Algorithm, usize, f64)],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(a, b, t)| (a.to_string(), *b, *t)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<(Algorithm, usize, f64)>, D::Error> {
        Vec::<(String, usize, f64)>::deserialize(d)?
            .into_iter()
            .map(|(a, b, t)| Ok((a.parse().map_err(D::Error::custom)?, b, t)))
            .collect()
    }
}

/// Bandwidth (bytes/s, from the slope of the three largest sizes less the all-gather's local
/// copy of its own block at `copy` bytes/s) and the smallest size and its time of a pair's
/// curve; an error naming `what` when the curve does not grow.
///
/// The slope is the median of the three pairwise slopes (Theil–Sen): one size whose rounds
/// were all slowed (a busy host descheduling a rank) neither stops the fit nor bends it.
fn line(pts: &[(usize, f64)], copy: f64, what: &str) -> Result<(f64, f64, f64)> {
    let bad = |why: &str| Err(Error::invalid(format!("network fit: the {what} {why}")));
    if pts.len() < 3 {
        return bad("needs at least 3 sizes");
    }
    if pts.iter().any(|&(_, t)| !(t > 0.0 && t.is_finite())) {
        return bad("holds a time that is not above zero");
    }
    let top = &pts[pts.len() - 3..];
    if top.windows(2).any(|w| w[1].0 <= w[0].0) {
        return bad("sizes are not ascending");
    }
    let slope = |a: (usize, f64), b: (usize, f64)| (b.1 - a.1) / (b.0 - a.0) as f64;
    let mut slopes = [
        slope(top[0], top[1]),
        slope(top[0], top[2]),
        slope(top[1], top[2]),
    ];
    slopes.sort_by(f64::total_cmp);
    let per_byte = slopes[1];
    if per_byte <= 0.0 {
        return bad("does not take longer at its largest sizes: no bandwidth to fit");
    }
    let rest = per_byte - 1.0 / copy;
    // A copy as slow as the whole transfer: the copy rate is not this host's; keep the slope.
    let rate = if rest > 0.1 * per_byte {
        1.0 / rest
    } else {
        1.0 / per_byte
    };
    let (s0, t0) = pts[0];
    Ok((rate, s0 as f64, t0))
}

/// The topology the timings were taken on (NICs spread evenly over the local ranks).
fn world_topology(m: &NetworkTimings) -> Topology {
    Topology::uniform(m.nodes * m.ranks_per_node, m.ranks_per_node)
        .with_nic_map(NicMap::even(m.ranks_per_node, m.nics))
}

/// The model's time of the whole world's all-gather `algo` at `bytes` per rank.
fn predict(prof: &Profile, topo: &Topology, algo: Algorithm, bytes: usize) -> f64 {
    predict_of(prof, topo, Collective::AllGather, algo, bytes)
}

/// The all-reduce (a sum) the world's reduce timings hold.
const ALL_REDUCE: Collective = Collective::AllReduce { average: false };

/// The model's time of `coll` with `algo` at `bytes` per rank on `topo` (an all-reduce's
/// whole vector: its block is the `1/P` share each rank reduces).
fn predict_of(
    prof: &Profile,
    topo: &Topology,
    coll: Collective,
    algo: Algorithm,
    bytes: usize,
) -> f64 {
    let block = match coll {
        Collective::AllReduce { .. } => bytes as f64 / topo.nranks().max(1) as f64,
        _ => bytes as f64,
    };
    let job = Job::new(coll, algo, block);
    Cluster::new(topo, prof)
        .simulate(&job, Engine::Events)
        .map_or(f64::NAN, |o| o.seconds)
}

/// `base` (the host's terms: copies, reductions) with the network's terms fitted to `m`
/// (see the module's documentation), and the fit's error: the largest ratio between a
/// world timing and its prediction (≥ 1).
pub fn fit(base: &Profile, m: &NetworkTimings) -> Result<(Profile, f64)> {
    if m.nodes < 2 || m.ranks_per_node < 2 {
        return Err(Error::invalid(format!(
            "network fit: needs at least 2 nodes of at least 2 ranks, not {} x {}",
            m.nodes, m.ranks_per_node
        )));
    }
    if m.world.is_empty() {
        return Err(Error::invalid("network fit: no whole-world timing"));
    }
    let copy = base.copy_gbps * 1e9;
    let (inter_rate, inter_s0, inter_t0) = line(&m.inter_pair, copy, "pair between nodes")?;
    let (intra_rate, intra_s0, intra_t0) = line(&m.intra_pair, copy, "pair inside a node")?;
    let mut prof = base.clone();
    prof.one_host = false;
    prof.efficiency = 1.0;
    prof.inter.nics = m.nics.max(1);
    prof.inter.nic_bandwidth_gbps = inter_rate / 1e9;
    prof.intra.bandwidth_gbps = intra_rate / 1e9;
    prof.intra.node_bandwidth_gbps = 0.0;
    prof.ranks_per_node = m.ranks_per_node;
    prof.oversub.cores = m.cores.max(1);
    prof.oversub.nodes_per_host = m.nodes_per_host.max(1);
    prof.oversub.per_message_us = 0.0;
    prof.oversub.reduce_cpu_us = 0.0;
    prof.oversub.rate_share = 0.0;
    // Extra ranks per core of the world's host (the wake-up term's factor).
    let extra = ((m.ranks_per_node * m.nodes_per_host.clamp(1, m.nodes)) as f64
        / m.cores.max(1) as f64
        - 1.0)
        .max(0.0);
    let topo = world_topology(m);
    // A pair's lone message has its node's share of the cores to itself (two nodes of the
    // host busy): `o` beyond that share is not hidden behind its latency.
    let pair_cores = (m.cores.max(1) as f64 / 2.0_f64.min(m.nodes_per_host as f64)).min(1.0);
    let with = |oe: f64, oa: f64, wake: f64| {
        let mut q = prof.clone();
        q.oversub.inter_cpu_us = oe * 1e6;
        q.oversub.intra_cpu_us = oa * 1e6;
        if extra > 0.0 {
            q.oversub.per_message_us = wake * 1e6 / extra;
        }
        // The pair's message: t = α + max(overhead, bytes at the rate) (+ the local copy).
        let alpha = |t0: f64, s0: f64, rate: f64, o: f64| {
            (t0 - s0 / copy - (o / pair_cores).max(s0 / rate)).max(0.0) * 1e6
        };
        q.inter.alpha_us = alpha(inter_t0, inter_s0, inter_rate, oe);
        q.intra.alpha_us = alpha(intra_t0, intra_s0, intra_rate, oa);
        q
    };
    let error = |q: &Profile| -> f64 {
        m.world
            .iter()
            .map(|&(a, s, t)| (predict(q, &topo, a, s) / t).ln().powi(2))
            .sum()
    };
    // Relative least squares over a grid of both overheads (0 … the pair's own latency,
    // which holds one overhead) and of the wake-up latency a message pays in the busy world
    // (0 … the slowest world timing's time per rank: ranks outnumbering the cores wait to
    // be scheduled, longer beside MPI's busy-polling progress; `oversub.per_message_us`),
    // refined around the best point.
    const STEPS: usize = 12;
    let p = (m.nodes * m.ranks_per_node) as f64;
    let wake_hi = if extra > 0.0 {
        m.world.iter().map(|w| w.2).fold(0.0, f64::max) / p
    } else {
        0.0
    };
    let mut box_ = [
        (0.0, inter_t0 * pair_cores),
        (0.0, intra_t0 * pair_cores),
        (0.0, wake_hi),
    ];
    let at = |(lo, hi): (f64, f64), i: usize| lo + (hi - lo) * i as f64 / STEPS as f64;
    let mut best = (f64::INFINITY, 0.0, 0.0, 0.0);
    for _ in 0..3 {
        for i in 0..=STEPS {
            for j in 0..=STEPS {
                for k in 0..=STEPS {
                    let (oe, oa, w) = (at(box_[0], i), at(box_[1], j), at(box_[2], k));
                    let e = error(&with(oe, oa, w));
                    if e < best.0 {
                        best = (e, oe, oa, w);
                    }
                }
            }
        }
        for (b, centre) in box_.iter_mut().zip([best.1, best.2, best.3]) {
            let step = (b.1 - b.0) / STEPS as f64;
            *b = ((centre - step).max(0.0), centre + step);
        }
    }
    if !best.0.is_finite() {
        return Err(Error::invalid(
            "network fit: the model predicts no finite time for the world's timings",
        ));
    }
    let mut out = with(best.1, best.2, best.3);
    if out.message_cpu_seconds(true).is_some() {
        out.oversub.reduce_cpu_us = reduce_cost(&out, &topo, &m.world_reduce) * 1e6;
    }
    let worst = m
        .world
        .iter()
        .map(|&(a, s, t)| (Collective::AllGather, a, s, t))
        .chain(
            m.world_reduce
                .iter()
                .map(|&(a, s, t)| (ALL_REDUCE, a, s, t)),
        )
        .map(|(c, a, s, t)| {
            let r = predict_of(&out, &topo, c, a, s) / t;
            r.max(1.0 / r)
        })
        .fold(1.0, f64::max);
    if let Some(bus) = node_bus(&out, m) {
        out.intra.node_bandwidth_gbps = bus / 1e9;
    }
    out.validate()?;
    Ok((out, worst))
}

/// The core time (seconds) a reduced message costs its receiver beyond its bytes
/// ([`super::profile::Oversub::reduce_cpu_us`]), from the world's all-reduces under `prof`
/// (whose other terms the all-gathers fixed: they reduce nothing): relative least squares
/// over a grid from 0 to the slowest all-reduce's time per rank, refined around the best
/// point. 0 without all-reduce timings. (The emulated cluster's small all-reduces took
/// 1.2–1.4× what the model gave without it, each reduced message some 2–3 µs of core time
/// more than a stored one: the receive into scratch, the reduction's start.)
fn reduce_cost(prof: &Profile, topo: &Topology, timings: &[(Algorithm, usize, f64)]) -> f64 {
    if timings.is_empty() {
        return 0.0;
    }
    let error = |c: f64| -> f64 {
        let mut q = prof.clone();
        q.oversub.reduce_cpu_us = c * 1e6;
        timings
            .iter()
            .map(|&(a, s, t)| (predict_of(&q, topo, ALL_REDUCE, a, s) / t).ln().powi(2))
            .sum()
    };
    const STEPS: usize = 16;
    let p = topo.nranks().max(1) as f64;
    let mut range = (0.0, timings.iter().map(|w| w.2).fold(0.0, f64::max) / p);
    let mut best = (f64::INFINITY, 0.0);
    for _ in 0..3 {
        for i in 0..=STEPS {
            let c = range.0 + (range.1 - range.0) * i as f64 / STEPS as f64;
            let e = error(c);
            if e < best.0 {
                best = (e, c);
            }
        }
        let step = (range.1 - range.0) / STEPS as f64;
        range = ((best.1 - step).max(0.0), best.1 + step);
    }
    best.1
}

/// The bandwidth (bytes/s) a node's intra-node messages share, from `m.intra_all`, under
/// `prof`: None where there is no such timing or the links alone explain it. A node's ring
/// all-gather of `s` bytes per rank moves `M (M − 1) s` bytes; the model's prediction with
/// the bus set to that over the measured time is brought to the measurement by scaling (the
/// call is bandwidth-bound at the sizes measured).
fn node_bus(prof: &Profile, m: &NetworkTimings) -> Option<f64> {
    let (s, t) = m
        .intra_all
        .filter(|&(s, t)| s > 0 && t > 0.0 && t.is_finite())?;
    let mm = m.ranks_per_node;
    let node = Topology::uniform(mm, mm);
    let ring = Algorithm::Flat(crate::plan::LevelAlgo::Ring);
    let links_only = predict(prof, &node, ring, s);
    if !(links_only.is_finite() && links_only < 0.95 * t) {
        return None;
    }
    let mut bus = (mm * (mm - 1) * s) as f64 / t;
    for _ in 0..3 {
        let mut q = prof.clone();
        q.intra.node_bandwidth_gbps = bus / 1e9;
        let pred = predict(&q, &node, ring, s);
        if !(pred.is_finite() && pred > 0.0) {
            return None;
        }
        bus *= pred / t;
    }
    Some(bus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::LevelAlgo;

    /// A cluster of 4 nodes × 4 ranks, 2 NICs at 25 MB/s, on one 2-core host.
    fn truth() -> Profile {
        let mut p = Profile::default();
        p.inter.alpha_us = 60.0;
        p.inter.nics = 2;
        p.inter.nic_bandwidth_gbps = 0.025;
        p.intra.alpha_us = 10.0;
        p.intra.bandwidth_gbps = 2.0;
        p.oversub.cores = 2;
        p.oversub.nodes_per_host = 4;
        p.oversub.inter_cpu_us = 40.0;
        p.oversub.intra_cpu_us = 12.0;
        p.oversub.per_message_us = 4.0; // 28 µs per message at 8 ranks per core
        p.oversub.reduce_cpu_us = 6.0;
        p
    }

    /// What the timings would be if the model were the machine.
    fn timings_of(p: &Profile) -> NetworkTimings {
        let mut m = NetworkTimings {
            nodes: 4,
            ranks_per_node: 4,
            nics: 2,
            cores: 2,
            nodes_per_host: 4,
            inter_pair: Vec::new(),
            intra_pair: Vec::new(),
            world: Vec::new(),
            world_reduce: Vec::new(),
            intra_all: None,
        };
        // The pairs on a 2-node world of one rank per node, and a 1-node world of two (the
        // other nodes idle: as the pair measurement runs).
        let mut pair = p.clone();
        pair.oversub.nodes_per_host = 2;
        let inter = Topology::uniform(2, 1);
        let mut intra = p.clone();
        intra.oversub.nodes_per_host = 1;
        let one = Topology::uniform(2, 2);
        for s in [1024usize, 64 << 10, 1 << 20, 4 << 20] {
            m.inter_pair.push((
                s,
                predict(&pair, &inter, Algorithm::Flat(LevelAlgo::Ring), s),
            ));
            m.intra_pair.push((
                s,
                predict(&intra, &one, Algorithm::Flat(LevelAlgo::Ring), s),
            ));
        }
        let topo = world_topology(&m);
        for a in ["ring", "hier-ring", "rd"] {
            let a: Algorithm = a.parse().unwrap();
            for s in [1024, 64] {
                m.world.push((a, s, predict(p, &topo, a, s)));
            }
        }
        for a in ["ring", "hier-ring"] {
            let a: Algorithm = a.parse().unwrap();
            m.world_reduce
                .push((a, 1024, predict_of(p, &topo, ALL_REDUCE, a, 1024)));
        }
        let node = Topology::uniform(4, 4);
        let s = 4 << 20;
        m.intra_all = Some((s, predict(p, &node, Algorithm::Flat(LevelAlgo::Ring), s)));
        m
    }

    #[test]
    fn the_bus_a_node_shares_is_found_where_it_binds_and_left_out_where_it_does_not() {
        let mut t = truth();
        t.intra.node_bandwidth_gbps = 3.0; // 4 links of 2 GB/s would move 8
        let (got, _) = fit(&Profile::default(), &timings_of(&t)).unwrap();
        let bus = got.intra.node_bandwidth_gbps;
        assert!(
            (bus / 3.0 - 1.0).abs() < 0.1,
            "node bus {bus} GB/s, given 3"
        );
        let (got, _) = fit(&Profile::default(), &timings_of(&truth())).unwrap();
        assert_eq!(
            got.intra.node_bandwidth_gbps, 0.0,
            "no bus where the links explain it"
        );
    }

    #[test]
    fn the_fit_gives_back_the_overheads_and_links_the_model_was_given() {
        let t = truth();
        let m = timings_of(&t);
        let (got, worst) = fit(&Profile::default(), &m).unwrap();
        assert!(worst < 1.05, "the world's timings predicted within {worst}");
        let near = |a: f64, b: f64, tol: f64| (a / b - 1.0).abs() < tol;
        assert!(
            near(got.inter.nic_bandwidth_gbps, 0.025, 0.02),
            "NIC rate {}",
            got.inter.nic_bandwidth_gbps
        );
        assert!(
            near(got.oversub.inter_cpu_us, 40.0, 0.2),
            "inter overhead {} µs, given 40",
            got.oversub.inter_cpu_us
        );
        assert!(
            near(got.oversub.intra_cpu_us, 12.0, 0.35),
            "intra overhead {} µs, given 12",
            got.oversub.intra_cpu_us
        );
        assert!(
            near(got.inter.alpha_us, 60.0, 0.25),
            "inter latency {} µs, given 60",
            got.inter.alpha_us
        );
        assert!(
            near(got.oversub.per_message_us, 4.0, 0.35),
            "wake-up {} µs per extra rank per core, given 4",
            got.oversub.per_message_us
        );
        assert!(
            near(got.oversub.reduce_cpu_us, 6.0, 0.35),
            "a reduced message's core time {} µs, given 6",
            got.oversub.reduce_cpu_us
        );
    }

    /// A timing's bytes are what the call was given: an all-reduce of `B` bytes is a vector
    /// of `B` (each rank reduces `B/P` of it), an all-gather `B` per rank. A bandwidth-bound
    /// ring all-reduce of `B` moves `2(P−1)/P · B` per rank, the all-gather `(P−1) · B`.
    #[test]
    fn an_all_reduce_timing_is_simulated_as_the_vector_it_reduced() {
        let mut p = Profile::default();
        p.inter.nic_bandwidth_gbps = 0.025;
        p.inter.nics = 2;
        let m = timings_of(&truth());
        let topo = world_topology(&m);
        let ring = Algorithm::Flat(LevelAlgo::Ring);
        let b = 4 << 20;
        let ar = predict_of(&p, &topo, ALL_REDUCE, ring, b);
        let ag = predict(&p, &topo, ring, b);
        let want = 2.0 / 16.0;
        assert!(
            (ar / ag / want - 1.0).abs() < 0.1,
            "all-reduce {ar} s, all-gather {ag} s: ratio {} (want {want})",
            ar / ag
        );
    }

    #[test]
    fn without_all_reduce_timings_no_reduction_cost_is_fitted() {
        let m = timings_of(&truth());
        assert_eq!(reduce_cost(&truth(), &world_topology(&m), &[]), 0.0);
    }

    #[test]
    fn the_timings_a_profile_keeps_read_back_as_written() {
        let mut p = truth();
        p.measured_network = Some(timings_of(&truth()));
        let back = Profile::from_toml(&p.to_toml()).unwrap();
        assert_eq!(back.measured_network, p.measured_network);
    }

    #[test]
    fn one_size_slowed_by_a_busy_host_neither_stops_nor_bends_the_bandwidth_fit() {
        let t = truth();
        let clean = fit(&Profile::default(), &timings_of(&t)).unwrap().0;
        for (which, inside) in [(2, true), (2, false), (3, true)] {
            let mut m = timings_of(&t);
            let pts = if inside {
                &mut m.intra_pair
            } else {
                &mut m.inter_pair
            };
            // The CI failure of 11-28: the second-largest size slower than the largest.
            pts[which].1 *= if which == 2 { 5.0 } else { 0.98 };
            let got = fit(&Profile::default(), &m).unwrap().0;
            let (a, b) = if inside {
                (got.intra.bandwidth_gbps, clean.intra.bandwidth_gbps)
            } else {
                (got.inter.nic_bandwidth_gbps, clean.inter.nic_bandwidth_gbps)
            };
            assert!(
                (a / b - 1.0).abs() < 0.25,
                "size {which} disturbed (inside a node: {inside}): {a} GB/s against {b}"
            );
        }
    }

    #[test]
    fn timings_that_do_not_grow_or_a_one_node_world_are_refused() {
        let mut m = timings_of(&truth());
        let t1 = m.inter_pair[1].1;
        m.inter_pair[2].1 = t1 * 0.8;
        m.inter_pair[3].1 = t1 * 0.7;
        let e = fit(&Profile::default(), &m).unwrap_err();
        assert!(e.message().contains("pair between nodes"), "{e}");
        let mut m = timings_of(&truth());
        m.nodes = 1;
        assert!(fit(&Profile::default(), &m).is_err());
    }
}
