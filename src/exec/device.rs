//! Runs the same [`Plan`]s as the host executor on buffers in GPU memory, over any
//! [`Transport`] (which moves host bytes), through page-locked host staging:
//!
//! - `Send`: the span(s) are copied device → pinned host on a copy stream of their own, piece
//!   by piece, and each piece is sent as soon as its copy has finished;
//! - `Recv`: each piece is received into a pinned slot and copied host → device into place;
//! - `RecvReduce`: each piece is received into a pinned slot, copied into a device piece and
//!   reduced on the device (`dst = with ⊕ piece`, every dtype and op through
//!   [`CudaDevice::reduce_raw`]);
//! - `Copy`: device → device; `Average`: the device divide kernel.
//!
//! Messages are cut into pieces of `piece_bytes` (every rank must use the same size: each
//! piece travels as a message of its own), so the device → host copy of one piece, the
//! transfer of the next and the host → device copy and reduction of earlier ones overlap; a
//! ring of [`SLOTS`] pinned receive slots keeps several pieces in flight. Device work is
//! stream-ordered on the [`CudaDevice`]'s stream; the host waits only for a send piece's copy
//! (before handing it to the transport), for a receive slot before reusing it, and for the
//! stream at the end of the collective.
//!
//! Phase semantics are the host executor's: post the sends (here: queue their copies and post
//! each piece when ready), run the local copies, complete the receives, wait for the sends —
//! always, even after an error. Deadlock freedom with piecewise posting: before a rank blocks
//! on piece `k` of any message it has posted every send piece of index `<= k`, and posting
//! depends only on local device work.
//!
//! Direct path ([`DeviceExecOptions::direct`] on a transport whose
//! [`Transport::moves_device_memory`] — CUDA-aware MPI, a thread world in device mode): no
//! host staging. Per phase the host first waits for the stream (the transport reads device
//! memory earlier kernels wrote, and writes memory nothing may still be using); a contiguous
//! send goes out from its device address ([`Transport::isend_device`]), a strided one is packed
//! device → device into a scratch buffer first; a contiguous `Recv` lands in place
//! ([`Transport::recv_device`]), a strided one in a device temporary then copied out; a
//! `RecvReduce` lands in a device temporary and the reduction kernel runs `dst = with ⊕ tmp`.
//! One message per step (the transport pieces it), so every rank must take the same path.

use super::memory::BlockLayout;
use super::segments::{parts, segments, total, zip_segments, Seg};
use crate::device::cuda::{CudaDevice, PinnedBuffer};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{Buf, Phase, Plan, Span, Step};
use crate::transport::{SendOp, Tag, Transport};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pinned receive slots in flight per rank.
pub const SLOTS: usize = 4;

/// Per-call settings of the device executor.
#[derive(Clone, Copy, Debug)]
pub struct DeviceExecOptions {
    /// Tag of this collective (its sequence number on the communicator).
    pub tag: Tag,
    /// How long any single wait may take before it fails with a timeout error.
    pub timeout: Duration,
    /// Reduction operator (ignored by plans without reductions).
    pub op: ReduceOp,
    /// Bytes per piece of a message (rounded down to whole elements, at least one); every
    /// rank of the collective must use the same value.
    pub piece_bytes: usize,
    /// Hand device pointers to the transport when it moves device memory
    /// ([`Transport::moves_device_memory`]) instead of staging through pinned host memory;
    /// every rank of the collective must use the same value (`PCCL_DEVICE_DIRECT`).
    pub direct: bool,
}

/// One device buffer: base address, length in elements and block layout.
#[derive(Clone, Copy, Debug)]
struct DevRegion {
    ptr: u64,
    len: usize,
    layout: BlockLayout,
}

/// The input, output and scratch buffers of one collective, as device addresses.
#[derive(Debug)]
pub struct DeviceMemory {
    input: DevRegion,
    output: DevRegion,
    scratch: DevRegion,
    es: usize,
}

impl DeviceMemory {
    /// Describes the buffers of a call: `(address, elements, layout)` each, with elements of
    /// `elem_size` bytes.
    ///
    /// # Safety
    /// The addresses must be device memory of the device the collective runs on, valid for
    /// the element counts given until the collective returns, and overlap only in the in-place
    /// forms the collectives define.
    pub unsafe fn from_raw(
        input: (u64, usize, BlockLayout),
        output: (u64, usize, BlockLayout),
        scratch: (u64, usize, BlockLayout),
        elem_size: usize,
    ) -> Result<Self> {
        let region = |name: &str, (ptr, len, layout): (u64, usize, BlockLayout)| {
            if layout.total() > len {
                return Err(Error::invalid(format!(
                    "{name} device buffer holds {len} elements but the collective needs {}",
                    layout.total()
                )));
            }
            Ok(DevRegion { ptr, len, layout })
        };
        Ok(DeviceMemory {
            input: region("input", input)?,
            output: region("output", output)?,
            scratch: region("scratch", scratch)?,
            es: elem_size,
        })
    }

    fn region(&self, b: Buf) -> &DevRegion {
        match b {
            Buf::Input => &self.input,
            Buf::Output => &self.output,
            Buf::Scratch => &self.scratch,
        }
    }

    fn elems(&self, s: Span) -> Range<usize> {
        self.region(s.buf).layout.range(s.start, s.len)
    }

    /// Device address of element `off` of `b`, checking that `len` elements fit.
    fn addr(&self, b: Buf, off: usize, len: usize) -> Result<u64> {
        let r = self.region(b);
        if off + len > r.len {
            return Err(Error::internal(format!(
                "{len} elements at {off} run past device {b:?}"
            )));
        }
        Ok(r.ptr + (off * self.es) as u64)
    }
}

fn cuda_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::system(format!("CUDA {what} failed: {e}"))
}

fn dev_ptr(s: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> u64 {
    let (p, _guard) = s.device_ptr(stream);
    p
}

/// A pinned receive slot: host landing area, device piece, and the event that says when the
/// device is done with both.
struct Slot {
    host: PinnedBuffer,
    dev: CudaSlice<u8>,
    event: CudaEvent,
    busy: bool,
}

/// Reusable working space of the device executor for one [`CudaDevice`] handle: the copy
/// stream for sends, pinned send staging, the ring of receive slots, events, and the device
/// scratch buffer plans call `Scratch`. Kept between collectives (pinned allocations are slow).
pub struct DeviceStaging {
    stream: Arc<CudaStream>,
    d2h: Arc<CudaStream>,
    send: Option<PinnedBuffer>,
    slots: Vec<Slot>,
    piece_bytes: usize,
    events: Vec<CudaEvent>,
    scratch: Option<CudaSlice<u8>>,
    /// Direct path: packed strided sends of a phase.
    direct_send: Option<CudaSlice<u8>>,
    /// Direct path: landing area of a phase's reduced and strided receives.
    direct_recv: Option<CudaSlice<u8>>,
}

impl DeviceStaging {
    /// Working space for collectives on `dev`'s stream (buffers are allocated on first use).
    pub fn new(dev: &CudaDevice) -> Result<Self> {
        Ok(DeviceStaging {
            stream: dev.stream().clone(),
            d2h: dev.new_stream()?,
            send: None,
            slots: Vec::new(),
            piece_bytes: 0,
            events: Vec::new(),
            scratch: None,
            direct_send: None,
            direct_recv: None,
        })
    }

    /// True when this staging was made for `dev`'s device (its buffers belong to that
    /// device's context; the stream may differ from call to call).
    pub fn serves(&self, dev: &CudaDevice) -> bool {
        self.stream.context().ordinal() == dev.ordinal()
    }

    /// A device scratch buffer of at least `bytes` bytes (grown as needed; stream-ordered on
    /// `dev`'s stream, so reuse across collectives needs no synchronisation), as an address.
    pub fn scratch(&mut self, dev: &CudaDevice, bytes: usize) -> Result<u64> {
        if self.scratch.as_ref().is_none_or(|s| s.len() < bytes) {
            self.scratch = None;
            self.scratch = Some(dev.alloc_zeroed(bytes.max(16))?);
        }
        match &self.scratch {
            Some(s) => Ok(dev_ptr(s, dev.stream())),
            None => Err(Error::internal("device scratch missing")),
        }
    }

    fn ensure_slots(&mut self, dev: &CudaDevice, piece_bytes: usize) -> Result<()> {
        if self.piece_bytes == piece_bytes && self.slots.len() == SLOTS {
            return Ok(());
        }
        for s in &self.slots {
            s.event
                .synchronize()
                .map_err(cuda_err("event synchronize"))?;
        }
        self.slots.clear();
        for _ in 0..SLOTS {
            self.slots.push(Slot {
                host: PinnedBuffer::new(dev, piece_bytes)?,
                dev: dev.alloc_zeroed(piece_bytes.max(16))?,
                event: dev.new_event()?,
                busy: false,
            });
        }
        self.piece_bytes = piece_bytes;
        Ok(())
    }

    fn ensure_send(&mut self, dev: &CudaDevice, bytes: usize) -> Result<()> {
        if self.send.as_ref().is_none_or(|s| s.len() < bytes) {
            self.send = None;
            self.send = Some(PinnedBuffer::new(dev, bytes)?);
        }
        Ok(())
    }

    fn ensure_events(&mut self, dev: &CudaDevice, n: usize) -> Result<()> {
        while self.events.len() < n {
            self.events.push(dev.new_event()?);
        }
        Ok(())
    }
}

/// Runs `plan` on `tr` over the device buffers `mem`, with elements of type `T`, on `dev`'s
/// stream. Every rank of the communicator must run its own plan of the same collective with
/// the same tag and piece size. Returns after the device work of the collective finished.
pub fn execute_device<T: Element>(
    plan: &Plan,
    tr: &dyn Transport,
    dev: &CudaDevice,
    mem: &DeviceMemory,
    st: &mut DeviceStaging,
    opt: &DeviceExecOptions,
) -> Result<()> {
    if !st.serves(dev) {
        return Err(Error::internal(
            "device staging belongs to another CudaDevice handle",
        ));
    }
    dev.bind()?;
    // The collective is ordered on the caller's stream of this call.
    st.stream = dev.stream().clone();
    if opt.direct && tr.moves_device_memory() {
        return execute_direct::<T>(plan, tr, dev, mem, st, opt);
    }
    let es = std::mem::size_of::<T>();
    let piece_elems = (opt.piece_bytes / es).max(1);
    st.ensure_slots(dev, piece_elems * es)?;
    let mut r = Ok(());
    for phase in &plan.phases {
        r = run_phase::<T>(phase, plan.nranks, tr, dev, mem, st, opt, piece_elems);
        if r.is_err() {
            break;
        }
    }
    // The pinned slots and the caller's buffers must not be used by the device after return
    // (the copy stream is idle after a successful phase; after an early error it may not be).
    let s = st
        .d2h
        .synchronize()
        .map_err(cuda_err("stream synchronize"))
        .and(dev.synchronize());
    for slot in &mut st.slots {
        slot.busy = false;
    }
    r.and(s)
}

fn pieces_of(elems: usize, pe: usize) -> usize {
    elems.div_ceil(pe).max(1)
}

struct SendMsg {
    peer: usize,
    segs: Vec<Seg>,
    elems: usize,
    /// Byte offset of the message in the pinned send staging.
    at: usize,
}

struct RecvMsg {
    peer: usize,
    dst: Vec<Seg>,
    /// For a reduction: `(message offset, dst part, with part)`.
    reduce: Option<Vec<(usize, Seg, Seg)>>,
    elems: usize,
}

#[allow(clippy::too_many_arguments)]
fn run_phase<T: Element>(
    phase: &Phase,
    nranks: usize,
    tr: &dyn Transport,
    dev: &CudaDevice,
    mem: &DeviceMemory,
    st: &mut DeviceStaging,
    opt: &DeviceExecOptions,
    pe: usize,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    // One deadline for the whole collective.
    let end = Instant::now() + opt.timeout;
    let deadline = || end;

    // ---- sends: queue every piece's device -> host copy on the copy stream -----------------
    let mut msgs = Vec::new();
    let mut at = 0usize;
    for step in &phase.steps {
        if let Step::Send { peer, src } = step {
            let segs = segments(src, |sp| mem.elems(sp));
            let elems = total(&segs);
            msgs.push(SendMsg {
                peer: *peer,
                segs,
                elems,
                at,
            });
            at += elems * es;
        }
    }
    // Posting order: piece 0 of every message, then piece 1, ... (the receivers use the same).
    let mut order: Vec<(usize, usize)> = Vec::new();
    let most = msgs
        .iter()
        .map(|m| pieces_of(m.elems, pe))
        .max()
        .unwrap_or(0);
    for k in 0..most {
        for (i, m) in msgs.iter().enumerate() {
            if k < pieces_of(m.elems, pe) {
                order.push((i, k));
            }
        }
    }
    let mut sends: Vec<Box<dyn SendOp>> = Vec::new();
    let mut first_err: Option<Error> = None;
    if !msgs.is_empty() {
        st.ensure_send(dev, at)?;
        st.ensure_events(dev, order.len() + 1)?;
        // The copy stream reads what earlier work on the main stream wrote.
        let ready = &st.events[order.len()];
        ready.record(&st.stream).map_err(cuda_err("event record"))?;
        st.d2h.wait(ready).map_err(cuda_err("stream wait"))?;
        let base = st
            .send
            .as_mut()
            .ok_or_else(|| Error::internal("send staging missing"))?
            .as_mut_ptr();
        for (e, &(i, k)) in order.iter().enumerate() {
            let m = &msgs[i];
            let (lo, hi) = (k * pe, ((k + 1) * pe).min(m.elems));
            for (pos, s) in parts(&m.segs, lo, hi) {
                let src = mem.addr(s.buf, s.off, s.len)?;
                // SAFETY: `src` addresses `s.len` elements of a caller buffer (checked); the
                // destination lies inside the pinned staging (`at` sums every message's
                // bytes), which lives in `st` until the sends were waited for and the
                // stream synchronised.
                unsafe { dev.copy_dtoh_raw(&st.d2h, base.add(m.at + pos * es), src, s.len * es)? };
            }
            st.events[e]
                .record(&st.d2h)
                .map_err(cuda_err("event record"))?;
        }
    }
    let mut posted = 0usize;
    // Posts pieces in order: all with index <= `upto` (waiting for their copies), then any
    // further ones whose copies already finished.
    let mut post = |upto: usize, sends: &mut Vec<Box<dyn SendOp>>, st: &DeviceStaging| {
        while posted < order.len() {
            let (i, k) = order[posted];
            let ev = &st.events[posted];
            if k > upto && !ev.try_is_complete().map_err(cuda_err("event query"))? {
                break;
            }
            ev.synchronize().map_err(cuda_err("event synchronize"))?;
            let m = &msgs[i];
            let (lo, hi) = (k * pe, ((k + 1) * pe).min(m.elems));
            let base = st
                .send
                .as_ref()
                .ok_or_else(|| Error::internal("send staging missing"))?
                .as_ptr();
            // SAFETY: the piece's bytes lie inside the pinned staging, written by the copy
            // waited for above and left alone until every send of the phase was waited for.
            let op = unsafe {
                tr.isend(
                    m.peer,
                    opt.tag,
                    base.add(m.at + lo * es),
                    (hi.max(lo) - lo) * es,
                )?
            };
            sends.push(op);
            posted += 1;
        }
        Ok::<(), Error>(())
    };

    // ---- local steps on the main stream -----------------------------------------------------
    if let Err(e) = local_steps::<T>(phase, nranks, dev, mem) {
        first_err = Some(e);
    }

    // ---- receives, piece by piece ----------------------------------------------------------
    let mut recvs = Vec::new();
    for step in &phase.steps {
        match step {
            Step::Recv { peer, dst } => {
                let d = segments(dst, |sp| mem.elems(sp));
                recvs.push(RecvMsg {
                    peer: *peer,
                    elems: total(&d),
                    dst: d,
                    reduce: None,
                });
            }
            Step::RecvReduce { peer, dst, with } => {
                let d = segments(dst, |sp| mem.elems(sp));
                let w = segments(with, |sp| mem.elems(sp));
                if total(&d) != total(&w) {
                    first_err
                        .get_or_insert(Error::internal("reduce operand and target differ in size"));
                }
                recvs.push(RecvMsg {
                    peer: *peer,
                    elems: total(&d),
                    reduce: Some(zip_segments(&d, &w)),
                    dst: d,
                });
            }
            _ => {}
        }
    }
    let most_r = recvs
        .iter()
        .map(|m| pieces_of(m.elems, pe))
        .max()
        .unwrap_or(0);
    let mut next_slot = 0usize;
    'outer: for k in 0..most_r {
        if first_err.is_some() {
            break;
        }
        for m in &recvs {
            if k >= pieces_of(m.elems, pe) {
                continue;
            }
            let r = post(k, &mut sends, st).and_then(|()| {
                let slot_i = next_slot % SLOTS;
                next_slot += 1;
                recv_piece::<T>(tr, dev, mem, st, slot_i, m, k, pe, opt, deadline())
            });
            if let Err(e) = r {
                first_err = Some(e);
                break 'outer;
            }
        }
    }
    if first_err.is_none() {
        if let Err(e) = post(usize::MAX, &mut sends, st) {
            first_err = Some(e);
        }
    }
    // Always wait for the sends, even after an error: their memory must outlive them.
    for s in sends {
        if let Err(e) = s.wait(deadline()) {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => {
            // Let queued copies out of the staging finish before anything reuses it.
            let _ = st.d2h.synchronize();
            Err(e)
        }
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn recv_piece<T: Element>(
    tr: &dyn Transport,
    dev: &CudaDevice,
    mem: &DeviceMemory,
    st: &mut DeviceStaging,
    slot_i: usize,
    m: &RecvMsg,
    k: usize,
    pe: usize,
    opt: &DeviceExecOptions,
    deadline: Instant,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    let (lo, hi) = (k * pe, ((k + 1) * pe).min(m.elems));
    let n = hi.max(lo) - lo;
    let stream = st.stream.clone();
    let slot = &mut st.slots[slot_i];
    if slot.busy {
        slot.event
            .synchronize()
            .map_err(cuda_err("event synchronize"))?;
        slot.busy = false;
    }
    tr.recv_into(
        m.peer,
        opt.tag,
        &mut slot.host.as_mut_slice()[..n * es],
        deadline,
    )?;
    if n == 0 {
        return Ok(());
    }
    let host = slot.host.as_ptr();
    match &m.reduce {
        None => {
            for (pos, s) in parts(&m.dst, lo, hi) {
                let dst = mem.addr(s.buf, s.off, s.len)?;
                // SAFETY: `dst` addresses `s.len` elements of a receive target (checked), which
                // no other step of the phase touches; the source lies in the pinned slot,
                // which is not reused before its event (recorded below) has completed.
                unsafe { dev.copy_htod_raw(&stream, dst, host.add((pos - lo) * es), s.len * es)? };
            }
        }
        Some(pairs) => {
            let piece = dev_ptr(&slot.dev, &stream);
            // SAFETY: the slot's device piece holds `piece_bytes >= n * es` bytes; the pinned
            // source is not reused before the slot's event has completed.
            unsafe { dev.copy_htod_raw(&stream, piece, host, n * es)? };
            for &(pos, d, w) in pairs {
                let (a, b) = (pos.max(lo), (pos + d.len).min(hi));
                if a >= b {
                    continue;
                }
                let len = b - a;
                let dp = mem.addr(d.buf, d.off + (a - pos), len)?;
                let wp = mem.addr(w.buf, w.off + (a - pos), len)?;
                // SAFETY: target and operand are checked device ranges of the caller's
                // buffers (the same or disjoint blocks, as the plan guarantees), the piece
                // lies in the slot; all are ordered on this stream.
                unsafe {
                    dev.reduce_raw(
                        opt.op,
                        T::DTYPE,
                        dp,
                        wp,
                        piece + ((a - lo) * es) as u64,
                        len * es,
                    )?
                };
            }
        }
    }
    slot.event
        .record(&stream)
        .map_err(cuda_err("event record"))?;
    slot.busy = true;
    Ok(())
}

/// A device buffer of at least `bytes` bytes in `buf` (grown as needed, stream-ordered on
/// `dev`'s stream: the caller synchronises before the transport touches it), as an address.
fn grow(dev: &CudaDevice, buf: &mut Option<CudaSlice<u8>>, bytes: usize) -> Result<u64> {
    if buf.as_ref().is_none_or(|s| s.len() < bytes) {
        *buf = None;
        *buf = Some(dev.alloc_zeroed(bytes.max(16))?);
    }
    match buf {
        Some(s) => Ok(dev_ptr(s, dev.stream())),
        None => Err(Error::internal("direct-path device buffer missing")),
    }
}

/// The direct path of [`execute_device`]: device pointers straight to the transport.
fn execute_direct<T: Element>(
    plan: &Plan,
    tr: &dyn Transport,
    dev: &CudaDevice,
    mem: &DeviceMemory,
    st: &mut DeviceStaging,
    opt: &DeviceExecOptions,
) -> Result<()> {
    let mut r = Ok(());
    for phase in &plan.phases {
        r = run_phase_direct::<T>(phase, plan.nranks, tr, dev, mem, st, opt);
        if r.is_err() {
            break;
        }
    }
    // Nothing queued on the stream may use the caller's buffers or the temporaries after
    // return (after an error too).
    let s = dev.synchronize();
    r.and(s)
}

/// A send of the direct path: its device address (in place, or packed) and length in
/// elements.
struct DirectSend {
    peer: usize,
    addr: u64,
    elems: usize,
}

/// `(message offset, dst part, with part)` of a reduction.
type ReducePairs = Vec<(usize, Seg, Seg)>;

enum DirectLanding {
    /// Received in place.
    InPlace,
    /// Received into the temporary, then copied to these segments.
    Unpack(Vec<Seg>),
    /// Received into the temporary, then `dst = with ⊕ tmp` on these `(offset, dst, with)`.
    Reduce(ReducePairs),
}

struct DirectRecv {
    peer: usize,
    addr: u64,
    elems: usize,
    landing: DirectLanding,
}

fn run_phase_direct<T: Element>(
    phase: &Phase,
    nranks: usize,
    tr: &dyn Transport,
    dev: &CudaDevice,
    mem: &DeviceMemory,
    st: &mut DeviceStaging,
    opt: &DeviceExecOptions,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    // One deadline for the whole collective.
    let end = Instant::now() + opt.timeout;
    let deadline = || end;
    let seg_addr = |s: &Seg| mem.addr(s.buf, s.off, s.len);

    // ---- lay out the messages: which need the pack / landing temporaries ---------------
    let mut send_segs: Vec<(usize, Vec<Seg>, usize)> = Vec::new();
    let mut pack_bytes = 0usize;
    for step in &phase.steps {
        if let Step::Send { peer, src } = step {
            let segs = segments(src, |sp| mem.elems(sp));
            let at = if segs.len() > 1 {
                let at = pack_bytes;
                pack_bytes += total(&segs) * es;
                at
            } else {
                0
            };
            send_segs.push((*peer, segs, at));
        }
    }
    // (peer, destination segments, reduction pairs, landing offset) per receive.
    let mut recv_plan: Vec<(usize, Vec<Seg>, Option<ReducePairs>, usize)> = Vec::new();
    let mut land_bytes = 0usize;
    for step in &phase.steps {
        let (peer, d, reduce) = match step {
            Step::Recv { peer, dst } => (*peer, segments(dst, |sp| mem.elems(sp)), None),
            Step::RecvReduce { peer, dst, with } => {
                let d = segments(dst, |sp| mem.elems(sp));
                let w = segments(with, |sp| mem.elems(sp));
                if total(&d) != total(&w) {
                    return Err(Error::internal("reduce operand and target differ in size"));
                }
                let z = zip_segments(&d, &w);
                (*peer, d, Some(z))
            }
            _ => continue,
        };
        let at = if reduce.is_some() || d.len() > 1 {
            let at = land_bytes;
            land_bytes += total(&d) * es;
            at
        } else {
            0
        };
        recv_plan.push((peer, d, reduce, at));
    }
    let pack = if pack_bytes > 0 {
        grow(dev, &mut st.direct_send, pack_bytes)?
    } else {
        0
    };
    let land = if land_bytes > 0 {
        grow(dev, &mut st.direct_recv, land_bytes)?
    } else {
        0
    };

    // ---- sends: pack the strided ones on the stream ------------------------------------
    let mut sends = Vec::with_capacity(send_segs.len());
    for (peer, segs, at) in &send_segs {
        let elems = total(segs);
        let addr = match segs.as_slice() {
            [] => 0,
            [s] => seg_addr(s)?,
            _ => {
                let base = pack + *at as u64;
                let mut pos = 0usize;
                for s in segs {
                    // SAFETY: the source is a checked device range of the call's buffers, the
                    // destination lies inside the pack buffer (`at` sums the packed messages'
                    // bytes), which stays allocated until the sends were waited for.
                    unsafe {
                        dev.copy_dtod_raw(base + (pos * es) as u64, seg_addr(s)?, s.len * es)?
                    };
                    pos += s.len;
                }
                base
            }
        };
        sends.push(DirectSend {
            peer: *peer,
            addr,
            elems,
        });
    }
    let mut recvs = Vec::with_capacity(recv_plan.len());
    for (peer, d, reduce, at) in recv_plan {
        let elems = total(&d);
        let recv = match (reduce, d.as_slice()) {
            (Some(pairs), _) => DirectRecv {
                peer,
                addr: land + at as u64,
                elems,
                landing: DirectLanding::Reduce(pairs),
            },
            (None, []) => DirectRecv {
                peer,
                addr: 0,
                elems,
                landing: DirectLanding::InPlace,
            },
            (None, [s]) => DirectRecv {
                peer,
                addr: seg_addr(s)?,
                elems,
                landing: DirectLanding::InPlace,
            },
            (None, _) => DirectRecv {
                peer,
                addr: land + at as u64,
                elems,
                landing: DirectLanding::Unpack(d),
            },
        };
        recvs.push(recv);
    }
    // The transport works outside the stream: the data earlier work (and the packing above)
    // wrote must be in device memory, and nothing queued may still use what it will write.
    dev.synchronize()?;

    let mut first_err: Option<Error> = None;
    let mut ops: Vec<Box<dyn SendOp>> = Vec::with_capacity(sends.len());
    for m in &sends {
        // SAFETY: `addr` addresses `elems` elements of a caller buffer (checked) or of the pack
        // buffer, all written by completed device work; no step of the phase writes them and
        // they stay allocated until the op was waited for below.
        match unsafe { tr.isend_device(m.peer, opt.tag, m.addr, m.elems * es) } {
            Ok(op) => ops.push(op),
            Err(e) => {
                first_err = Some(e);
                break;
            }
        }
    }

    // ---- local steps on the stream (disjoint from every send and receive) ---------------
    if first_err.is_none() {
        if let Err(e) = local_steps::<T>(phase, nranks, dev, mem) {
            first_err = Some(e);
        }
    }

    // ---- receives, in step order --------------------------------------------------------
    if first_err.is_none() {
        for m in &recvs {
            if let Err(e) = recv_direct::<T>(tr, dev, mem, m, opt, deadline()) {
                first_err = Some(e);
                break;
            }
        }
    }
    // Always wait for the sends, even after an error: their memory must outlive them.
    for op in ops {
        if let Err(e) = op.wait(deadline()) {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => {
            // No queued work may outlive the call's buffers or the temporaries.
            let _ = dev.synchronize();
            Err(e)
        }
        None => Ok(()),
    }
}

fn recv_direct<T: Element>(
    tr: &dyn Transport,
    dev: &CudaDevice,
    mem: &DeviceMemory,
    m: &DirectRecv,
    opt: &DeviceExecOptions,
    deadline: Instant,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    // SAFETY: `addr` addresses `elems` elements of a receive target (checked) that no other
    // step of the phase touches, or of the landing buffer, which no queued work uses (the
    // stream was synchronised at the phase start and only later steps read it).
    unsafe { tr.recv_device(m.peer, opt.tag, m.addr, m.elems * es, deadline)? };
    match &m.landing {
        DirectLanding::InPlace => {}
        DirectLanding::Unpack(segs) => {
            let mut pos = 0usize;
            for s in segs {
                let dst = mem.addr(s.buf, s.off, s.len)?;
                // SAFETY: `dst` is a checked receive target; the source lies inside the landing
                // buffer, left alone until the stream is synchronised at the next phase or the
                // end of the collective.
                unsafe { dev.copy_dtod_raw(dst, m.addr + (pos * es) as u64, s.len * es)? };
                pos += s.len;
            }
        }
        DirectLanding::Reduce(pairs) => {
            for &(pos, d, w) in pairs {
                let dp = mem.addr(d.buf, d.off, d.len)?;
                let wp = mem.addr(w.buf, w.off, w.len)?;
                // SAFETY: target and operand are checked device ranges of the caller's
                // buffers (the same or disjoint blocks, as the plan guarantees); the message
                // lies in the landing buffer; all are ordered on this stream.
                unsafe {
                    dev.reduce_raw(
                        opt.op,
                        T::DTYPE,
                        dp,
                        wp,
                        m.addr + (pos * es) as u64,
                        d.len * es,
                    )?
                };
            }
        }
    }
    Ok(())
}

fn local_steps<T: Element>(
    phase: &Phase,
    nranks: usize,
    dev: &CudaDevice,
    mem: &DeviceMemory,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    for step in &phase.steps {
        match step {
            Step::Copy { src, dst } => {
                let s = segments(src, |sp| mem.elems(sp));
                let d = segments(dst, |sp| mem.elems(sp));
                if total(&s) != total(&d) {
                    return Err(Error::internal("copy between spans of different sizes"));
                }
                for (_, a, b) in zip_segments(&s, &d) {
                    let pa = mem.addr(a.buf, a.off, a.len)?;
                    let pb = mem.addr(b.buf, b.off, b.len)?;
                    // SAFETY: both ranges are checked device ranges of the call's buffers;
                    // distinct blocks never overlap, and equal addresses are skipped (the
                    // in-place form).
                    unsafe { dev.copy_dtod_raw(pb, pa, a.len * es)? };
                }
            }
            Step::Average { dst } => {
                for s in segments(dst, |sp| mem.elems(sp)) {
                    let p = mem.addr(s.buf, s.off, s.len)?;
                    // SAFETY: a checked device range no other step of the phase touches.
                    unsafe { dev.divide_raw(T::DTYPE, p, s.len * es, nranks)? };
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cut_segments_at_piece_bounds() {
        let segs = [
            Seg {
                buf: Buf::Input,
                off: 10,
                len: 5,
            },
            Seg {
                buf: Buf::Output,
                off: 0,
                len: 5,
            },
        ];
        let p = parts(&segs, 3, 8);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].0, p[0].1.off, p[0].1.len), (3, 13, 2));
        assert_eq!((p[1].0, p[1].1.off, p[1].1.len), (5, 0, 3));
        assert!(parts(&segs, 10, 10).is_empty());
        assert_eq!(pieces_of(0, 4), 1);
        assert_eq!(pieces_of(9, 4), 3);
    }
}
