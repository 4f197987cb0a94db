//! Rooted collectives (reduce, gather, scatter), all-to-all(v) and point-to-point calls of the
//! C ABI, with NCCL's group semantics for sends and receives. With a stream, every one of
//! them takes device memory and is queued on it, as the collectives are (a group's sends and
//! receives share one stream); `pcclIsend`/`pcclIrecv` and `pcclGroupEndAsync` are host
//! memory only: a stream there is `pcclInvalidUsage`.

use super::handles::{self, CommEntry};
use super::{
    check_buffer, datatype, entry, hand_out, not_null, pcclComm_t, pcclDataType_t, pcclRedOp_t,
    pcclRequest_t, pcclResult_t, red_op, start, OnComm, Outcome,
};
use crate::comm::request::Request;
use crate::error::{Error, Result};
use crate::{Communicator, DType, Dir, Element, P2pOp, RawRooted};
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Calls `$f::<T>(args)` with `T` the element type of `$dt`.
macro_rules! by_type {
    ($dt:expr, $f:ident ( $($a:expr),* )) => {
        match $dt {
            DType::I8 => $f::<i8>($($a),*),
            DType::U8 => $f::<u8>($($a),*),
            DType::I32 => $f::<i32>($($a),*),
            DType::U32 => $f::<u32>($($a),*),
            DType::I64 => $f::<i64>($($a),*),
            DType::U64 => $f::<u64>($($a),*),
            DType::F16 => $f::<half::f16>($($a),*),
            DType::BF16 => $f::<half::bf16>($($a),*),
            DType::F32 => $f::<f32>($($a),*),
            DType::F64 => $f::<f64>($($a),*),
        }
    };
}

// ---- groups --------------------------------------------------------------------------------

/// This thread's open group: depth of `pcclGroupStart` nesting and the queued operations.
#[derive(Default)]
struct GroupState {
    depth: usize,
    comm: Option<Arc<CommEntry>>,
    ops: Vec<P2pOp>,
    /// The stream of the group's operations (0: host memory), set by the first one.
    stream: usize,
}

/// What an outermost group end takes: the communicator, the operations, their stream.
type Taken = Option<(Arc<CommEntry>, Vec<P2pOp>, usize)>;

/// Closes one level of this thread's group; at the outermost, takes what it holds.
fn end_group(what: &str) -> Result<Taken> {
    with_group(|g| -> Result<Taken> {
        match g.depth {
            0 => Err(Error::usage(format!(
                "no group is open on this thread ({what} without pcclGroupStart)"
            ))),
            1 => {
                g.depth = 0;
                let ops = std::mem::take(&mut g.ops);
                let stream = std::mem::take(&mut g.stream);
                Ok(g.comm.take().map(|c| (c, ops, stream)))
            }
            _ => {
                g.depth -= 1;
                Ok(None)
            }
        }
    })?
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

fn with_group<R>(f: impl FnOnce(&mut GroupState) -> R) -> Result<R> {
    GROUP
        .try_with(|g| f(&mut g.borrow_mut()))
        .map_err(|_| Error::usage("the calling thread is exiting"))
}

fn in_group() -> bool {
    with_group(|g| g.depth > 0).unwrap_or(false)
}

/// Starts (or nests) a group of point-to-point calls on this thread (NCCL's
/// `ncclGroupStart`): `pcclSend` and `pcclRecv` issued until the matching outermost
/// `pcclGroupEnd` are only queued, and posted together there, so a ring where every rank
/// sends right and receives left cannot deadlock. A group holds the calls of one communicator;
/// collectives and `pcclIsend`/`pcclIrecv` are refused inside a group (`pcclInvalidUsage`).
#[no_mangle]
pub extern "C" fn pcclGroupStart() -> pcclResult_t {
    entry("pcclGroupStart", || {
        with_group(|g| g.depth += 1)?;
        Ok(())
    })
}

/// Ends a group opened by `pcclGroupStart`. At the outermost end, posts every queued send
/// and receive together and returns once all have completed; their first error is returned
/// (on the group's communicator). A group on a stream (device memory) is queued on it
/// instead and returns at once (a failure becomes the communicator's asynchronous error,
/// `pcclCommGetAsyncError`). Without an open group: `pcclInvalidUsage`.
#[no_mangle]
pub extern "C" fn pcclGroupEnd() -> pcclResult_t {
    entry("pcclGroupEnd", || {
        let Some((c, ops, stream)) = end_group("pcclGroupEnd")? else {
            return Ok(());
        };
        // SAFETY: every queued buffer was promised valid until the group ends (documented on
        // pcclSend and pcclRecv), or, with a stream, until the stream has passed it.
        unsafe { p2p_now(&c, "group", &ops, stream as *mut c_void) }.on(&c)
    })
}

/// Ends a group as `pcclGroupEnd` does, but without waiting: at the outermost end the queued
/// sends and receives are posted together as one non-blocking request, behind this rank's
/// earlier non-blocking calls on the group's communicator, and `*request` is set to it (finish
/// it with `pcclWait`, poll it with `pcclTest`; every queued buffer must stay valid until
/// then). An inner end, or a group that queued nothing, stores NULL. Without an open group:
/// `pcclInvalidUsage`.
///
/// # Safety
/// `request` must be NULL (an error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclGroupEndAsync(request: *mut pcclRequest_t) -> pcclResult_t {
    entry("pcclGroupEndAsync", || {
        // SAFETY: `request` is NULL or writable (caller's promise).
        unsafe { super::clear(request) };
        if request.is_null() {
            // Close the group anyway, so a bad call does not leave it open on this thread.
            let _ = with_group(|g| {
                g.depth = g.depth.saturating_sub(1);
                if g.depth == 0 {
                    g.ops.clear();
                    g.comm = None;
                    g.stream = 0;
                }
            });
            return Err(Error::invalid("request is NULL").into());
        }
        let Some((c, ops, stream)) = end_group("pcclGroupEndAsync")? else {
            return Ok(());
        };
        if stream != 0 {
            return Err(Error::usage(
                "this group's sends and receives are on a stream (device memory): they are \
                 ordered on it, so end the group with pcclGroupEnd (it returns once they are \
                 queued)",
            ))
            .on(&c);
        }
        // SAFETY: every queued buffer was promised valid until the request completes.
        let req: Request<()> = unsafe { c.comm.p2p_async("group", ops, ()) }.on(&c)?;
        // SAFETY: `request` is non-NULL (checked above) and writable.
        unsafe { hand_out(request, &c, Some(req), "pcclGroupEndAsync") }
    })
}

// ---- argument checks -----------------------------------------------------------------------

/// Refuses a collective called inside a group.
fn not_in_group() -> Result<()> {
    if in_group() {
        return Err(Error::usage(
            "collectives are not supported inside pcclGroupStart/pcclGroupEnd yet",
        ));
    }
    Ok(())
}

fn root_of(root: c_int, p: usize) -> Result<usize> {
    usize::try_from(root)
        .ok()
        .filter(|&r| r < p)
        .ok_or_else(|| Error::invalid(format!("root {root} is not a rank of comm (of {p})")))
}

fn peer_of(peer: c_int, p: usize) -> Result<usize> {
    usize::try_from(peer)
        .ok()
        .filter(|&r| r < p)
        .ok_or_else(|| Error::invalid(format!("peer {peer} is not a rank of comm (of {p})")))
}

fn times(count: usize, p: usize) -> Result<usize> {
    count
        .checked_mul(p)
        .ok_or_else(|| Error::invalid(format!("count {count} x {p} ranks overflows size_t")))
}

/// Element extents `(send, recv)` this rank uses in `coll`.
fn rooted_extents(coll: RawRooted, count: usize, me: usize, p: usize) -> Result<(usize, usize)> {
    let at = |root: usize, n: usize| if me == root { n } else { 0 };
    Ok(match coll {
        RawRooted::Reduce(_, root) => (count, at(root, count)),
        RawRooted::Gather(root) => (count, at(root, times(count, p)?)),
        RawRooted::Scatter(root) => (at(root, times(count, p)?), count),
        RawRooted::AllToAll => (times(count, p)?, times(count, p)?),
    })
}

// ---- rooted collectives and all-to-all -----------------------------------------------------

/// Checks the buffers of `coll` and runs it (blocking).
///
/// # Safety
/// The buffers must be valid for the counts `coll` implies until the call returns.
unsafe fn rooted_typed<T: Element>(
    comm: &Communicator,
    coll: RawRooted,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
) -> Result<()> {
    let checked = rooted_extents(coll, count, comm.rank(), comm.size()).and_then(|(si, ri)| {
        check_buffer::<T>("sendbuff", send as usize, si)?;
        check_buffer::<T>("recvbuff", recv as usize, ri)
    });
    checked.map_err(|e| comm.refuse_call("argument check", e))?;
    // SAFETY: the caller guarantees the buffers for the counts of `coll` (checked above to be
    // addressable).
    unsafe { comm.raw_rooted(coll, send.cast::<T>(), recv.cast::<T>(), count) }
}

/// The shared body of the rooted collectives and all-to-all: argument checks refused on every
/// rank (so the peers stay in step), then the call.
///
/// # Safety
/// As for `rooted_typed`.
unsafe fn rooted(
    comm: pcclComm_t,
    make: impl FnOnce(usize) -> Result<RawRooted>,
    dtype_code: pcclDataType_t,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stream: *mut c_void,
) -> Outcome<()> {
    let c = handles::comm(comm as usize, "comm", false)?;
    let cm = &c.comm;
    let args = not_in_group()
        .and_then(|()| datatype(dtype_code))
        .and_then(|dt| Ok((dt, make(cm.size())?)));
    let (dt, coll) = args
        .map_err(|e| cm.refuse_call("argument check", e))
        .on(&c)?;
    if !stream.is_null() {
        // Device buffers, queued on the stream (as the collectives are).
        let runtime = c.runtime.load(std::sync::atomic::Ordering::SeqCst);
        let call = super::device::DeviceCall::Op {
            op: super::device::DeviceOp::Rooted(coll),
            dt,
            send,
            recv,
            count,
        };
        // SAFETY: forwarded from the caller (device buffers valid for the counts, `stream` a
        // stream of their GPU).
        return unsafe { super::device::run(cm, runtime, call, stream) }.on(&c);
    }
    // SAFETY: forwarded from the caller.
    unsafe { by_type!(dt, rooted_typed(cm, coll, send, recv, count)) }.on(&c)
}

/// Reduces `count` elements of every rank's `sendbuff` with `op` into `recvbuff` on rank
/// `root` (`recvbuff` is used on `root` only and may be NULL elsewhere). In place when
/// `sendbuff == recvbuff` on the root. With a `stream`, device memory queued on it (as
/// `pcclAllReduce`); NULL: host memory.
///
/// # Safety
/// `sendbuff` must be readable for `count` elements, and on `root` `recvbuff` writable for
/// `count`; neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    op: pcclRedOp_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclReduce", || {
        let make = |p| Ok(RawRooted::Reduce(red_op(op)?, root_of(root, p)?));
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe { rooted(comm, make, datatype, sendbuff, recvbuff, count, stream) }
    })
}

/// Gathers `sendcount` elements of every rank's `sendbuff` into `recvbuff` on `root`, in
/// rank order (`sendcount * nranks` elements; `recvbuff` is used on `root` only and may be
/// NULL elsewhere). In place on the root when `sendbuff == recvbuff + root * sendcount` (in
/// elements). With a `stream`, device memory queued on it; NULL: host memory.
///
/// # Safety
/// `sendbuff` must be readable for `sendcount` elements, and on `root` `recvbuff` writable
/// for `sendcount * nranks`; neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclGather", || {
        let make = |p| Ok(RawRooted::Gather(root_of(root, p)?));
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe { rooted(comm, make, datatype, sendbuff, recvbuff, sendcount, stream) }
    })
}

/// Scatters `root`'s `sendbuff` (`recvcount * nranks` elements, block `i` for rank `i`):
/// every rank's `recvbuff` gets its `recvcount` elements (`sendbuff` is read on `root` only
/// and may be NULL elsewhere). In place on the root when
/// `recvbuff == sendbuff + root * recvcount` (in elements). With a `stream`, device memory
/// queued on it; NULL: host memory.
///
/// # Safety
/// On `root` `sendbuff` must be readable for `recvcount * nranks` elements; `recvbuff` must
/// be writable for `recvcount`; neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: pcclDataType_t,
    root: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclScatter", || {
        let make = |p| Ok(RawRooted::Scatter(root_of(root, p)?));
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe { rooted(comm, make, datatype, sendbuff, recvbuff, recvcount, stream) }
    })
}

/// All-to-all of equal blocks: block `j` of `sendbuff` (`count` elements at `j * count`)
/// goes to rank `j`, and block `i` of `recvbuff` comes from rank `i`. Both buffers hold
/// `count * nranks` elements and must not overlap. With a `stream`, device memory queued on
/// it; NULL: host memory.
///
/// # Safety
/// `sendbuff` must be readable and `recvbuff` writable for `count * nranks` elements,
/// neither touched by others during the call.
#[no_mangle]
pub unsafe extern "C" fn pcclAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllToAll", || {
        let make = |_| Ok(RawRooted::AllToAll);
        // SAFETY: the buffers are valid for the counts (caller's promise, documented above).
        unsafe { rooted(comm, make, datatype, sendbuff, recvbuff, count, stream) }
    })
}

/// Reads a per-rank array of `p` counts or displacements from the caller's memory.
///
/// # Safety
/// `ptr` is NULL (an error) or readable for `p` `size_t`s.
unsafe fn counts_of<'a>(ptr: *const usize, p: usize, name: &str) -> Result<&'a [usize]> {
    not_null(ptr, name)?;
    if ptr as usize % std::mem::align_of::<usize>() != 0 {
        return Err(Error::invalid(format!("{name} must be aligned for size_t")));
    }
    // SAFETY: non-NULL and aligned; the caller guarantees `p` readable elements (`p` is the
    // communicator's size, not caller input).
    Ok(unsafe { std::slice::from_raw_parts(ptr, p) })
}

/// Elements a buffer needs for the blocks `(displs[i], counts[i])`, if it fits in a `usize`.
fn extent(counts: &[usize], displs: &[usize]) -> Option<usize> {
    counts
        .iter()
        .zip(displs)
        .map(|(&c, &d)| d.checked_add(c))
        .try_fold(0usize, |m, e| e.map(|e| m.max(e)))
}

/// Checks the arrays and buffers of an all-to-all-v and runs it.
///
/// # Safety
/// As for `pcclAllToAllv`.
#[allow(clippy::too_many_arguments)]
unsafe fn all_to_all_v_typed<T: Element>(
    comm: &Communicator,
    send: *const c_void,
    sc: *const usize,
    sd: *const usize,
    recv: *mut c_void,
    rc: *const usize,
    rd: *const usize,
    device: Option<(super::pcclDeviceRuntime_t, *mut c_void)>,
) -> Result<()> {
    let p = comm.size();
    // SAFETY: the arrays are readable for `p` elements (caller's promise).
    let arrays = unsafe {
        (|| -> Result<_> {
            let a = (
                counts_of(sc, p, "sendcounts")?,
                counts_of(sd, p, "sdispls")?,
                counts_of(rc, p, "recvcounts")?,
                counts_of(rd, p, "rdispls")?,
            );
            // Extents that overflow are reported by the core's own checks.
            if let Some(n) = extent(a.0, a.1) {
                check_buffer::<T>("sendbuff", send as usize, n)?;
            }
            if let Some(n) = extent(a.2, a.3) {
                check_buffer::<T>("recvbuff", recv as usize, n)?;
            }
            Ok(a)
        })()
    };
    let (sc, sd, rc, rd) = arrays.map_err(|e| comm.refuse_call("argument check", e))?;
    if let Some((runtime, stream)) = device {
        let call = super::device::DeviceCall::AllToAllV {
            dt: T::DTYPE,
            send,
            recv,
            arrays: [sc, sd, rc, rd],
        };
        // SAFETY: forwarded from the caller (device buffers holding every block, `stream` a
        // stream of their GPU).
        return unsafe { super::device::run(comm, runtime, call, stream) };
    }
    // SAFETY: the buffers are valid for every block the arrays name (caller's promise).
    unsafe { comm.raw_all_to_all_v(send.cast::<T>(), sc, sd, recv.cast::<T>(), rc, rd) }
}

/// Uneven all-to-all (MPI's `MPI_Alltoallv`): this rank sends `sendcounts[j]` elements at
/// `sendbuff + sdispls[j]` to rank `j`, and receives rank `i`'s block into `recvbuff +
/// rdispls[i]` (`recvcounts[i]` elements). The four arrays have one entry per rank, in
/// elements; the counts must agree pairwise (a disagreement fails the call on every rank
/// before data moves); receive blocks must not overlap, nor the two buffers. With a
/// `stream`, device memory queued on it (only the receive blocks are written); NULL: host
/// memory.
///
/// # Safety
/// The arrays must be readable for `nranks` `size_t`s; `sendbuff` readable and `recvbuff`
/// writable for every block they name, untouched by others during the call (with a
/// `stream`, until the stream has passed it).
#[no_mangle]
pub unsafe extern "C" fn pcclAllToAllv(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: pcclDataType_t,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclAllToAllv", || {
        let c = handles::comm(comm as usize, "comm", false)?;
        let cm = &c.comm;
        let dt = not_in_group()
            .and_then(|()| super::datatype(datatype))
            .map_err(|e| cm.refuse_call("argument check", e))
            .on(&c)?;
        let runtime = c.runtime.load(std::sync::atomic::Ordering::SeqCst);
        let device = (!stream.is_null()).then_some((runtime, stream));
        // SAFETY: forwarded from the caller (documented above).
        unsafe {
            by_type!(
                dt,
                all_to_all_v_typed(
                    cm, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, device
                )
            )
        }
        .on(&c)
    })
}

// ---- point to point ------------------------------------------------------------------------

/// Checks one send or receive and builds it.
fn p2p_op(
    c: &CommEntry,
    dir: Dir,
    buf: *const c_void,
    count: usize,
    dtype_code: pcclDataType_t,
    peer: c_int,
) -> Result<P2pOp> {
    let dtype = datatype(dtype_code)?;
    let peer = peer_of(peer, c.comm.size())?;
    let es = dtype.size();
    let bytes = count
        .checked_mul(es)
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "{count} elements of {dtype} overflow the address space"
            ))
        })?;
    let addr = buf as usize;
    if count > 0 {
        let name = if dir == Dir::Send {
            "sendbuff"
        } else {
            "recvbuff"
        };
        if buf.is_null() {
            return Err(Error::invalid(format!(
                "{name} is NULL but count is {count}"
            )));
        }
        if addr % es != 0 {
            return Err(Error::invalid(format!(
                "{name} of dtype {dtype} must be aligned to {es} bytes"
            )));
        }
        if addr.checked_add(bytes).is_none() {
            return Err(Error::invalid(format!(
                "{name} at {addr:#x} of {bytes} bytes wraps around the address space"
            )));
        }
    }
    Ok(P2pOp {
        peer,
        dir,
        addr,
        count,
        dtype,
    })
}

/// A blocking send or receive: run now, or queued in this thread's open group.
///
/// # Safety
/// The buffer must be valid for `count` elements until the call (or the group) ends.
#[allow(clippy::too_many_arguments)]
unsafe fn p2p(
    what: &str,
    dir: Dir,
    buf: *const c_void,
    count: usize,
    dtype_code: pcclDataType_t,
    peer: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> Outcome<()> {
    let c = handles::comm(comm as usize, "comm", false)?;
    let op = p2p_op(&c, dir, buf, count, dtype_code, peer).on(&c)?;
    let queued = with_group(|g| {
        if g.depth == 0 {
            return Ok(Some(op));
        }
        match &g.comm {
            Some(gc) if !Arc::ptr_eq(gc, &c) => Err(Error::usage(
                "this group already holds sends or receives of another communicator (a group \
                 may use one communicator only)",
            )),
            Some(_) if g.stream != stream as usize => Err(Error::usage(
                "this group already holds sends or receives on another stream (or on host \
                 memory): a group's operations share one stream",
            )),
            _ => {
                g.comm = Some(c.clone());
                g.stream = stream as usize;
                g.ops.push(op);
                Ok(None)
            }
        }
    })
    .and_then(|r| r)
    .on(&c)?;
    match queued {
        // SAFETY: the buffer is valid for `count` elements (caller's promise).
        Some(op) => unsafe { p2p_now(&c, what, &[op], stream) }.on(&c),
        None => Ok(()),
    }
}

/// Runs a batch of sends and receives: on host memory to completion, or with a stream
/// queued on it (device memory).
///
/// # Safety
/// Every buffer must be valid for its count until the call returns (host memory), or until
/// `stream` has passed the batch (device memory of the stream's GPU).
unsafe fn p2p_now(c: &CommEntry, what: &str, ops: &[P2pOp], stream: *mut c_void) -> Result<()> {
    if stream.is_null() {
        // SAFETY: forwarded from the caller.
        return unsafe { c.comm.raw_p2p(what, ops) };
    }
    let runtime = c.runtime.load(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: forwarded from the caller.
    unsafe {
        super::device::run(
            &c.comm,
            runtime,
            super::device::DeviceCall::P2p(ops),
            stream,
        )
    }
}

/// Sends `count` elements of `sendbuff` to rank `peer`; it matches, in order, `peer`'s
/// receives from this rank, which must name the same count and datatype. Only the two ranks
/// take part. Inside `pcclGroupStart`/`pcclGroupEnd` it is queued and posted at the
/// outermost `pcclGroupEnd`, and `sendbuff` must stay valid until then. With a `stream`,
/// device memory: the send (or the group, whose operations share the stream) is queued on
/// it and the call returns at once, as `ncclSend` does; NULL: host memory, blocking.
///
/// # Safety
/// `sendbuff` must be readable for `count` elements until the send (or the group) completes
/// (with a stream: until the stream has passed it).
#[no_mangle]
pub unsafe extern "C" fn pcclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: pcclDataType_t,
    peer: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclSend", || {
        // SAFETY: forwarded from the caller (documented above).
        unsafe {
            p2p(
                "pcclSend",
                Dir::Send,
                sendbuff,
                count,
                datatype,
                peer,
                comm,
                stream,
            )
        }
    })
}

/// Receives `count` elements from rank `peer` into `recvbuff` (the matching send must name
/// the same count and datatype). Inside a group it is queued like `pcclSend`. With a
/// `stream`, device memory queued on it, as for `pcclSend`.
///
/// # Safety
/// `recvbuff` must be writable for `count` elements, and untouched by others, until the
/// receive (or the group) completes (with a stream: until the stream has passed it).
#[no_mangle]
pub unsafe extern "C" fn pcclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    peer: c_int,
    comm: pcclComm_t,
    stream: *mut c_void,
) -> pcclResult_t {
    entry("pcclRecv", || {
        // SAFETY: forwarded from the caller (documented above).
        unsafe {
            p2p(
                "pcclRecv",
                Dir::Recv,
                recvbuff,
                count,
                datatype,
                peer,
                comm,
                stream,
            )
        }
    })
}

/// A non-blocking send or receive, handed out as a request.
///
/// # Safety
/// As for `pcclIsend`.
#[allow(clippy::too_many_arguments)]
unsafe fn ip2p(
    what: &'static str,
    dir: Dir,
    buf: *const c_void,
    count: usize,
    dtype_code: pcclDataType_t,
    peer: c_int,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> Outcome<()> {
    // SAFETY: `request` is NULL or writable (caller's promise).
    let c = unsafe { start(comm, request) }?;
    if in_group() {
        return Err(Error::usage(
            "non-blocking sends and receives are not supported inside a group; use pcclSend \
             and pcclRecv there",
        ))
        .on(&c);
    }
    let op = p2p_op(&c, dir, buf, count, dtype_code, peer).on(&c)?;
    // SAFETY: the buffer stays valid until the request completes (caller's promise).
    let req: Request<()> = unsafe { c.comm.p2p_async(what, vec![op], ()) }.on(&c)?;
    // SAFETY: `request` is non-NULL (checked by `start`) and writable.
    unsafe { hand_out(request, &c, Some(req), what) }
}

/// Non-blocking `pcclSend` on host memory: stores a request in `*request` to finish with
/// `pcclWait` (or poll with `pcclTest`); `sendbuff` must stay valid until then. Posted in
/// issue order after this rank's earlier non-blocking calls on `comm`, then it progresses on
/// its own: separate `pcclIsend`/`pcclIrecv` requests (a ring, posted in any order, of any
/// size) complete together; sends to a peer match its receives in issue order. Not allowed
/// inside a group.
///
/// # Safety
/// `sendbuff` must be readable for `count` elements until the request completes; `request`
/// must be NULL (an error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIsend(
    sendbuff: *const c_void,
    count: usize,
    datatype: pcclDataType_t,
    peer: c_int,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIsend", || {
        // SAFETY: forwarded from the caller (documented above).
        unsafe {
            ip2p(
                "pcclIsend",
                Dir::Send,
                sendbuff,
                count,
                datatype,
                peer,
                comm,
                request,
            )
        }
    })
}

/// Non-blocking `pcclRecv` on host memory (see `pcclIsend`): `recvbuff` must stay valid and
/// untouched until `pcclWait` on the request returns.
///
/// # Safety
/// `recvbuff` must be writable for `count` elements until the request completes; `request`
/// must be NULL (an error) or point to a writable `pcclRequest_t`.
#[no_mangle]
pub unsafe extern "C" fn pcclIrecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: pcclDataType_t,
    peer: c_int,
    comm: pcclComm_t,
    request: *mut pcclRequest_t,
) -> pcclResult_t {
    entry("pcclIrecv", || {
        // SAFETY: forwarded from the caller (documented above).
        unsafe {
            ip2p(
                "pcclIrecv",
                Dir::Recv,
                recvbuff,
                count,
                datatype,
                peer,
                comm,
                request,
            )
        }
    })
}
