//! Collectives on thread-ranks: every rank count 1..=16 and node shape, every algorithm,
//! every dtype x op, in-place and out-of-place, against a straightforward reference.

mod common;

use common::{input, reduced, same_bits, value};
use half::{bf16, f16};
use pccl::config::Config;
use pccl::plan::Algorithm;
use pccl::{Communicator, Element, ErrorKind, ReduceOp};
use std::time::Duration;

const ALGOS: [Algorithm; 7] = Algorithm::ALL;

fn cfg(m: usize, algo: Option<Algorithm>) -> Config {
    Config {
        ranks_per_node: Some(m),
        algo,
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// Runs all-gather, reduce-scatter and all-reduce of `count` elements (per block) with `op`
/// on `comm`, checks each against the reference, and returns the all-reduce output so the
/// caller can check that all ranks agree bit for bit.
fn check_collectives<T: Element>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    inplace: bool,
) -> Result<Vec<T>, String> {
    let (r, p) = (comm.rank(), comm.size());
    let ctx = |what: &str| {
        format!(
            "{what} {} count={count} op={op} inplace={inplace} rank={r}/{p}",
            T::DTYPE
        )
    };
    if op == ReduceOp::Sum || T::DTYPE.is_float() || op != ReduceOp::Avg {
        // all-gather
        let mine = input::<T>(r, count, op);
        let mut out = vec![T::from_i64(99); count * p];
        if inplace {
            out[r * count..(r + 1) * count].copy_from_slice(&mine);
            comm.all_gather_in_place(&mut out)
                .map_err(|e| format!("{}: {e}", ctx("all_gather")))?;
        } else {
            comm.all_gather(&mine, &mut out)
                .map_err(|e| format!("{}: {e}", ctx("all_gather")))?;
        }
        let want: Vec<T> = (0..p).flat_map(|q| input::<T>(q, count, op)).collect();
        if !same_bits(&out, &want) {
            return Err(format!("{}: wrong result", ctx("all_gather")));
        }
    }
    // reduce-scatter: rank q's input element j is value(q, j)
    let full = input::<T>(r, count * p, op);
    let want: Vec<T> = (r * count..(r + 1) * count)
        .map(|i| reduced::<T>(p, i, op))
        .collect();
    let got = if inplace {
        let mut buf = full.clone();
        comm.reduce_scatter_in_place(&mut buf, op)
            .map_err(|e| format!("{}: {e}", ctx("reduce_scatter")))?;
        buf[r * count..(r + 1) * count].to_vec()
    } else {
        let mut out = vec![T::from_i64(99); count];
        comm.reduce_scatter(&full, &mut out, op)
            .map_err(|e| format!("{}: {e}", ctx("reduce_scatter")))?;
        out
    };
    if !same_bits(&got, &want) {
        return Err(format!(
            "{}: wrong result {:?} vs {:?}",
            ctx("reduce_scatter"),
            &got[..got.len().min(4)],
            &want[..want.len().min(4)]
        ));
    }
    // all-reduce of an odd length (blocks of unequal size)
    let n = count * p + count / 2 + 1;
    let mine = input::<T>(r, n, op);
    let want: Vec<T> = (0..n).map(|i| reduced::<T>(p, i, op)).collect();
    let got = if inplace {
        let mut buf = mine.clone();
        comm.all_reduce_in_place(&mut buf, op)
            .map_err(|e| format!("{}: {e}", ctx("all_reduce")))?;
        buf
    } else {
        let mut out = vec![T::from_i64(99); n];
        comm.all_reduce(&mine, &mut out, op)
            .map_err(|e| format!("{}: {e}", ctx("all_reduce")))?;
        out
    };
    if !same_bits(&got, &want) {
        return Err(format!("{}: wrong result", ctx("all_reduce")));
    }
    Ok(got)
}

fn all_dtypes(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    inplace: bool,
) -> Result<Vec<u8>, String> {
    let mut digest = Vec::new();
    macro_rules! each {
        ($($t:ty),*) => {$(
            if op != ReduceOp::Avg || <$t as Element>::DTYPE.is_float() {
                let v = check_collectives::<$t>(comm, count, op, inplace)?;
                digest.extend_from_slice(bytemuck::cast_slice(&v));
            }
        )*};
    }
    each!(i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64);
    Ok(digest)
}

fn assert_all_ok_and_identical(results: Vec<Result<Vec<u8>, String>>) {
    let mut first: Option<Vec<u8>> = None;
    for (r, res) in results.into_iter().enumerate() {
        let d = res.unwrap_or_else(|e| panic!("{e}"));
        match &first {
            None => first = Some(d),
            Some(f) => assert!(
                f == &d,
                "rank {r}'s all-reduce result differs from rank 0's"
            ),
        }
    }
}

#[test]
fn every_dtype_and_op_matches_the_reference_on_every_algorithm() {
    for (p, m) in [(6, 3), (4, 2), (5, 5), (8, 2)] {
        for algo in ALGOS {
            let res = Communicator::run_threads(
                p,
                cfg(m, Some(algo)),
                |comm| -> Result<Vec<u8>, String> {
                    let mut digest = Vec::new();
                    for op in ReduceOp::ALL {
                        for count in [0usize, 1, 7] {
                            for inplace in [false, true] {
                                digest.extend(all_dtypes(&comm, count, op, inplace)?);
                            }
                        }
                    }
                    Ok(digest)
                },
            )
            .unwrap();
            assert_all_ok_and_identical(res);
        }
    }
}

#[test]
fn overlapped_hierarchy_matches_the_reference_for_every_dtype_op_and_piece_count() {
    use pccl::plan::LevelAlgo;
    // (nodes, ranks per node); counts below, equal to and above the piece count, odd ones.
    for (n, m) in [(2, 2), (2, 3), (3, 2), (2, 4)] {
        for pieces in [1, 2, 4, 8] {
            for (inter, intra) in [
                (LevelAlgo::Rd, LevelAlgo::Ring),
                (LevelAlgo::Ring, LevelAlgo::Ring),
            ] {
                let algo = Algorithm::Overlap {
                    inter,
                    intra,
                    pieces,
                };
                let res = Communicator::run_threads(
                    n * m,
                    cfg(m, Some(algo)),
                    |comm| -> Result<Vec<u8>, String> {
                        let mut digest = Vec::new();
                        for op in ReduceOp::ALL {
                            for count in [0usize, 1, 7, 13] {
                                let inplace = count % 2 == 1;
                                digest.extend(all_dtypes(&comm, count, op, inplace)?);
                            }
                        }
                        // Larger than the transport's piece size, in place and not.
                        for inplace in [false, true] {
                            let v =
                                check_collectives::<f32>(&comm, 40_001, ReduceOp::Sum, inplace)?;
                            digest.extend_from_slice(bytemuck::cast_slice(&v));
                        }
                        Ok(digest)
                    },
                )
                .unwrap();
                assert_all_ok_and_identical(res);
            }
        }
    }
}

#[test]
fn every_rank_count_and_node_shape_up_to_16() {
    for p in 1..=16usize {
        for m in (1..=p).filter(|m| p % m == 0) {
            for algo in ALGOS {
                let res = Communicator::run_threads(
                    p,
                    cfg(m, Some(algo)),
                    |comm| -> Result<Vec<u8>, String> {
                        let mut d = Vec::new();
                        for count in [1usize, 7, 129] {
                            let v =
                                check_collectives::<f32>(&comm, count, ReduceOp::Sum, count == 7)?;
                            d.extend_from_slice(bytemuck::cast_slice(&v));
                            let v =
                                check_collectives::<i32>(&comm, count, ReduceOp::Max, count != 7)?;
                            d.extend_from_slice(bytemuck::cast_slice(&v));
                        }
                        Ok(d)
                    },
                )
                .unwrap();
                assert_all_ok_and_identical(res);
            }
        }
    }
}

#[test]
fn every_dtype_and_op_on_every_shape_up_to_16_with_the_tuned_algorithm() {
    for p in 1..=16usize {
        for m in (1..=p).filter(|m| p % m == 0) {
            let res =
                Communicator::run_threads(p, cfg(m, None), |comm| -> Result<Vec<u8>, String> {
                    let mut digest = Vec::new();
                    for op in ReduceOp::ALL {
                        digest.extend(all_dtypes(&comm, 3, op, op == ReduceOp::Max)?);
                    }
                    Ok(digest)
                })
                .unwrap();
            assert_all_ok_and_identical(res);
        }
    }
}

#[test]
fn unequal_nodes_give_correct_results() {
    // PCCL_RANKS_PER_NODE=4 on 6 ranks: nodes of 4 and 2; the hierarchy falls back to flat.
    let res = Communicator::run_threads(
        6,
        cfg(4, Some(ALGOS[2])),
        |comm| -> Result<Vec<u8>, String> {
            let v = check_collectives::<bf16>(&comm, 33, ReduceOp::Avg, false)?;
            Ok(bytemuck::cast_slice(&v).to_vec())
        },
    )
    .unwrap();
    assert_all_ok_and_identical(res);
}

#[test]
fn odd_million_element_counts_are_exact() {
    for (p, m, algo) in [(4, 2, ALGOS[2]), (3, 1, ALGOS[1]), (4, 4, ALGOS[0])] {
        let res =
            Communicator::run_threads(p, cfg(m, Some(algo)), |comm| -> Result<Vec<u8>, String> {
                let v = check_collectives::<f32>(&comm, 1_000_003, ReduceOp::Sum, false)?;
                Ok(bytemuck::cast_slice(&v[..1024]).to_vec())
            })
            .unwrap();
        assert_all_ok_and_identical(res);
    }
}

#[test]
fn auto_algorithm_choice_is_correct_across_sizes() {
    let res = Communicator::run_threads(8, cfg(4, None), |comm| -> Result<Vec<u8>, String> {
        let mut d = Vec::new();
        for count in [1usize, 100, 10_000, 300_000] {
            let v = check_collectives::<f64>(&comm, count, ReduceOp::Sum, false)?;
            d.extend_from_slice(bytemuck::cast_slice(&v[..8]));
        }
        Ok(d)
    })
    .unwrap();
    assert_all_ok_and_identical(res);
}

#[test]
fn broadcast_from_every_root_and_barrier() {
    let res = Communicator::run_threads(7, cfg(3, None), |comm| -> Result<(), String> {
        for root in 0..comm.size() {
            let mut buf: Vec<u64> = if comm.rank() == root {
                (0..1001).map(|i| i * 3 + root as u64).collect()
            } else {
                vec![0; 1001]
            };
            comm.broadcast(&mut buf, root).map_err(|e| e.to_string())?;
            let want: Vec<u64> = (0..1001).map(|i| i * 3 + root as u64).collect();
            if buf != want {
                return Err(format!("rank {} wrong broadcast from {root}", comm.rank()));
            }
            comm.barrier().map_err(|e| e.to_string())?;
        }
        Ok(())
    })
    .unwrap();
    res.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn many_outstanding_requests_on_two_communicators_complete_correctly() {
    let res = Communicator::run_threads(6, cfg(3, None), |comm| -> Result<(), String> {
        let (r, p) = (comm.rank(), comm.size());
        let sub = comm
            .split(Some((r % 2) as u32), -(r as i32))
            .map_err(|e| e.to_string())?
            .unwrap();
        let mut reqs = Vec::new();
        let mut sub_reqs = Vec::new();
        for k in 0..8usize {
            let mine: Vec<f32> = (0..1000).map(|i| (r * 10 + k + i % 3) as f32).collect();
            reqs.push(
                comm.all_gather_async(mine, vec![0f32; 1000 * p])
                    .map_err(|e| e.to_string())?,
            );
            let buf: Vec<i64> = vec![(r + k) as i64; 513];
            sub_reqs.push(
                sub.all_reduce_async(buf, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?,
            );
        }
        // Blocking calls after async ones run after them, in order.
        let mut out = vec![0u8; p];
        comm.all_gather(&[r as u8], &mut out)
            .map_err(|e| e.to_string())?;
        if out != (0..p as u8).collect::<Vec<_>>() {
            return Err("blocking all_gather after async ones is wrong".into());
        }
        for (k, req) in reqs.into_iter().enumerate() {
            let (_, out) = req.wait().map_err(|e| e.to_string())?;
            for q in 0..p {
                for i in 0..1000 {
                    if out[q * 1000 + i] != (q * 10 + k + i % 3) as f32 {
                        return Err(format!("async all_gather #{k} wrong at rank {q} elem {i}"));
                    }
                }
            }
        }
        let members: Vec<usize> = (0..p).filter(|q| q % 2 == r % 2).collect();
        for (k, req) in sub_reqs.into_iter().enumerate() {
            let got = req.wait().map_err(|e| e.to_string())?;
            let want: i64 = members.iter().map(|&q| (q + k) as i64).sum();
            if got.iter().any(|&x| x != want) {
                return Err(format!("sub-communicator all_reduce #{k} wrong"));
            }
        }
        // key = -rank reverses the order inside each color.
        let expect_rank = members.iter().rev().position(|&q| q == r).unwrap();
        if sub.rank() != expect_rank || sub.size() != members.len() {
            return Err(format!("split gave rank {}/{}", sub.rank(), sub.size()));
        }
        let t = comm.barrier_async().map_err(|e| e.to_string())?;
        t.wait().map_err(|e| e.to_string())?;
        Ok(())
    })
    .unwrap();
    res.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn request_test_turns_true_without_wait() {
    let res = Communicator::run_threads(2, cfg(1, None), |comm| -> Result<(), String> {
        let req = comm
            .all_reduce_async(vec![1u32; 4096], ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        while !req.test() {
            if start.elapsed() > Duration::from_secs(30) {
                return Err("request never completed on its own".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let v = req.wait().map_err(|e| e.to_string())?;
        if v.iter().any(|&x| x != 2) {
            return Err("wrong sum".into());
        }
        Ok(())
    })
    .unwrap();
    res.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let res = Communicator::run_threads(2, cfg(1, None), |comm| {
        let mut errs = Vec::new();
        let mut out = vec![0f32; 3];
        errs.push(comm.all_gather(&[1f32, 2.0], &mut out).unwrap_err());
        errs.push(
            comm.reduce_scatter(&[1f32; 5], &mut out, ReduceOp::Sum)
                .unwrap_err(),
        );
        errs.push(
            comm.all_reduce(&[1i32; 4], &mut [0i32; 4], ReduceOp::Avg)
                .unwrap_err(),
        );
        errs.push(
            comm.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum)
                .unwrap_err(),
        );
        errs.push(comm.broadcast(&mut out, 2).unwrap_err());
        errs.push(comm.all_gather_in_place(&mut [0u8; 3]).unwrap_err());
        // The communicator still works afterwards.
        let mut ok = [0u8; 2];
        comm.all_gather(&[comm.rank() as u8], &mut ok).unwrap();
        assert_eq!(ok, [0, 1]);
        errs
    })
    .unwrap();
    for errs in res {
        for e in errs {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(!e.message().is_empty());
        }
    }
    let e = Communicator::run_threads(2, cfg(1, None), |comm| {
        comm.all_reduce(&[1u8; 2], &mut [0u8; 2], ReduceOp::Avg)
            .unwrap_err()
    })
    .unwrap();
    assert!(e[0].message().contains("avg"), "{}", e[0]);
}

#[test]
fn ranks_disagreeing_on_counts_get_an_error_not_a_hang() {
    let mut c = cfg(1, Some(ALGOS[0]));
    c.timeout = Duration::from_secs(3);
    let res = Communicator::run_threads(2, c, |comm| {
        let n = 4 + comm.rank();
        let mine = vec![1f32; n];
        let mut out = vec![0f32; 2 * n];
        comm.all_gather(&mine, &mut out)
    })
    .unwrap();
    assert!(
        res.iter()
            .any(|r| r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Remote)),
        "{res:?}"
    );
}

#[test]
fn a_rank_that_never_arrives_ends_in_a_timeout_error() {
    let mut c = cfg(1, None);
    c.timeout = Duration::from_millis(500);
    let res = Communicator::run_threads(3, c, |comm| {
        if comm.rank() == 2 {
            // Alive, holding its communicator, but never calling.
            std::thread::sleep(Duration::from_millis(1500));
            return Ok(());
        }
        let mut out = vec![0f64; 3 * 10];
        comm.all_gather(&[1.0; 10], &mut out)
    })
    .unwrap();
    for r in &res[..2] {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    }
}

#[test]
fn a_rank_that_leaves_without_calling_fails_the_others_at_once_naming_it() {
    let mut c = cfg(1, None);
    c.timeout = Duration::from_secs(30);
    let t0 = std::time::Instant::now();
    let res = Communicator::run_threads(3, c, |comm| {
        if comm.rank() == 2 {
            return Ok(()); // destroys its communicator without calling
        }
        let mut out = vec![0f64; 3 * 10];
        comm.all_gather(&[1.0; 10], &mut out)
    })
    .unwrap();
    for r in &res[..2] {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote, "{e}");
        assert!(e.message().contains("rank 2 left"), "{e}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn value_helper_is_exact_in_the_smallest_types() {
    // 16 ranks of the largest summand stay exact in i8 and f16.
    let s: i64 = (0..16).map(|r| value::<i64>(r, 0, ReduceOp::Sum)).sum();
    assert!(s < 127);
    assert_eq!(reduced::<f16>(16, 0, ReduceOp::Sum).to_f32() as i64, s);
}

#[test]
fn whole_vector_all_reduce_matches_the_reference_for_every_dtype_op_and_rank_count() {
    for p in 1..=6usize {
        let res = Communicator::run_threads(
            p,
            cfg(1, Some(Algorithm::VectorRd)),
            |comm| -> Result<Vec<u8>, String> {
                let mut digest = Vec::new();
                for op in ReduceOp::ALL {
                    for count in [0usize, 1, 7, 1001] {
                        for inplace in [false, true] {
                            digest.extend(all_dtypes(&comm, count, op, inplace)?);
                        }
                    }
                }
                Ok(digest)
            },
        )
        .unwrap();
        assert_all_ok_and_identical(res);
    }
}

/// Runs an equal-block all-to-all of `count` elements per peer and checks it: rank `r`'s
/// block `i` must be rank `i`'s block `r`.
fn check_all_to_all<T: Element>(comm: &Communicator, count: usize) -> Result<(), String> {
    let (r, p) = (comm.rank(), comm.size());
    // Element `e` of the block rank `from` sends to rank `to`: distinct for small p, count.
    let cell =
        |from: usize, to: usize, e: usize| T::from_i64(((from * 7 + to * 3 + e) % 100) as i64);
    let inp: Vec<T> = (0..p)
        .flat_map(|to| (0..count).map(move |e| cell(r, to, e)))
        .collect();
    let want: Vec<T> = (0..p)
        .flat_map(|from| (0..count).map(move |e| cell(from, r, e)))
        .collect();
    let mut out = vec![T::from_i64(-1); p * count];
    comm.all_to_all(&inp, &mut out)
        .map_err(|e| format!("all_to_all {} count={count} rank={r}/{p}: {e}", T::DTYPE))?;
    if !same_bits(&out, &want) {
        return Err(format!(
            "all_to_all {} count={count} rank={r}/{p}: wrong result",
            T::DTYPE
        ));
    }
    Ok(())
}

#[test]
fn all_to_all_is_exact_on_both_sides_of_the_direct_threshold() {
    let over = pccl::plan::alltoall::DIRECT_MAX_BLOCK_BYTES / 8 + 1;
    // The default limit, always pairwise (0), always direct.
    for limit in [None, Some(0), Some(usize::MAX)] {
        for p in 1..=6usize {
            let mut c = cfg(1, None);
            if let Some(l) = limit {
                c.alltoall_direct_max = l;
            }
            let res = Communicator::run_threads(p, c, |comm| -> Result<(), String> {
                for count in [0usize, 1, 7, 1001, over] {
                    check_all_to_all::<u8>(&comm, count)?;
                    check_all_to_all::<f16>(&comm, count)?;
                    check_all_to_all::<f64>(&comm, count)?;
                }
                Ok(())
            })
            .unwrap();
            res.into_iter().for_each(|r| r.unwrap());
        }
    }
}

#[test]
fn a_rank_missing_from_a_direct_all_to_all_ends_in_an_error_not_a_hang() {
    let mut c = cfg(1, None);
    c.timeout = Duration::from_millis(500);
    let res = Communicator::run_threads(4, c, |comm| {
        if comm.rank() == 2 {
            return Ok(()); // this rank "dies"
        }
        let mut out = vec![0f32; 4 * 3];
        comm.all_to_all(&[1.0; 12], &mut out)
    })
    .unwrap();
    for (r, res) in res.iter().enumerate().filter(|(r, _)| *r != 2) {
        let e = res.as_ref().unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Remote),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn three_level_hierarchy_matches_the_reference_for_every_dtype_and_op() {
    // (nodes, ranks per node, ranks per group): pairs, triples, an odd node count.
    for (n, m, g) in [(2, 4, 2), (3, 4, 2), (2, 6, 3), (2, 6, 2)] {
        for name in [
            "hier3-rd",
            "hier3-ring",
            "hier3-rd-rd-rd",
            "hier3-ring-rd-ring-pipe3",
        ] {
            let algo: Algorithm = name.parse().unwrap();
            let cfg = Config {
                group_size: Some(g),
                ..cfg(m, Some(algo))
            };
            let res = Communicator::run_threads(n * m, cfg, |comm| -> Result<Vec<u8>, String> {
                if !comm.topology().has_groups() {
                    return Err(format!("no groups in {}", comm.topology().describe()));
                }
                let mut digest = Vec::new();
                for op in ReduceOp::ALL {
                    for count in [0usize, 1, 7] {
                        digest.extend(all_dtypes(&comm, count, op, count % 2 == 1)?);
                    }
                }
                for inplace in [false, true] {
                    let v = check_collectives::<f32>(&comm, 40_001, ReduceOp::Sum, inplace)?;
                    digest.extend_from_slice(bytemuck::cast_slice(&v));
                }
                Ok(digest)
            })
            .unwrap();
            assert_all_ok_and_identical(res);
        }
    }
}

#[test]
fn communicators_split_from_one_another_keep_one_scratch_between_calls() {
    // Three algorithms, each on its own split (as pccl-bench's list runs them), take turns:
    // their idle scratch is the largest one's need, not the sum, and every result is right.
    let (n, m, count) = (2, 4, 5_000usize);
    let res = Communicator::run_threads(n * m, cfg(m, None), |comm| -> Result<(), String> {
        let p = comm.size();
        let mut subs = Vec::new();
        for name in ["ring", "rd", "hier-rd-pipe4"] {
            let c = Config {
                algo: Some(name.parse().unwrap()),
                ..comm.config().clone()
            };
            let sub = comm.split_with_config(Some(0), comm.rank() as i32, c);
            subs.push(sub.map_err(|e| e.to_string())?.ok_or("left out")?);
        }
        let input: Vec<f32> = input(comm.rank(), count * p, ReduceOp::Sum);
        for _round in 0..2 {
            for sub in &subs {
                let mut out = vec![0f32; count];
                sub.reduce_scatter(&input, &mut out, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?;
                let at = comm.rank() * count;
                for (i, &v) in out.iter().enumerate() {
                    let want: f32 = reduced(p, at + i, ReduceOp::Sum);
                    if !same_bits(&[v], &[want]) {
                        return Err(format!("rank {}: element {i}: {v} != {want}", comm.rank()));
                    }
                }
            }
        }
        let needs: Vec<usize> = subs.iter().map(Communicator::scratch_bytes).collect();
        let (most, sum) = (*needs.iter().max().unwrap(), needs.iter().sum::<usize>());
        if needs.contains(&0) || most == sum {
            return Err(format!(
                "expected three different scratch needs, got {needs:?}"
            ));
        }
        for sub in &subs {
            if sub.scratch_pool_bytes() != most || comm.scratch_pool_bytes() != most {
                return Err(format!(
                    "the pool holds {} bytes, the largest need is {most} (needs {needs:?})",
                    sub.scratch_pool_bytes()
                ));
            }
        }
        Ok(())
    })
    .unwrap();
    for (r, x) in res.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}
