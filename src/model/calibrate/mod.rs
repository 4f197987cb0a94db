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

mod derive;
mod merge;

pub use derive::{derive, exchange_seconds, piece_overhead, rate_share};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::profile::Profile;

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
