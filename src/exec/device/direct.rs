//! The direct path of the device executor: device pointers straight to a transport that
//! moves device memory.

use super::*;

/// The direct path of [`execute_device`]: device pointers straight to the transport.
pub(super) fn execute_direct<T: Element, D: Device>(
    plan: &Plan,
    tr: &dyn Transport,
    dev: &D,
    mem: &DeviceMemory,
    st: &mut DeviceStaging<D>,
    opt: &DeviceExecOptions,
    w: &Watch<'_>,
) -> Result<()> {
    // The caller's final wait drains the stream: nothing queued may use the caller's
    // buffers or the temporaries after return (after an error too).
    plan.phases.iter().enumerate().try_for_each(|(i, phase)| {
        run_phase_direct::<T, D>(phase, i, plan.nranks, tr, dev, mem, st, opt, w)
    })
}

/// A send of the direct path: its device address (in place, or packed) and length in
/// elements.
struct DirectSend {
    peer: usize,
    addr: DevSpan,
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
    addr: DevSpan,
    elems: usize,
    landing: DirectLanding,
}

#[allow(clippy::too_many_arguments)]
fn run_phase_direct<T: Element, D: Device>(
    phase: &Phase,
    index: usize,
    nranks: usize,
    tr: &dyn Transport,
    dev: &D,
    mem: &DeviceMemory,
    st: &mut DeviceStaging<D>,
    opt: &DeviceExecOptions,
    w: &Watch<'_>,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    let deadline = || w.deadline;
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
    let empty = DevSpan::empty(dev.ordinal());
    let pack = if pack_bytes > 0 {
        grow(dev, &mut st.direct_send, pack_bytes)?
    } else {
        empty
    };
    let land = if land_bytes > 0 {
        grow(dev, &mut st.direct_recv, land_bytes)?
    } else {
        empty
    };

    // ---- sends: pack the strided ones on the stream ------------------------------------
    let mut sends = Vec::with_capacity(send_segs.len());
    for (peer, segs, at) in &send_segs {
        let elems = total(segs);
        let addr = match segs.as_slice() {
            [] => empty,
            [s] => seg_addr(s)?,
            _ => {
                let base = pack.sub(*at, elems * es)?;
                let mut pos = 0usize;
                for s in segs {
                    // SAFETY: the source is a checked device range of the call's buffers, the
                    // destination lies inside the pack buffer (`at` sums the packed messages'
                    // bytes), which stays allocated until the sends were waited for.
                    unsafe { dev.copy_dtod(base.sub(pos * es, s.len * es)?, seg_addr(s)?)? };
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
                addr: land.sub(at, elems * es)?,
                elems,
                landing: DirectLanding::Reduce(pairs),
            },
            (None, []) => DirectRecv {
                peer,
                addr: empty,
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
                addr: land.sub(at, elems * es)?,
                elems,
                landing: DirectLanding::Unpack(d),
            },
        };
        recvs.push(recv);
    }
    // The transport works outside the stream: the data earlier work (and the packing above)
    // wrote must be in device memory, and nothing queued may still use what it will write.
    w.streams(
        dev,
        st,
        false,
        true,
        &format!("the device work before phase {index}"),
    )?;

    let mut first_err: Option<Error> = None;
    let mut ops: Vec<Box<dyn SendOp>> = Vec::with_capacity(sends.len());
    for m in &sends {
        // SAFETY: `addr` addresses `elems` elements of a caller buffer (checked) or of the pack
        // buffer, all written by completed device work; no step of the phase writes them and
        // they stay allocated until the op was waited for below.
        match unsafe { tr.isend_device(m.peer, opt.tag, m.addr.addr(), m.elems * es) } {
            Ok(op) => ops.push(op),
            Err(e) => {
                first_err = Some(e);
                break;
            }
        }
    }

    // ---- local steps on the stream (disjoint from every send and receive) ---------------
    if first_err.is_none() {
        if let Err(e) = local_steps(phase, nranks, &DeviceLocal::<T, D>::new(dev, mem)) {
            first_err = Some(e);
        }
    }

    // ---- receives, in step order --------------------------------------------------------
    if first_err.is_none() {
        for m in &recvs {
            if let Err(e) = recv_direct::<T, D>(tr, dev, mem, m, opt, deadline()) {
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
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn recv_direct<T: Element, D: Device>(
    tr: &dyn Transport,
    dev: &D,
    mem: &DeviceMemory,
    m: &DirectRecv,
    opt: &DeviceExecOptions,
    deadline: Instant,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    // SAFETY: `addr` addresses `elems` elements of a receive target (checked) that no other
    // step of the phase touches, or of the landing buffer, which no queued work uses (the
    // stream was synchronised at the phase start and only later steps read it).
    unsafe { tr.recv_device(m.peer, opt.tag, m.addr.addr(), m.elems * es, deadline)? };
    match &m.landing {
        DirectLanding::InPlace => {}
        DirectLanding::Unpack(segs) => {
            let mut pos = 0usize;
            for s in segs {
                let dst = mem.addr(s.buf, s.off, s.len)?;
                // SAFETY: `dst` is a checked receive target; the source lies inside the landing
                // buffer, left alone until the stream is synchronised at the next phase or the
                // end of the collective.
                unsafe { dev.copy_dtod(dst, m.addr.sub(pos * es, s.len * es)?)? };
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
                unsafe { dev.reduce(opt.op, T::DTYPE, dp, wp, m.addr.sub(pos * es, d.len * es)?)? };
            }
        }
    }
    Ok(())
}
