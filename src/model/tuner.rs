//! Picks the algorithm (flat or hierarchical, each level's algorithm) and the piece size with
//! the lowest simulated time for a collective, message size and topology (nodes, ranks per
//! node, NIC map), and parses `PCCL_ALGO` overrides.
//!
//! Every rank must choose the same algorithm: the simulation depends only on the topology,
//! the profile and the size, never on the calling rank.

use super::cost::CostParams;
use super::profile::Profile;
use super::sim::{Cluster, Engine, Job};
use crate::error::{Error, Result};
use crate::plan::{Algorithm, Collective, LevelAlgo};
use crate::topology::Topology;

/// The algorithms worth considering on `topo`: the flat ones, the two-level ones on equal
/// nodes, the three-level ones where the nodes are cut into groups.
pub fn candidates(topo: &Topology) -> Vec<Algorithm> {
    let mut v = vec![
        Algorithm::Flat(LevelAlgo::Ring),
        Algorithm::Flat(LevelAlgo::Rd),
    ];
    if let Some(m) = topo.ranks_per_node() {
        if m > 1 && topo.nodes().len() > 1 {
            for inter in [LevelAlgo::Rd, LevelAlgo::Ring] {
                for intra in [LevelAlgo::Ring, LevelAlgo::Rd] {
                    v.push(Algorithm::Hier { inter, intra });
                }
            }
        }
    }
    // Three levels where the nodes are cut into groups (after the two-level ones: ties
    // keep the older choice).
    if topo.has_groups() && topo.nodes().len() > 1 {
        v.extend(Algorithm::three_level_forms());
    }
    v
}

/// Pieces per block the tuner tries for an overlapped hierarchy (`hier-*-pipeK`).
pub const OVERLAP_PIECES: [usize; 4] = [2, 4, 8, 16];

/// The smallest piece of a block worth overlapping: below it the extra phases' latency
/// outweighs any overlap (the model would say so too, at the cost of more simulations).
pub const MIN_OVERLAP_PIECE_BYTES: usize = 4 << 10;

/// The default of `PCCL_TUNE_OVERLAP_MARGIN`: how much faster than the best plain candidate
/// an overlapped hierarchy must be predicted for the tuner to take it. 0: the model's
/// fastest as is.
///
/// It was 0.05 until 2026-12-07: an overlapped form runs `K` times the phases and messages,
/// and on the 2-core VM of 2026-11 forms the model put 0.5–2% ahead of the plain hierarchy
/// measured 4–8% behind (before the model priced a phase's per-message core time). On the
/// emulated cluster with profiles measured in it the margin only cost: at four NICs, 4×4 and
/// 8×2, all three collectives at 1 KiB–1 MiB, `auto` with it was within 10% of the best
/// fixed algorithm at 61 of 66 points and without it at 66 of 66 (where the two chose
/// differently, 18 points, without it was faster at 16, median 0.982); at 4–16 MiB it kept
/// the 8×2 all-reduce on `hier-rd`, 1.13–1.21× the best (docs/CLUSTER.md). The margin stays
/// for hosts whose per-phase costs the model misses.
pub const OVERLAP_MARGIN: f64 = 0.0;

/// The default of `PCCL_TUNE_MARGIN`: how much faster than the simpler form it would replace
/// a more involved one must be predicted, per step of involvement ([`involvement`]): each
/// doubling of an overlapped hierarchy's pieces beyond two, and recursive doubling inside the
/// node where the ring would do. 0: the model's fastest as is.
///
/// It was 0.05 from 2026-11-29: on the emulated cluster `auto` then missed the best fixed
/// algorithm wherever it took `hier-rd-rd` or a pipeline of 8 or 16 pieces, and the margin
/// kept it off them (45–51 of 66 points within 10% against 38–45). Those misses were BBR's
/// misreading of the shaped NICs, which stalls connections that idle between turns; with
/// cubic on the same cluster (2026-12-01, docs/CLUSTER.md) the pure model's choice was within
/// 10% at 60 and 64 of 66 points and the margin's at 58 and 57, so the default went back to
/// the pure model. The margin stays for hosts whose costs the model misses the same way.
pub const TIE_MARGIN: f64 = 0.0;

/// Steps of involvement the tuner charges `algo` in near-ties ([`TIE_MARGIN`]): one per
/// doubling of its pieces beyond two, one for recursive doubling inside the node of a
/// two-level hierarchy.
pub fn involvement(algo: Algorithm) -> i32 {
    let p = algo.pieces();
    let pipe = if p > 2 { p.ilog2() as i32 - 1 } else { 0 };
    let intra_rd = match algo {
        Algorithm::Hier {
            intra: LevelAlgo::Rd,
            ..
        }
        | Algorithm::Overlap {
            intra: LevelAlgo::Rd,
            ..
        } => 1,
        _ => 0,
    };
    pipe + intra_rd
}

/// `seconds` as the tuner weighs `algo` against simpler forms under `margin`.
fn weighed(algo: Algorithm, seconds: f64, margin: f64) -> f64 {
    seconds * (1.0 + margin).powi(involvement(algo))
}

/// Piece sizes the tuner compares for the chosen algorithm.
pub const PIECES: [usize; 4] = [256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// The tuner's answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The fastest algorithm.
    pub algo: Algorithm,
    /// Its best piece size: the communicator runs the call with it (the transports cut
    /// messages at it, [`crate::exec::ExecOptions::piece`]) unless `PCCL_CHUNK_SIZE` is set.
    pub piece_bytes: usize,
    /// Its predicted seconds with the profile's piece size.
    pub seconds: f64,
}

/// Simulated seconds of `coll` with `algo` on `topo`, blocks of `block_bytes`.
pub fn predict(
    coll: Collective,
    algo: Algorithm,
    topo: &Topology,
    block_bytes: f64,
    prof: &Profile,
) -> Result<f64> {
    // The phase engine times node 0's ranks and assumes every node acts alike; whole-vector
    // doubling on a non-power of two is not node-symmetric (the top ranks only fold in and
    // wait), so it is timed event by event.
    let symmetric = algo != Algorithm::VectorRd || topo.nranks().is_power_of_two();
    let engine = if topo.is_regular() && symmetric {
        Engine::Phases
    } else {
        Engine::Events
    };
    Ok(Cluster::new(topo, prof)
        .simulate(&Job::new(coll, algo, block_bytes), engine)?
        .seconds)
}

/// The best algorithm for `coll` on `topo` with blocks of `block_bytes`, with every
/// candidate's predicted seconds (for `PCCL_DEBUG=INFO`), with the default near-tie margin
/// ([`TIE_MARGIN`]: none, the model's fastest).
pub fn choose_with(
    coll: Collective,
    topo: &Topology,
    block_bytes: usize,
    prof: &Profile,
) -> Result<(Choice, Vec<(Algorithm, f64)>)> {
    choose_with_margin(coll, topo, block_bytes, prof, TIE_MARGIN)
}

/// [`choose_with`] with the near-tie margin `margin` (`PCCL_TUNE_MARGIN`; 0: the pure
/// model) and the default [`OVERLAP_MARGIN`]. Every rank must use the same margins.
pub fn choose_with_margin(
    coll: Collective,
    topo: &Topology,
    block_bytes: usize,
    prof: &Profile,
    margin: f64,
) -> Result<(Choice, Vec<(Algorithm, f64)>)> {
    choose_with_margins(coll, topo, block_bytes, prof, margin, OVERLAP_MARGIN)
}

/// [`choose_with_margin`] with the overlapped hierarchies' margin `overlap`
/// (`PCCL_TUNE_OVERLAP_MARGIN`; 0 with `margin` 0: the model's fastest as is).
pub fn choose_with_margins(
    coll: Collective,
    topo: &Topology,
    block_bytes: usize,
    prof: &Profile,
    margin: f64,
    overlap: f64,
) -> Result<(Choice, Vec<(Algorithm, f64)>)> {
    let mut scored = Vec::new();
    let mut cands = candidates(topo);
    if matches!(coll, Collective::AllReduce { .. }) {
        // Latency-optimal for small vectors; last, so ties keep the older choices.
        cands.push(Algorithm::VectorRd);
    }
    for a in cands {
        scored.push((a, predict(coll, a, topo, block_bytes as f64, prof)?));
    }
    // Each hierarchy overlapped in the piece count the model likes best (one entry each).
    if topo.is_regular() {
        let hier: Vec<Algorithm> = scored
            .iter()
            .map(|s| s.0)
            .filter(|a| matches!(a, Algorithm::Hier { .. } | Algorithm::Deep { .. }))
            .collect();
        for h in hier {
            let mut best: Option<(Algorithm, f64)> = None;
            for k in OVERLAP_PIECES {
                if block_bytes / k < MIN_OVERLAP_PIECE_BYTES {
                    break;
                }
                let Some(a) = h.overlapped(k) else { continue };
                let t = predict(coll, a, topo, block_bytes as f64, prof)?;
                if best.is_none_or(|b| weighed(a, t, margin) < weighed(b.0, b.1, margin)) {
                    best = Some((a, t));
                }
            }
            scored.extend(best);
        }
    }
    let (algo, seconds) = pick_with(&scored, margin, overlap);
    let piece_bytes = best_piece(coll, algo, topo, block_bytes, prof, seconds)?;
    Ok((
        Choice {
            algo,
            piece_bytes,
            seconds,
        },
        scored,
    ))
}

/// [`pick_with`] with the default [`OVERLAP_MARGIN`].
#[cfg(test)]
fn pick(scored: &[(Algorithm, f64)], margin: f64) -> (Algorithm, f64) {
    pick_with(scored, margin, OVERLAP_MARGIN)
}

/// The fastest of `scored` as weighed under `margin` ([`weighed`]), where an overlapped
/// hierarchy must also beat the fastest plain candidate by `overlap` ([`OVERLAP_MARGIN`]).
/// Ties (equal to the last bit) go to the first candidate: the same on every rank. Returns
/// the chosen algorithm with its predicted (unweighed) seconds.
fn pick_with(scored: &[(Algorithm, f64)], margin: f64, overlap: f64) -> (Algorithm, f64) {
    let w = |x: &(Algorithm, f64)| weighed(x.0, x.1, margin);
    let fastest = |overlapped: bool| {
        scored
            .iter()
            .copied()
            .filter(|(a, _)| (a.pieces() > 1) == overlapped)
            .min_by(|x, y| w(x).total_cmp(&w(y)))
    };
    match (fastest(false), fastest(true)) {
        (Some(plain), Some(over)) if w(&over) >= w(&plain) * (1.0 - overlap) => plain,
        (plain, over) => over
            .into_iter()
            .chain(plain)
            .min_by(|x, y| w(x).total_cmp(&w(y)))
            .unwrap_or((Algorithm::Flat(LevelAlgo::Ring), 0.0)),
    }
}

/// The piece size of the profile's candidates (else [`PIECES`]) with which `algo` is
/// predicted fastest; the profile's own unless one beats `seconds`, its time with it.
pub fn best_piece(
    coll: Collective,
    algo: Algorithm,
    topo: &Topology,
    block_bytes: usize,
    prof: &Profile,
    seconds: f64,
) -> Result<usize> {
    let mut piece_bytes = prof.piece_bytes;
    let mut best = seconds;
    let pieces: &[usize] = if prof.piece_candidates.is_empty() {
        &PIECES
    } else {
        &prof.piece_candidates
    };
    for &pb in pieces {
        let p = Profile {
            piece_bytes: pb,
            ..prof.clone()
        };
        let t = predict(coll, algo, topo, block_bytes as f64, &p)?;
        if t < best * (1.0 - 1e-9) {
            best = t;
            piece_bytes = pb;
        }
    }
    Ok(piece_bytes)
}

/// The older entry point: the best algorithm under the five `PCCL_MODEL` parameters.
pub fn choose(
    coll: Collective,
    topo: &Topology,
    block_bytes: usize,
    prm: &CostParams,
) -> Result<(Algorithm, Vec<(Algorithm, f64)>)> {
    let prof = Profile::default().with_cost_params(prm);
    let (c, scored) = choose_with(coll, topo, block_bytes, &prof)?;
    Ok((c.algo, scored))
}

/// `PCCL_ALGO`: one algorithm for every collective (`hier-rd`), or per collective in
/// NCCL_ALGO style (`allgather:hier-rd;reducescatter:ring`), a bare entry being the default
/// for the collectives not named.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlgoOverrides {
    /// The algorithm for collectives not listed (`None`: the tuner's).
    pub default: Option<Algorithm>,
    /// `(collective name, algorithm)`: `allgather`, `reducescatter`, `allreduce`; `None`
    /// (`allgather:auto`) leaves that collective to the tuner.
    pub per_collective: Vec<(&'static str, Option<Algorithm>)>,
}

const COLLS: [&str; 3] = ["allgather", "reducescatter", "allreduce"];

fn coll_name(c: Collective) -> Option<&'static str> {
    match c {
        Collective::AllGather => Some("allgather"),
        Collective::ReduceScatter { .. } => Some("reducescatter"),
        Collective::AllReduce { .. } => Some("allreduce"),
        _ => None,
    }
}

impl AlgoOverrides {
    /// Parses a `PCCL_ALGO` value (`auto` entries mean the tuner's choice).
    pub fn parse(v: &str) -> Result<Self> {
        let mut o = AlgoOverrides::default();
        for entry in v.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (coll, algo) = match entry.split_once(':') {
                Some((c, a)) => (Some(c.trim().to_ascii_lowercase()), a.trim()),
                None => (None, entry),
            };
            let algo = if algo == "auto" {
                None
            } else {
                Some(
                    algo.parse::<Algorithm>()
                        .map_err(|e| Error::invalid(format!("PCCL_ALGO={v}: {}", e.message())))?,
                )
            };
            match coll {
                None => o.default = algo,
                Some(c) => {
                    let c = c.replace(['_', '-'], "");
                    let name = COLLS.iter().find(|n| **n == c).ok_or_else(|| {
                        Error::invalid(format!(
                            "PCCL_ALGO={v}: unknown collective '{c}', expected allgather, \
                             reducescatter or allreduce"
                        ))
                    })?;
                    o.per_collective.retain(|(n, _)| n != name);
                    o.per_collective.push((name, algo));
                }
            }
        }
        Ok(o)
    }

    /// The forced algorithm for `coll`, if any.
    pub fn get(&self, coll: Collective) -> Option<Algorithm> {
        self.get_or(coll, self.default)
    }

    /// The entry for `coll` when there is one, else `default`.
    pub fn get_or(&self, coll: Collective, default: Option<Algorithm>) -> Option<Algorithm> {
        match coll_name(coll).and_then(|n| self.per_collective.iter().find(|(c, _)| *c == n)) {
            Some(&(_, a)) => a,
            None => default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets;
    use crate::topology::NicMap;

    const HIER_RD: Algorithm = Algorithm::Hier {
        inter: LevelAlgo::Rd,
        intra: LevelAlgo::Ring,
    };

    #[test]
    fn many_small_blocks_across_nodes_prefer_logarithmic_inter_node_steps() {
        let topo = Topology::uniform(64, 4);
        let prm = CostParams {
            alpha_inter: 20e-6,
            ..CostParams::default()
        };
        let (best, _) = choose(Collective::AllGather, &topo, 1024, &prm).unwrap();
        assert!(
            matches!(
                best,
                Algorithm::Flat(LevelAlgo::Rd)
                    | Algorithm::Hier {
                        inter: LevelAlgo::Rd,
                        ..
                    }
                    | Algorithm::Overlap {
                        inter: LevelAlgo::Rd,
                        ..
                    }
            ),
            "{best}"
        );
    }

    #[test]
    fn small_all_reduce_picks_whole_vector_doubling_and_large_does_not() {
        let topo = Topology::uniform(8, 8);
        let prof = Profile::default();
        let ar = Collective::AllReduce { average: false };
        let (small, _) = choose_with(ar, &topo, 8, &prof).unwrap();
        assert_eq!(small.algo, Algorithm::VectorRd);
        let (large, _) = choose_with(ar, &topo, 8 << 20, &prof).unwrap();
        assert_ne!(large.algo, Algorithm::VectorRd);
        // A non-power of two across nodes (timed event by event), at scale too.
        let (c, _) = choose_with(ar, &Topology::uniform(24, 8), 8, &prof).unwrap();
        assert_eq!(c.algo, Algorithm::VectorRd);
        let t0 = std::time::Instant::now();
        let (_, scored) = choose_with(ar, &Topology::uniform(1000, 8), 8, &prof).unwrap();
        assert!(scored.iter().any(|(a, _)| *a == Algorithm::VectorRd));
        assert!(t0.elapsed().as_secs_f64() < 5.0, "{:?}", t0.elapsed());
        // Never offered to the collectives it does not implement.
        let (_, scored) = choose_with(Collective::AllGather, &topo, 8, &prof).unwrap();
        assert!(scored.iter().all(|(a, _)| *a != Algorithm::VectorRd));
    }

    #[test]
    fn a_slow_network_prefers_the_hierarchy() {
        let topo = Topology::uniform(16, 4);
        let prm = CostParams {
            beta_inter: 1.0 / 1e9,
            beta_intra: 1.0 / 50e9,
            ..CostParams::default()
        };
        let (best, _) = choose(Collective::AllGather, &topo, 1 << 20, &prm).unwrap();
        assert!(
            matches!(best, Algorithm::Hier { .. } | Algorithm::Overlap { .. }),
            "{best}"
        );
    }

    /// PCCL's own executor (no NCCL-style multi-channel ring) on Frontier's links, reducing
    /// at the GPU's rate.
    fn frontier_pccl() -> Profile {
        let f = presets::named("frontier").unwrap();
        Profile {
            nccl_ring: false,
            reduce_host_gbps: f.reduce_device_gbps.clone(),
            ..f
        }
    }

    #[test]
    fn frontier_at_256_ranks_and_more_goes_hierarchical_from_16_mib_per_rank() {
        let prof = frontier_pccl();
        for ranks in [256usize, 1024] {
            let topo = Topology::uniform(ranks, 8).with_nic_map(NicMap::even(8, 4));
            for coll in [
                Collective::AllGather,
                Collective::ReduceScatter { average: false },
            ] {
                for mib in [16usize, 64, 256] {
                    let (c, scored) = choose_with(coll, &topo, mib << 20, &prof).unwrap();
                    assert!(
                        matches!(c.algo, Algorithm::Hier { .. } | Algorithm::Overlap { .. }),
                        "{coll:?} {ranks} ranks {mib} MiB: {} {scored:?}",
                        c.algo
                    );
                }
            }
        }
    }

    #[test]
    fn frontier_with_its_gcd_pairs_as_groups_goes_three_levels() {
        // The pair level saves three of the node's seven steps: the tuner takes it where the
        // nodes show pairs, and never offers it where they do not.
        let prof = frontier_pccl();
        let pairs = Topology::uniform(256, 8)
            .with_nic_map(NicMap::even(8, 4))
            .with_groups(2);
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter { average: false },
            Collective::AllReduce { average: false },
        ] {
            for bytes in [256usize, 4096, 65536] {
                let (c, scored) = choose_with(coll, &pairs, bytes, &prof).unwrap();
                assert!(
                    matches!(c.algo, Algorithm::Deep { .. }),
                    "{coll:?} {bytes} B: {} {scored:?}",
                    c.algo
                );
            }
            let plain = Topology::uniform(256, 8).with_nic_map(NicMap::even(8, 4));
            assert!(candidates(&plain)
                .iter()
                .all(|a| !matches!(a, Algorithm::Deep { .. })));
        }
    }

    #[test]
    fn frontier_at_scale_overlaps_the_levels_for_large_blocks() {
        // At 64 MiB per rank the overlapped hierarchy must beat the plain one in the model
        // (both levels busy at once), and the tuner must pick an overlapped form.
        let prof = frontier_pccl();
        let topo = Topology::uniform(512, 8).with_nic_map(NicMap::even(8, 4));
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter { average: false },
        ] {
            let (c, scored) = choose_with(coll, &topo, 64 << 20, &prof).unwrap();
            assert!(
                matches!(c.algo, Algorithm::Overlap { .. }),
                "{coll:?}: {scored:?}"
            );
            let t = |a: Algorithm| scored.iter().find(|s| s.0 == a).unwrap().1;
            let plain = t(Algorithm::Hier {
                inter: match c.algo {
                    Algorithm::Overlap { inter, .. } => inter,
                    _ => unreachable!(),
                },
                intra: match c.algo {
                    Algorithm::Overlap { intra, .. } => intra,
                    _ => unreachable!(),
                },
            });
            assert!(
                c.seconds < plain * 0.9,
                "{coll:?}: {} vs {plain}",
                c.seconds
            );
        }
    }

    #[test]
    fn an_overlapped_hierarchy_must_beat_the_plain_candidates_by_the_margin() {
        let hier = Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Ring,
        };
        let pipe = hier.overlapped(4).unwrap();
        let ring = Algorithm::Flat(LevelAlgo::Ring);
        // 2% ahead of the best plain one: by default (no overlap margin) it is taken.
        let near = [(ring, 1.1), (hier, 1.0), (pipe, 0.98)];
        assert_eq!(pick(&near, 0.0).0, pipe);
        // Under a margin above its lead (PCCL_TUNE_OVERLAP_MARGIN=0.05) the plain one is
        // taken; under one below the lead, still the overlapped one.
        assert_eq!(pick_with(&near, 0.0, 0.05).0, hier);
        assert_eq!(pick_with(&near, 0.0, 0.01).0, pipe);
        assert_eq!(pick_with(&near, 0.0, 1.0).0, hier);
        // 20% ahead: taken.
        assert_eq!(
            pick(&[(ring, 1.1), (hier, 1.0), (pipe, 0.8)], 0.0),
            (pipe, 0.8)
        );
        // Plain candidates among themselves: the fastest, ties to the first.
        assert_eq!(pick(&[(ring, 1.0), (hier, 1.0)], 0.0).0, ring);
        assert_eq!(pick(&[(ring, 1.0), (hier, 0.99), (pipe, 1.2)], 0.0).0, hier);
        // Only overlapped candidates: the fastest of them.
        let pipe2 = hier.overlapped(2).unwrap();
        assert_eq!(pick(&[(pipe2, 1.0), (pipe, 0.99)], 0.0).0, pipe);
    }

    #[test]
    fn near_ties_go_to_fewer_pieces_and_the_ring_inside_the_node() {
        // The margin of 2026-11-29 (PCCL_TUNE_MARGIN=0.05; the default is 0 since 12-01).
        const M: f64 = 0.05;
        assert_eq!(TIE_MARGIN, 0.0, "the default is the pure model");
        let hier = |intra, pieces| {
            let h = Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra,
            };
            if pieces > 1 {
                h.overlapped(pieces).unwrap()
            } else {
                h
            }
        };
        assert_eq!(involvement(hier(LevelAlgo::Ring, 1)), 0);
        assert_eq!(involvement(hier(LevelAlgo::Ring, 2)), 0);
        assert_eq!(involvement(hier(LevelAlgo::Ring, 16)), 3);
        assert_eq!(involvement(hier(LevelAlgo::Rd, 1)), 1);
        assert_eq!(involvement(hier(LevelAlgo::Rd, 8)), 3);
        assert_eq!(involvement(Algorithm::Flat(LevelAlgo::Rd)), 0);
        // Intra-node doubling 3% ahead of the ring: the ring, unless the margin is off.
        let plain = [
            (hier(LevelAlgo::Ring, 1), 1.00),
            (hier(LevelAlgo::Rd, 1), 0.97),
        ];
        assert_eq!(pick(&plain, M).0, hier(LevelAlgo::Ring, 1));
        assert_eq!(pick(&plain, 0.0).0, hier(LevelAlgo::Rd, 1));
        // ... but 10% ahead, doubling.
        let plain = [
            (hier(LevelAlgo::Ring, 1), 1.00),
            (hier(LevelAlgo::Rd, 1), 0.90),
        ];
        assert_eq!(pick(&plain, M).0, hier(LevelAlgo::Rd, 1));
        // 16 pieces 4% ahead of 4 (two doublings more) lose; 12% ahead win.
        for (t16, want) in [(0.96, 4), (0.88, 16)] {
            let over = [
                (hier(LevelAlgo::Ring, 1), 2.0),
                (hier(LevelAlgo::Ring, 4), 1.00),
                (hier(LevelAlgo::Ring, 16), t16),
            ];
            let (a, t) = pick(&over, M);
            assert_eq!(a.pieces(), want, "16 pieces at {t16}");
            assert!(
                (t - if want == 4 { 1.0 } else { t16 }).abs() < 1e-12,
                "seconds unweighed"
            );
        }
        // The whole choice: with the margin off it is the model's argmin.
        let topo = Topology::uniform(16, 4);
        let prof = Profile::default();
        for b in [1usize << 10, 64 << 10, 1 << 20] {
            let coll = Collective::AllGather;
            let (c0, scored) = choose_with_margin(coll, &topo, b, &prof, 0.0).unwrap();
            let (c, _) = choose_with_margin(coll, &topo, b, &prof, M).unwrap();
            let best = scored.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
            assert!(
                c.seconds <= best * (1.0 + M).powi(4),
                "{b}: {c:?} vs {best}"
            );
            assert!(
                involvement(c.algo) <= involvement(c0.algo),
                "{b}: {c:?} vs {c0:?}"
            );
        }
    }

    #[test]
    fn small_blocks_are_never_overlapped() {
        let prof = frontier_pccl();
        let topo = Topology::uniform(64, 8);
        let (c, scored) = choose_with(Collective::AllGather, &topo, 4096, &prof).unwrap();
        assert!(!matches!(c.algo, Algorithm::Overlap { .. }), "{c:?}");
        assert!(scored.iter().all(|s| s.0.pieces() == 1), "{scored:?}");
    }

    #[test]
    fn one_rank_per_node_never_goes_hierarchical() {
        let prof = frontier_pccl();
        for ranks in [2usize, 64, 256] {
            let topo = Topology::uniform(ranks, 1);
            for bytes in [1024usize, 1 << 20, 64 << 20] {
                let (c, scored) = choose_with(Collective::AllGather, &topo, bytes, &prof).unwrap();
                assert!(matches!(c.algo, Algorithm::Flat(_)), "{c:?}");
                assert_eq!(scored.len(), 2, "only the flat candidates");
            }
        }
    }

    #[test]
    fn the_choice_does_not_depend_on_the_calling_rank_or_vary_between_calls() {
        let prof = frontier_pccl();
        let topo = Topology::uniform(96, 8);
        let a = choose_with(Collective::AllGather, &topo, 4 << 20, &prof).unwrap();
        let b = choose_with(Collective::AllGather, &topo.clone(), 4 << 20, &prof).unwrap();
        assert_eq!(a.0, b.0);
        assert_eq!(a.1, b.1);
    }

    #[test]
    fn pccl_algo_accepts_one_value_or_per_collective_entries() {
        let o = AlgoOverrides::parse("hier-rd").unwrap();
        assert_eq!(o.get(Collective::AllGather), Some(HIER_RD));
        let o = AlgoOverrides::parse("allgather:hier-rd; reducescatter:ring").unwrap();
        assert_eq!(o.get(Collective::AllGather), Some(HIER_RD));
        assert_eq!(
            o.get(Collective::ReduceScatter { average: true }),
            Some(Algorithm::Flat(LevelAlgo::Ring))
        );
        assert_eq!(o.get(Collective::AllReduce { average: false }), None);
        let o = AlgoOverrides::parse("rd;allreduce:hier-ring-rd;allgather:auto").unwrap();
        assert_eq!(o.get(Collective::AllGather), None);
        assert_eq!(
            o.get(Collective::ReduceScatter { average: false }),
            Some(Algorithm::Flat(LevelAlgo::Rd))
        );
        assert_eq!(
            o.get(Collective::AllReduce { average: false }),
            Some(Algorithm::Hier {
                inter: LevelAlgo::Ring,
                intra: LevelAlgo::Rd
            })
        );
        let o =
            AlgoOverrides::parse("allgather:hier-rd-pipe4;allreduce:hier-ring-rd-pipe2").unwrap();
        assert_eq!(o.get(Collective::AllGather), HIER_RD.overlapped(4));
        assert_eq!(
            o.get(Collective::AllReduce { average: true })
                .map(|a| a.name()),
            Some("hier-ring-rd-pipe2".to_string())
        );
        for bad in [
            "hier-rd-pipe0",
            "hier-rd-pipe65",
            "ring-pipe2",
            "hier-rd-pipe",
        ] {
            let e = AlgoOverrides::parse(bad).unwrap_err();
            assert!(e.message().contains("pipeK"), "{bad}: {e}");
        }
        let e = AlgoOverrides::parse("allgathr:ring").unwrap_err();
        assert!(e.message().contains("allgathr"), "{e}");
        let e = AlgoOverrides::parse("allgather:tree").unwrap_err();
        assert!(e.message().contains("tree"), "{e}");
    }
}
