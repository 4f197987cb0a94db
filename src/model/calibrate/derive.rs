//! The profile's terms derived from one run's measurements ([`derive`]), and the model's
//! predictions of the probes they are fitted against.

use super::{Measured, PROBE_BYTES, PROBE_PIECE, RING_BYTES};
use crate::error::{Error, Result};
use crate::model::link_fit::{self, Sample};
use crate::model::profile::{CacheTier, Profile, Protocol, ReceiveReduce, Strided};
use crate::model::sim::{Cluster, Engine, Job};
use crate::plan::Collective;
use crate::topology::Topology;
use crate::{Algorithm, LevelAlgo};

/// The cost of each piece after the first beyond what the model already predicts for
/// cutting a message (the pieces' pipelining), from the probe's all-gather at 2 ranks whole
/// (`t_whole` s) and in pieces (`t_pieced` s): the measured difference less the model's, per
/// extra piece, in µs, never below 0 (pieces that run faster than modelled are the host's
/// cache at work, not a negative cost).
pub fn piece_overhead(prof: &Profile, t_whole: f64, t_pieced: f64) -> f64 {
    let topo = Topology::uniform(2, 2);
    let job = Job::new(
        Collective::AllGather,
        Algorithm::Flat(LevelAlgo::Ring),
        PROBE_BYTES as f64,
    );
    let at = |piece: usize| {
        let q = Profile {
            piece_bytes: piece,
            piece_overhead_us: 0.0,
            ..prof.clone()
        };
        Cluster::new(&topo, &q)
            .simulate(&job, Engine::Events)
            .map_or(f64::NAN, |o| o.seconds)
    };
    let extra = (PROBE_BYTES / PROBE_PIECE - 1) as f64;
    let modelled = at(PROBE_PIECE) - at(PROBE_BYTES);
    let per = ((t_pieced - t_whole) - modelled) / extra * 1e6;
    if per.is_finite() {
        per.max(0.0)
    } else {
        0.0
    }
}

/// The `oversub.rate_share` (0 … `MAX_RATE_SHARE`) with which the model's ring all-gather of
/// `s` bytes per rank at `p` ranks on one host takes `t` seconds (bisection: the time grows
/// with it); 0 when even no share predicts it slower, the maximum at most.
pub fn rate_share(prof: &Profile, p: usize, s: f64, t: f64) -> f64 {
    let topo = Topology::uniform(p, p);
    let job = Job::new(Collective::AllGather, Algorithm::Flat(LevelAlgo::Ring), s);
    let at = |share: f64| {
        let mut q = prof.clone();
        q.oversub.rate_share = share;
        Cluster::new(&topo, &q)
            .simulate(&job, Engine::Events)
            .map_or(f64::NAN, |o| o.seconds)
    };
    let (mut lo, mut hi) = (0.0, crate::model::profile::MAX_RATE_SHARE);
    if at(lo).is_nan() || at(lo) >= t {
        return 0.0;
    }
    if at(hi) <= t {
        return hi;
    }
    for _ in 0..30 {
        let mid = 0.5 * (lo + hi);
        if at(mid) < t {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The profile's model of the 2-rank exchange at `s` bytes per rank (seconds): the local
/// copy, then one message (what [`derive`] fits, for `pccl-tune -v`'s table).
pub fn exchange_seconds(prof: &Profile, s: f64) -> f64 {
    let ws = 6.0 * s;
    s / (prof.copy_gbps * 1e9 * prof.cache_speedup(ws))
        + prof.intra.alpha_us * 1e-6
        + prof.rendezvous_seconds(s)
        + s * prof.eager_factor(s) / (prof.intra.bandwidth_gbps * 1e9 * prof.link_speedup(ws))
}

/// The profile `m` calibrates, with `m` kept in it (`measured`), or an error naming what
/// does not fit. The terms (see `pccl-tune --help`):
/// * memory's copy rate and the cache tier from the sweep ([`crate::model::cache::fit`]);
/// * γ per dtype: the reduction rates, less the cache's speed-up on their 3 × 16 MiB;
/// * α, β, the transfers' share of the cache's gain and the protocol's steps from the
///   exchange less its local copy ([`link_fit::fit`]; thread ranks, whose transfer is the
///   receiver's `memcpy`, fit α alone, [`link_fit::fit_latency`]);
/// * the node's shared bandwidth from the concurrent ring, when its flows got less than β;
/// * the cost per piece from the probe ([`piece_overhead`]);
/// * the oversubscription terms from the 1 KiB ring at more ranks than cores
///   ([`crate::model::oversub::per_message_us`]; against the exchange's own 1 KiB time for
///   threads, the profile's 1 KiB message for MPI, which measures it in a run of its own)
///   and, for MPI, the rate share from its 4 MiB ring ([`rate_share`]).
pub fn derive(m: &Measured) -> Result<Profile> {
    m.check()?;
    let sweep: Vec<(f64, f64)> = m
        .copy_set_bytes
        .iter()
        .copied()
        .zip(m.copy_gbps.iter().copied())
        .collect();
    let (copy, cache) = crate::model::cache::fit(&sweep, m.cache_quarter_bytes);
    let mut prof = Profile {
        name: "measured".into(),
        copy_gbps: copy,
        cache,
        ..Profile::default()
    };
    match m.cache_bytes {
        Some(0) => prof.cache = CacheTier::default(),
        Some(_) if prof.cache.copy_gbps == 0.0 => prof.cache = CacheTier::default(),
        Some(b) => prof.cache.bytes = b,
        None => {}
    }
    prof.reduce_host_gbps = m.reduce_gbps.clone();
    if let Some(&f) = m.reduce_gbps.get("f32") {
        prof.reduce_host_gbps.insert("default".into(), f);
    }
    // The exchange is a local copy and one message: t = s/(copy·f) + link(s), f the cache
    // tier's speed-up for its footprint (2 ranks × (input s + output 2s)).
    let tier = prof.clone();
    let samples: Vec<Sample> = m
        .exchange_us
        .iter()
        .zip(&m.exchange_bytes)
        .map(|(&t, &s)| {
            let s = s as f64;
            Sample {
                bytes: s,
                seconds: t * 1e-6 - s / (copy * 1e9 * tier.cache_speedup(6.0 * s)),
                hit: tier.cache_hit(6.0 * s),
            }
        })
        .collect();
    let ratio = if tier.cache.bytes == 0 {
        1.0
    } else {
        tier.cache.copy_gbps / copy
    };
    let threads = m.transport == "threads";
    let fitted = if threads {
        link_fit::fit_latency(&samples, copy * 1e9, ratio)
    } else {
        link_fit::fit(&samples, ratio, m.transport == "mpi")
    };
    let lf = fitted.ok_or_else(|| {
        Error::invalid(format!(
            "the 2-rank exchange's times do not fit a latency and a bandwidth: {:?}",
            m.exchange_bytes
                .iter()
                .zip(&m.exchange_us)
                .map(|(s, t)| format!("{s} B {t:.1} us"))
                .collect::<Vec<_>>()
        ))
    })?;
    prof.cache.link_share = lf.link_share;
    prof.protocol = Protocol {
        eager_bytes: lf.eager_bytes,
        rendezvous_us: lf.rendezvous * 1e6,
        eager_slowdown: lf.eager_slowdown.clamp(1.0, 100.0),
        small_bytes: lf.small_bytes,
        small_step_us: lf.small_step * 1e6,
    };
    let (alpha, beta_gbps) = (lf.alpha, lf.beta / 1e9);
    prof.intra.alpha_us = alpha * 1e6;
    prof.intra.bandwidth_gbps = beta_gbps;
    prof.intra.pair_bandwidth_gbps = beta_gbps;
    // How the transport sends strided blocks and meets a received block's reduction: known,
    // not measured.
    (prof.strided, prof.receive_reduce) = match m.transport.as_str() {
        "threads" => (Strided::Gathered, ReceiveReduce::Fused),
        "mpi" => (Strided::PackedBelowPiece, ReceiveReduce::After),
        "tcp" => (Strided::PackedSmall, ReceiveReduce::Pieces),
        "ofi" => (Strided::PackedBelowPiece, ReceiveReduce::Pieces),
        _ => (Strided::Packed, ReceiveReduce::Pieces),
    };
    // The reductions ran on 3 × 16 MiB: memory's rate is what the cache did not speed up.
    let sped = prof.cache_speedup(3.0 * (16u64 << 20) as f64);
    for v in prof.reduce_host_gbps.values_mut() {
        *v /= sped;
    }
    let mut notes = format!(
        "pccl-tune --transport {}: copy {copy:.2} GB/s, {:.2} GB/s in a {} KiB cache; 2-rank exchange fit alpha {:.2} us, beta {beta_gbps:.2} GB/s, transfers get {:.0}% of the cache's gain",
        m.transport,
        prof.cache.copy_gbps,
        prof.cache.bytes >> 10,
        alpha * 1e6,
        prof.cache.link_share * 100.0
    );
    if prof.protocol.eager_bytes > 0 {
        notes.push_str(&format!(
            ", +{:.1} us above {} B (rendezvous), eager bytes {:.2}x slower",
            prof.protocol.rendezvous_us, prof.protocol.eager_bytes, prof.protocol.eager_slowdown
        ));
    }
    if prof.protocol.small_bytes > 0 {
        notes.push_str(&format!(
            ", +{:.1} us above {} B (small-message path)",
            prof.protocol.small_step_us, prof.protocol.small_bytes
        ));
    }
    if m.concurrent_ranks > 1 {
        let (p, t) = (m.concurrent_ranks, m.concurrent_us * 1e-6);
        let s = RING_BYTES as f64;
        let ws = p as f64 * (p as f64 + 1.0) * s;
        let (fp, fl) = (prof.cache_speedup(ws), prof.link_speedup(ws));
        // Ring at P ranks: copy + (P−1)(α + s/rate), copies sped up fp times, transfers fl.
        let per_step =
            (t - s / (copy * 1e9 * fp)) / (p - 1) as f64 - alpha - prof.rendezvous_seconds(s);
        let rate = s / per_step.max(1e-9) / 1e9 / fl;
        if rate < 0.95 * beta_gbps {
            prof.intra.node_bandwidth_gbps = rate * p as f64;
        }
        notes.push_str(&format!(
            "; {p} concurrent flows got {rate:.2} GB/s each (node total {:.2} GB/s)",
            prof.intra.node_bandwidth_gbps
        ));
    }
    // One host: the "inter-node" level of pretend nodes is the same memory (the simulator
    // gives each rank its own port there, so `nics` does not matter).
    prof.inter.alpha_us = prof.intra.alpha_us;
    prof.inter.nic_bandwidth_gbps = beta_gbps;
    prof.inter.nics = 1;
    prof.one_host = true;
    prof.piece_overhead_us =
        piece_overhead(&prof, m.probe_whole_us * 1e-6, m.probe_pieced_us * 1e-6);
    notes.push_str(&format!(
        "; {} KiB in {} KiB pieces {:.0} us vs whole {:.0} us: +{:.1} us per piece",
        PROBE_BYTES >> 10,
        PROBE_PIECE >> 10,
        m.probe_pieced_us,
        m.probe_whole_us,
        prof.piece_overhead_us
    ));
    prof.oversub.cores = m.cores;
    if !m.oversub_ranks.is_empty() {
        // The 1 KiB message at 2 ranks: threads' own exchange (the first size is 1 KiB);
        // MPI's oversubscribed run is a process of its own, against the profile's message.
        let s = 1024.0;
        let base = if threads {
            m.exchange_us[0] * 1e-6
        } else {
            prof.intra.alpha_us * 1e-6
                + prof.rendezvous_seconds(s)
                + s * prof.eager_factor(s) / (prof.intra.bandwidth_gbps * 1e9)
                + s / (prof.copy_gbps * 1e9)
        };
        let n = m.cores;
        let points: Vec<(f64, usize)> = m
            .oversub_us
            .iter()
            .zip(&m.oversub_ranks)
            .map(|(&t, &p)| (t * 1e-6, p))
            .collect();
        match crate::model::oversub::per_message_us(&points, base, 2, n) {
            Some(us) => {
                prof.oversub.per_message_us = us;
                let list = |v: Vec<String>| v.join(", ");
                notes.push_str(&format!(
                    "; {} ranks on {n} cores: {} us per 1 KiB message vs {:.1} at 2 ranks, +{us:.1} us per extra rank per core",
                    list(m.oversub_ranks.iter().map(|p| p.to_string()).collect()),
                    list(points.iter().map(|(t, p)| format!("{:.1}", t / (p - 1) as f64 * 1e6)).collect()),
                    base * 1e6
                ));
            }
            None => notes.push_str(&format!("; {n} cores, oversubscription not measured")),
        }
        if m.oversub_ring_us > 0.0 {
            let p = m.oversub_ranks[0];
            let share = rate_share(&prof, p, RING_BYTES as f64, m.oversub_ring_us * 1e-6);
            prof.oversub.rate_share = share;
            notes.push_str(&format!(
                "; {} KiB ring at {p} ranks {:.0} us: rate share {share:.2}",
                RING_BYTES >> 10,
                m.oversub_ring_us
            ));
        }
    }
    prof.source = notes;
    prof.measured = Some(m.clone());
    prof.validate()?;
    Ok(prof)
}
