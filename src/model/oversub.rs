//! The oversubscription term's slope from two timings (what `pccl-tune` measures): the same
//! small-message ring all-gather with few ranks and with more ranks than the host has cores.

/// Extra ranks per core beyond one for `ranks` ranks on `cores` cores (`k − 1`, at least 0).
pub fn extra_per_core(ranks: usize, cores: usize) -> f64 {
    (ranks as f64 / cores.max(1) as f64 - 1.0).max(0.0)
}

/// The per-message cost (µs) of one extra rank per core ([`super::profile::Oversub`]) from
/// ring all-gathers' median times at more ranks than `cores`: `points` holds (seconds,
/// ranks) of each, `base_msg` is the time per message (seconds) at `p_base` ranks. A ring
/// takes `P − 1` messages one after another, so its time per message is `t / (P − 1)`; the
/// slope is the growth of that per extra rank per core, fitted to every point by relative
/// least squares (each rank count counts alike: on the 2-core VM the growth from 4 to 8
/// ranks was a third below the line through 2 and 4). Points with no more ranks per core
/// than `p_base` are left out. `None` when no point is left or a time is not finite; `0`
/// when oversubscription measured no slower.
pub fn per_message_us(
    points: &[(f64, usize)],
    base_msg: f64,
    p_base: usize,
    cores: usize,
) -> Option<f64> {
    if !base_msg.is_finite() {
        return None;
    }
    let k0 = extra_per_core(p_base, cores);
    let mut num = 0.0;
    let mut den = 0.0;
    for &(t, p) in points {
        let dk = extra_per_core(p, cores) - k0;
        if !t.is_finite() || t <= 0.0 {
            return None;
        }
        if p < 2 || dk <= 0.0 {
            continue; // no more ranks per core than the base: nothing to fit
        }
        // Minimise Σ((base + s·dk)/m − 1)² over s: s = Σ (dk/m)(1 − base/m) / Σ (dk/m)².
        let m = t / (p - 1) as f64;
        num += dk / m * (1.0 - base_msg / m);
        den += (dk / m).powi(2);
    }
    (den > 0.0).then(|| (num / den * 1e6).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_comes_back_from_timings_the_model_would_give() {
        // 2 cores, 8 µs per message unloaded, 30 µs per extra rank per core: 4 ranks (k = 2)
        // take 3 × (8 + 30) µs, 8 ranks (k = 4) 7 × (8 + 90) µs.
        let s = per_message_us(&[(3.0 * 38e-6, 4)], 8e-6, 2, 2).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "{s}");
        let s = per_message_us(&[(7.0 * 98e-6, 8)], 8e-6, 2, 2).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "{s}");
        let s = per_message_us(&[(3.0 * 38e-6, 4), (7.0 * 98e-6, 8)], 8e-6, 2, 2).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "both points on the line: {s}");
        // One core: the 2-rank baseline is already at k = 2.
        let s = per_message_us(&[(3.0 * (8e-6 + 3.0 * 30e-6), 4)], 8e-6 + 30e-6, 2, 1).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "{s}");
    }

    #[test]
    fn a_slope_through_two_points_off_the_line_lies_between_their_own() {
        // As on the 2-core VM: +6 µs per message at 4 ranks (k = 2), +4.6 per extra rank per
        // core at 8 (k = 4), from 1.5 µs at 2 ranks.
        let at4 = (3.0 * 7.5e-6, 4);
        let at8 = (7.0 * (1.5e-6 + 3.0 * 4.6e-6), 8);
        let s = per_message_us(&[at4, at8], 1.5e-6, 2, 2).unwrap();
        assert!(s > 4.6 && s < 6.0, "{s}");
        // Each point predicted within a third.
        for (t, p) in [at4, at8] {
            let pred = 1.5e-6 + s * 1e-6 * extra_per_core(p, 2);
            let r = pred / (t / (p - 1) as f64);
            assert!((0.75..1.34).contains(&r), "{p} ranks: {r}");
        }
    }

    #[test]
    fn no_oversubscription_or_no_slowdown_gives_no_or_a_zero_slope() {
        assert_eq!(
            per_message_us(&[(1e-3, 4)], 8e-6, 2, 4),
            None,
            "4 ranks fit 4 cores"
        );
        assert_eq!(
            per_message_us(&[(1e-3, 2)], 8e-6, 2, 1),
            None,
            "no more ranks per core"
        );
        assert_eq!(per_message_us(&[(f64::NAN, 4)], 8e-6, 2, 2), None);
        assert_eq!(per_message_us(&[], 8e-6, 2, 2), None);
        // One core: 2 ranks are no more per core than the base, 4 ranks are.
        let s = per_message_us(
            &[(1e-3, 2), (3.0 * (8e-6 + 3.0 * 30e-6), 4)],
            8e-6 + 30e-6,
            2,
            1,
        );
        assert!((s.unwrap() - 30.0).abs() < 1e-9, "{s:?}");
        assert_eq!(per_message_us(&[(3.0 * 5e-6, 4)], 8e-6, 2, 2), Some(0.0));
    }
}
