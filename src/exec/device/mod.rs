//! Runs the same [`Plan`]s as the host executor on buffers in GPU memory, over any
//! [`Transport`] (which moves host bytes), through page-locked host staging:
//!
//! - `Send`: the span(s) are copied device → pinned host on a copy stream of their own, piece
//!   by piece, and each piece is sent as soon as its copy has finished;
//! - `Recv`: each piece is received into a pinned slot and copied host → device into place;
//! - `RecvReduce`: each piece is received into a pinned slot, copied into a device piece and
//!   reduced on the device (`dst = with ⊕ piece`, every dtype and op through
//!   [`Device::reduce`]);
//! - `Copy`: device → device; `Average`: the device divide kernel.
//!
//! Messages are cut into pieces of `piece_bytes` (every rank must use the same size: each
//! piece travels as a message of its own), so the device → host copy of one piece, the
//! transfer of the next and the host → device copy and reduction of earlier ones overlap; a
//! ring of [`SLOTS`] pinned receive slots keeps several pieces in flight. Device work is
//! stream-ordered on the [`Device`] handle's stream; the host waits only for a send piece's copy
//! (before handing it to the transport), for a receive slot before reusing it, and for the
//! stream at the end of the collective; every such wait polls under the collective's deadline
//! (`wait`), so a device that never finishes fails the collective instead of hanging it.
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

mod direct;
mod staged;
mod wait;

use super::local::{local_steps, LocalTarget};
use super::memory::BlockLayout;
use super::segments::{parts, segments, total, zip_segments, Seg};
use crate::device::api::{DevSpan, Device, PinnedHost};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{Buf, Phase, Plan, Span, Step};
use crate::transport::{SendOp, Tag, Transport};
use std::ops::Range;
use std::time::{Duration, Instant};
use wait::Watch;

/// Pinned receive slots in flight per rank.
pub const SLOTS: usize = 4;

/// Per-call settings of the device executor.
#[derive(Clone, Copy, Debug)]
pub struct DeviceExecOptions {
    /// Tag of this collective (its sequence number on the communicator).
    pub tag: Tag,
    /// How long the whole collective may take (one deadline from its start, for the
    /// transport's waits and the device's) before it fails with a timeout error.
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

/// One device buffer: its span and block layout.
#[derive(Clone, Copy, Debug)]
struct DevRegion {
    span: DevSpan,
    layout: BlockLayout,
}

/// The input, output and scratch buffers of one collective, as device addresses.
#[derive(Debug)]
pub struct DeviceMemory {
    input: DevRegion,
    output: DevRegion,
    scratch: DevRegion,
    es: usize,
    pieces: usize,
}

impl DeviceMemory {
    /// Describes the buffers of a call: `(span, layout)` each, with elements of `elem_size`
    /// bytes. The spans must overlap only in the in-place forms the collectives define.
    pub fn new(
        input: (DevSpan, BlockLayout),
        output: (DevSpan, BlockLayout),
        scratch: (DevSpan, BlockLayout),
        elem_size: usize,
    ) -> Result<Self> {
        let region = |name: &str, (span, layout): (DevSpan, BlockLayout)| {
            let need = layout.total().checked_mul(elem_size);
            if need.is_none_or(|n| n > span.len()) {
                return Err(Error::invalid(format!(
                    "{name} device buffer holds {} bytes but the collective needs {} elements \
                     of {elem_size} bytes",
                    span.len(),
                    layout.total()
                )));
            }
            Ok(DevRegion { span, layout })
        };
        Ok(DeviceMemory {
            input: region("input", input)?,
            output: region("output", output)?,
            scratch: region("scratch", scratch)?,
            es: elem_size,
            pieces: 1,
        })
    }

    /// Addresses blocks as `k` pieces each, as a plan with `pieces == k` does.
    pub fn with_pieces(mut self, k: usize) -> Self {
        self.pieces = k.max(1);
        self
    }

    fn region(&self, b: Buf) -> &DevRegion {
        match b {
            Buf::Input => &self.input,
            Buf::Output => &self.output,
            Buf::Scratch => &self.scratch,
        }
    }

    fn elems(&self, s: Span) -> Range<usize> {
        self.region(s.buf)
            .layout
            .piece_range(s.start, s.len, self.pieces)
    }

    /// The `len` elements at element `off` of `b`, checked to lie inside it.
    fn addr(&self, b: Buf, off: usize, len: usize) -> Result<DevSpan> {
        self.region(b)
            .span
            .sub(off * self.es, len * self.es)
            .map_err(|e| Error::internal(format!("device {b:?}: {}", e.message())))
    }

    /// The span of segment `s`.
    fn seg(&self, s: &Seg) -> Result<DevSpan> {
        self.addr(s.buf, s.off, s.len)
    }
}

/// A pinned receive slot: host landing area, device piece, and the event that says when the
/// device is done with both.
struct Slot<D: Device> {
    host: D::Pinned,
    dev: D::Memory,
    event: D::Event,
    busy: bool,
}

/// Reusable working space of the device executor for one device: the copy stream for sends,
/// pinned send staging, the ring of receive slots, events, and the device scratch buffer plans
/// call `Scratch`. Kept between collectives (pinned allocations are slow).
pub struct DeviceStaging<D: Device> {
    ordinal: usize,
    d2h: D::Stream,
    send: Option<D::Pinned>,
    slots: Vec<Slot<D>>,
    piece_bytes: usize,
    events: Vec<D::Event>,
    scratch: Option<D::Memory>,
    /// Direct path: packed strided sends of a phase.
    direct_send: Option<D::Memory>,
    /// Direct path: landing area of a phase's reduced and strided receives.
    direct_recv: Option<D::Memory>,
    /// Events marking the end of the work queued on the handle's stream and on `d2h`, for
    /// the polled waits ([`wait::Watch::streams`]).
    marks: (D::Event, D::Event),
    /// Why device work of an earlier collective may still be running on this staging and on
    /// its caller's buffers (its final wait ran out of time): later collectives are refused,
    /// and the buffers are leaked rather than freed under that work.
    stuck: Option<String>,
}

impl<D: Device> Drop for DeviceStaging<D> {
    fn drop(&mut self) {
        if self.stuck.is_some() {
            // Freeing device or page-locked memory waits for (or races with) the work still
            // queued on it: a hung kernel would hang the drop. Leak it instead.
            std::mem::forget(self.send.take());
            std::mem::forget(std::mem::take(&mut self.slots));
            std::mem::forget(self.scratch.take());
            std::mem::forget(self.direct_send.take());
            std::mem::forget(self.direct_recv.take());
        }
    }
}

/// A device buffer of at least `bytes` bytes in `buf` (grown as needed, stream-ordered on
/// `dev`'s stream), as a span.
fn grow<D: Device>(dev: &D, buf: &mut Option<D::Memory>, bytes: usize) -> Result<DevSpan> {
    if buf.as_ref().is_none_or(|s| dev.span_of(s).len() < bytes) {
        *buf = None;
        *buf = Some(dev.alloc_zeroed(bytes)?);
    }
    match buf {
        Some(s) => dev.span_of(s).sub(0, bytes),
        None => Err(Error::internal("device working buffer missing")),
    }
}

impl<D: Device> DeviceStaging<D> {
    /// Working space for collectives on `dev` (buffers are allocated on first use).
    pub fn new(dev: &D) -> Result<Self> {
        Ok(DeviceStaging {
            ordinal: dev.ordinal(),
            d2h: dev.new_stream()?,
            send: None,
            slots: Vec::new(),
            piece_bytes: 0,
            events: Vec::new(),
            scratch: None,
            direct_send: None,
            direct_recv: None,
            marks: (dev.new_event()?, dev.new_event()?),
            stuck: None,
        })
    }

    /// Why this staging is unusable (an earlier collective's device work never finished), if
    /// it is.
    pub fn stuck(&self) -> Option<&str> {
        self.stuck.as_deref()
    }

    /// True when this staging was made for `dev`'s device (its buffers belong to it; the
    /// handle and its stream may differ from call to call).
    pub fn serves(&self, dev: &D) -> bool {
        self.ordinal == dev.ordinal()
    }

    /// A device scratch buffer of at least `bytes` bytes (grown as needed; stream-ordered on
    /// `dev`'s stream, so reuse across collectives needs no synchronisation).
    pub fn scratch(&mut self, dev: &D, bytes: usize) -> Result<DevSpan> {
        grow(dev, &mut self.scratch, bytes)
    }

    /// Receive slots of at least `piece_bytes` bytes (grown only: the tuner's piece varies
    /// from call to call, and page-locked allocations are slow).
    fn ensure_slots(&mut self, dev: &D, piece_bytes: usize, w: &Watch<'_>) -> Result<()> {
        if self.piece_bytes >= piece_bytes && self.slots.len() == SLOTS {
            return Ok(());
        }
        for s in &self.slots {
            // Idle after every collective's final wait; checked rather than assumed.
            w.event(dev, &s.event, w.deadline, false, || {
                "the last work of a receive slot before it is resized".to_string()
            })?;
        }
        self.slots.clear();
        for _ in 0..SLOTS {
            self.slots.push(Slot {
                host: dev.pinned(piece_bytes)?,
                dev: dev.alloc_zeroed(piece_bytes)?,
                event: dev.new_event()?,
                busy: false,
            });
        }
        self.piece_bytes = piece_bytes;
        Ok(())
    }

    fn ensure_send(&mut self, dev: &D, bytes: usize) -> Result<()> {
        if self.send.as_ref().is_none_or(|s| s.len() < bytes) {
            self.send = None;
            self.send = Some(dev.pinned(bytes)?);
        }
        Ok(())
    }

    fn ensure_events(&mut self, dev: &D, n: usize) -> Result<()> {
        while self.events.len() < n {
            self.events.push(dev.new_event()?);
        }
        Ok(())
    }
}

/// Runs `plan` on `tr` over the device buffers `mem`, with elements of type `T`, on `dev`'s
/// stream. Every rank of the communicator must run its own plan of the same collective with
/// the same tag and piece size. Returns after the device work of the collective finished, or
/// with an error once a wait ran past the collective's deadline (`opt.timeout` from the
/// start; every device wait is polled, see `wait`). On failure the collective is abandoned
/// on the transport, so every peer's waits for it end too.
pub fn execute_device<T: Element, D: Device>(
    plan: &Plan,
    tr: &dyn Transport,
    dev: &D,
    mem: &DeviceMemory,
    st: &mut DeviceStaging<D>,
    opt: &DeviceExecOptions,
) -> Result<()> {
    if !st.serves(dev) {
        return Err(Error::internal(format!(
            "device staging of {} device {} used with device {}",
            D::VENDOR,
            st.ordinal,
            dev.ordinal()
        )));
    }
    if let Some(why) = &st.stuck {
        let e = Error::usage(format!(
            "rank {}: an earlier device collective of this communicator never finished on {} \
             device {} ({why}); its device work may still use the staging buffers: destroy \
             the communicator (and reset the device if it is hung)",
            tr.rank(),
            D::VENDOR,
            st.ordinal
        ));
        crate::exec::abandon(tr, opt.tag, &e);
        return Err(e);
    }
    if mem.pieces != plan.pieces {
        return Err(Error::internal(format!(
            "a plan of {} pieces per block run on device memory addressed in {}",
            plan.pieces, mem.pieces
        )));
    }
    // One deadline for the whole collective, as on the host path.
    let w = Watch {
        tr,
        tag: opt.tag,
        deadline: Instant::now() + opt.timeout,
        timeout: opt.timeout,
    };
    let direct = opt.direct && D::TRANSPORT_MOVES && tr.moves_device_memory();
    let r = dev.bind().and_then(|()| {
        if direct {
            direct::execute_direct::<T, D>(plan, tr, dev, mem, st, opt, &w)
        } else {
            let es = std::mem::size_of::<T>();
            let piece_elems = (opt.piece_bytes / es).max(1);
            st.ensure_slots(dev, piece_elems * es, &w)?;
            plan.phases.iter().try_for_each(|phase| {
                staged::run_phase::<T, D>(
                    phase,
                    plan.nranks,
                    tr,
                    dev,
                    mem,
                    st,
                    opt,
                    piece_elems,
                    &w,
                )
            })
        }
    });
    if let Err(e) = &r {
        // The peers stop waiting for this rank now, not after the drain below.
        crate::exec::abandon(tr, opt.tag, e);
    }
    // The pinned slots and the caller's buffers must not be used by the device after return
    // (the copy stream is idle after a successful phase; after an early error it may not be).
    let what = "the device work of the collective before returning";
    let s = w.streams(dev, st, !direct, false, what);
    for slot in &mut st.slots {
        slot.busy = false;
    }
    if let Err(e) = &s {
        if e.kind() == crate::error::ErrorKind::Timeout {
            st.stuck = Some(e.message().to_string());
            if r.is_ok() {
                crate::exec::abandon(tr, opt.tag, e);
            }
        }
    }
    r.and(s)
}

/// The local steps of a phase on the device: copies and divisions queued on the stream.
struct DeviceLocal<'a, T, D> {
    dev: &'a D,
    mem: &'a DeviceMemory,
    _t: std::marker::PhantomData<T>,
}

impl<'a, T: Element, D: Device> DeviceLocal<'a, T, D> {
    fn new(dev: &'a D, mem: &'a DeviceMemory) -> Self {
        DeviceLocal {
            dev,
            mem,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Element, D: Device> LocalTarget for DeviceLocal<'_, T, D> {
    fn elems(&self, s: Span) -> Range<usize> {
        self.mem.elems(s)
    }

    fn copy(&self, src: Seg, dst: Seg) -> Result<()> {
        let (a, b) = (self.mem.seg(&src)?, self.mem.seg(&dst)?);
        // SAFETY: both are checked spans of the call's buffers; distinct blocks never
        // overlap, and equal addresses are skipped (the in-place form).
        unsafe { self.dev.copy_dtod(b, a) }
    }

    fn divide(&self, seg: Seg, ranks: usize) -> Result<()> {
        let p = self.mem.seg(&seg)?;
        // SAFETY: a checked span no other step of the phase touches.
        unsafe { self.dev.divide(T::DTYPE, p, ranks) }
    }
}

#[cfg(test)]
mod tests {
    use super::staged::pieces_of;
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
