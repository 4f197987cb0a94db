//! Run under `mpiexec -n K`: checks every algorithm's collectives on the MPI transport
//! against the reference, for several dtypes, ops and counts, in-place and not, plus
//! broadcast, barrier, split and non-blocking requests; the overlapped hierarchy
//! (`hier-*-pipeK`, K in {2, 4, 7}) as well. Exits non-zero on any failure.
//! `PCCL_RANKS_PER_NODE` sets the pretend node shape.
//!
//! It also checks the CUDA-awareness detection: rank 0 prints
//! `mpi_check: MPI moves device memory: BOOL`, which must be `false` (the MPI this is tested
//! with is not CUDA-aware) unless `PCCL_MPI_CUDA_AWARE=1` forces it on, and sub-communicators
//! must agree with their parent.

#[path = "../tests/common.rs"]
mod common;

use common::{input, overlapped, reduced, same_bits};
use half::bf16;
use pccl::config::Config;
use pccl::plan::Algorithm;
use pccl::transport::mpi::{finalize, parse_cuda_aware_override, MpiTransport};
use pccl::transport::Transport;
use pccl::{Communicator, Element, ReduceOp};
use std::sync::Arc;

const ALGOS: [Algorithm; 7] = Algorithm::ALL;

fn check<T: Element>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    inplace: bool,
) -> Result<(), String> {
    let (r, p) = (comm.rank(), comm.size());
    let tag = format!(
        "{} count={count} op={op} inplace={inplace} algo-rank={r}/{p}",
        T::DTYPE
    );
    let e = |what: &str, err: pccl::Error| format!("{what} {tag}: {err}");
    // all-gather
    let mine = input::<T>(r, count, op);
    let mut out = vec![T::from_i64(77); count * p];
    if inplace {
        out[r * count..(r + 1) * count].copy_from_slice(&mine);
        comm.all_gather_in_place(&mut out)
            .map_err(|x| e("all_gather", x))?;
    } else {
        comm.all_gather(&mine, &mut out)
            .map_err(|x| e("all_gather", x))?;
    }
    let want: Vec<T> = (0..p).flat_map(|q| input::<T>(q, count, op)).collect();
    if !same_bits(&out, &want) {
        return Err(format!("all_gather {tag}: wrong result"));
    }
    // reduce-scatter
    let full = input::<T>(r, count * p, op);
    let want: Vec<T> = (r * count..(r + 1) * count)
        .map(|i| reduced::<T>(p, i, op))
        .collect();
    let got = if inplace {
        let mut b = full.clone();
        comm.reduce_scatter_in_place(&mut b, op)
            .map_err(|x| e("reduce_scatter", x))?;
        b[r * count..(r + 1) * count].to_vec()
    } else {
        let mut o = vec![T::from_i64(77); count];
        comm.reduce_scatter(&full, &mut o, op)
            .map_err(|x| e("reduce_scatter", x))?;
        o
    };
    if !same_bits(&got, &want) {
        return Err(format!("reduce_scatter {tag}: wrong result"));
    }
    // all-reduce, odd length
    let n = count * p + 3;
    let mine = input::<T>(r, n, op);
    let want: Vec<T> = (0..n).map(|i| reduced::<T>(p, i, op)).collect();
    let mut o = vec![T::from_i64(77); n];
    if inplace {
        o.copy_from_slice(&mine);
        comm.all_reduce_in_place(&mut o, op)
            .map_err(|x| e("all_reduce", x))?;
    } else {
        comm.all_reduce(&mine, &mut o, op)
            .map_err(|x| e("all_reduce", x))?;
    }
    if !same_bits(&o, &want) {
        return Err(format!("all_reduce {tag}: wrong result"));
    }
    Ok(())
}

fn run(comm: &Communicator) -> Result<(), String> {
    for count in [0usize, 1, 7, 1000] {
        for inplace in [false, true] {
            check::<f32>(comm, count, ReduceOp::Sum, inplace)?;
            check::<i64>(comm, count, ReduceOp::Max, inplace)?;
        }
    }
    check::<bf16>(comm, 33, ReduceOp::Avg, false)?;
    check::<u8>(comm, 5, ReduceOp::Prod, true)?;
    check::<f64>(comm, 70_001, ReduceOp::Min, false)?;
    // broadcast from every root, barrier
    for root in 0..comm.size() {
        let mut b: Vec<u32> = if comm.rank() == root {
            (0..999).collect()
        } else {
            vec![0; 999]
        };
        comm.broadcast(&mut b, root).map_err(|x| x.to_string())?;
        if b != (0..999).collect::<Vec<u32>>() {
            return Err(format!("broadcast from {root} wrong"));
        }
    }
    comm.barrier().map_err(|x| x.to_string())?;
    Ok(())
}

fn main() {
    let mut failures = 0;
    let rank;
    {
        let base = Config::from_env().expect("PCCL_* settings");
        let world = Arc::new(MpiTransport::world(base.chunk_bytes).expect("MPI world"));
        // Small pieces so the chunked receive path is exercised at moderate sizes.
        let world_comm = Communicator::with_config(
            world,
            Config {
                chunk_bytes: 64 * 1024,
                ..base.clone()
            },
        )
        .expect("communicator");
        rank = world_comm.rank();
        // CUDA-awareness: detected (false here) unless PCCL_MPI_CUDA_AWARE overrides it.
        let forced =
            parse_cuda_aware_override(std::env::var("PCCL_MPI_CUDA_AWARE").ok().as_deref())
                .expect("PCCL_MPI_CUDA_AWARE");
        let probe = MpiTransport::world(base.chunk_bytes).expect("MPI world");
        let aware = probe.moves_device_memory();
        let members: Vec<usize> = (0..probe.size()).collect();
        let sub_aware = probe
            .subset(&members, 1)
            .expect("MPI subset")
            .moves_device_memory();
        if rank == 0 {
            println!("mpi_check: MPI moves device memory: {aware}");
        }
        if aware != forced.unwrap_or(false) || sub_aware != aware {
            eprintln!(
                "FAIL CUDA-awareness: detected {aware} (sub-communicator {sub_aware}), expected {} \
                 (PCCL_MPI_CUDA_AWARE={forced:?})",
                forced.unwrap_or(false)
            );
            failures += 1;
        }
        drop(probe);
        // The overlapped hierarchy too: K in {2, 4, 7}, three level pairs; the counts above
        // are no multiple of P·K.
        let pipes = [overlapped(0, 2), overlapped(1, 4), overlapped(2, 7)];
        for algo in ALGOS.into_iter().chain(pipes) {
            let cfg = Config {
                algo: Some(algo),
                chunk_bytes: 64 * 1024,
                ..base.clone()
            };
            let t = Arc::new(MpiTransport::world(cfg.chunk_bytes).expect("MPI world"));
            let comm = Communicator::with_config(t, cfg).expect("communicator");
            if let Err(e) = run(&comm) {
                eprintln!("FAIL {algo} on {}: {e}", comm.topology().describe());
                failures += 1;
            }
        }
        // split + non-blocking requests on the sub-communicator and the parent at once
        let r = world_comm.rank();
        let p = world_comm.size();
        match world_comm.split(Some((r % 2) as u32), r as i32) {
            Ok(Some(sub)) => {
                let a = sub
                    .all_reduce_async(vec![r as i64; 1001], ReduceOp::Sum)
                    .expect("submit");
                let b = world_comm
                    .all_gather_async(vec![r as u32; 3], vec![0u32; 3 * p])
                    .expect("submit");
                let got = a.wait().expect("sub all_reduce");
                let want: i64 = (0..p).filter(|q| q % 2 == r % 2).map(|q| q as i64).sum();
                if got.iter().any(|&x| x != want) {
                    eprintln!("FAIL split all_reduce");
                    failures += 1;
                }
                let (_, g) = b.wait().expect("all_gather");
                if g != (0..p).flat_map(|q| [q as u32; 3]).collect::<Vec<_>>() {
                    eprintln!("FAIL async all_gather");
                    failures += 1;
                }
            }
            other => {
                eprintln!(
                    "FAIL split: {other:?}",
                    other = other.map(|c| c.map(|c| c.size()))
                );
                failures += 1;
            }
        }
        // The survivors' agreement with every rank alive keeps them all, leaves nothing
        // in the way of the next collective, and its communicator works.
        match world_comm.survivors() {
            Ok(alive) if alive == (0..p).collect::<Vec<_>>() => {}
            other => {
                eprintln!("FAIL survivors: {other:?}");
                failures += 1;
            }
        }
        let mut v = vec![1u64; 77];
        if world_comm
            .all_reduce_in_place(&mut v, ReduceOp::Sum)
            .is_err()
            || v.iter().any(|&x| x != p as u64)
        {
            eprintln!("FAIL all_reduce after the survivors' agreement");
            failures += 1;
        }
        match world_comm.shrink_to_survivors() {
            Ok(all) if all.size() == p => {
                let mut v = vec![r as u32; 5];
                let want: u32 = (0..p as u32).sum();
                if all.all_reduce_in_place(&mut v, ReduceOp::Sum).is_err()
                    || v.iter().any(|&x| x != want)
                {
                    eprintln!("FAIL all_reduce on the survivors' communicator");
                    failures += 1;
                }
            }
            other => {
                eprintln!("FAIL shrink_to_survivors: {:?}", other.map(|c| c.size()));
                failures += 1;
            }
        }
    }
    finalize();
    if failures > 0 {
        eprintln!("rank {rank}: {failures} failures");
        std::process::exit(1);
    }
    if rank == 0 {
        println!("mpi_check: all algorithms correct");
    }
}
