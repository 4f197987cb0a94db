//! The collectives of the C ABI on one buffer pair: all-gather, reduce-scatter, all-reduce,
//! broadcast and barrier, blocking (host memory, or device memory queued on a stream) and
//! non-blocking (host memory, a request), with `pcclWait` and `pcclTest`.

use super::handles::{self, lock, CommEntry};
use super::{
    check_buffer, datatype, device, entry, extents, hand_out, not_null, pcclComm_t, pcclDataType_t,
    pcclRedOp_t, pcclRequest_t, pcclResult_t, put, red_op, root_of, start, OnComm, Outcome,
};
use crate::comm::request::Request;
use crate::error::{Error, Result};
use crate::{Communicator, DType, Element, RawCollective};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Starts `coll` on buffers of `T`: blocking (returns `None`) or not (returns the request).
///
/// # Safety
/// The buffers must be valid for the counts `coll` implies, until the call returns (blocking)
/// or the request completes.
unsafe fn typed<T: Element>(
    comm: &Communicator,
    coll: RawCollective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    nonblocking: bool,
) -> Result<Option<Request<()>>> {
    let checked = extents(coll, count, comm.size()).and_then(|(in_len, out_len)| {
        check_buffer::<T>("sendbuff", send as usize, in_len)?;
        check_buffer::<T>("recvbuff", recv as usize, out_len)
    });
    // A call refused here still takes its turn, so the peers fail it too and stay in step.
    checked.map_err(|e| comm.refuse_call("argument check", e))?;
    let (send, recv) = (send.cast::<T>(), recv.cast::<T>());
    // SAFETY: the caller guarantees the buffers for the counts of `coll` (checked above to
    // be addressable), for as long as the collective runs.
    unsafe {
        if nonblocking {
            comm.raw_collective_async(coll, send, recv, count).map(Some)
        } else {
            comm.raw_collective(coll, send, recv, count).map(|()| None)
        }
    }
}

/// How a collective is issued.
#[derive(Clone, Copy)]
enum How {
    /// Blocking, on host memory (a NULL stream) or on device memory ordered on the stream.
    Blocking(*mut c_void),
    /// A request on host memory.
    NonBlocking,
}

/// The shared body of the collectives: validates `comm`, `datatype`, then runs.
///
/// # Safety
/// As for `typed`.
unsafe fn collective(
    c: &Arc<CommEntry>,
    coll: RawCollective,
    dtype_code: pcclDataType_t,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    how: How,
) -> Outcome<Option<Request<()>>> {
    let comm = &c.comm;
    let dt = datatype(dtype_code)
        .map_err(|e| comm.refuse_call("argument check", e))
        .on(c)?;
    let nonblocking = matches!(how, How::NonBlocking);
    let device_stream = match how {
        How::Blocking(stream) if !stream.is_null() => Some(stream),
        _ => None,
    };
    if let Some(stream) = device_stream {
        // SAFETY: forwarded from the caller (device buffers valid for the counts, `stream` a
        // stream of their GPU).
        let runtime = c.runtime.load(std::sync::atomic::Ordering::SeqCst);
        let call = device::DeviceCall::Op {
            op: device::DeviceOp::Coll(coll),
            dt,
            send,
            recv,
            count,
        };
        return unsafe { device::run(comm, runtime, call, stream) }
            .map(|()| None)
            .on(c);
    }
    // SAFETY: forwarded from the caller (see `typed`).
    let r = unsafe {
        match dt {
            DType::I8 => typed::<i8>(comm, coll, send, recv, count, nonblocking),
            DType::U8 => typed::<u8>(comm, coll, send, recv, count, nonblocking),
            DType::I32 => typed::<i32>(comm, coll, send, recv, count, nonblocking),
            DType::U32 => typed::<u32>(comm, coll, send, recv, count, nonblocking),
            DType::I64 => typed::<i64>(comm, coll, send, recv, count, nonblocking),
            DType::U64 => typed::<u64>(comm, coll, send, recv, count, nonblocking),
            DType::F16 => typed::<half::f16>(comm, coll, send, recv, count, nonblocking),
            DType::BF16 => typed::<half::bf16>(comm, coll, send, recv, count, nonblocking),
            DType::F32 => typed::<f32>(comm, coll, send, recv, count, nonblocking),
            DType::F64 => typed::<f64>(comm, coll, send, recv, count, nonblocking),
        }
    };
    r.on(c)
}

// ---- blocking collectives ------------------------------------------------------------------

/// Gathers `sendcount` elements from every rank into `recvbuff` (`sendcount * nranks`
/// elements) in rank order. In place when `sendbuff == recvbuff + rank * sendcount`
/// (in elements). `stream`: NULL for host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// `sendbuff` must be readable for `sendcount` elements and `recvbuff` writable for
/// `sendcount * nranks`, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: pcclDataType_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllGather", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                RawCollective::AllGather,
                datatype,
                sendbuff,
                recvbuff,
                sendcount,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// Reduces `recvcount * nranks` elements of every rank's `sendbuff` with `op` and leaves
/// block `rank` of the result (`recvcount` elements) in `recvbuff`. In place when
/// `recvbuff == sendbuff + rank * recvcount` (in elements). `stream`: NULL for host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// `sendbuff` must be readable for `recvcount * nranks` elements and `recvbuff` writable for
/// `recvcount`, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclReduceScatter", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let op = red_op(op).on(&c)?;
        let coll = RawCollective::ReduceScatter(op);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                recvcount,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// Reduces `count` elements of every rank's `sendbuff` with `op` into every rank's
/// `recvbuff`. In place when `sendbuff == recvbuff`. `stream`: NULL for host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// `sendbuff` must be readable and `recvbuff` writable for `count` elements, and neither
/// touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllReduce", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let op = red_op(op).on(&c)?;
        let coll = RawCollective::AllReduce(op);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// Copies `count` elements of `sendbuff` on rank `root` into `recvbuff` on every rank
/// (`sendbuff` is read on `root` only). In place when `sendbuff == recvbuff`. `stream`: NULL for
/// host buffers, else the CUDA stream of device buffers.
///
/// # Safety
/// On `root`, `sendbuff` must be readable for `count` elements; everywhere `recvbuff` must
/// be writable for `count`, and neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclBroadcast", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let coll = RawCollective::Broadcast(root_of(root).on(&c)?);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe {
            collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::Blocking(stream),
            )
        }
        .map(drop)
    })
}

/// In-place broadcast of `count` elements of `buff` from `root` (NCCL's `ncclBcast`).
///
/// # Safety
/// `buff` must be readable and writable for `count` elements and untouched by others during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn pcclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclBcast", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let coll = RawCollective::Broadcast(root_of(root).on(&c)?);
        // SAFETY: `buff` is valid for `count` elements (caller's promise, documented above).
        unsafe { collective(&c, coll, datatype, buff, buff, count, How::Blocking(stream)) }
            .map(drop)
    })
}

/// Returns once every rank of `comm` has entered the barrier (after this rank's earlier
/// non-blocking collectives).
#[no_mangle]
pub extern "C" fn pcclBarrier(comm: pcclComm_t) -> pcclResult_t {
    entry("pcclBarrier", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        c.comm.barrier().on(&c)
    })
}

// ---- non-blocking collectives --------------------------------------------------------------

/// Non-blocking `pcclAllGather` on host memory: stores a request in `*request`; the buffers
/// must stay valid and untouched until `pcclWait` on it returns.
///
/// # Safety
/// As for `pcclAllGather`, until the request completes; `request` must be NULL (an error)
/// or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIallGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: pcclDataType_t,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIallGather", || {
        // SAFETY: `request` is NULL or writable (caller's promise); the buffers stay valid
        // until the request completes (caller's promise, documented above).
        unsafe {
            let c = start(comm, request)?;
            let r = collective(
                &c,
                RawCollective::AllGather,
                datatype,
                sendbuff,
                recvbuff,
                sendcount,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIallGather")
        }
    })
}

/// Non-blocking `pcclReduceScatter` on host memory (see `pcclIallGather`).
///
/// # Safety
/// As for `pcclReduceScatter`, until the request completes; `request` must be NULL (an
/// error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIreduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIreduceScatter", || {
        // SAFETY: as in `pcclIallGather`.
        unsafe {
            let c = start(comm, request)?;
            let coll = RawCollective::ReduceScatter(red_op(op).on(&c)?);
            let r = collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                recvcount,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIreduceScatter")
        }
    })
}

/// Non-blocking `pcclAllReduce` on host memory (see `pcclIallGather`).
///
/// # Safety
/// As for `pcclAllReduce`, until the request completes; `request` must be NULL (an error)
/// or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIallReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIallReduce", || {
        // SAFETY: as in `pcclIallGather`.
        unsafe {
            let c = start(comm, request)?;
            let coll = RawCollective::AllReduce(red_op(op).on(&c)?);
            let r = collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIallReduce")
        }
    })
}

/// Non-blocking `pcclBroadcast` on host memory (see `pcclIallGather`).
///
/// # Safety
/// As for `pcclBroadcast`, until the request completes; `request` must be NULL (an error)
/// or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIbroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIbroadcast", || {
        // SAFETY: as in `pcclIallGather`.
        unsafe {
            let c = start(comm, request)?;
            let coll = RawCollective::Broadcast(root_of(root).on(&c)?);
            let r = collective(
                &c,
                coll,
                datatype,
                sendbuff,
                recvbuff,
                count,
                How::NonBlocking,
            )?;
            hand_out(request, &c, r, "pcclIbroadcast")
        }
    })
}

/// Non-blocking `pcclBarrier`: stores a request in `*request`.
///
/// # Safety
/// `request` must be NULL (an error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIbarrier(
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIbarrier", || {
        // SAFETY: `request` is NULL or writable (caller's promise).
        unsafe {
            let c = start(comm, request)?;
            let r = c.comm.raw_barrier_async().on(&c)?;
            hand_out(request, &c, Some(r), "pcclIbarrier")
        }
    })
}

/// Blocks until `request` has completed, frees it, and returns the collective's result
/// (its message goes to `pcclGetLastError` of the communicator and of this thread).
/// Using the handle afterwards returns `pcclInvalidUsage`.
#[no_mangle]
pub extern "C" fn pcclWait(request: pcclRequest_t) -> pcclResult_t {
    entry("pcclWait", || {
        let r = handles::request(request as usize, "request", true)?;
        let req = lock(&r.req).take();
        let req = req
            .ok_or_else(|| Error::usage("request was already completed and freed by pcclWait"))
            .on(&r.comm)?;
        req.wait()
            .map_err(|e| Error::new(e.kind(), format!("{}: {}", r.what, e.message())))
            .on(&r.comm)
    })
}

/// Stores in `*done` whether `request` has completed (1) or not (0), without blocking.
/// It does not free the request: call `pcclWait` for the result, which then returns at
/// once.
///
/// # Safety
/// `done` must be NULL (an error) or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn pcclTest(request: pcclRequest_t, done: *mut c_int) -> pcclResult_t {
    entry("pcclTest", || {
        let r = handles::request(request as usize, "request", false)?;
        not_null(done, "done").on(&r.comm)?;
        let finished = lock(&r.req)
            .as_ref()
            .map(Request::test)
            .ok_or_else(|| Error::usage("request was already completed and freed by pcclWait"))
            .on(&r.comm)?;
        // SAFETY: `done` is non-NULL and points to a writable int (caller's promise).
        unsafe { put(done, c_int::from(finished)) };
        Ok(())
    })
}
