//! The quantized all-gather on thread-ranks: every element within half its block's step for
//! every dtype × bits × block × shape and every plan (flat, hierarchical, overlapped); zeros
//! exact; a rank that disagrees, passes bad arguments or holds NaN fails the call on every
//! rank, naming it, before any data moves.

use half::{bf16, f16};
use pccl::config::Config;
use pccl::quant::QuantFloat;
use pccl::{Algorithm, Communicator, ErrorKind, Quant, QuantScheme};
use std::time::Duration;

fn cfg(m: usize, algo: Option<&str>) -> Config {
    Config {
        ranks_per_node: Some(m),
        algo: algo.map(|a| a.parse::<Algorithm>().unwrap()),
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// Rank `r`'s shard: mixed scales, a heavy tail, exact zeros.
fn shard(r: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = ((i * 7919 + r * 104_729) % 2003) as f32 / 1001.0 - 1.0;
            match i % 13 {
                0 => 0.0,
                1 => x * 3e3,
                _ => x * (1 + r) as f32,
            }
        })
        .collect()
}

/// Checks rank `r`'s decoded shard against its input, element by element.
fn check_shard<T: QuantFloat>(q: Quant, input: &[T], got: &[T], tag: &str) {
    for (b, (xs, ys)) in input.chunks(q.block).zip(got.chunks(q.block)).enumerate() {
        let step = xs.iter().fold(0f32, |m, v| m.max(v.to_f32().abs())) / q.q_max();
        let out_rounding = if std::mem::size_of::<T>() == 2 {
            4e-3
        } else {
            1e-6
        };
        for (i, (x, y)) in xs.iter().zip(ys).enumerate() {
            let (x, y) = (x.to_f32(), y.to_f32());
            if x == 0.0 {
                assert_eq!(
                    y,
                    0.0,
                    "{tag}: element {} is zero, got {y}",
                    b * q.block + i
                );
            }
            let tol = step / 2.0 * 1.0001 + y.abs() * out_rounding;
            assert!(
                (x - y).abs() <= tol,
                "{tag}: element {}: sent {x}, got {y} (step {step})",
                b * q.block + i
            );
        }
    }
}

fn run<T: QuantFloat>(p: usize, m: usize, algo: Option<&str>, q: Quant, n: usize) {
    let tag = format!(
        "{p} ranks ({m}/node) {} {}-bit block {} count {n} {}",
        algo.unwrap_or("tuned"),
        q.bits,
        q.block,
        std::any::type_name::<T>()
    );
    Communicator::run_threads(p, cfg(m, algo), |c| {
        let mine: Vec<T> = shard(c.rank(), n).into_iter().map(T::from_f32).collect();
        let mut out = vec![T::from_f32(7.0); n * p];
        c.all_gather_quantized(&mine, &mut out, q)
            .unwrap_or_else(|e| panic!("{tag}: {e}"));
        for r in 0..p {
            let want: Vec<T> = shard(r, n).into_iter().map(T::from_f32).collect();
            check_shard(
                q,
                &want,
                &out[r * n..(r + 1) * n],
                &format!("{tag}, rank {r}'s shard"),
            );
        }
    })
    .unwrap();
}

#[test]
fn every_element_is_within_half_a_step_for_every_plan_dtype_width_and_shape() {
    let plans: &[(usize, usize, Option<&str>)] = &[
        (1, 1, None),
        (2, 1, Some("ring")),
        (3, 1, Some("rd")),
        (4, 2, Some("hier-rd")),
        (6, 3, Some("hier-ring-rd")),
        (8, 4, Some("hier-rd-pipe4")),
        (5, 2, None),
    ];
    for &(p, m, algo) in plans {
        for bits in [8, 4] {
            for (block, n) in [(32usize, 1usize), (32, 95), (2048, 4099), (8192, 100)] {
                let q = Quant {
                    bits,
                    block,
                    allow_nonfinite: false,
                };
                run::<f32>(p, m, algo, q, n);
                run::<bf16>(p, m, algo, q, n);
                run::<f16>(p, m, algo, q, n);
            }
        }
    }
    // An empty shard is a valid call.
    run::<f32>(3, 1, None, Quant::INT8, 0);
}

#[test]
fn int8_moves_about_half_the_bytes_of_bf16_and_int4_a_quarter() {
    let q8 = Quant::INT8;
    let q4 = Quant { bits: 4, ..q8 };
    let n = 1 << 20;
    let bf16_bytes = 2 * n;
    let r8 = bf16_bytes as f64 / q8.record_bytes(n) as f64;
    let r4 = bf16_bytes as f64 / q4.record_bytes(n) as f64;
    assert!(
        r8 >= 1.99 && r4 >= 3.98,
        "INT8 {r8:.3}x, INT4 {r4:.3}x fewer than bf16"
    );
}

#[test]
fn a_rank_that_disagrees_fails_the_call_on_every_rank_naming_it() {
    let out = Communicator::run_threads(4, cfg(2, None), |c| {
        let q = Quant {
            block: if c.rank() == 2 { 64 } else { 128 },
            ..Quant::INT8
        };
        let mine = vec![1f32; 256];
        let mut o = vec![0f32; 1024];
        let e = c.all_gather_quantized(&mine, &mut o, q).unwrap_err();
        assert!(o.iter().all(|&v| v == 0.0), "nothing may be written");
        (e.kind(), e.message().to_string())
    })
    .unwrap();
    for (r, (k, m)) in out.iter().enumerate() {
        assert_eq!(*k, ErrorKind::InvalidArgument, "rank {r}: {m}");
        assert!(
            m.contains("disagree") && m.contains("rank 2: 8 bits, block 64"),
            "rank {r}: {m}"
        );
    }
    // The communicator is still usable.
    Communicator::run_threads(2, cfg(1, None), |c| {
        let bits = if c.rank() == 0 { 8 } else { 4 };
        let q = Quant {
            bits,
            ..Quant::INT8
        };
        assert!(c
            .all_gather_quantized(&[1f32; 4], &mut [0f32; 8], q)
            .is_err());
        let mut o = [0f32; 8];
        c.all_gather_quantized(&[1f32; 4], &mut o, Quant::INT8)
            .unwrap();
        assert_eq!(o, [1f32; 8]);
    })
    .unwrap();
}

#[test]
fn nan_or_bad_arguments_on_one_rank_fail_every_rank_before_any_data_moves() {
    let out = Communicator::run_threads(3, cfg(1, None), |c| {
        let mut mine = vec![0.5f32; 64];
        if c.rank() == 1 {
            mine[10] = f32::NAN;
        }
        let mut o = vec![0f32; 192];
        let e = c
            .all_gather_quantized(&mine, &mut o, Quant::INT8)
            .unwrap_err();
        assert!(o.iter().all(|&v| v == 0.0));
        let nan = e.message().to_string();
        // Opting in: the NaN's block comes back NaN, the others as sent.
        let allow = Quant {
            allow_nonfinite: true,
            block: 32,
            ..Quant::INT8
        };
        c.all_gather_quantized(&mine, &mut o, allow).unwrap();
        assert!(o[64..96].iter().all(|v| v.is_nan()));
        assert!(o[96..128].iter().all(|&v| (v - 0.5).abs() < 0.01));
        // A short output on rank 0, a bad block on rank 2.
        let short = if c.rank() == 0 { 100 } else { 192 };
        let q = Quant {
            block: if c.rank() == 2 { 48 } else { 64 },
            ..Quant::INT8
        };
        let e2 = c
            .all_gather_quantized(&[1f32; 64], &mut vec![0f32; short], q)
            .unwrap_err();
        (nan, e2.kind(), e2.message().to_string())
    })
    .unwrap();
    for (r, (nan, k, m)) in out.iter().enumerate() {
        assert!(nan.contains("rank(s) 1 holds NaN"), "rank {r}: {nan}");
        assert_eq!(*k, ErrorKind::InvalidArgument);
        assert!(
            m.contains("rank(s) 0, 2 passed unsound arguments"),
            "rank {r}: {m}"
        );
    }
}

/// Reduce-scatter inputs whose every element has exactly one contributing rank, ±1: the
/// quantized sums are exact, so the output shows whether each element holds its one
/// contribution exactly once (0 or 2 if it were lost or doubled) from the right rank (sign).
#[test]
fn reduce_scatter_quantized_holds_each_contribution_exactly_once() {
    // (ranks, per node): one hop (one node, one rank per node, uneven nodes) and two hops.
    for &(p, m) in &[
        (1, 1),
        (3, 1),
        (4, 4),
        (5, 2),
        (4, 2),
        (6, 3),
        (7, 1),
        (8, 2),
        (8, 4),
        (12, 2),
    ] {
        for (bits, scheme) in [8, 4]
            .into_iter()
            .flat_map(|b| [QuantScheme::TwoHop, QuantScheme::Halving].map(|s| (b, s)))
        {
            let n = 70; // several quantization blocks of 32, one partial
            let q = Quant {
                bits,
                block: 32,
                allow_nonfinite: false,
            };
            let owner = |dst: usize, e: usize| (dst * 5 + e * 3) % p;
            let sign = |r: usize| if r % 2 == 0 { 1.0f32 } else { -1.0 };
            Communicator::run_threads(p, cfg(m, None), |c| {
                let me = c.rank();
                let input = owned_input(p, n, me, owner, sign);
                let mut out = vec![9f32; n];
                c.reduce_scatter_quantized_with(&input, &mut out, q, false, scheme)
                    .unwrap_or_else(|e| panic!("{p} ranks ({m}/node) {bits}-bit {scheme:?}: {e}"));
                for (e, &v) in out.iter().enumerate() {
                    assert_eq!(
                        v,
                        sign(owner(me, e)),
                        "{p} ranks ({m}/node) {bits}-bit {scheme:?}: rank {me} element {e}"
                    );
                }
                // Twice on the same communicator (the levels are split once).
                let mut again = vec![0f32; n];
                c.reduce_scatter_quantized_with(&input, &mut again, q, true, scheme)
                    .unwrap();
                assert!(again
                    .iter()
                    .zip(&out)
                    .all(|(a, o)| (a - o / p as f32).abs() < 1e-7));
            })
            .unwrap();
        }
    }
}

/// A reduce-scatter input in which element `e` of block `dst` comes from one rank only,
/// `owner(dst, e)`, as `sign(owner)` (zero on every other rank): exact at any quantization
/// step, so the sum shows each contribution counted exactly once.
fn owned_input(
    p: usize,
    n: usize,
    me: usize,
    owner: impl Fn(usize, usize) -> usize,
    sign: impl Fn(usize) -> f32,
) -> Vec<f32> {
    (0..p * n)
        .map(|i| {
            let (dst, e) = (i / n, i % n);
            if owner(dst, e) == me {
                sign(me)
            } else {
                0.0
            }
        })
        .collect()
}

/// Element `i` of rank `r`'s data for the error-bound tests: uniform in [-1, 1), or with
/// `tail` every 97th element 1000× larger (heavy-tailed).
fn sample(r: usize, i: usize, tail: bool) -> f32 {
    let x = ((i * 2654435761 + r * 40503) % 10007) as f32 / 5003.5 - 1.0;
    if tail && i % 97 == 0 {
        x * 1e3
    } else {
        x
    }
}

/// The documented bound on random and heavy-tailed data, every dtype, both widths and both
/// schemes; prints the measured error against the exact f32 reduce-scatter.
#[test]
fn reduce_scatter_quantized_stays_within_its_error_bound() {
    for &(p, m, scheme) in &[
        (4, 1, QuantScheme::TwoHop),
        (8, 2, QuantScheme::TwoHop),
        (4, 1, QuantScheme::Halving),
        (6, 1, QuantScheme::Halving),
        (8, 2, QuantScheme::Halving),
        (12, 2, QuantScheme::Halving),
    ] {
        for bits in [8u32, 4] {
            for tail in [false, true] {
                let q = Quant {
                    bits,
                    block: 64,
                    allow_nonfinite: false,
                };
                let n = 300;
                let data = |r: usize, i: usize| sample(r, i, tail);
                let qmax = q.q_max();
                let out = Communicator::run_threads(p, cfg(m, None), |c| {
                    let me = c.rank();
                    let input: Vec<f32> = (0..p * n).map(|i| data(me, i)).collect();
                    let mut out = vec![0f32; n];
                    c.reduce_scatter_quantized_with(&input, &mut out, q, false, scheme)
                        .unwrap();
                    let mut b16 = vec![bf16::from_f32(0.0); n];
                    let in16: Vec<bf16> = input.iter().map(|&v| bf16::from_f32(v)).collect();
                    c.reduce_scatter_quantized_with(&in16, &mut b16, q, false, scheme)
                        .unwrap();
                    (out, b16)
                })
                .unwrap();
                let (mut worst, mut sq, mut norm) = (0f64, 0f64, 0f64);
                for (me, (got, got16)) in out.iter().enumerate() {
                    for e in 0..n {
                        let i = me * n + e;
                        let exact: f32 = (0..p).map(|r| data(r, i)).sum();
                        // A loose form of the bound: every contributor's largest magnitude
                        // over this rank's whole payload, and the partial sums' largest.
                        let s1: f32 = (0..p)
                            .map(|r| (0..p * n).map(|k| data(r, k).abs()).fold(0f32, f32::max))
                            .sum::<f32>()
                            / qmax;
                        let s2 = if m > 1 && p > m {
                            (p / m) as f32
                                * (0..p * n)
                                    .map(|k| (0..p).map(|r| data(r, k)).sum::<f32>().abs())
                                    .fold(0f32, f32::max)
                                / qmax
                        } else {
                            0.0
                        };
                        // Halving: one quantized partial sum per step of each level (plus
                        // the fold-in off a power of two), each at most the sum of every
                        // contributor's largest magnitude.
                        let level = |k: usize| {
                            k.next_power_of_two().trailing_zeros() as f32
                                + f32::from(u8::from(!k.is_power_of_two()))
                        };
                        let steps = if m > 1 && p > m {
                            level(m) + level(p / m)
                        } else {
                            level(p)
                        };
                        let bound = match scheme {
                            QuantScheme::TwoHop | QuantScheme::PerLevel => (s1 + s2) / 2.0 * 1.001,
                            QuantScheme::Halving => steps * s1 / 2.0 * 1.001,
                        };
                        let err = (got[e] - exact).abs();
                        assert!(
                            err <= bound,
                            "{p} ranks {bits}-bit tail {tail}: rank {me} element {e}: {} vs {exact}, bound {bound}",
                            got[e]
                        );
                        let err16 = (got16[e].to_f32() - exact).abs();
                        assert!(
                            err16 <= bound + exact.abs() * 1e-2 + 0.05,
                            "bf16: {err16} > {bound}"
                        );
                        worst = worst.max(f64::from(err));
                        sq += f64::from(err).powi(2);
                        norm += f64::from(exact).powi(2);
                    }
                }
                println!(
                    "reduce_scatter_quantized {scheme:?} {p} ranks ({m}/node) INT{bits}, {}: max error {worst:.4}, relative RMS error {:.4}",
                    if tail { "heavy-tailed" } else { "uniform" },
                    (sq / norm).sqrt()
                );
            }
        }
    }
}

#[test]
fn reduce_scatter_quantized_refuses_nan_and_disagreement_on_every_rank() {
    let out = Communicator::run_threads(4, cfg(2, None), |c| {
        let mut x = vec![1f32; 4 * 40];
        if c.rank() == 3 {
            x[7] = f32::INFINITY;
        }
        let mut o = vec![0f32; 40];
        let nan = c
            .reduce_scatter_quantized(&x, &mut o, Quant::INT8, false)
            .unwrap_err();
        let q = Quant {
            bits: if c.rank() == 1 { 4 } else { 8 },
            ..Quant::INT8
        };
        let differ = c
            .reduce_scatter_quantized(&[1f32; 160], &mut o, q, false)
            .unwrap_err();
        let scheme = if c.rank() == 2 {
            QuantScheme::Halving
        } else {
            QuantScheme::TwoHop
        };
        let schemes = c
            .reduce_scatter_quantized_with(&[1f32; 160], &mut o, Quant::INT8, false, scheme)
            .unwrap_err();
        // Still usable afterwards.
        c.reduce_scatter_quantized(&[1f32; 160], &mut o, Quant::INT8, false)
            .unwrap();
        assert!(o.iter().all(|&v| v == 4.0));
        (
            nan.message().to_string(),
            differ.message().to_string(),
            schemes.message().to_string(),
        )
    })
    .unwrap();
    for (r, (nan, differ, schemes)) in out.iter().enumerate() {
        assert!(nan.contains("rank(s) 3 holds NaN"), "rank {r}: {nan}");
        assert!(differ.contains("rank 1: 4 bits"), "rank {r}: {differ}");
        assert!(schemes.contains("scheme halving"), "rank {r}: {schemes}");
    }
}

fn cfg_groups(m: usize, g: usize) -> Config {
    Config {
        group_size: Some(g),
        ..cfg(m, None)
    }
}

/// The per-level scheme (one quantized all-to-all per level: group, node, network) on
/// shapes with groups, one node, and none: every contribution exactly once (±1 values are
/// exact at any step, so the sum must be too).
#[test]
fn per_level_reduce_scatter_holds_each_contribution_exactly_once() {
    // (ranks, per node, per group, whether the groups make a level)
    for &(p, m, g, grouped) in &[
        (8, 4, 2, true),
        (12, 6, 3, true),
        (12, 6, 2, true),
        (16, 8, 2, true),
        (8, 8, 2, true),
        (6, 6, 3, true),
        (4, 2, 2, false),
        (8, 4, 1, false),
        (5, 1, 1, false),
    ] {
        for bits in [8, 4] {
            let n = 70;
            let q = Quant {
                bits,
                block: 32,
                allow_nonfinite: false,
            };
            let owner = |dst: usize, e: usize| (dst * 7 + e * 3) % p;
            let sign = |r: usize| if r % 3 == 0 { -1.0f32 } else { 1.0 };
            Communicator::run_threads(p, cfg_groups(m, g), |c| {
                assert_eq!(c.topology().has_groups(), grouped, "{p}x{m}/g{g}");
                let me = c.rank();
                let input = owned_input(p, n, me, owner, sign);
                for round in 0..2 {
                    let mut out = vec![9f32; n];
                    c.reduce_scatter_quantized_with(&input, &mut out, q, false, QuantScheme::PerLevel)
                        .unwrap_or_else(|e| panic!("{p} ranks ({m}/node, g{g}) {bits}-bit: {e}"));
                    for (e, &v) in out.iter().enumerate() {
                        assert_eq!(
                            v,
                            sign(owner(me, e)),
                            "{p} ranks ({m}/node, g{g}) {bits}-bit round {round}: rank {me} element {e}"
                        );
                    }
                }
            })
            .unwrap();
        }
    }
}

/// The per-level scheme's error: at most half a step per quantized piece an element passed
/// through — each contributor's block, each group's partial sum, each node's — so within
/// `3 · Σ_r max|x_r| / (2 · q_max)` with three levels; the measured error is printed next to
/// the two-hop scheme's on the same data.
#[test]
fn per_level_reduce_scatter_stays_within_its_error_bound() {
    let (p, m, g, n) = (8, 4, 2, 300);
    for bits in [8u32, 4] {
        for tail in [false, true] {
            let q = Quant {
                bits,
                block: 64,
                allow_nonfinite: false,
            };
            let data = |r: usize, i: usize| sample(r, i, tail);
            let out = Communicator::run_threads(p, cfg_groups(m, g), |c| {
                let input: Vec<f32> = (0..p * n).map(|i| data(c.rank(), i)).collect();
                let mut per = vec![0f32; n];
                c.reduce_scatter_quantized_with(&input, &mut per, q, false, QuantScheme::PerLevel)
                    .unwrap();
                let mut two = vec![0f32; n];
                c.reduce_scatter_quantized_with(&input, &mut two, q, false, QuantScheme::TwoHop)
                    .unwrap();
                (per, two)
            })
            .unwrap();
            let s: f32 = (0..p)
                .map(|r| (0..p * n).map(|k| data(r, k).abs()).fold(0f32, f32::max))
                .sum();
            let bound = 3.0 * s / (2.0 * q.q_max()) * 1.01;
            let (mut worst, mut worst2) = (0f32, 0f32);
            for (me, (per, two)) in out.iter().enumerate() {
                for e in 0..n {
                    let exact: f32 = (0..p).map(|r| data(r, me * n + e)).sum();
                    let err = (per[e] - exact).abs();
                    assert!(
                        err <= bound,
                        "INT{bits} tail {tail}: rank {me} element {e}: {} vs {exact}, bound {bound}",
                        per[e]
                    );
                    worst = worst.max(err);
                    worst2 = worst2.max((two[e] - exact).abs());
                }
            }
            println!(
                "reduce_scatter_quantized PerLevel {p} ranks ({m}/node, groups of {g}) INT{bits}, {}: max error {worst:.4} (two-hop {worst2:.4}), bound {bound:.4}",
                if tail { "heavy-tailed" } else { "uniform" }
            );
        }
    }
}

/// A rank that asks for another scheme, or brings a NaN, fails the per-level call on every
/// rank (named), before any piece moves; the next call is right.
#[test]
fn per_level_refusals_reach_every_rank() {
    let out = Communicator::run_threads(8, cfg_groups(4, 2), |c| {
        let me = c.rank();
        let scheme = if me == 5 {
            QuantScheme::TwoHop
        } else {
            QuantScheme::PerLevel
        };
        let mut o = vec![0f32; 40];
        let differ = c
            .reduce_scatter_quantized_with(&[1f32; 320], &mut o, Quant::INT8, false, scheme)
            .unwrap_err();
        let mut x = vec![1f32; 320];
        if me == 2 {
            x[100] = f32::NAN;
        }
        let nan = c
            .reduce_scatter_quantized_with(&x, &mut o, Quant::INT8, false, QuantScheme::PerLevel)
            .unwrap_err();
        c.reduce_scatter_quantized_with(
            &[1f32; 320],
            &mut o,
            Quant::INT8,
            false,
            QuantScheme::PerLevel,
        )
        .unwrap();
        assert!(o.iter().all(|&v| v == 8.0), "{o:?}");
        (differ.message().to_string(), nan.message().to_string())
    })
    .unwrap();
    for (r, (differ, nan)) in out.iter().enumerate() {
        assert!(differ.contains('5'), "rank {r}: {differ}");
        assert!(
            nan.contains('2') && nan.to_lowercase().contains("nan"),
            "rank {r}: {nan}"
        );
    }
}
