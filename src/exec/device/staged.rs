//! The host-staged path of the device executor: messages through pinned host memory, piece
//! by piece.

use super::*;

pub(super) fn pieces_of(elems: usize, pe: usize) -> usize {
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
pub(super) fn run_phase<T: Element, D: Device>(
    phase: &Phase,
    nranks: usize,
    tr: &dyn Transport,
    dev: &D,
    mem: &DeviceMemory,
    st: &mut DeviceStaging<D>,
    opt: &DeviceExecOptions,
    pe: usize,
    w: &Watch<'_>,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    let deadline = || w.deadline;

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
        dev.record(ready, None)?;
        dev.stream_wait(&st.d2h, ready)?;
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
                unsafe { dev.copy_dtoh(Some(&st.d2h), base.add(m.at + pos * es), src)? };
            }
            dev.record(&st.events[e], Some(&st.d2h))?;
        }
    }
    let mut posted = 0usize;
    // Posts pieces in order: all with index <= `upto` (waiting for their copies), then any
    // further ones whose copies already finished.
    let mut post = |upto: usize, sends: &mut Vec<Box<dyn SendOp>>, st: &DeviceStaging<D>| {
        while posted < order.len() {
            let (i, k) = order[posted];
            let ev = &st.events[posted];
            if k > upto && !dev.event_done(ev)? {
                break;
            }
            let m = &msgs[i];
            w.event(dev, ev, w.deadline, true, || {
                format!(
                    "the device-to-host copy of piece {k} of its message to rank {}",
                    m.peer
                )
            })?;
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
    if let Err(e) = local_steps(phase, nranks, &DeviceLocal::<T, D>::new(dev, mem)) {
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
                recv_piece::<T, D>(tr, dev, mem, st, slot_i, m, k, pe, opt, w)
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
    // After an error, copies may still be queued out of the staging: the caller's final
    // wait (execute_device) drains them before anything reuses it.
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn recv_piece<T: Element, D: Device>(
    tr: &dyn Transport,
    dev: &D,
    mem: &DeviceMemory,
    st: &mut DeviceStaging<D>,
    slot_i: usize,
    m: &RecvMsg,
    k: usize,
    pe: usize,
    opt: &DeviceExecOptions,
    w: &Watch<'_>,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    let (lo, hi) = (k * pe, ((k + 1) * pe).min(m.elems));
    let n = hi.max(lo) - lo;
    let slot = &mut st.slots[slot_i];
    if slot.busy {
        w.event(dev, &slot.event, w.deadline, true, || {
            format!("the host-to-device copy (and reduction) of an earlier piece in receive slot {slot_i}")
        })?;
        slot.busy = false;
    }
    tr.recv_into(
        m.peer,
        opt.tag,
        &mut slot.host.as_mut_slice()[..n * es],
        w.deadline,
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
                unsafe { dev.copy_htod(dst, host.add((pos - lo) * es))? };
            }
        }
        Some(pairs) => {
            let piece = dev.span_of(&slot.dev).sub(0, n * es)?;
            // SAFETY: the slot's device piece holds `piece_bytes >= n * es` bytes; the pinned
            // source is not reused before the slot's event has completed.
            unsafe { dev.copy_htod(piece, host)? };
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
                    dev.reduce(
                        opt.op,
                        T::DTYPE,
                        dp,
                        wp,
                        piece.sub((a - lo) * es, len * es)?,
                    )?
                };
            }
        }
    }
    dev.record(&slot.event, None)?;
    slot.busy = true;
    Ok(())
}
