//! The cache tier's parameters from a `memcpy` sweep (what `pccl-tune` measures): memory's
//! copy rate, the cache's, and the cache size that makes [`Profile::cache_speedup`] match the
//! sweep best.

use super::profile::{CacheTier, Profile};

/// Median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Fits the tier to `sweep`: `(working set bytes, copy GB/s)` in increasing working sets.
/// The cache's rate is the median of the sets up to `quarter` bytes (a quarter of the
/// cache sysfs reports), memory's the largest set's, corrected for what of it still fits;
/// the size is searched on a quarter-octave grid between the smallest and the largest set,
/// and with it the edge's sharpness ([`CacheTier::sharpness`], 1 … 8), minimising the
/// squared log error of the model over the whole sweep (ties go to the gentler edge). Returns memory's
/// rate and the tier, which is off (`bytes = 0`) when the cache is not at least 10% faster
/// than memory or the sweep is too short to say.
pub fn fit(sweep: &[(f64, f64)], quarter: f64) -> (f64, CacheTier) {
    let Some(&(w_last, r_last)) = sweep.last() else {
        return (0.0, CacheTier::default());
    };
    let small: Vec<f64> = sweep
        .iter()
        .filter(|(w, _)| *w <= quarter)
        .map(|x| x.1)
        .collect();
    if small.is_empty() || sweep.len() < 3 {
        return (r_last, CacheTier::default());
    }
    let cached = median(small);
    if cached <= r_last * 1.1 {
        return (r_last, CacheTier::default());
    }
    let model = |c: f64, k: f64| {
        let h = (c / w_last).min(0.99).powf(k);
        let mem = (1.0 - h) / (1.0 / r_last - h / cached).max(1e-12);
        let p = Profile {
            copy_gbps: mem,
            cache: CacheTier {
                bytes: c as usize,
                copy_gbps: cached,
                sharpness: k,
                ..CacheTier::default()
            },
            ..Profile::default()
        };
        let err: f64 = sweep
            .iter()
            .map(|(w, r)| (mem * p.cache_speedup(*w) / r).ln().powi(2))
            .sum();
        (err, mem)
    };
    let mut best = (f64::INFINITY, 0.0, r_last, 1.0);
    for k in [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0] {
        let mut c = sweep[0].0;
        while c <= w_last {
            let (err, mem) = model(c, k);
            // A sharper edge must earn its place: 2% less error.
            if err < best.0 * 0.98 {
                best = (err, c, mem, k);
            }
            c *= 2f64.powf(0.25);
        }
    }
    (
        best.2,
        CacheTier {
            bytes: best.1 as usize,
            copy_gbps: cached,
            sharpness: best.3,
            ..CacheTier::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep_of(mem: f64, cached: f64, bytes: usize) -> Vec<(f64, f64)> {
        sharp_sweep_of(mem, cached, bytes, 1.0)
    }

    fn sharp_sweep_of(mem: f64, cached: f64, bytes: usize, sharpness: f64) -> Vec<(f64, f64)> {
        let p = Profile {
            copy_gbps: mem,
            cache: CacheTier {
                bytes,
                copy_gbps: cached,
                sharpness,
                ..CacheTier::default()
            },
            ..Profile::default()
        };
        (18..=27)
            .map(|k| {
                let w = (1u64 << k) as f64;
                (w, mem * p.cache_speedup(w))
            })
            .collect()
    }

    #[test]
    fn a_sweep_of_the_model_gives_its_parameters_back() {
        let (mem, tier) = fit(&sweep_of(3.0, 24.0, 12 << 20), (32 << 20) as f64 / 4.0);
        assert!((mem - 3.0).abs() < 0.05, "{mem}");
        assert_eq!(tier.copy_gbps, 24.0);
        let ratio = tier.bytes as f64 / (12 << 20) as f64;
        assert!((0.92..1.09).contains(&ratio), "{}", tier.bytes);
        assert_eq!(tier.sharpness, 1.0, "a gentle edge stays gentle");
    }

    #[test]
    fn a_steep_edge_is_fitted_steep_at_the_cache_size() {
        // A sweep at quarter-octave steps, so the grid can land on the size.
        let p = Profile {
            copy_gbps: 3.0,
            cache: CacheTier {
                bytes: 16 << 20,
                copy_gbps: 24.0,
                sharpness: 4.0,
                ..CacheTier::default()
            },
            ..Profile::default()
        };
        let sweep: Vec<(f64, f64)> = (72..=108)
            .map(|q| {
                let w = 2f64.powf(q as f64 / 4.0);
                (w, 3.0 * p.cache_speedup(w))
            })
            .collect();
        let (mem, tier) = fit(&sweep, (32 << 20) as f64 / 4.0);
        assert!((mem - 3.0).abs() < 0.05, "{mem}");
        assert_eq!(tier.sharpness, 4.0);
        let ratio = tier.bytes as f64 / (16 << 20) as f64;
        assert!((0.92..1.09).contains(&ratio), "{}", tier.bytes);
        // Octave steps (what pccl-tune sweeps) still see the edge as steep.
        let octaves = sharp_sweep_of(3.0, 24.0, 16 << 20, 4.0);
        let (_, t) = fit(&octaves, (32 << 20) as f64 / 4.0);
        assert!(t.sharpness > 1.0, "{t:?}");
    }

    #[test]
    fn no_faster_cache_or_a_short_sweep_gives_no_tier() {
        let flat: Vec<(f64, f64)> = (18..=27).map(|k| ((1u64 << k) as f64, 5.0)).collect();
        assert_eq!(fit(&flat, 8e6), (5.0, CacheTier::default()));
        assert_eq!(fit(&[], 8e6).1, CacheTier::default());
        let short = &sweep_of(3.0, 24.0, 12 << 20)[7..];
        assert_eq!(fit(short, 8e6).1.bytes, 0, "nothing below the quarter");
    }
}
