//! The median of several `pccl-tune` runs' measurements (`pccl-tune --merge`), and the
//! checks a run's measurements pass before anything is derived from them.

use super::Measured;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// The median of `v` ([`crate::model::online::median`]: the mean of the middle two for an even
/// count); every list merged here holds at least one run's value.
fn median(mut v: Vec<f64>) -> f64 {
    crate::model::online::median(&mut v)
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
    pub(super) fn check(&self) -> Result<()> {
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
