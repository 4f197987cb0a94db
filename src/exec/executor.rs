//! Runs one rank's plan: per phase, post every send, do the local copies, complete every
//! receive (copying or reducing straight out of the transport's pieces), then wait for the
//! sends. Large messages arrive in pieces (the tuner's piece size per call, or
//! `PCCL_CHUNK_SIZE`: [`ExecOptions::piece`]), so the reduction of one piece overlaps the
//! transfer of the next.

use super::local::{local_steps, LocalTarget};
use super::memory::Memory;
use super::segments::{segments, total, zip_segments, Seg};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::{Phase, Plan, Span, Step};
use crate::transport::{SendOp, Tag, Transport};
use std::time::Instant;

/// Per-call settings of the executor.
#[derive(Clone, Copy, Debug)]
pub struct ExecOptions {
    /// Stamp of this collective: its sequence number and call fingerprint
    /// (`transport::faults::stamp`).
    pub tag: Tag,
    /// When the whole collective must have finished: one deadline for every wait in it.
    pub deadline: Instant,
    /// Reduction operator (ignored by plans without reductions).
    pub op: ReduceOp,
    /// Fault injection (`corrupt`): sends leave with a damaged stamp.
    pub corrupt: bool,
    /// Bytes per transport piece for this call (the tuner's choice, or an explicit
    /// `PCCL_CHUNK_SIZE`); `None` keeps the transport's creation-time size. Every rank of
    /// the collective must pass the same (see [`Transport::isend_pieces`]).
    pub piece: Option<usize>,
}

/// The bits fault injection flips in a damaged stamp (inside the call fingerprint's hash).
const DAMAGE: Tag = 0x0a5a_5000;

/// Calls `f(src_elems, piece)` for every part of `pieces` (message offset, length, payload)
/// that overlaps the message elements `[e0, e0 + src.len())`.
fn for_overlaps<T, P: Copy>(
    pieces: &[(usize, usize, P)],
    e0: usize,
    src: &[T],
    mut f: impl FnMut(&[T], P, usize),
) {
    let e1 = e0 + src.len();
    // Pieces are sorted by offset: skip to the first that ends after e0.
    let first = pieces.partition_point(|(off, len, _)| off + len <= e0);
    for &(off, len, p) in &pieces[first..] {
        if off >= e1 {
            break;
        }
        let lo = off.max(e0);
        let hi = (off + len).min(e1);
        f(&src[lo - e0..hi - e0], p, lo - off);
    }
}

fn as_elems<T: Element>(bytes: &[u8], scratch: &mut Vec<T>) -> Option<usize> {
    match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(_) => None,
        Err(_) => {
            // Misaligned piece (a transport's staging buffer): copy to aligned memory once.
            *scratch = bytemuck::pod_collect_to_vec(bytes);
            Some(scratch.len())
        }
    }
}

/// Runs `plan` on `tr` over `mem`. Every rank of the communicator must run its own plan of
/// the same collective with the same tag. On failure the collective is abandoned on the
/// transport (every peer's waits for it end, see [`Transport::abandon`]) unless the
/// transport's board already explains the failure (a peer's refusal, a death, an abort).
pub fn execute<T: Element>(
    plan: &Plan,
    tr: &dyn Transport,
    mem: &Memory<'_, T>,
    opt: &ExecOptions,
) -> Result<()> {
    if mem.pieces() != plan.pieces {
        return Err(Error::internal(format!(
            "a plan of {} pieces per block run on memory addressed in {}",
            plan.pieces,
            mem.pieces()
        )));
    }
    for phase in &plan.phases {
        if let Err(e) = run_phase(phase, plan.nranks, tr, mem, opt) {
            abandon(tr, opt.tag, &e);
            return Err(e);
        }
    }
    Ok(())
}

/// Tells the peers that this rank gave up collective `tag` because of `e`, unless the
/// board already holds a cause every rank was told (an abort, a refusal). A death counts as
/// untold: each rank finds it for itself, within its monitor's sweep, and a peer still
/// waiting for this rank's message would meanwhile meet whatever this rank sends next (a
/// shrink's first message) instead of the reason (a transport sends one refusal per
/// collective, so a notice already sent is not repeated).
pub fn abandon(tr: &dyn Transport, tag: Tag, e: &Error) {
    let f = tr.faults();
    if f.check(tag, tr.rank()).is_ok() || !f.dead_ranks().is_empty() {
        if e.kind() == crate::error::ErrorKind::Timeout {
            let why = format!("{}{}", crate::transport::faults::TIMED_OUT, e.message());
            tr.abandon(tag, &why);
        } else {
            tr.abandon(tag, e.message());
        }
    }
}

fn run_phase<T: Element>(
    phase: &Phase,
    nranks: usize,
    tr: &dyn Transport,
    mem: &Memory<'_, T>,
    opt: &ExecOptions,
) -> Result<()> {
    let es = std::mem::size_of::<T>();
    let deadline = || opt.deadline;
    let send_tag = if opt.corrupt {
        opt.tag ^ DAMAGE
    } else {
        opt.tag
    };
    let mut sends: Vec<Box<dyn SendOp>> = Vec::new();
    let mut first_err: Option<Error> = None;

    // The receives' "ready" go ahead of this rank's own sends (rendezvous transports; only
    // stamps that ask for one, so other plans pay nothing here).
    let rendezvous = crate::transport::faults::is_rendezvous(opt.tag);
    for step in phase.steps.iter().filter(|_| rendezvous) {
        if let Step::Recv { peer, dst } | Step::RecvReduce { peer, dst, .. } = step {
            let n: usize = segments(dst, |sp| mem.elems(sp))
                .iter()
                .map(|s| s.len)
                .sum();
            tr.expect(*peer, opt.tag, n * es);
        }
    }
    for step in &phase.steps {
        if let Step::Send { peer, src } = step {
            let segs = segments(src, |sp| mem.elems(sp));
            let posted = if segs.len() <= 1 {
                let (ptr, len) = match segs.first() {
                    Some(s) => (mem.ptr_at(s.buf, s.off, s.len)?, s.len),
                    None => (std::ptr::null(), 0),
                };
                // SAFETY: the send's memory is part of a caller buffer that outlives this call,
                // and the plan never writes it during this phase; we wait for the send below.
                unsafe { tr.isend_pieces(*peer, send_tag, ptr as *const u8, len * es, opt.piece) }
            } else {
                let mut v = Vec::with_capacity(segs.len());
                for s in &segs {
                    v.push((mem.ptr_at(s.buf, s.off, s.len)? as *const u8, s.len * es));
                }
                // SAFETY: as above, for every segment: caller memory the phase only reads,
                // waited for below.
                unsafe { tr.isendv(*peer, send_tag, &v, opt.piece) }
            };
            match posted {
                Ok(op) => sends.push(op),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
    }

    if first_err.is_none() {
        first_err = local_steps(phase, nranks, mem).err();
    }
    if first_err.is_none() {
        for step in &phase.steps {
            let r = match step {
                Step::Recv { peer, dst } => recv_copy(tr, *peer, dst, mem, opt, deadline()),
                Step::RecvReduce { peer, dst, with } => {
                    recv_reduce(tr, *peer, dst, with, mem, opt, deadline())
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                first_err = Some(e);
                break;
            }
        }
    }
    // Always wait for the sends, even after an error: their memory must outlive them. After
    // an error the collective is abandoned first, so sends nobody will take end at once.
    if let Some(e) = &first_err {
        abandon(tr, opt.tag, e);
    }
    for s in sends {
        if let Err(e) = s.wait(deadline()) {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

impl<T: Element> LocalTarget for Memory<'_, T> {
    fn elems(&self, s: Span) -> std::ops::Range<usize> {
        Memory::elems(self, s)
    }

    fn copy(&self, a: Seg, b: Seg) -> Result<()> {
        if self.addr(a.buf, a.off) == self.addr(b.buf, b.off) {
            return Ok(()); // in-place form: already where it belongs
        }
        // SAFETY: the plan writes `b` only here in this phase and `a` is not written;
        // distinct addresses of distinct blocks do not overlap.
        unsafe {
            self.slice_mut(b.buf, b.off, a.len)
                .copy_from_slice(self.slice(a.buf, a.off, a.len))
        };
        Ok(())
    }

    fn divide(&self, s: Seg, ranks: usize) -> Result<()> {
        // SAFETY: the target of an average is touched by no other step of its phase.
        T::divide(unsafe { self.slice_mut(s.buf, s.off, s.len) }, ranks);
        Ok(())
    }
}

fn recv_copy<T: Element>(
    tr: &dyn Transport,
    peer: usize,
    dst: &[Span],
    mem: &Memory<'_, T>,
    opt: &ExecOptions,
    deadline: Instant,
) -> Result<()> {
    let segs = segments(dst, |sp| mem.elems(sp));
    let es = std::mem::size_of::<T>();
    if segs.len() == 1 {
        let s = segs[0];
        // SAFETY: the receive target is written by no other step of the phase and read by none.
        let d = unsafe { mem.slice_mut(s.buf, s.off, s.len) };
        return tr.recv_into_pieces(
            peer,
            opt.tag,
            bytemuck::cast_slice_mut(d),
            opt.piece,
            deadline,
        );
    }
    let mut v = Vec::with_capacity(segs.len());
    for s in &segs {
        // SAFETY: as above: receive targets are exclusive to this step.
        let d = unsafe { mem.slice_mut(s.buf, s.off, s.len) };
        v.push((d.as_mut_ptr() as *mut u8, s.len * es));
    }
    // SAFETY: the segments are distinct blocks of caller memory, exclusive to this step.
    unsafe { tr.recvv_into(peer, opt.tag, &v, opt.piece, deadline) }
}

fn recv_reduce<T: Element>(
    tr: &dyn Transport,
    peer: usize,
    dst: &[Span],
    with: &[Span],
    mem: &Memory<'_, T>,
    opt: &ExecOptions,
    deadline: Instant,
) -> Result<()> {
    let d = segments(dst, |sp| mem.elems(sp));
    let w = segments(with, |sp| mem.elems(sp));
    if total(&d) != total(&w) {
        return Err(Error::internal("reduce operand and target differ in size"));
    }
    let es = std::mem::size_of::<T>();
    let pieces: Vec<(usize, usize, (Seg, Seg))> = zip_segments(&d, &w)
        .into_iter()
        .map(|(pos, a, b)| (pos, a.len, (a, b)))
        .collect();
    let op = opt.op;
    let mut tmp: Vec<T> = Vec::new();
    tr.recv_pieces(
        peer,
        opt.tag,
        total(&d) * es,
        opt.piece,
        deadline,
        &mut |off, bytes| {
            let src: &[T] = match as_elems::<T>(bytes, &mut tmp) {
                None => bytemuck::cast_slice(bytes),
                Some(_) => &tmp,
            };
            for_overlaps(&pieces, off / es, src, |part, (ds, ws), at| {
                let n = part.len();
                if mem.addr(ds.buf, ds.off + at) == mem.addr(ws.buf, ws.off + at) {
                    // SAFETY: an in-place reduction; the target is exclusive to this step.
                    T::reduce_into(op, unsafe { mem.slice_mut(ds.buf, ds.off + at, n) }, part);
                } else {
                    // SAFETY: target and operand are distinct blocks (never partially overlapping),
                    // and the target is exclusive to this step.
                    unsafe {
                        T::reduce3(
                            op,
                            mem.slice_mut(ds.buf, ds.off + at, n),
                            mem.slice(ws.buf, ws.off + at, n),
                            part,
                        )
                    };
                }
            });
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::faults::stamp;
    use crate::transport::threads::ThreadWorld;

    #[test]
    fn a_rank_that_gave_up_for_a_death_tells_the_peers_still_waiting_for_it() {
        let w = ThreadWorld::new(3);
        let (t0, t1) = (w.transport(0).unwrap(), w.transport(1).unwrap());
        let tag = stamp(4, 1);
        // Rank 0 saw rank 2 die; rank 1, waiting for rank 0's message, has not yet.
        t0.faults()
            .dead(2, "its connection closed without a goodbye");
        let e = t0.faults().check(tag, 0).unwrap_err();
        abandon(&*t0, tag, &e);
        let got = t1.faults().check(tag, 0).unwrap_err();
        assert!(
            got.message().contains("rank 0 refused collective #4")
                && got.message().contains("rank 2 died"),
            "rank 1 learns the cause from rank 0: {got}"
        );
        // An abort reached every rank by itself: giving up because of it tells nobody more.
        let w = ThreadWorld::new(2);
        let (t0, t1) = (w.transport(0).unwrap(), w.transport(1).unwrap());
        t1.abort("stop");
        let e = t0.faults().check(tag, 0).unwrap_err();
        abandon(&*t0, tag, &e);
        assert!(t1.faults().refusals(4).is_empty());
    }
}
