//! The quantized collectives of the C ABI (`pcclAllGatherQuantized`,
//! `pcclReduceScatterQuantized`): host memory with `stream` NULL; device memory of the
//! stream's GPU otherwise (CUDA or HIP, the communicator's runtime), encoded and decoded by
//! the device's kernels, blocking. A rank whose call fails before the agreement (bad flags,
//! dtype, runtime or stream) still takes part in it, so every rank fails alike.

use super::handles;
use super::{
    check_buffer, datatype as dtype_of, entry, pcclComm_t, pcclDataType_t, pcclResult_t, OnComm,
    Outcome,
};
use crate::error::{Error, Result};
use crate::quant::{Quant, QuantFloat};
use crate::{Communicator, DType};
use std::ffi::c_void;

/// `flags` bit of the quantized calls: encode NaN and infinities (their blocks arrive as NaN)
/// instead of refusing the call.
pub const PCCL_QUANT_ALLOW_NONFINITE: u32 = 1;

/// `flags` bit of [`pcclReduceScatterQuantized`]: divide the sums by the number of ranks.
pub const PCCL_QUANT_AVERAGE: u32 = 2;

/// `flags` bit of [`pcclReduceScatterQuantized`]: recursive halving inside the node and
/// between nodes, every partial sum quantized (`log2` steps per level), instead of the two
/// quantized all-to-alls (docs/QUANTIZED.md). Every rank must pass the same.
pub const PCCL_QUANT_HALVING: u32 = 4;

/// `flags` bit of [`pcclReduceScatterQuantized`]: one quantized all-to-all per level of the
/// topology — inside the group (`PCCL_GROUP_SIZE`: a GPU pair, a NUMA node), among the
/// node's groups, between nodes — instead of two (without groups it is the two-hop scheme).
/// Not with [`PCCL_QUANT_HALVING`].
pub const PCCL_QUANT_PER_LEVEL: u32 = 8;

/// Which quantized collective.
#[derive(Clone, Copy)]
enum Which {
    AllGather,
    ReduceScatter {
        average: bool,
        scheme: crate::QuantScheme,
    },
}

/// Runs the quantized collective on `T`; argument problems found here still take the
/// collective's turn (the header exchange), so every rank fails alike.
///
/// # Safety
/// As [`pcclAllGatherQuantized`] / [`pcclReduceScatterQuantized`].
unsafe fn run_typed<T: QuantFloat>(
    comm: &Communicator,
    which: Which,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    q: Quant,
    local: Option<Error>,
) -> Result<()> {
    let p = comm.size();
    let (in_len, out_len) = match which {
        Which::AllGather => (Some(count), count.checked_mul(p)),
        Which::ReduceScatter { .. } => (count.checked_mul(p), Some(count)),
    };
    let checked = local.map_or(Ok(()), Err).and_then(|()| {
        let (Some(in_len), Some(out_len)) = (in_len, out_len) else {
            return Err(Error::invalid(format!(
                "count {count} x {p} ranks overflows size_t"
            )));
        };
        check_buffer::<T>("sendbuff", send as usize, in_len)?;
        check_buffer::<T>("recvbuff", recv as usize, out_len)?;
        if count > 0 && (send.is_null() || recv.is_null()) {
            return Err(Error::invalid("sendbuff and recvbuff must not be NULL"));
        }
        Ok((in_len, out_len))
    });
    let call = |input: &[T], output: &mut [T]| match which {
        Which::AllGather => comm.all_gather_quantized(input, output, q),
        Which::ReduceScatter { average, scheme } => {
            comm.reduce_scatter_quantized_with(input, output, q, average, scheme)
        }
    };
    match checked {
        // SAFETY: the caller guarantees `in_len` readable elements at `send` and `out_len`
        // writable ones at `recv` (checked above to be addressable), not touched by others
        // during the call; the two do not overlap (no in-place form).
        Ok((in_len, out_len)) if count > 0 => unsafe {
            let input = std::slice::from_raw_parts(send.cast::<T>(), in_len);
            let output = std::slice::from_raw_parts_mut(recv.cast::<T>(), out_len);
            call(input, output)
        },
        Ok(_) => call(&[], &mut []),
        Err(e) => {
            // Take part with buffers that cannot match: every rank then refuses the call.
            let mut one = [T::from_f32(0.0)];
            let _ = match which {
                Which::AllGather => call(&[], &mut one),
                Which::ReduceScatter { .. } => call(&one.clone(), &mut []),
            };
            Err(e)
        }
    }
}

/// The shared body of the quantized entry points.
#[allow(clippy::too_many_arguments)]
fn quantized(
    comm_handle: pcclComm_t,
    which: Which,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    (bits, block, flags, known): (u32, usize, u32, u32),
    stream: *mut c_void,
) -> Outcome<()> {
    let c = handles::comm(comm_handle as usize, "comm", false)?;
    let q = Quant {
        bits,
        block,
        allow_nonfinite: flags & PCCL_QUANT_ALLOW_NONFINITE != 0,
    };
    let mut local = None;
    if flags & !known != 0 {
        local = Some(Error::invalid(format!(
            "unknown flags {:#x}",
            flags & !known
        )));
    } else if flags & PCCL_QUANT_HALVING != 0 && flags & PCCL_QUANT_PER_LEVEL != 0 {
        local = Some(Error::invalid(
            "flags PCCL_QUANT_HALVING and PCCL_QUANT_PER_LEVEL name two schemes: pass one",
        ));
    }
    let comm = &c.comm;
    let dt = dtype_of(datatype);
    // A count of 0 moves nothing: the host path's agreement serves any buffers.
    if !stream.is_null() && local.is_none() && count > 0 {
        if let Ok(dt @ (DType::F32 | DType::F64 | DType::F16 | DType::BF16)) = dt {
            let entered = std::cell::Cell::new(false);
            let call = super::device::DeviceCall::Quantized {
                dt,
                send,
                recv,
                count,
                q,
                rs: match which {
                    Which::AllGather => None,
                    Which::ReduceScatter { average, scheme } => Some((average, scheme)),
                },
                entered: &entered,
            };
            let runtime = c.runtime.load(std::sync::atomic::Ordering::SeqCst);
            // SAFETY: forwarded from the caller (device buffers valid for the counts,
            // `stream` a stream of their GPU).
            let r = unsafe { super::device::run(comm, runtime, call, stream) };
            match r {
                Err(e) if !entered.get() => local = Some(e),
                r => return r.on(&c),
            }
        }
    }
    // SAFETY: forwarded from the caller (buffers valid for the counts).
    let r = unsafe {
        match dt {
            Ok(DType::F32) => run_typed::<f32>(comm, which, send, recv, count, q, local),
            Ok(DType::F64) => run_typed::<f64>(comm, which, send, recv, count, q, local),
            Ok(DType::F16) => run_typed::<half::f16>(comm, which, send, recv, count, q, local),
            Ok(DType::BF16) => run_typed::<half::bf16>(comm, which, send, recv, count, q, local),
            other => {
                let e = other.err().unwrap_or_else(|| {
                    Error::invalid(format!(
                        "datatype {datatype}: quantized collectives take float32, float16, \
                         bfloat16 or float64"
                    ))
                });
                run_typed::<f32>(comm, which, send, recv, count, q, Some(e))
            }
        }
    };
    r.on(&c)
}

/// All-gathers `sendcount` elements of every rank's `sendbuff` into `recvbuff` (rank `r`'s at
/// `r * sendcount`) with the data block-quantized on the wire: `bits` 8 or 4, one `f32` scale
/// per `block` elements (a power of two, 32 … 8192). Every element arrives within half its
/// block's step (`max |x| / 127`, or `/ 7` for 4 bits), zeros exactly. `datatype`: float32,
/// float16, bfloat16 or float64. NaN or infinity in any rank's data fails the call on every
/// rank before any data moves, unless `flags` has [`PCCL_QUANT_ALLOW_NONFINITE`]. Every rank
/// must pass the same `bits`, `block`, `sendcount` and flags; one that does not fails the call
/// on every rank, named. `stream` NULL: host memory; otherwise device memory of that stream's
/// GPU (CUDA or HIP, as the communicator's runtime), ordered on the stream as the other
/// collectives are: queued (the call returns at once; the stream waits for the result;
/// encoded and decoded on pinned host memory, bit-identical) where the communicator queues
/// its device calls, a refusal found then (NaN, a disagreeing rank) being the communicator's
/// asynchronous error (`pcclCommGetAsyncError`; every later call returns it; the stream stays
/// held until `pcclCommAbort`); otherwise blocking, encoded by the device's kernels.
///
/// # Safety
/// `sendbuff` must be readable for `sendcount` elements and `recvbuff` writable for
/// `sendcount * nranks`, not overlapping, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclAllGatherQuantized(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: pcclDataType_t,
    bits: u32,
    block: usize,
    flags: u32,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllGatherQuantized", || {
        quantized(
            comm,
            Which::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            (bits, block, flags, PCCL_QUANT_ALLOW_NONFINITE),
            stream,
        )
    })
}

/// Reduce-scatter (sum; the average with [`PCCL_QUANT_AVERAGE`] in `flags`) of `recvcount *
/// nranks` elements of every rank's `sendbuff`, block `r` to rank `r`'s `recvbuff`, with the
/// data block-quantized on the wire (ZeRO++'s qgZ: inside a node an all-to-all of quantized
/// pieces, summed in f32 and requantized, then between nodes the same; one all-to-all on one
/// node or one rank per node; with [`PCCL_QUANT_HALVING`] in `flags`, recursive halving at
/// each level instead). `bits` 8 or 4, one `f32` scale per `block` elements (a power
/// of two, 32 … 8192). Every element is within half a step of every quantized piece it passed
/// through (docs/QUANTIZED.md). Datatypes, refusals and `stream` as
/// [`pcclAllGatherQuantized`] (queued on the stream, every scheme; on device memory the
/// halving scheme and the per-level one with groups are encoded on the host).
///
/// # Safety
/// `sendbuff` must be readable for `recvcount * nranks` elements and `recvbuff` writable for
/// `recvcount`, not overlapping, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclReduceScatterQuantized(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: pcclDataType_t,
    bits: u32,
    block: usize,
    flags: u32,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclReduceScatterQuantized", || {
        quantized(
            comm,
            Which::ReduceScatter {
                average: flags & PCCL_QUANT_AVERAGE != 0,
                scheme: if flags & PCCL_QUANT_HALVING != 0 {
                    crate::QuantScheme::Halving
                } else if flags & PCCL_QUANT_PER_LEVEL != 0 {
                    crate::QuantScheme::PerLevel
                } else {
                    crate::QuantScheme::TwoHop
                },
            },
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            (
                bits,
                block,
                flags,
                PCCL_QUANT_ALLOW_NONFINITE
                    | PCCL_QUANT_AVERAGE
                    | PCCL_QUANT_HALVING
                    | PCCL_QUANT_PER_LEVEL,
            ),
            stream,
        )
    })
}
