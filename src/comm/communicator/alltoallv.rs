//! The uneven all-to-all (`all_to_all_v`, MPI's `MPI_Alltoallv`): a count agreement round,
//! then a direct pairwise exchange.

use super::{len_mul, Communicator, Inner};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::exec::abandon;
use crate::plan::alltoall::round_peers;
use crate::transport::faults::{self as stamps, stamp};
use crate::transport::SendOp;
use std::time::Instant;

/// One rank's side of an uneven all-to-all, checked: element ranges per peer.
/// `(offset, count)` in elements of the block sent to and received from each rank.
pub(crate) type AllToAllBlocks = (Vec<(usize, usize)>, Vec<(usize, usize)>);

struct Exchange<T> {
    send: *const T,
    recv: *mut T,
    /// `(offset, count)` of the block sent to each rank.
    out: Vec<(usize, usize)>,
    /// `(offset, count)` of the block received from each rank.
    inp: Vec<(usize, usize)>,
}

// SAFETY: an Exchange only carries pointers into buffers that the front end keeps alive and
// untouched until the call completes.
unsafe impl<T: Send> Send for Exchange<T> {}

/// Checks per-peer counts and displacements against a buffer of `len` elements.
fn ranges(
    what: &str,
    counts: &[usize],
    displs: &[usize],
    len: usize,
    p: usize,
) -> Result<Vec<(usize, usize)>> {
    if counts.len() != p || displs.len() != p {
        return Err(Error::invalid(format!(
            "all_to_all_v: {what} counts ({}) and displacements ({}) must have one entry per \
             rank ({p})",
            counts.len(),
            displs.len()
        )));
    }
    let mut v = Vec::with_capacity(p);
    for (r, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        match d.checked_add(c) {
            Some(end) if end <= len => v.push((d, c)),
            _ => {
                return Err(Error::invalid(format!(
                    "all_to_all_v: {what} block for rank {r} ({c} elements at {d}) runs past the \
                     {len}-element buffer"
                )))
            }
        }
    }
    Ok(v)
}

impl Communicator {
    /// Uneven all-to-all (MPI's `MPI_Alltoallv`): this rank sends
    /// `input[send_displs[j]..][..send_counts[j]]` to rank `j` and receives rank `i`'s block
    /// into `output[recv_displs[i]..][..recv_counts[i]]`. The counts must agree pairwise
    /// (rank `i`'s send count to `j` equals `j`'s receive count from `i`): a disagreement is
    /// found before any data moves and fails the call on every rank. Receive blocks must not
    /// overlap.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let (o, n) = (output.as_mut_ptr(), output.len());
        let check = || -> Result<Exchange<T>> {
            let p = self.size();
            let out = ranges("send", send_counts, send_displs, input.len(), p)?;
            let inp = ranges("receive", recv_counts, recv_displs, n, p)?;
            no_overlap(&inp)?;
            Ok(Exchange {
                send: input.as_ptr(),
                recv: o,
                out,
                inp,
            })
        };
        // SAFETY: both slices are borrowed for the whole call; the ranges were checked.
        unsafe { self.exchange::<T>("all_to_all_v", check) }
    }

    /// [`Communicator::all_to_all_v`] on raw buffers (the C ABI): `sendcounts` etc. are the
    /// per-rank arrays (already read from the caller's memory), `send_len`/`recv_len` the
    /// element extents they imply.
    ///
    /// # Safety
    /// `send` must be readable and `recv` writable for every block the counts and
    /// displacements name, untouched by others until the call returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn raw_all_to_all_v<T: Element>(
        &self,
        send: *const T,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: *mut T,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let check = || -> Result<Exchange<T>> {
            let p = self.size();
            let out = ranges("send", send_counts, send_displs, usize::MAX, p)?;
            let inp = ranges("receive", recv_counts, recv_displs, usize::MAX, p)?;
            let es = std::mem::size_of::<T>();
            let extent = |v: &[(usize, usize)]| -> Result<usize> {
                let n = v.iter().map(|&(d, c)| d + c).max().unwrap_or(0);
                len_mul(n, es, "all_to_all_v buffer size in bytes")
            };
            let (sb, rb) = (extent(&out)?, extent(&inp)?);
            if (sb > 0 && send.is_null()) || (rb > 0 && recv.is_null()) {
                return Err(Error::invalid(
                    "all_to_all_v: a buffer pointer is NULL but its counts are above zero",
                ));
            }
            let align = std::mem::align_of::<T>();
            if send as usize % align != 0 || recv as usize % align != 0 {
                return Err(Error::invalid(format!(
                    "all_to_all_v: buffers of dtype {} must be aligned to {align} bytes",
                    T::DTYPE
                )));
            }
            let (s0, r0) = (send as usize, recv as usize);
            if sb > 0 && rb > 0 && s0 < r0.saturating_add(rb) && r0 < s0.saturating_add(sb) {
                return Err(Error::invalid(
                    "all_to_all_v: send and receive buffers overlap (no in-place form)",
                ));
            }
            no_overlap(&inp)?;
            Ok(Exchange {
                send,
                recv,
                out,
                inp,
            })
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.exchange::<T>("all_to_all_v", check) }
    }

    /// The blocks of an uneven all-to-all on this communicator, checked as
    /// [`Communicator::all_to_all_v`] checks them: `(offset, count)` sent to and received from
    /// each rank, in elements.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn all_to_all_v_blocks(
        &self,
        send_counts: &[usize],
        send_displs: &[usize],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<AllToAllBlocks> {
        let p = self.size();
        let out = ranges("send", send_counts, send_displs, usize::MAX, p)?;
        let inp = ranges("receive", recv_counts, recv_displs, usize::MAX, p)?;
        no_overlap(&inp)?;
        Ok((out, inp))
    }

    /// An uneven all-to-all of checked blocks as collective `seq` (taken earlier) on the
    /// calling thread, without waiting for queued work: the host part of a queued device
    /// call (see [`Communicator::host_collective_as`]).
    ///
    /// # Safety
    /// `send` must be readable and `recv` writable for every block, untouched by others until
    /// this returns.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) unsafe fn host_all_to_all_v_as<T: Element>(
        &self,
        send: *const T,
        recv: *mut T,
        blocks: AllToAllBlocks,
        seq: u32,
    ) -> Result<()> {
        let (out, inp) = blocks;
        let ex = Exchange {
            send,
            recv,
            out,
            inp,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.exchange(&ex, seq) }
    }

    /// Runs an uneven exchange as one collective: sequence number, refusal on every rank of
    /// bad arguments, then [`Inner::exchange`].
    ///
    /// # Safety
    /// The buffers the checked exchange points to must stay valid and otherwise untouched
    /// until this returns.
    unsafe fn exchange<T: Element>(
        &self,
        what: &str,
        check: impl FnOnce() -> Result<Exchange<T>>,
    ) -> Result<()> {
        let _one = self.inner.enter(what)?;
        let seq = self.inner.next_seq();
        let ex = check().map_err(|e| self.inner.refuse(seq, what, e))?;
        self.inner.quiesce();
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.exchange(&ex, seq) }
    }
}

/// Refuses receive blocks that overlap (two peers would write the same elements).
fn no_overlap(v: &[(usize, usize)]) -> Result<()> {
    let mut s: Vec<(usize, usize, usize)> = v
        .iter()
        .enumerate()
        .filter(|(_, &(_, c))| c > 0)
        .map(|(r, &(d, c))| (d, d + c, r))
        .collect();
    s.sort_unstable();
    for w in s.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::invalid(format!(
                "all_to_all_v: the receive blocks of ranks {} and {} overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(())
}

impl Inner {
    /// The uneven exchange of collective `seq`: round one tells every peer how many elements
    /// this rank expects from it (and checks what each peer expects from this rank); round
    /// two moves the data pairwise. Any disagreement fails the collective on every rank
    /// before data moves.
    ///
    /// # Safety
    /// As for [`Communicator::exchange`].
    unsafe fn exchange<T: Element>(&self, ex: &Exchange<T>, seq: u32) -> Result<()> {
        let tr = self.transport.as_ref();
        let (p, me) = (tr.size(), tr.rank());
        let tag = if self.cfg.checks {
            stamp(
                seq,
                stamps::fingerprint(12, T::DTYPE as u32 + 1, 0, &[p as u64]),
            )
        } else {
            stamp(seq, 0)
        };
        let deadline = Instant::now() + self.timeout();
        let es = std::mem::size_of::<T>();
        let r = (|| -> Result<()> {
            tr.faults().check(tag, me)?;
            // Round one: expectations (8 bytes per peer, bounded by the communicator size).
            let expect: Vec<[u8; 8]> = ex
                .inp
                .iter()
                .map(|&(_, c)| (c as u64).to_le_bytes())
                .collect();
            let mut sends: Vec<Box<dyn SendOp>> = Vec::with_capacity(p);
            let mut first: Option<Error> = None;
            for (j, e) in expect.iter().enumerate() {
                if j == me {
                    continue;
                }
                // SAFETY: `expect` outlives every send, waited for below on every path.
                match unsafe { tr.isend(j, tag, e.as_ptr(), 8) } {
                    Ok(s) => sends.push(s),
                    Err(e) => {
                        first = Some(e);
                        break;
                    }
                }
            }
            if first.is_none() && ex.out[me].1 != ex.inp[me].1 {
                first = Some(Error::invalid(format!(
                    "all_to_all_v: rank {me} sends {} elements to itself but expects {}",
                    ex.out[me].1, ex.inp[me].1
                )));
            }
            if first.is_none() {
                for j in (0..p).filter(|&j| j != me) {
                    let mut b = [0u8; 8];
                    if let Err(e) = tr.recv_into(j, tag, &mut b, deadline) {
                        first = Some(e);
                        break;
                    }
                    let theirs = u64::from_le_bytes(b);
                    if theirs != ex.out[j].1 as u64 {
                        first = Some(Error::invalid(format!(
                            "all_to_all_v: rank {me} sends {} elements to rank {j}, but rank {j} \
                             expects {theirs} from rank {me}: the counts must agree pairwise",
                            ex.out[j].1
                        )));
                        break;
                    }
                }
            }
            if let Some(e) = &first {
                abandon(tr, tag, e);
            }
            for s in sends {
                if let Err(e) = s.wait(deadline) {
                    first.get_or_insert(e);
                }
            }
            if let Some(e) = first {
                return Err(e);
            }
            // Own block.
            let (sd, n) = ex.out[me];
            let rd = ex.inp[me].0;
            if n > 0 {
                // SAFETY: checked ranges of the caller's buffers; the send and receive
                // buffers do not overlap (checked), and this block is written only here.
                unsafe { std::ptr::copy_nonoverlapping(ex.send.add(sd), ex.recv.add(rd), n) };
            }
            // Round two: pairwise data.
            for k in 1..p {
                let (to, from) = round_peers(me, p, k);
                let (sd, sn) = ex.out[to];
                let ptr = if sn > 0 {
                    // SAFETY: in bounds of the checked send range.
                    unsafe { ex.send.add(sd) as *const u8 }
                } else {
                    std::ptr::null()
                };
                // SAFETY: the send range stays valid and unmodified until the wait below.
                let s = unsafe { tr.isend(to, tag, ptr, sn * es)? };
                let (rd, rn) = ex.inp[from];
                let got = if rn > 0 {
                    // SAFETY: a checked receive range, disjoint from every other receive
                    // range and from the send buffer, written only by this receive.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ex.recv.add(rd), rn) };
                    tr.recv_into(from, tag, bytemuck::cast_slice_mut(dst), deadline)
                } else {
                    tr.recv_into(from, tag, &mut [], deadline)
                };
                if let Err(e) = &got {
                    abandon(tr, tag, e);
                }
                let sent = s.wait(deadline);
                got?;
                sent?;
            }
            Ok(())
        })();
        if let Err(e) = &r {
            abandon(tr, tag, e);
        }
        r
    }
}
