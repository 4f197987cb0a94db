//! Symbolic proofs that every algorithm delivers exactly the right contributions to every
//! output block, for every rank count 1..=64 and every N x M node shape, in-place and not.

use pccl::plan::check::check_plans;
use pccl::plan::{build, Algorithm, Collective, LevelAlgo, Plan};
use pccl::Topology;

const ALGOS: [Algorithm; 7] = Algorithm::ALL;

fn plans(coll: Collective, algo: Algorithm, topo: &Topology) -> Vec<Plan> {
    (0..topo.nranks())
        .map(|r| build(coll, algo, topo, r).expect("plan builds"))
        .collect()
}

fn check_all(coll: Collective, algo: Algorithm, topo: &Topology) {
    let ps = plans(coll, algo, topo);
    for inplace in [false, true] {
        if let Err(e) = check_plans(coll, &ps, inplace) {
            panic!(
                "{coll:?} {algo} on {} (inplace={inplace}): {e}",
                topo.describe()
            );
        }
    }
}

fn collectives(p: usize) -> Vec<Collective> {
    vec![
        Collective::AllGather,
        Collective::ReduceScatter { average: false },
        Collective::ReduceScatter { average: true },
        Collective::AllReduce { average: false },
        Collective::AllReduce { average: true },
        Collective::Broadcast { root: 0 },
        Collective::Broadcast { root: p - 1 },
        Collective::Barrier,
    ]
}

#[test]
fn every_algorithm_is_correct_for_every_rank_count_and_node_shape_up_to_64() {
    for p in 1..=64usize {
        for m in (1..=p).filter(|m| p % m == 0) {
            let topo = Topology::uniform(p, m);
            for coll in collectives(p) {
                for algo in ALGOS {
                    check_all(coll, algo, &topo);
                }
            }
        }
    }
}

#[test]
fn interleaved_rank_placement_is_handled() {
    // Round-robin placement: rank r on node r % N.
    for (n, m) in [(2, 3), (3, 2), (4, 4), (3, 5)] {
        let keys: Vec<u64> = (0..n * m).map(|r| (r % n) as u64).collect();
        let topo = Topology::from_node_keys(&keys);
        for coll in collectives(n * m) {
            for algo in ALGOS {
                check_all(coll, algo, &topo);
            }
        }
    }
}

#[test]
fn unequal_nodes_fall_back_to_a_correct_flat_algorithm() {
    for sizes in [vec![4, 2], vec![3, 1], vec![1, 2, 3], vec![5, 5, 2]] {
        let mut nodes = Vec::new();
        let mut r = 0;
        for s in sizes {
            nodes.push((r..r + s).collect::<Vec<_>>());
            r += s;
        }
        let topo = Topology::from_nodes(nodes);
        for coll in collectives(r) {
            for algo in ALGOS {
                let ps = plans(coll, algo, &topo);
                assert!(matches!(
                    ps[0].algorithm,
                    Algorithm::Flat(_) | Algorithm::VectorRd
                ));
                check_all(coll, algo, &topo);
            }
        }
    }
}

#[test]
fn large_rank_counts_are_correct() {
    // Thousands of ranks: the scalable algorithms, in a few shapes.
    let cases: [(usize, usize, Algorithm); 6] = [
        (
            1000,
            8,
            Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            },
        ),
        (1000, 1, Algorithm::Flat(LevelAlgo::Rd)),
        (
            2048,
            8,
            Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            },
        ),
        (2048, 1, Algorithm::Flat(LevelAlgo::Ring)),
        (
            4096,
            8,
            Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            },
        ),
        (
            4096,
            64,
            Algorithm::Hier {
                inter: LevelAlgo::Ring,
                intra: LevelAlgo::Rd,
            },
        ),
    ];
    for (p, m, algo) in cases {
        let topo = Topology::uniform(p, m);
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter { average: true },
        ] {
            let ps = plans(coll, algo, &topo);
            check_plans(coll, &ps, false)
                .unwrap_or_else(|e| panic!("{coll:?} {algo} P={p} M={m}: {e}"));
        }
    }
}

#[test]
fn logarithmic_algorithms_take_ceil_log2_steps() {
    for p in [5usize, 8, 12, 1000] {
        let topo = Topology::uniform(p, p);
        let plan = build(
            Collective::AllGather,
            Algorithm::Flat(LevelAlgo::Rd),
            &topo,
            0,
        )
        .unwrap();
        let steps = (usize::BITS - (p - 1).leading_zeros()) as usize;
        assert_eq!(plan.sends(), steps, "P={p}");
        let ring = build(
            Collective::AllGather,
            Algorithm::Flat(LevelAlgo::Ring),
            &topo,
            0,
        )
        .unwrap();
        assert_eq!(ring.sends(), p - 1);
    }
}

fn rooted(root: usize) -> [Collective; 5] {
    [
        Collective::Reduce {
            root,
            average: false,
        },
        Collective::Reduce {
            root,
            average: true,
        },
        Collective::Gather { root },
        Collective::Scatter { root },
        Collective::Broadcast { root },
    ]
}

#[test]
fn rooted_collectives_and_all_to_all_are_correct_in_every_root_up_to_64() {
    for p in 1..=64usize {
        let topo = Topology::uniform(p, 1);
        for root in 0..p {
            for coll in rooted(root) {
                check_all(coll, Algorithm::Flat(LevelAlgo::Ring), &topo);
            }
        }
        for direct in [false, true] {
            check_all(
                Collective::AllToAll { direct },
                Algorithm::Flat(LevelAlgo::Rd),
                &topo,
            );
        }
    }
}

#[test]
fn rooted_collectives_and_all_to_all_are_correct_at_1000_ranks() {
    let p = 1000;
    let topo = Topology::uniform(p, 8);
    for root in [0, 1, 511, 999] {
        for coll in rooted(root) {
            check_all(coll, Algorithm::Flat(LevelAlgo::Ring), &topo);
        }
    }
    for direct in [false, true] {
        check_all(
            Collective::AllToAll { direct },
            Algorithm::Flat(LevelAlgo::Ring),
            &topo,
        );
    }
    let ps = plans(
        Collective::AllToAll { direct: false },
        Algorithm::Flat(LevelAlgo::Ring),
        &topo,
    );
    assert!(
        ps.iter().all(|p| p.phases.len() == 1000),
        "p - 1 rounds and a copy"
    );
    let ps = plans(
        Collective::AllToAll { direct: true },
        Algorithm::Flat(LevelAlgo::Ring),
        &topo,
    );
    assert!(
        ps.iter().all(|p| p.phases.len() == 1 && p.sends() == 999),
        "one phase of p - 1 sends"
    );
    let ps = plans(
        Collective::Reduce {
            root: 3,
            average: false,
        },
        Algorithm::Flat(LevelAlgo::Ring),
        &topo,
    );
    assert!(ps.iter().all(|p| p.phases.len() <= 10), "log-depth tree");
}

/// The overlapped hierarchy with every pair of level algorithms.
fn overlapped(pieces: usize) -> Vec<Algorithm> {
    let mut v = Vec::new();
    for inter in [LevelAlgo::Rd, LevelAlgo::Ring] {
        for intra in [LevelAlgo::Ring, LevelAlgo::Rd] {
            v.push(Algorithm::Overlap {
                inter,
                intra,
                pieces,
            });
        }
    }
    v
}

#[test]
fn overlapped_hierarchy_is_correct_for_every_rank_count_node_shape_and_piece_count_up_to_64() {
    for p in 1..=64usize {
        for m in (1..=p).filter(|m| p % m == 0) {
            let topo = Topology::uniform(p, m);
            // Every piece count meets every shape class; all of them would take minutes.
            let k = [2, 3, 4, 8][(p + m) % 4];
            {
                for coll in [
                    Collective::AllGather,
                    Collective::ReduceScatter { average: true },
                    Collective::AllReduce { average: false },
                ] {
                    for algo in overlapped(k) {
                        check_all(coll, algo, &topo);
                    }
                }
            }
        }
    }
}

#[test]
fn overlapped_hierarchy_handles_interleaved_placement_unequal_nodes_and_scale() {
    for (n, m) in [(2, 3), (3, 2), (4, 4)] {
        let keys: Vec<u64> = (0..n * m).map(|r| (r % n) as u64).collect();
        let topo = Topology::from_node_keys(&keys);
        for coll in collectives(n * m) {
            for algo in overlapped(4) {
                check_all(coll, algo, &topo);
            }
        }
    }
    let topo = Topology::from_nodes(vec![vec![0, 1, 2], vec![3]]);
    let ps = plans(Collective::AllGather, overlapped(4)[0], &topo);
    assert!(matches!(ps[0].algorithm, Algorithm::Flat(_)));
    assert_eq!(ps[0].pieces, 1);
    check_all(Collective::AllGather, overlapped(4)[0], &topo);
    for (p, m, k) in [(512, 8, 4), (1024, 4, 2)] {
        let topo = Topology::uniform(p, m);
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter { average: false },
        ] {
            let algo = overlapped(k)[0];
            let ps = plans(coll, algo, &topo);
            check_plans(coll, &ps, false)
                .unwrap_or_else(|e| panic!("{coll:?} {algo} P={p} M={m}: {e}"));
        }
    }
}

/// Phases in which `plan` sends or receives (local copies and averages are free of latency).
fn message_phases(plan: &Plan) -> usize {
    plan.phases
        .iter()
        .filter(|ph| {
            ph.steps.iter().any(|s| {
                matches!(
                    s,
                    pccl::plan::Step::Send { .. }
                        | pccl::plan::Step::Recv { .. }
                        | pccl::plan::Step::RecvReduce { .. }
                )
            })
        })
        .count()
}

#[test]
fn whole_vector_all_reduce_is_correct_and_takes_lg_p_rounds_up_to_33_ranks() {
    for p in 1..=33usize {
        let q = if p == 1 {
            1
        } else {
            1usize << (usize::BITS - 1 - p.leading_zeros())
        };
        let lg = q.trailing_zeros() as usize;
        for m in (1..=p).filter(|m| p % m == 0) {
            let topo = Topology::uniform(p, m);
            for average in [false, true] {
                let coll = Collective::AllReduce { average };
                check_all(coll, Algorithm::VectorRd, &topo);
                let ps = plans(coll, Algorithm::VectorRd, &topo);
                for pl in &ps {
                    assert_eq!(pl.algorithm, Algorithm::VectorRd);
                    // Ranks 0..q: the doubling, plus fold-in and send-back when p > q;
                    // ranks q..p: one send and one receive.
                    let want = match pl.rank {
                        r if r >= q => 2,
                        r if r < p - q => lg + 2,
                        _ => lg,
                    };
                    assert_eq!(message_phases(pl), want, "P={p} rank {}", pl.rank);
                }
            }
        }
    }
}

#[test]
fn whole_vector_rd_falls_back_to_rd_for_other_collectives() {
    let topo = Topology::uniform(12, 4);
    for coll in collectives(12)
        .into_iter()
        .filter(|c| !matches!(c, Collective::AllReduce { .. }))
    {
        let ps = plans(coll, Algorithm::VectorRd, &topo);
        let rd = plans(coll, Algorithm::Flat(LevelAlgo::Rd), &topo);
        assert_eq!(ps, rd, "{coll:?}");
    }
}

#[test]
fn direct_all_to_all_is_correct_in_one_phase_up_to_33_ranks() {
    for p in 1..=33usize {
        let topo = Topology::uniform(p, 1);
        let coll = Collective::AllToAll { direct: true };
        check_all(coll, Algorithm::Flat(LevelAlgo::Ring), &topo);
        for pl in plans(coll, Algorithm::Flat(LevelAlgo::Ring), &topo) {
            assert_eq!(pl.phases.len(), 1, "P={p}");
            assert_eq!(pl.sends(), p - 1, "P={p}");
        }
    }
}

#[test]
fn overlapped_hierarchy_is_correct_for_every_piece_count_up_to_16() {
    // Non-power-of-two node counts, one rank per node, one node, and uneven pieces (K not
    // dividing anything): every K in 1..=16, every collective built from levels.
    for (p, m) in [
        (6, 1),
        (1, 1),
        (4, 4),
        (6, 2),
        (10, 2),
        (15, 3),
        (12, 4),
        (24, 8),
    ] {
        let topo = Topology::uniform(p, m);
        for k in 1..=16 {
            for coll in [
                Collective::AllGather,
                Collective::ReduceScatter { average: false },
                Collective::ReduceScatter { average: true },
                Collective::AllReduce { average: false },
                Collective::AllReduce { average: true },
            ] {
                for algo in overlapped(k) {
                    check_all(coll, algo, &topo);
                }
            }
        }
    }
}

/// The ring reduce-scatter keeps its partial sums in two rotating scratch blocks at every rank
/// count (the executor allocates only the blocks a plan touches), and the checker proves it.
#[test]
fn ring_reduce_scatter_needs_two_scratch_blocks_at_every_rank_count() {
    for p in 1..=64 {
        let topo = Topology::uniform(p, p);
        let coll = Collective::ReduceScatter { average: false };
        let algo = Algorithm::Flat(LevelAlgo::Ring);
        let ps = plans(coll, algo, &topo);
        for pl in &ps {
            assert!(
                pl.scratch_blocks() <= 2,
                "P={p} rank {}: {} scratch blocks",
                pl.rank,
                pl.scratch_blocks()
            );
        }
        check_all(coll, algo, &topo);
    }
}

/// Out of place, the ring reduce-scatter keeps one of its two partial sums in the output
/// block: one scratch block at every rank count, proven for disjoint buffers (averaged too);
/// in place the same plans would overwrite the rank's own input block before it is read,
/// and the checker catches that (which is why in-place calls get the two-scratch plans).
#[test]
fn out_of_place_ring_reduce_scatter_needs_one_scratch_block() {
    use pccl::plan::build_for;
    for p in 1..=64 {
        let topo = Topology::uniform(p, p);
        let algo = Algorithm::Flat(LevelAlgo::Ring);
        for average in [false, true] {
            let coll = Collective::ReduceScatter { average };
            let ps: Vec<Plan> = (0..p)
                .map(|r| build_for(coll, algo, &topo, r, true).expect("plan builds"))
                .collect();
            for pl in &ps {
                assert!(
                    pl.scratch_blocks() <= 1,
                    "P={p} rank {}: {} scratch blocks",
                    pl.rank,
                    pl.scratch_blocks()
                );
            }
            if let Err(e) = check_plans(coll, &ps, false) {
                panic!("P={p} average={average} out of place: {e}");
            }
            // From 4 ranks on, a partial sum lands in the output before the last step reads
            // the rank's own block there.
            if p > 3 {
                assert!(
                    check_plans(coll, &ps, true).is_err(),
                    "P={p}: the output-slot plans passed in place"
                );
            }
        }
    }
}

/// A ring that folded every partial into one scratch slot would overwrite the partial it is
/// still sending: the checker catches it.
#[test]
fn a_ring_reduce_scatter_with_one_slot_is_caught() {
    use pccl::plan::{ring, Buf, Level, Span};
    let p = 5;
    let coll = Collective::ReduceScatter { average: false };
    let group: Vec<usize> = (0..p).collect();
    let ps: Vec<Plan> = (0..p)
        .map(|r| {
            let lvl = Level {
                group: &group,
                me: r,
            };
            let src: Vec<Vec<Span>> = (0..p).map(|b| vec![Span::block(Buf::Input, b)]).collect();
            let one = vec![Span::block(Buf::Scratch, 0)];
            let phases = ring::reduce_scatter_two_slots(
                lvl,
                &src,
                &[one.clone(), one],
                &vec![Span::block(Buf::Output, 0)],
            );
            Plan {
                collective: coll,
                algorithm: Algorithm::Flat(LevelAlgo::Ring),
                rank: r,
                nranks: p,
                phases,
                pieces: 1,
            }
        })
        .collect();
    assert!(check_plans(coll, &ps, false).is_err());
}

/// Three levels with every choice of level algorithm.
fn deep_algos() -> Vec<Algorithm> {
    Algorithm::three_level_forms()
}

const LEVELLED: [Collective; 4] = [
    Collective::AllGather,
    Collective::ReduceScatter { average: false },
    Collective::ReduceScatter { average: true },
    Collective::AllReduce { average: true },
];

#[test]
fn three_level_hierarchy_is_correct_for_every_node_group_shape_up_to_64() {
    // N nodes of G groups of S ranks, every N·G·S ≤ 64 with G, S ≥ 2 (odd and awkward
    // ones included: 3 × 3 × 2, 1 × 5 × 3, 7 × 2 × 2, ...).
    let mut shapes = 0;
    for p in 4..=64usize {
        for m in (4..=p).filter(|m| p % m == 0) {
            for s in (2..m).filter(|s| m % s == 0) {
                let topo = Topology::uniform(p, m).with_groups(s);
                assert!(topo.has_groups());
                for coll in LEVELLED {
                    for algo in deep_algos() {
                        let ps = plans(coll, algo, &topo);
                        assert_eq!(ps[0].algorithm, algo, "{}", topo.describe());
                        check_all(coll, algo, &topo);
                    }
                }
                shapes += 1;
            }
        }
    }
    assert!(shapes > 100, "{shapes} shapes");
}

#[test]
fn three_level_hierarchy_handles_interleaved_placement_and_scale() {
    // Round-robin placement: rank r on node r % N, groups of consecutive local indices.
    for (n, m, s) in [(2, 4, 2), (3, 6, 3), (3, 6, 2), (4, 4, 2)] {
        let keys: Vec<u64> = (0..n * m).map(|r| (r % n) as u64).collect();
        let topo = Topology::from_node_keys(&keys).with_groups(s);
        for coll in LEVELLED {
            for algo in deep_algos() {
                check_all(coll, algo, &topo);
            }
        }
    }
    // Frontier-shaped: 256 nodes of 4 MI250X × 2 GCDs.
    let topo = Topology::uniform(2048, 8).with_groups(2);
    for coll in [
        Collective::AllGather,
        Collective::ReduceScatter { average: false },
    ] {
        let algo: Algorithm = "hier3-rd".parse().unwrap();
        let ps = plans(coll, algo, &topo);
        check_plans(coll, &ps, false).unwrap_or_else(|e| panic!("{coll:?} {algo}: {e}"));
        // lg 256 network steps, 3 ring steps across groups, 1 inside the pair.
        assert_eq!(ps[0].sends(), 8 + 3 + 1, "{coll:?}");
    }
}

#[test]
fn three_levels_without_groups_run_two_and_on_unequal_nodes_run_flat() {
    let algo: Algorithm = "hier3-rd-rd-ring".parse().unwrap();
    assert_eq!(algo.to_string(), "hier3-rd-rd-ring");
    for name in ["hier3-rd", "hier3-ring", "hier3-ring-rd-rd"] {
        assert_eq!(name.parse::<Algorithm>().unwrap().to_string(), name);
    }
    for bad in [
        "hier3-rd-ring",
        "hier3-rd-ring-ring-ring",
        "hier3-x-ring-ring",
    ] {
        let e = bad.parse::<Algorithm>().unwrap_err();
        assert!(e.message().contains("hier3-INTER-MID-INNER"), "{e}");
    }
    // Groups that make no level: none, one per node, or not dividing the node.
    for topo in [
        Topology::uniform(16, 4),
        Topology::uniform(16, 4).with_groups(4),
        Topology::uniform(18, 6).with_groups(4),
    ] {
        assert!(!topo.has_groups());
        for coll in LEVELLED {
            let ps = plans(coll, algo, &topo);
            assert_eq!(
                ps[0].algorithm,
                Algorithm::Hier {
                    inter: LevelAlgo::Rd,
                    intra: LevelAlgo::Rd
                }
            );
            check_all(coll, algo, &topo);
        }
    }
    let topo = Topology::from_nodes(vec![vec![0, 1, 2, 3], vec![4, 5]]).with_groups(2);
    for coll in LEVELLED {
        let ps = plans(coll, algo, &topo);
        assert_eq!(ps[0].algorithm, Algorithm::Flat(LevelAlgo::Rd));
        check_all(coll, algo, &topo);
    }
}

#[test]
fn three_level_reduce_scatter_keeps_at_most_half_the_blocks_in_scratch() {
    let deep = Topology::uniform(32, 8).with_groups(2);
    let coll = Collective::ReduceScatter { average: false };
    for r in 0..32 {
        let d = build(coll, "hier3-rd".parse().unwrap(), &deep, r).unwrap();
        assert!(
            d.scratch_blocks() <= 16,
            "rank {r}: {} blocks",
            d.scratch_blocks()
        );
    }
}

/// The reduce-scatter plans keep block `j`'s partial sum in scratch block `j`; renumbered by
/// lifetime (`plan::scratch::pack`) a rank allocates only the blocks alive at once: at most
/// half of `P` for recursive halving and the un-overlapped hierarchies (before: `P − 1` for
/// every hierarchy), and fewer than `P` for the overlapped ones.
#[test]
fn reduce_scatter_scratch_holds_only_the_blocks_alive_at_once() {
    let coll = Collective::ReduceScatter { average: false };
    for (n, m) in [
        (2, 2),
        (4, 4),
        (8, 2),
        (2, 8),
        (4, 8),
        (8, 8),
        (3, 4),
        (16, 4),
    ] {
        let p = n * m;
        let topo = Topology::uniform(p, m);
        for (algo, most) in [
            ("ring", 2),
            ("rd", p.div_ceil(2)),
            ("hier-rd", p.div_ceil(2)),
            ("hier-ring", p.div_ceil(2)),
            ("hier-ring-rd", p.div_ceil(2)),
            ("hier-rd-pipe4", p - 1),
            ("hier-ring-pipe4", p - 1),
        ] {
            for r in 0..p {
                let pl = build(coll, algo.parse().unwrap(), &topo, r).unwrap();
                assert!(
                    pl.scratch_blocks() <= most,
                    "{n}x{m} {algo} rank {r}: {} scratch blocks, expected at most {most}",
                    pl.scratch_blocks()
                );
            }
        }
    }
}

#[test]
fn overlapped_three_level_hierarchy_is_correct_for_awkward_shapes_and_piece_counts() {
    for (n, m, s) in [
        (2, 4, 2),
        (3, 6, 2),
        (2, 6, 3),
        (5, 4, 2),
        (4, 8, 2),
        (3, 9, 3),
    ] {
        let topo = Topology::uniform(n * m, m).with_groups(s);
        for k in [2, 3, 4] {
            for coll in LEVELLED {
                for algo in deep_algos() {
                    let algo = algo.overlapped(k).unwrap();
                    let ps = plans(coll, algo, &topo);
                    assert_eq!(ps[0].algorithm, algo);
                    assert_eq!(ps[0].pieces, k);
                    check_all(coll, algo, &topo);
                }
            }
        }
    }
    // Interleaved placement, and 1024 ranks as 128 × 4 × 2.
    let keys: Vec<u64> = (0..12).map(|r| (r % 3) as u64).collect();
    let topo = Topology::from_node_keys(&keys).with_groups(2);
    for coll in LEVELLED {
        check_all(coll, "hier3-rd-pipe4".parse().unwrap(), &topo);
    }
    let topo = Topology::uniform(1024, 8).with_groups(2);
    for coll in [
        Collective::AllGather,
        Collective::ReduceScatter { average: false },
    ] {
        let algo: Algorithm = "hier3-rd-rd-ring-pipe4".parse().unwrap();
        let ps = plans(coll, algo, &topo);
        check_plans(coll, &ps, false).unwrap_or_else(|e| panic!("{coll:?} {algo}: {e}"));
    }
    // One piece is the plain three-level plan; without groups the overlapped two-level one.
    let one: Algorithm = "hier3-rd-pipe1".parse().unwrap();
    assert_eq!(one, "hier3-rd".parse().unwrap());
    let flat_nodes = Topology::uniform(16, 4);
    let ps = plans(
        Collective::AllGather,
        "hier3-rd-pipe4".parse().unwrap(),
        &flat_nodes,
    );
    assert_eq!(ps[0].algorithm, "hier-rd-pipe4".parse().unwrap());
}

/// A hierarchical all-reduce's blocks are numbered by level (`plan::relabel`), so on a power
/// of two of nodes every message is one run of consecutive blocks (or pieces): nothing for
/// the transport to pack at the sender and scatter at the receiver. Before: 8×2 `hier-rd`
/// sent 8, 4 and 2 blocks strided by 2; the pipelined forms one piece in 4.
#[test]
fn hierarchical_all_reduce_sends_every_message_as_one_run() {
    use pccl::plan::Step;
    let coll = Collective::AllReduce { average: false };
    for (n, m, g) in [
        (2, 2, 1),
        (4, 4, 1),
        (8, 2, 1),
        (2, 8, 1),
        (4, 3, 1),
        (4, 8, 2),
        (2, 8, 4),
    ] {
        let topo = Topology::uniform(n * m, m).with_groups(g);
        let mut algos = vec![
            "hier-rd",
            "hier-ring",
            "hier-ring-rd",
            "hier-rd-pipe4",
            "hier-ring-pipe4",
        ];
        if g > 1 {
            algos.extend(["hier3-rd", "hier3-ring-pipe4"]);
        }
        for algo in algos {
            for (r, pl) in plans(coll, algo.parse().unwrap(), &topo).iter().enumerate() {
                for step in pl.phases.iter().flat_map(|ph| &ph.steps) {
                    let list = match step {
                        Step::Send { src, .. } => src,
                        Step::Recv { dst, .. } | Step::RecvReduce { dst, .. } => dst,
                        _ => continue,
                    };
                    assert_eq!(
                        list.len(),
                        1,
                        "{n}x{m} (groups of {g}) {algo} rank {r}: {step:?}"
                    );
                }
            }
        }
    }
}
