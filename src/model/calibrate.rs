//! A profile from what `pccl-tune` measured, and the median of several runs' measurements.
//!
//! `pccl-tune` keeps its raw timings in the profile it writes (`[measured]`), and the
//! profile's terms are derived from them here ([`derive`]): the cache tier from the `memcpy`
//! sweep, α/β/the protocol's steps from the 2-rank exchange ([`super::link_fit`]), the
//! node's shared bandwidth from the concurrent flows, the piece cost from the probe and the
//! oversubscription terms. `pccl-tune --merge A B C` derives one profile from the per-size
//! medians of several runs ([`Measured::median`]): on a shared host a process's exchange can
//! run slow for its whole life (on the 2-core VM 16 KiB–2 MiB took 3–4.5× longer in periods
//! of minutes, as the hypervisor placed the two vCPUs, and one slow run's fit put a false
//! +310–450 µs "rendezvous" at 512 KiB), which the minimum or median over sweeps inside one
//! process cannot see; runs merged outvote it, and runs spread over a job's time take the
//! machine's usual state.

use super::link_fit::{self, Sample};
use super::profile::{CacheTier, Profile, Protocol, ReceiveReduce, Strided};
use super::sim::{Cluster, Engine, Job};
use crate::error::{Error, Result};
use crate::plan::Collective;
use crate::topology::Topology;
use crate::{Algorithm, LevelAlgo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bytes per rank of the piece-cost probe's all-gather (sent whole, and in
/// [`PROBE_PIECE`]-byte pieces).
pub const PROBE_BYTES: usize = 2 << 20;
/// The probe's piece size.
pub const PROBE_PIECE: usize = 128 << 10;
/// Bytes per rank of the concurrent-flows ring and of the MPI oversubscribed ring.
pub const RING_BYTES: usize = 4 << 20;

/// What one `pccl-tune` run measured, before any fit (times in µs, rates in GB/s).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Measured {
    /// The transport measured: `threads` or `mpi`.
    pub transport: String,
    /// Cores the process could run on.
    pub cores: usize,
    /// Working sets (source + destination bytes) of the `memcpy` sweep.
    pub copy_set_bytes: Vec<f64>,
    /// The sweep's copy rate at each working set.
    pub copy_gbps: Vec<f64>,
    /// A quarter of the last-level cache sysfs reports (the sweep's sets up to it give the
    /// cache's rate).
    pub cache_quarter_bytes: f64,
    /// `--cache-bytes`: the cache tier's size instead of the fitted one (`0`: no tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_bytes: Option<usize>,
    /// The host reduction `a ⊕ b → c` on 16 MiB per dtype (output bytes), cache included.
    pub reduce_gbps: BTreeMap<String, f64>,
    /// Sizes of the 2-rank exchange (PCCL's ring all-gather, bytes per rank).
    pub exchange_bytes: Vec<usize>,
    /// Its time at each size.
    pub exchange_us: Vec<f64>,
    /// The probe's all-gather sent whole.
    pub probe_whole_us: f64,
    /// The probe's all-gather in pieces.
    pub probe_pieced_us: f64,
    /// Ranks of the concurrent-flows ring (`0`: not measured).
    pub concurrent_ranks: usize,
    /// Its time ([`RING_BYTES`] per rank).
    pub concurrent_us: f64,
    /// Rank counts (more than the cores) of the 1 KiB rings that measure oversubscription
    /// (empty: not measured).
    pub oversub_ranks: Vec<usize>,
    /// Their times.
    pub oversub_us: Vec<f64>,
    /// The [`RING_BYTES`] ring at the first of `oversub_ranks` (MPI, whose ranks busy-poll;
    /// `0`: not measured).
    pub oversub_ring_us: f64,
}

/// The median of `v` ([`super::online::median`]: the mean of the middle two for an even
/// count); every list merged here holds at least one run's value.
fn median(mut v: Vec<f64>) -> f64 {
    super::online::median(&mut v)
}

/// `runs` with those whose `key` repeats an earlier one's left out.
fn distinct(runs: &[Measured], key: impl Fn(&Measured) -> Vec<u64>) -> Vec<&Measured> {
    let mut seen = std::collections::HashSet::new();
    runs.iter().filter(|r| seen.insert(key(r))).collect()
}

impl Measured {
    /// The per-size, per-field median of several runs' measurements (the runs must have
    /// measured the same transport, sizes and cores). A ring only some runs measured takes
    /// the median of those that did (their rank counts must agree). Timings that several
    /// profiles carry alike (the 2-rank ones `--oversub-of` copies from its base) count
    /// once.
    pub fn median(runs: &[Measured]) -> Result<Measured> {
        let first = runs
            .first()
            .ok_or_else(|| Error::invalid("no measurements to take the median of"))?;
        for (i, r) in runs.iter().enumerate() {
            r.check()
                .map_err(|e| Error::invalid(format!("run {}: {}", i + 1, e.message())))?;
            let differs = if r.transport != first.transport {
                Some(format!("transport {} vs {}", r.transport, first.transport))
            } else if r.exchange_bytes != first.exchange_bytes {
                Some("the exchange's sizes".into())
            } else if r.copy_set_bytes != first.copy_set_bytes {
                Some("the copy sweep's working sets".into())
            } else if r.cores != first.cores {
                Some(format!("cores {} vs {}", r.cores, first.cores))
            } else if r.cache_bytes != first.cache_bytes {
                Some("--cache-bytes".into())
            } else {
                None
            };
            if let Some(d) = differs {
                return Err(Error::invalid(format!(
                    "run {} measured differently from run 1 ({d}): merge runs of the same \
                     pccl-tune command on the same host",
                    i + 1
                )));
            }
        }
        // A measurement counts once however many profiles carry it: `--oversub-of` copies
        // its base profile's 2-rank timings into each profile it writes.
        let base = distinct(runs, |r| {
            [&r.exchange_us, &r.copy_gbps]
                .into_iter()
                .flatten()
                .chain([&r.probe_whole_us, &r.probe_pieced_us])
                .map(|v| v.to_bits())
                .collect()
        });
        let over = distinct(runs, |r| {
            r.oversub_us
                .iter()
                .chain([&r.oversub_ring_us])
                .map(|v| v.to_bits())
                .collect()
        });
        let each = |f: &dyn Fn(&Measured) -> f64| median(base.iter().map(|r| f(r)).collect());
        let per_index = |f: &dyn Fn(&Measured) -> &Vec<f64>| -> Vec<f64> {
            (0..f(first).len())
                .map(|k| median(base.iter().map(|r| f(r)[k]).collect()))
                .collect()
        };
        // A ring some runs measured: (ranks, median time) over those runs.
        let ring = |ranks: &dyn Fn(&Measured) -> usize,
                    t: &dyn Fn(&Measured) -> f64|
         -> Result<(usize, f64)> {
            let did: Vec<&Measured> = base.iter().copied().filter(|r| ranks(r) > 0).collect();
            let Some(p) = did.first().map(|r| ranks(r)) else {
                return Ok((0, 0.0));
            };
            if did.iter().any(|r| ranks(r) != p) {
                return Err(Error::invalid(
                    "the runs measured their rings at different rank counts",
                ));
            }
            Ok((p, median(did.iter().map(|r| t(r)).collect())))
        };
        let (concurrent_ranks, concurrent_us) =
            ring(&|r| r.concurrent_ranks, &|r| r.concurrent_us)?;
        // The oversubscribed rings: the median per rank count of the runs that measured them.
        let over: Vec<&Measured> = over
            .into_iter()
            .filter(|r| !r.oversub_ranks.is_empty())
            .collect();
        let oversub_ranks = over.first().map_or(Vec::new(), |r| r.oversub_ranks.clone());
        if over.iter().any(|r| r.oversub_ranks != oversub_ranks) {
            return Err(Error::invalid(
                "the runs measured their rings at different rank counts",
            ));
        }
        let oversub_us = (0..oversub_ranks.len())
            .map(|k| median(over.iter().map(|r| r.oversub_us[k]).collect()))
            .collect();
        let rings: Vec<f64> = over
            .iter()
            .map(|r| r.oversub_ring_us)
            .filter(|&t| t > 0.0)
            .collect();
        let oversub_ring_us = if rings.is_empty() { 0.0 } else { median(rings) };
        let mut reduce_gbps = BTreeMap::new();
        for k in first.reduce_gbps.keys() {
            let v: Vec<f64> = base
                .iter()
                .filter_map(|r| r.reduce_gbps.get(k))
                .copied()
                .collect();
            reduce_gbps.insert(k.clone(), median(v));
        }
        Ok(Measured {
            transport: first.transport.clone(),
            cores: first.cores,
            copy_set_bytes: first.copy_set_bytes.clone(),
            copy_gbps: per_index(&|r| &r.copy_gbps),
            cache_quarter_bytes: each(&|r| r.cache_quarter_bytes),
            cache_bytes: first.cache_bytes,
            reduce_gbps,
            exchange_bytes: first.exchange_bytes.clone(),
            exchange_us: per_index(&|r| &r.exchange_us),
            probe_whole_us: each(&|r| r.probe_whole_us),
            probe_pieced_us: each(&|r| r.probe_pieced_us),
            concurrent_ranks,
            concurrent_us,
            oversub_ranks,
            oversub_us,
            oversub_ring_us,
        })
    }

    /// Adds the 1 KiB ring message (`msg_us`, µs for the whole ring) and 4 MiB ring
    /// (`ring_us`) measured at `p` ranks to the oversubscribed points, kept in rank order and
    /// replacing an earlier point at `p`. The 4 MiB ring (the rate share) stays the one at
    /// the fewest ranks. MPI measures each point in a world of its own: a second
    /// `--oversub-of` at 4 × cores on the first one's profile gives the slope two points, as
    /// thread ranks get in one run.
    pub fn add_oversub_point(&mut self, p: usize, msg_us: f64, ring_us: f64) {
        if let Some(k) = self.oversub_ranks.iter().position(|&q| q == p) {
            self.oversub_ranks.remove(k);
            self.oversub_us.remove(k);
        }
        let k = self.oversub_ranks.partition_point(|&q| q < p);
        if k == 0 || self.oversub_ring_us <= 0.0 {
            self.oversub_ring_us = ring_us;
        }
        self.oversub_ranks.insert(k, p);
        self.oversub_us.insert(k, msg_us);
    }

    /// Where `runs` disagree most on the exchange: (bytes, slowest / fastest run's time) at
    /// the size with the largest ratio; `None` for fewer than two runs or sizes that differ.
    /// Above about 1.5× the machine's state changed between the runs (on the 2-core VM the
    /// two vCPUs' transfer rate switched 3–4.5× at 16 KiB–2 MiB), and the merge takes
    /// whichever state most of them met.
    pub fn spread(runs: &[Measured]) -> Option<(usize, f64)> {
        let first = runs.first()?;
        if runs.len() < 2
            || runs.iter().any(|r| {
                r.exchange_us.len() != first.exchange_us.len()
                    || r.exchange_bytes.len() != r.exchange_us.len()
            })
        {
            return None;
        }
        (0..first.exchange_us.len())
            .map(|k| {
                let v = runs.iter().map(|r| r.exchange_us[k]);
                let hi = v.clone().fold(f64::NEG_INFINITY, f64::max);
                let lo = v.fold(f64::INFINITY, f64::min);
                (first.exchange_bytes[k], hi / lo)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Checks the lists' lengths and that every time and rate is positive and finite.
    fn check(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::invalid(format!("profile: [measured] {what}")));
        if self.exchange_bytes.len() != self.exchange_us.len() || self.exchange_bytes.len() < 4 {
            return bad("needs at least 4 exchange sizes, each with its time");
        }
        if self.copy_set_bytes.len() != self.copy_gbps.len() || self.copy_gbps.is_empty() {
            return bad("needs the copy sweep, a rate per working set");
        }
        if self.oversub_ranks.len() != self.oversub_us.len() {
            return bad("needs a time per oversubscribed rank count");
        }
        let positive = |v: f64| v > 0.0 && v.is_finite();
        if !self
            .exchange_us
            .iter()
            .chain(&self.copy_gbps)
            .all(|&v| positive(v))
            || !self.reduce_gbps.values().all(|&v| positive(v))
        {
            return bad("holds a time or rate that is not above zero");
        }
        Ok(())
    }
}

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
    let (mut lo, mut hi) = (0.0, super::profile::MAX_RATE_SHARE);
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
/// * memory's copy rate and the cache tier from the sweep ([`super::cache::fit`]);
/// * γ per dtype: the reduction rates, less the cache's speed-up on their 3 × 16 MiB;
/// * α, β, the transfers' share of the cache's gain and the protocol's steps from the
///   exchange less its local copy ([`link_fit::fit`]; thread ranks, whose transfer is the
///   receiver's `memcpy`, fit α alone, [`link_fit::fit_latency`]);
/// * the node's shared bandwidth from the concurrent ring, when its flows got less than β;
/// * the cost per piece from the probe ([`piece_overhead`]);
/// * the oversubscription terms from the 1 KiB ring at more ranks than cores
///   ([`super::oversub::per_message_us`]; against the exchange's own 1 KiB time for
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
    let (copy, cache) = super::cache::fit(&sweep, m.cache_quarter_bytes);
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
        match super::oversub::per_message_us(&points, base, 2, n) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Measurements of a 2-rank MPI exchange as `prof`'s model gives them (no cache tier, no
    /// steps): 1 KiB … 64 MiB.
    fn measured_from(prof: &Profile) -> Measured {
        let exchange_bytes: Vec<usize> = (10..=26).map(|k| 1usize << k).collect();
        let exchange_us = exchange_bytes
            .iter()
            .map(|&s| exchange_seconds(prof, s as f64) * 1e6)
            .collect();
        let copy_set_bytes: Vec<f64> = (18..=27).map(|k| f64::from(1u32 << k)).collect();
        Measured {
            transport: "mpi".into(),
            cores: 2,
            copy_gbps: vec![prof.copy_gbps; copy_set_bytes.len()],
            copy_set_bytes,
            cache_quarter_bytes: 1e6,
            cache_bytes: Some(0),
            reduce_gbps: [("f32".to_string(), 6.0)].into_iter().collect(),
            exchange_bytes,
            exchange_us,
            probe_whole_us: 500.0,
            probe_pieced_us: 500.0,
            ..Measured::default()
        }
    }

    fn truth() -> Profile {
        let mut p = Profile {
            copy_gbps: 10.0,
            ..Profile::default()
        };
        p.intra.alpha_us = 3.0;
        p.intra.bandwidth_gbps = 5.0;
        p
    }

    #[test]
    fn a_profile_comes_back_from_the_measurements_its_model_gives() {
        let m = measured_from(&truth());
        let p = derive(&m).unwrap();
        assert!((p.intra.alpha_us - 3.0).abs() < 0.05, "{p:?}");
        assert!((p.intra.bandwidth_gbps / 5.0 - 1.0).abs() < 0.01, "{p:?}");
        assert_eq!(p.protocol.eager_bytes, 0, "no step in a straight curve");
        assert_eq!(p.measured.as_ref(), Some(&m), "the measurements are kept");
        // Kept through TOML, and derived again to the same profile.
        let q = Profile::from_toml(&p.to_toml()).unwrap();
        assert_eq!(derive(q.measured.as_ref().unwrap()).unwrap(), p);
    }

    #[test]
    fn the_median_of_three_runs_ignores_one_run_whose_mid_sizes_ran_slow() {
        let good = measured_from(&truth());
        let mut slow = good.clone();
        // One process's pair slowed 3× from 16 KiB to 2 MiB for its whole life (as on the
        // 2-core VM): alone it fits a false step.
        for (t, &s) in slow.exchange_us.iter_mut().zip(&slow.exchange_bytes) {
            if (16 << 10..=2 << 20).contains(&s) {
                *t *= 3.0;
            }
        }
        let mut other = good.clone();
        other.exchange_us.iter_mut().for_each(|t| *t *= 1.02);
        let alone = derive(&slow).unwrap();
        let predicted = |p: &Profile| exchange_seconds(p, (256 << 10) as f64);
        assert!(
            predicted(&alone) > 2.0 * predicted(&truth()),
            "the slow run alone mispredicts"
        );
        let m = Measured::median(&[slow, good.clone(), other]).unwrap();
        let p = derive(&m).unwrap();
        let r = predicted(&p) / predicted(&truth());
        assert!((0.95..1.05).contains(&r), "median run predicts {r}x: {p:?}");
        assert!((p.intra.bandwidth_gbps / 5.0 - 1.0).abs() < 0.05, "{p:?}");
    }

    #[test]
    fn rings_only_some_runs_measured_take_the_median_of_those() {
        let mut a = measured_from(&truth());
        let mut b = a.clone();
        let c = a.clone();
        (a.oversub_ranks, a.oversub_us) = (vec![4, 8], vec![30.0, 100.0]);
        (b.oversub_ranks, b.oversub_us) = (vec![4, 8], vec![50.0, 140.0]);
        let m = Measured::median(&[a.clone(), b.clone(), c]).unwrap();
        assert_eq!(m.oversub_ranks, [4, 8]);
        assert_eq!(m.oversub_us, [40.0, 120.0]);
        let p = derive(&m).unwrap();
        assert!(p.oversub.per_message_us > 0.0, "{p:?}");
        assert!(p.source.contains("4, 8 ranks on 2 cores"), "{}", p.source);
        b.oversub_ranks = vec![4];
        b.oversub_us = vec![50.0];
        let e = Measured::median(&[a, b]).unwrap_err();
        assert!(e.message().contains("rank counts"), "{e}");
    }

    #[test]
    fn a_second_oversubscribed_world_adds_its_point_and_keeps_the_first_ring() {
        let t = truth();
        let mut m = measured_from(&t);
        // 2 cores, 1 KiB messages of the 2-rank profile plus 4 µs per extra rank per core:
        // 4 ranks (k = 1 beyond the base) take 3 messages, 8 ranks (k = 3) take 7.
        let base = derive(&m).unwrap();
        let msg = |k: f64| exchange_seconds(&base, 1024.0) * 1e6 + 4.0 * k;
        m.add_oversub_point(8, 7.0 * msg(3.0), 9000.0);
        m.add_oversub_point(4, 3.0 * msg(1.0), 5000.0);
        assert_eq!(m.oversub_ranks, [4, 8], "in rank order");
        assert_eq!(m.oversub_ring_us, 5000.0, "the ring at the fewest ranks");
        // Measured again at 8 ranks: replaced, not added; the 4-rank ring stays.
        m.add_oversub_point(8, 7.0 * msg(3.0), 1.0);
        assert_eq!((m.oversub_ranks.len(), m.oversub_ring_us), (2, 5000.0));
        let p = derive(&m).unwrap();
        let s = p.oversub.per_message_us;
        assert!(
            (s / 4.0 - 1.0).abs() < 0.2,
            "the slope through both points: {s}"
        );
        assert!(p.source.contains("4, 8 ranks on 2 cores"), "{}", p.source);
    }

    #[test]
    fn timings_that_several_profiles_carry_alike_count_once() {
        let a = measured_from(&truth());
        let mut b = a.clone();
        b.exchange_us.iter_mut().for_each(|t| *t *= 1.01);
        let mut slow = a.clone();
        slow.exchange_us.iter_mut().for_each(|t| *t *= 3.0);
        // Three `--oversub-of` profiles of the slow base: its exchange copied into each.
        let over: Vec<Measured> = [30.0, 40.0, 50.0]
            .into_iter()
            .map(|us| Measured {
                oversub_ranks: vec![4],
                oversub_us: vec![us],
                oversub_ring_us: 100.0 * us,
                ..slow.clone()
            })
            .collect();
        let mut all = vec![a.clone(), b, slow];
        all.extend(over);
        let m = Measured::median(&all).unwrap();
        assert_eq!(m.exchange_us, {
            let mut v = a.exchange_us.clone();
            v.iter_mut().for_each(|t| *t *= 1.01);
            v
        });
        assert_eq!(
            (m.oversub_us.clone(), m.oversub_ring_us),
            (vec![40.0], 4000.0)
        );
    }

    #[test]
    fn the_spread_names_the_size_where_runs_disagree_most() {
        let a = measured_from(&truth());
        let mut b = a.clone();
        b.exchange_us[5] *= 3.0;
        b.exchange_us[6] *= 2.0;
        let (bytes, r) = Measured::spread(&[a.clone(), b]).unwrap();
        assert_eq!(bytes, a.exchange_bytes[5]);
        assert!((r - 3.0).abs() < 1e-12, "{r}");
        assert_eq!(Measured::spread(std::slice::from_ref(&a)), None);
    }

    #[test]
    fn runs_of_different_transports_or_sizes_are_not_merged() {
        let a = measured_from(&truth());
        let mut b = a.clone();
        b.transport = "threads".into();
        let e = Measured::median(&[a.clone(), b]).unwrap_err();
        assert!(
            e.message().contains("run 2") && e.message().contains("transport"),
            "{e}"
        );
        let mut c = a.clone();
        c.exchange_bytes.pop();
        c.exchange_us.pop();
        assert!(Measured::median(&[a, c]).is_err());
        assert!(Measured::median(&[]).is_err());
    }

    #[test]
    fn a_damaged_run_fails_the_merge_with_its_number_instead_of_panicking() {
        let a = measured_from(&truth());
        let mut b = a.clone();
        b.exchange_us.truncate(3);
        let e = Measured::median(&[a.clone(), b]).unwrap_err();
        assert!(e.message().contains("run 2"), "{e}");
        let mut c = a.clone();
        c.oversub_ranks = vec![4, 8];
        c.oversub_us = vec![30.0];
        let e = Measured::median(&[c, a]).unwrap_err();
        assert!(e.message().contains("run 1"), "{e}");
    }

    #[test]
    fn damaged_measurements_give_an_error_not_a_profile() {
        let mut m = measured_from(&truth());
        m.exchange_us[3] = f64::NAN;
        assert!(derive(&m).is_err());
        let mut m = measured_from(&truth());
        m.exchange_us.pop();
        let e = derive(&m).unwrap_err();
        assert!(e.message().contains("[measured]"), "{e}");
    }
}
