//! The oversubscription term's slope from two timings (what `pccl-tune` measures): the same
//! small-message ring all-gather with few ranks and with more ranks than the host has cores.

/// Extra ranks per core beyond one for `ranks` ranks on `cores` cores (`k − 1`, at least 0).
pub fn extra_per_core(ranks: usize, cores: usize) -> f64 {
    (ranks as f64 / cores.max(1) as f64 - 1.0).max(0.0)
}

/// The per-message cost (µs) of one extra rank per core ([`super::profile::Oversub`]) from a
/// ring all-gather's median time `t_over` (seconds) at `p_over` ranks and the time per
/// message `base_msg` (seconds) at `p_base` ranks, both on `cores` cores. A ring takes
/// `P − 1` messages one after another, so its time per message is `t / (P − 1)`; the slope
/// is the growth of that per extra rank per core. `None` when `p_over` does not put more
/// ranks per core than `p_base`; `0` when oversubscription measured no slower.
pub fn per_message_us(
    t_over: f64,
    p_over: usize,
    base_msg: f64,
    p_base: usize,
    cores: usize,
) -> Option<f64> {
    let dk = extra_per_core(p_over, cores) - extra_per_core(p_base, cores);
    if p_over < 2 || dk <= 0.0 || !t_over.is_finite() || !base_msg.is_finite() {
        return None;
    }
    let per_msg = t_over / (p_over - 1) as f64;
    Some(((per_msg - base_msg) / dk * 1e6).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_comes_back_from_timings_the_model_would_give() {
        // 2 cores, 8 µs per message unloaded, 30 µs per extra rank per core: 4 ranks (k = 2)
        // take 3 × (8 + 30) µs, 8 ranks (k = 4) 7 × (8 + 90) µs.
        let s = per_message_us(3.0 * 38e-6, 4, 8e-6, 2, 2).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "{s}");
        let s = per_message_us(7.0 * 98e-6, 8, 8e-6, 2, 2).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "{s}");
        // One core: the 2-rank baseline is already at k = 2.
        let s = per_message_us(3.0 * (8e-6 + 3.0 * 30e-6), 4, 8e-6 + 30e-6, 2, 1).unwrap();
        assert!((s - 30.0).abs() < 1e-9, "{s}");
    }

    #[test]
    fn no_oversubscription_or_no_slowdown_gives_no_or_a_zero_slope() {
        assert_eq!(
            per_message_us(1e-3, 4, 8e-6, 2, 4),
            None,
            "4 ranks fit 4 cores"
        );
        assert_eq!(
            per_message_us(1e-3, 2, 8e-6, 2, 1),
            None,
            "no more ranks per core"
        );
        assert_eq!(per_message_us(f64::NAN, 4, 8e-6, 2, 2), None);
        assert_eq!(per_message_us(3.0 * 5e-6, 4, 8e-6, 2, 2), Some(0.0));
    }
}
