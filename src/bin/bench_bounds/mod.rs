//! What `pccl-bench` sets beside PCCL's time in a row: MPI's own collective on the same
//! buffers (under mpiexec), the NIC floor (`--nic-rate`: the bytes through the busiest NIC
//! direction of every rank's plan at that rate) and the model's prediction (`--model`: the
//! tuner's simulator with the run's profile on the communicator's topology).

use super::{Args, Coll, Native};
use pccl::{Communicator, DType, Element, RawCollective, ReduceOp};

/// A row's floor and prediction (µs), each `None` when not asked for.
pub struct Bounds {
    /// The NIC floor (`--nic-rate`).
    pub floor_us: Option<f64>,
    /// The model's prediction (`--model`).
    pub model_us: Option<f64>,
}

/// The bounds of a call of `coll` with `count` elements of `es` bytes per block, run with the
/// algorithm named `algo`.
pub fn of_row(
    comm: &Communicator,
    coll: Coll,
    op: ReduceOp,
    algo: &str,
    count: usize,
    es: usize,
    args: &Args,
) -> pccl::Result<Bounds> {
    if args.nic_rate.is_none() && !args.model {
        return Ok(Bounds {
            floor_us: None,
            model_us: None,
        });
    }
    let algo: pccl::Algorithm = algo.parse()?;
    let key = coll.plan_key(op);
    let block = coll.block_bytes(count, comm.size(), es) as f64;
    let floor_us = match &args.nic_rate {
        Some(rate) => {
            let rate = pccl::model::nic_load::parse_rate(rate)?;
            let load = pccl::model::nic_load::nic_load(key, algo, comm.topology())?;
            Some(load.floor_seconds(block, rate) * 1e6)
        }
        None => None,
    };
    let model_us = if args.model {
        let prof = &comm.config().profile;
        Some(pccl::model::tuner::predict(key, algo, comm.topology(), block, prof)? * 1e6)
    } else {
        None
    };
    Ok(Bounds { floor_us, model_us })
}

/// One call of MPI's own collective on the same buffers; `None` where MPI's collective is not
/// there to time (no MPI world, a dtype or op MPI lacks, `--no-mpi-compare`).
pub fn mpi_once<T: Element>(
    native: &Native<'_>,
    coll: Coll,
    op: ReduceOp,
    input: &[T],
    output: &mut [T],
    count: usize,
    args: &Args,
) -> Option<pccl::Result<()>> {
    if args.no_mpi_compare
        || T::DTYPE == DType::F16
        || T::DTYPE == DType::BF16
        || op == ReduceOp::Avg
    {
        return None;
    }
    let raw = match coll {
        Coll::AllGather => RawCollective::AllGather,
        Coll::ReduceScatter => RawCollective::ReduceScatter(op),
        Coll::AllReduce => RawCollective::AllReduce(op),
    };
    #[cfg(feature = "mpi")]
    {
        let m = native.mpi?;
        let (i, o) = super::lens(coll, count, pccl::transport::Transport::size(m));
        if input.len() < i || output.len() < o {
            return Some(Err(pccl::Error::internal(
                "MPI comparison buffers too short",
            )));
        }
        // SAFETY: `input` and `output` hold at least the lengths the collective implies for
        // `count` elements per block (checked above).
        Some(unsafe {
            m.native_collective(
                raw,
                T::DTYPE,
                input.as_ptr() as *const u8,
                output.as_mut_ptr() as *mut u8,
                count,
            )
        })
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = (native, raw, input, output, count);
        None
    }
}
