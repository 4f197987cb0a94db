//! The quantized collectives of the C ABI (`pcclAllGatherQuantized`): host memory only for
//! now (a non-NULL `stream` is `pcclInvalidUsage`, on every rank).

use super::handles;
use super::{
    check_buffer, datatype as dtype_of, entry, pcclComm_t, pcclDataType_t, pcclResult_t, OnComm,
};
use crate::error::{Error, Result};
use crate::quant::{Quant, QuantFloat};
use crate::{Communicator, DType};
use std::ffi::c_void;

/// `flags` bit of [`pcclAllGatherQuantized`]: encode NaN and infinities (their blocks arrive
/// as NaN) instead of refusing the call.
pub const PCCL_QUANT_ALLOW_NONFINITE: u32 = 1;

/// Runs the quantized all-gather on `T`; argument problems found here still take the
/// collective's turn (the header exchange), so every rank fails alike.
///
/// # Safety
/// As [`pcclAllGatherQuantized`].
unsafe fn gather_typed<T: QuantFloat>(
    comm: &Communicator,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    q: Quant,
    local: Option<Error>,
) -> Result<()> {
    let p = comm.size();
    let out_len = count.checked_mul(p);
    let checked = local.map_or(Ok(()), Err).and_then(|()| {
        let out_len = out_len
            .ok_or_else(|| Error::invalid(format!("count {count} x {p} ranks overflows size_t")))?;
        check_buffer::<T>("sendbuff", send as usize, count)?;
        check_buffer::<T>("recvbuff", recv as usize, out_len)?;
        if count > 0 && (send.is_null() || recv.is_null()) {
            return Err(Error::invalid("sendbuff and recvbuff must not be NULL"));
        }
        Ok(out_len)
    });
    match checked {
        // SAFETY: the caller guarantees `count` readable elements at `send` and `count × p`
        // writable ones at `recv` (checked above to be addressable), not touched by others
        // during the call; the two do not overlap (no in-place form).
        Ok(out_len) if count > 0 => unsafe {
            let input = std::slice::from_raw_parts(send.cast::<T>(), count);
            let output = std::slice::from_raw_parts_mut(recv.cast::<T>(), out_len);
            comm.all_gather_quantized(input, output, q)
        },
        Ok(_) => comm.all_gather_quantized::<T>(&[], &mut [], q),
        Err(e) => {
            // Take part with an output that cannot match: every rank then refuses the call.
            let _ = comm.all_gather_quantized::<T>(&[], &mut [T::from_f32(0.0)], q);
            Err(e)
        }
    }
}

/// All-gathers `sendcount` elements of every rank's `sendbuff` into `recvbuff` (rank `r`'s at
/// `r * sendcount`) with the data block-quantized on the wire: `bits` 8 or 4, one `f32` scale
/// per `block` elements (a power of two, 32 … 8192). Every element arrives within half its
/// block's step (`max |x| / 127`, or `/ 7` for 4 bits), zeros exactly. `datatype`: float32,
/// float16, bfloat16 or float64. NaN or infinity in any rank's data fails the call on every
/// rank before any data moves, unless `flags` has [`PCCL_QUANT_ALLOW_NONFINITE`]. Every rank
/// must pass the same `bits`, `block`, `sendcount` and flags; one that does not fails the call
/// on every rank, named. `stream` must be NULL (host memory).
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
        let c = handles::comm(comm as usize, "comm", false)?;
        let q = Quant {
            bits,
            block,
            allow_nonfinite: flags & PCCL_QUANT_ALLOW_NONFINITE != 0,
        };
        let mut local = None;
        if flags & !PCCL_QUANT_ALLOW_NONFINITE != 0 {
            local = Some(Error::invalid(format!("unknown flags {flags:#x}")));
        } else if !stream.is_null() {
            local = Some(Error::usage(
                "device memory is not supported for quantized collectives yet (pass stream = NULL)",
            ));
        }
        let dt = dtype_of(datatype);
        let comm = &c.comm;
        // SAFETY: forwarded from the caller (buffers valid for the counts).
        let r = unsafe {
            match dt {
                Ok(DType::F32) => {
                    gather_typed::<f32>(comm, sendbuff, recvbuff, sendcount, q, local)
                }
                Ok(DType::F64) => {
                    gather_typed::<f64>(comm, sendbuff, recvbuff, sendcount, q, local)
                }
                Ok(DType::F16) => {
                    gather_typed::<half::f16>(comm, sendbuff, recvbuff, sendcount, q, local)
                }
                Ok(DType::BF16) => {
                    gather_typed::<half::bf16>(comm, sendbuff, recvbuff, sendcount, q, local)
                }
                other => {
                    let e = other.err().unwrap_or_else(|| {
                        Error::invalid(format!(
                            "datatype {datatype}: quantized collectives take float32, \
                             float16, bfloat16 or float64"
                        ))
                    });
                    gather_typed::<f32>(comm, sendbuff, recvbuff, sendcount, q, Some(e))
                }
            }
        };
        r.on(&c)
    })
}
