//! A transport's message curve fitted to the model's link terms (what `pccl-tune` does with
//! its 2-rank exchange): the latency α, memory's transfer rate β, the share of the cache's
//! gain that transfers get ([`CacheTier::link_share`](super::profile::CacheTier)), an
//! eager/rendezvous step and a lower step where the small-message path ends
//! ([`Protocol`](super::profile::Protocol)).
//!
//! The model of one message of `s` bytes, `h` of them served from the cache:
//!
//! ```text
//! t(s) = α + [s > S]·q + [s > E]·r + ([s ≤ E]·(d − 1) + 1)·s·(h / (1 + σ·(c − 1)) + 1 − h) / β
//! ```
//!
//! with `c` the cache's copy speed-up over memory, σ the transfers' share of it, d ≥ 1 the
//! eager bytes' slowdown (MPICH copies them through shared cells; its rendezvous reads the
//! sender's buffer once), and q the step above the small-message path (UCX's 8 KiB copy-in
//! segment under MPICH ch4 on the test VM: 8 KiB took 3.5 µs, 16 KiB 8.0 µs, 32 KiB 11.2 µs).
//! For each σ on a grid and each placement of the steps between measured sizes (none, E
//! alone, or S below E), (α, 1/β, q, r, (d−1)/β) are linear: a least-squares fit of the
//! *relative* error (every size counts alike, as the model is judged by ratios); the fit kept
//! is the one with the smallest squared log error. Each step is kept only when it cuts that
//! error by [`STEP_GAIN`]: noise alone rarely does.

/// One size of the exchange.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Bytes of the message.
    pub bytes: f64,
    /// Seconds of the transfer (the exchange's time less its local copy).
    pub seconds: f64,
    /// Share of those bytes served from the cache (0 … 1).
    pub hit: f64,
}

/// The fitted link terms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFit {
    /// Latency of a message (seconds).
    pub alpha: f64,
    /// Transfer rate out of memory (bytes per second).
    pub beta: f64,
    /// Share of the cache's speed-up the transfers get (0 … 1).
    pub link_share: f64,
    /// Messages above this many bytes pay [`Self::rendezvous`]; 0 for no step.
    pub eager_bytes: usize,
    /// Extra latency above the step (seconds).
    pub rendezvous: f64,
    /// How many times longer an eager message's bytes take than a rendezvous message's (≥ 1;
    /// 1 without a step).
    pub eager_slowdown: f64,
    /// Messages above this many bytes (below `eager_bytes`) leave the small-message path and
    /// pay [`Self::small_step`]; 0 for no such step.
    pub small_bytes: usize,
    /// Extra latency above the small-message path (seconds).
    pub small_step: f64,
    /// Median of |log(model / measured)| over the samples.
    pub typical_error: f64,
}

/// A step is kept only when it cuts the squared log error by this factor or more.
pub const STEP_GAIN: f64 = 0.7;

/// The largest eager limit looked for (bytes). MPI libraries' limits lie from a few KiB to
/// a few hundred (MPICH ch3 64 KiB, Open MPI's shared memory 4–32 KiB, libfabric rxm
/// 16 KiB); a step in the curve above this one is the cache running out, not a protocol.
pub const MAX_EAGER: usize = 512 << 10;

/// The largest small-message path looked for (bytes): MPICH ch3's fastbox, UCX's copy-in
/// segment and Open MPI's fast boxes hold a few KiB.
pub const MAX_SMALL: usize = 64 << 10;

/// Solves the small dense system `m x = v` (Gaussian elimination, partial pivoting); `None`
/// when it is singular.
fn solve(mut m: Vec<Vec<f64>>, mut v: Vec<f64>) -> Option<Vec<f64>> {
    let n = v.len();
    for c in 0..n {
        let piv = (c..n).max_by(|&a, &b| m[a][c].abs().total_cmp(&m[b][c].abs()))?;
        if m[piv][c].abs() < 1e-300 {
            return None;
        }
        m.swap(c, piv);
        v.swap(c, piv);
        let pivot_row = m[c].clone();
        for r in c + 1..n {
            let f = m[r][c] / pivot_row[c];
            for (x, p) in m[r].iter_mut().zip(pivot_row.iter()).skip(c) {
                *x -= f * p;
            }
            v[r] -= f * v[c];
        }
    }
    let mut x = vec![0.0; n];
    for c in (0..n).rev() {
        let s: f64 = (c + 1..n).map(|k| m[c][k] * x[k]).sum();
        x[c] = (v[c] - s) / m[c][c];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Least squares of `Σ (row·x / y − 1)²` over `rows` (each with its `y`, all rows as long).
fn weighted(rows: &[(Vec<f64>, f64)]) -> Option<Vec<f64>> {
    let n = rows.first()?.0.len();
    let mut m = vec![vec![0.0; n]; n];
    let mut v = vec![0.0; n];
    for (row, y) in rows {
        let a: Vec<f64> = row.iter().map(|x| x / y).collect();
        for i in 0..n {
            for j in 0..n {
                m[i][j] += a[i] * a[j];
            }
            v[i] += a[i];
        }
    }
    solve(m, v)
}

/// Where a candidate puts its steps: the index of the last sample at or below each limit.
#[derive(Clone, Copy, Debug, Default)]
struct Steps {
    /// The small-message path's limit (a latency step, no change of rate).
    small: Option<usize>,
    /// The eager limit (a latency step; eager bytes may be slower).
    eager: Option<usize>,
}

/// The fitted terms of one candidate, in the order of [`candidate`]'s columns.
struct Terms {
    alpha: f64,
    inv_beta: f64,
    small: f64,
    rdv: f64,
    extra: f64,
}

/// Fits the columns `[1, per byte, above small?, above eager?, eager bytes?]` (those the
/// steps have); with an eager step, first with the eager bytes' own rate and, when that
/// comes out faster than the rendezvous rate, without it.
fn fit_terms(s: &[Sample], per_byte: &dyn Fn(&Sample) -> f64, st: Steps) -> Option<Terms> {
    let above = |k: Option<usize>, i: usize| k.is_some_and(|k| i > k);
    let rows = |slowdown: bool| -> Vec<(Vec<f64>, f64)> {
        s.iter()
            .enumerate()
            .map(|(i, x)| {
                let pb = per_byte(x);
                let mut row = vec![1.0, pb];
                if st.small.is_some() {
                    row.push(f64::from(u8::from(above(st.small, i))));
                }
                if st.eager.is_some() {
                    let up = f64::from(u8::from(above(st.eager, i)));
                    row.push(up);
                    if slowdown {
                        row.push(pb * (1.0 - up));
                    }
                }
                (row, x.seconds)
            })
            .collect()
    };
    let unpack = |x: Vec<f64>| {
        let mut it = x.into_iter();
        let alpha = it.next()?;
        let inv_beta = it.next()?;
        let small = if st.small.is_some() { it.next()? } else { 0.0 };
        let rdv = if st.eager.is_some() { it.next()? } else { 0.0 };
        let extra = it.next().unwrap_or(0.0);
        Some(Terms {
            alpha,
            inv_beta,
            small,
            rdv,
            extra,
        })
    };
    if st.eager.is_some() {
        if let Some(t) = weighted(&rows(true)).and_then(unpack) {
            if t.extra >= 0.0 {
                return Some(t);
            }
        }
    }
    weighted(&rows(false)).and_then(unpack)
}

/// One candidate: the terms for share `sigma` and the steps `st`, with its squared log
/// error; `None` where the fit is not physical.
fn candidate(s: &[Sample], ratio: f64, sigma: f64, st: Steps) -> Option<(f64, LinkFit)> {
    let rl = 1.0 + sigma * (ratio - 1.0);
    let per_byte = |x: &Sample| x.bytes * (x.hit / rl + 1.0 - x.hit);
    let t = fit_terms(s, &per_byte, st)?;
    if t.alpha <= 0.0 || t.inv_beta <= 0.0 || t.rdv < 0.0 || t.small < 0.0 {
        return None;
    }
    // A handshake is a round or two of small messages: a step longer than twice the message's
    // own time at it is a change of rate (the cache running out), not a protocol.
    let at = |k: Option<usize>| k.map_or(f64::INFINITY, |k| 2.0 * s[k].seconds);
    if t.rdv > at(st.eager) || t.small > at(st.small) {
        return None;
    }
    let limit = |k: Option<usize>| k.map_or(0, |k| s[k].bytes as usize);
    let above = |k: Option<usize>, i: usize| k.is_some_and(|k| i > k);
    let mut logs: Vec<f64> = s
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let pb = per_byte(x);
            let mut m = t.alpha + pb * t.inv_beta;
            if above(st.small, i) {
                m += t.small;
            }
            m += if above(st.eager, i) {
                t.rdv
            } else {
                pb * t.extra
            };
            (m / x.seconds).ln()
        })
        .collect();
    let err: f64 = logs.iter().map(|l| l * l).sum();
    logs.iter_mut().for_each(|l| *l = l.abs());
    logs.sort_by(f64::total_cmp);
    Some((
        err,
        LinkFit {
            alpha: t.alpha,
            beta: 1.0 / t.inv_beta,
            link_share: sigma,
            eager_bytes: limit(st.eager),
            rendezvous: t.rdv,
            eager_slowdown: 1.0 + t.extra / t.inv_beta,
            small_bytes: limit(st.small),
            small_step: t.small,
            typical_error: logs[logs.len() / 2],
        },
    ))
}

/// The small-message path's step, looked for on the sizes up to [`MAX_SMALL`] alone, where
/// neither the cache's edge nor a rendezvous blurs it: `t = α + s·b + [s > S]·q` against a
/// straight line and against a bend (a rate that changes at one size). Returns the index of the last sample at or below `S`, kept only where the
/// step cuts the relative squared error of both by [`STEP_GAIN`], with `t(S)/4 ≤ q ≤ 2·t(S)` (a switch
/// of path is a jump; a smaller one is the bend of an eager rate that changes). (Searched
/// jointly with the eager step over every size, the 8 KiB step of MPICH ch4/UCX was missed
/// in about one `pccl-tune` run in three: a steeper eager rate below a step at 96–128 KiB
/// stood in for it.)
fn small_path(s: &[Sample]) -> Option<usize> {
    let n = s.iter().take_while(|x| x.bytes <= MAX_SMALL as f64).count();
    if n < 6 {
        return None;
    }
    let sq = |rows: &[(Vec<f64>, f64)], x: &[f64]| -> f64 {
        rows.iter()
            .map(|(r, y)| {
                let m: f64 = r.iter().zip(x).map(|(a, b)| a * b).sum();
                (m / y - 1.0).powi(2)
            })
            .sum()
    };
    let flat: Vec<(Vec<f64>, f64)> = s[..n]
        .iter()
        .map(|x| (vec![1.0, x.bytes], x.seconds))
        .collect();
    let flat_err = sq(&flat, &weighted(&flat)?);
    // The best bend (a rate that changes at a size, no jump), what an eager rate slower than
    // the rendezvous one looks like here.
    let bend_err = (1..n - 2)
        .filter_map(|j| {
            let rows: Vec<(Vec<f64>, f64)> = s[..n]
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let past = if i > j { x.bytes - s[j].bytes } else { 0.0 };
                    (vec![1.0, x.bytes, past], x.seconds)
                })
                .collect();
            weighted(&rows).map(|x| sq(&rows, &x))
        })
        .fold(flat_err, f64::min);
    let mut best: Option<(f64, usize)> = None;
    for j in 1..n - 2 {
        let rows: Vec<(Vec<f64>, f64)> = s[..n]
            .iter()
            .enumerate()
            .map(|(i, x)| (vec![1.0, x.bytes, f64::from(u8::from(i > j))], x.seconds))
            .collect();
        let Some(x) = weighted(&rows) else { continue };
        let jump = x[2] / s[j].seconds;
        if x[0] <= 0.0 || x[1] <= 0.0 || !(0.25..=2.0).contains(&jump) {
            continue;
        }
        let e = sq(&rows, &x);
        if best.is_none_or(|b| e < b.0) {
            best = Some((e, j));
        }
    }
    let (e, j) = best?;
    (bend_err > n as f64 * 1e-8 && e <= STEP_GAIN * bend_err).then_some(j)
}

/// Fits the link terms to `samples` (increasing sizes, at least 4 with positive times);
/// `cache_ratio` is the cache's copy rate over memory's (≤ 1: no tier, the share is moot and
/// reported as 1); `step`: whether the transport has a protocol to look for (MPI; not
/// PCCL's own threads and TCP transports, whose curve's bumps are the host's `memcpy`
/// quirks, not a protocol). With `step`: first the small-message path's step
/// ([`small_path`]), then an eager/rendezvous step above it at most at [`MAX_EAGER`], kept
/// only when it cuts the squared log error by [`STEP_GAIN`]. A lone step is reported as the
/// eager one. `None` when no candidate fits with positive α and β.
pub fn fit(samples: &[Sample], cache_ratio: f64, step: bool) -> Option<LinkFit> {
    let s: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|x| x.seconds > 0.0 && x.bytes > 0.0 && x.seconds.is_finite())
        .collect();
    if s.len() < 4 {
        return None;
    }
    let cached = cache_ratio > 1.0 && s.iter().any(|x| x.hit > 0.0);
    let sigmas: Vec<f64> = if cached {
        (0..=20).map(|i| f64::from(i) / 20.0).collect()
    } else {
        vec![1.0]
    };
    let best_of = |steps: &[Steps]| {
        let mut best: Option<(f64, LinkFit)> = None;
        for &sigma in &sigmas {
            for &k in steps {
                if let Some(c) = candidate(&s, cache_ratio.max(1.0), sigma, k) {
                    if best.as_ref().is_none_or(|b| c.0 < b.0) {
                        best = Some(c);
                    }
                }
            }
        }
        best
    };
    let small = if step { small_path(&s) } else { None };
    let mut kept = best_of(&[Steps { small, eager: None }]);
    if !step {
        return kept.map(|k| k.1);
    }
    // An eager step needs two sizes on each side (and above the small path's step).
    let last = s.len().saturating_sub(2);
    let from = small.map_or(1, |j| j + 2);
    let eager: Vec<Steps> = (from..last)
        .filter(|&k| s[k].bytes <= MAX_EAGER as f64)
        .map(|k| Steps {
            small,
            eager: Some(k),
        })
        .collect();
    // A fit already exact to 0.01% per size needs no further step.
    let exact = s.len() as f64 * 1e-8;
    if let Some(c) = best_of(&eager) {
        if kept
            .as_ref()
            .is_none_or(|k| k.0 > exact && c.0 <= STEP_GAIN * k.0)
        {
            kept = Some(c);
        }
    }
    kept.map(|(_, mut f)| {
        if f.eager_bytes == 0 && f.small_bytes > 0 {
            // One step: the eager limit, as profiles have always named it.
            f.eager_bytes = f.small_bytes;
            f.rendezvous = f.small_step;
            (f.small_bytes, f.small_step) = (0, 0.0);
        }
        f
    })
}

/// The latency α alone, for a transport whose transfer *is* a `memcpy` (PCCL's thread ranks:
/// the receiver copies out of the sender's buffer), so β is memory's copy rate `beta` and
/// the transfers get all of the cache's gain (`cache_ratio`, share 1). Fitting β and the
/// share too leaves them unidentifiable beside the exchange's own copy: on the 2-core test
/// VM three runs gave β from 6 to 161 GB/s with the share from 0 to 100% and the same
/// curve. α minimises the relative squared error (every size alike); `None` with fewer
/// than 4 usable samples.
pub fn fit_latency(samples: &[Sample], beta: f64, cache_ratio: f64) -> Option<LinkFit> {
    let s: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|x| x.seconds > 0.0 && x.bytes > 0.0 && x.seconds.is_finite())
        .collect();
    if s.len() < 4 || beta.is_nan() || beta <= 0.0 {
        return None;
    }
    let rl = cache_ratio.max(1.0);
    let transfer = |x: &Sample| x.bytes * (x.hit / rl + 1.0 - x.hit) / beta;
    // Minimise Σ((α + m)/t − 1)²: α = Σ (t − m)/t² / Σ 1/t².
    let (num, den) = s.iter().fold((0.0, 0.0), |(n, d), x| {
        let w = 1.0 / (x.seconds * x.seconds);
        (n + (x.seconds - transfer(x)) * w, d + w)
    });
    let alpha = (num / den).max(0.0);
    let mut errs: Vec<f64> = s
        .iter()
        .map(|x| ((alpha + transfer(x)) / x.seconds).ln().abs())
        .collect();
    errs.sort_by(f64::total_cmp);
    Some(LinkFit {
        alpha,
        beta,
        link_share: 1.0,
        eager_bytes: 0,
        rendezvous: 0.0,
        eager_slowdown: 1.0,
        small_bytes: 0,
        small_step: 0.0,
        typical_error: errs[errs.len() / 2],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATIO: f64 = 3.7;
    const CACHE: f64 = 8.0 * 1048576.0;

    /// The exchange's samples 1 KiB … 64 MiB (2× steps) as the model gives them, each time
    /// multiplied by `noise(i)`.
    fn curve(f: &LinkFit, noise: impl Fn(usize) -> f64) -> Vec<Sample> {
        (10..=26)
            .enumerate()
            .map(|(i, k)| {
                let bytes = (1u64 << k) as f64;
                let hit = (CACHE / (6.0 * bytes)).min(1.0);
                let rl = 1.0 + f.link_share * (RATIO - 1.0);
                let above = f.eager_bytes > 0 && bytes > f.eager_bytes as f64;
                let small = f.small_bytes > 0 && bytes > f.small_bytes as f64;
                let step =
                    if above { f.rendezvous } else { 0.0 } + if small { f.small_step } else { 0.0 };
                let slow = if above || f.eager_bytes == 0 {
                    1.0
                } else {
                    f.eager_slowdown
                };
                let t = f.alpha + step + slow * bytes * (hit / rl + 1.0 - hit) / f.beta;
                Sample {
                    bytes,
                    seconds: t * noise(i),
                    hit,
                }
            })
            .collect()
    }

    fn mpi_like() -> LinkFit {
        LinkFit {
            alpha: 5.4e-6,
            beta: 6.4e9,
            link_share: 0.1,
            eager_bytes: 8192,
            rendezvous: 12e-6,
            eager_slowdown: 1.0,
            small_bytes: 0,
            small_step: 0.0,
            typical_error: 0.0,
        }
    }

    /// The fit of `f`'s curve with every other size `amp` above and below (a host's jitter).
    fn fit_jittered(f: &LinkFit, amp: f64) -> LinkFit {
        let noise = |i: usize| if i % 2 == 0 { 1.0 + amp } else { 1.0 - amp };
        fit(&curve(f, noise), RATIO, true).unwrap()
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a / b - 1.0).abs() <= tol
    }

    #[test]
    fn a_curve_of_the_model_gives_its_terms_back_step_included() {
        let want = mpi_like();
        let got = fit(&curve(&want, |_| 1.0), RATIO, true).unwrap();
        assert_eq!(got.eager_bytes, 8192, "{got:?}");
        assert!(close(got.alpha, want.alpha, 0.01), "{got:?}");
        assert!(close(got.beta, want.beta, 0.01), "{got:?}");
        assert!(close(got.rendezvous, want.rendezvous, 0.01), "{got:?}");
        assert!((got.link_share - 0.1).abs() < 1e-9, "{got:?}");
        assert!(got.typical_error < 1e-6, "{got:?}");
    }

    #[test]
    fn eager_bytes_slower_than_rendezvous_ones_are_fitted_as_a_slowdown() {
        // MPICH-like: 16 KiB eager messages through shared cells take longer than 32 KiB
        // rendezvous ones.
        let want = LinkFit {
            eager_bytes: 16384,
            rendezvous: 6e-6,
            eager_slowdown: 3.0,
            ..mpi_like()
        };
        let got = fit(&curve(&want, |_| 1.0), RATIO, true).unwrap();
        assert_eq!(got.eager_bytes, 16384, "{got:?}");
        assert!(close(got.eager_slowdown, 3.0, 0.01), "{got:?}");
        assert!(close(got.beta, want.beta, 0.01), "{got:?}");
        assert!(close(got.rendezvous, want.rendezvous, 0.02), "{got:?}");
        // The plain step of `mpi_like` comes back with no slowdown.
        let plain = fit(&curve(&mpi_like(), |_| 1.0), RATIO, true).unwrap();
        assert!(close(plain.eager_slowdown, 1.0, 0.01), "{plain:?}");
    }

    #[test]
    fn the_small_message_paths_step_below_the_eager_limit_is_found_too() {
        // MPICH ch4 over UCX on the test VM: +3 µs above 8 KiB, the rendezvous above 256 KiB.
        let want = LinkFit {
            small_bytes: 8192,
            small_step: 3e-6,
            eager_bytes: 262144,
            rendezvous: 30e-6,
            eager_slowdown: 2.5,
            ..mpi_like()
        };
        let got = fit_jittered(&want, 0.02);
        assert_eq!(
            (got.small_bytes, got.eager_bytes),
            (8192, 262144),
            "{got:?}"
        );
        assert!(close(got.small_step, 3e-6, 0.2), "{got:?}");
        assert!(close(got.rendezvous, 30e-6, 0.2), "{got:?}");
        assert!(close(got.eager_slowdown, 2.5, 0.1), "{got:?}");
        // One step stays one step: no second one made up from noise.
        let one = fit_jittered(&mpi_like(), 0.02);
        assert_eq!((one.small_bytes, one.eager_bytes), (0, 8192), "{one:?}");
    }

    #[test]
    fn the_small_paths_step_survives_a_large_sizes_misfit() {
        // Both steps, and the large sizes off the model by 20–25% (the cache's edge, which the
        // tier does not follow exactly): the global error is then the large sizes', and the
        // 8 KiB step must still be found from the small sizes.
        let want = LinkFit {
            small_bytes: 8192,
            small_step: 3.5e-6,
            eager_bytes: 131072,
            rendezvous: 40e-6,
            eager_slowdown: 4.0,
            ..mpi_like()
        };
        let got = fit(
            &curve(&want, |i| match i {
                12 => 0.75,
                13.. => 1.2,
                _ => 1.0,
            }),
            RATIO,
            true,
        )
        .unwrap();
        assert_eq!(got.small_bytes, 8192, "{got:?}");
        assert!(close(got.small_step, 3.5e-6, 0.3), "{got:?}");
    }

    #[test]
    fn a_jump_too_big_or_too_high_for_a_handshake_is_not_taken_for_a_protocol() {
        // Times that quadruple above 1 MiB (the cache running out) with no protocol below.
        let want = LinkFit {
            eager_bytes: 0,
            rendezvous: 0.0,
            ..mpi_like()
        };
        let s: Vec<Sample> = curve(&want, |_| 1.0)
            .into_iter()
            .map(|x| Sample {
                seconds: if x.bytes > 1048576.0 {
                    4.0 * x.seconds
                } else {
                    x.seconds
                },
                ..x
            })
            .collect();
        let got = fit(&s, RATIO, true).unwrap();
        assert!(got.eager_bytes <= MAX_EAGER, "{got:?}");
        assert!(
            got.eager_bytes == 0 || got.rendezvous <= 2.0 * s[0].seconds.max(1e-3),
            "{got:?}"
        );
    }

    #[test]
    fn a_curve_without_a_step_gets_none_even_with_noise() {
        let want = LinkFit {
            eager_bytes: 0,
            rendezvous: 0.0,
            link_share: 0.6,
            ..mpi_like()
        };
        // ±8% alternating, the jitter of a quiet host.
        let got = fit_jittered(&want, 0.08);
        assert_eq!(got.eager_bytes, 0, "{got:?}");
        assert!(close(got.alpha, want.alpha, 0.15), "{got:?}");
        assert!(close(got.beta, want.beta, 0.15), "{got:?}");
    }

    #[test]
    fn the_step_survives_noise_and_no_cache_tier_leaves_the_share_moot() {
        let want = mpi_like();
        let got = fit(
            &curve(&want, |i| if i % 3 == 0 { 1.1 } else { 0.95 }),
            RATIO,
            true,
        )
        .unwrap();
        assert_eq!(got.eager_bytes, 8192, "{got:?}");
        let flat: Vec<Sample> = curve(&want, |_| 1.0)
            .into_iter()
            .map(|x| Sample { hit: 0.0, ..x })
            .collect();
        let got = fit(&flat, 1.0, true).unwrap();
        assert_eq!(got.link_share, 1.0);
        // A transport without a protocol gets no step, even from a curve with one.
        let got = fit(&curve(&want, |_| 1.0), RATIO, false).unwrap();
        assert_eq!(got.eager_bytes, 0, "{got:?}");
    }

    #[test]
    fn too_few_or_unphysical_samples_give_no_fit() {
        let s = curve(&mpi_like(), |_| 1.0);
        assert!(fit(&s[..3], RATIO, true).is_none());
        // Times that fall with size: no positive β.
        let falling: Vec<Sample> = s
            .iter()
            .enumerate()
            .map(|(i, x)| Sample {
                seconds: 1.0 / (i + 1) as f64,
                ..*x
            })
            .collect();
        assert!(fit(&falling, RATIO, true).is_none());
    }

    #[test]
    fn a_memcpy_transfer_gives_its_latency_back_with_beta_fixed() {
        let truth = LinkFit {
            alpha: 7e-6,
            beta: 6e9,
            link_share: 1.0,
            eager_bytes: 0,
            rendezvous: 0.0,
            eager_slowdown: 1.0,
            small_bytes: 0,
            small_step: 0.0,
            typical_error: 0.0,
        };
        let got = fit_latency(
            &curve(&truth, |i| 1.0 + 0.03 * ((i % 3) as f64 - 1.0)),
            6e9,
            RATIO,
        )
        .unwrap();
        assert!((got.alpha - 7e-6).abs() < 0.5e-6, "{got:?}");
        assert_eq!((got.beta, got.link_share, got.eager_bytes), (6e9, 1.0, 0));
        assert!(fit_latency(&curve(&truth, |_| 1.0)[..3], 6e9, RATIO).is_none());
        assert!(fit_latency(&curve(&truth, |_| 1.0), 0.0, RATIO).is_none());
    }
}
