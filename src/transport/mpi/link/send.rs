//! Posting a message (its header, then its pieces, each an MPI send) and [`MpiSend`], the
//! request that waits for them.

use super::*;

impl Core {
    // ---- messages -------------------------------------------------------------------------

    /// Posts the header and pieces (of `chunk` bytes, see [`Core::cut`]) of a `len`-byte
    /// message at `ptr` stamped `tag` to `peer`.
    ///
    /// # Safety
    /// The `len` bytes at `ptr` (host, or device memory for a CUDA-aware MPI: only handed to
    /// MPI) must stay valid and unmodified until the returned send's `wait` returns.
    pub unsafe fn isend(
        self: &Arc<Self>,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        chunk: usize,
    ) -> Result<MpiSend> {
        // SAFETY: forwarded from the caller.
        unsafe { self.isend_segs(peer, tag, &[(ptr, len)], chunk) }
    }

    /// [`Core::isend`] of the host segments `segs` laid end to end (one message on the wire,
    /// byte for byte the packed one): a piece within one segment is sent from it as it is,
    /// a piece over several is packed.
    ///
    /// # Safety
    /// Each segment as [`Core::isend`]'s buffer (`Transport::isendv`'s contract).
    pub unsafe fn isend_segs(
        self: &Arc<Self>,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        chunk: usize,
    ) -> Result<MpiSend> {
        let len: usize = segs.iter().map(|s| s.1).sum();
        let addrs: Vec<(usize, usize)> = segs.iter().map(|&(p, n)| (p as usize, n)).collect();
        let first = segs.first().map_or(std::ptr::null(), |s| s.0);
        if peer >= self.size {
            return Err(Error::invalid(format!("no rank {peer}")));
        }
        self.seen(tag);
        let header = Box::new([tag.to_le(), (len as u64).to_le(), (chunk as u64).to_le()]);
        let h = self.header_tag(faults::seq_of(tag));
        let mut send = MpiSend {
            core: self.clone(),
            reqs: Vec::with_capacity(1 + pieces(len, chunk)),
            packed: Vec::new(),
            header,
            peer,
            tag,
        };
        let hp = send.header.as_ptr() as *const u8;
        send.reqs.push(self.isend_bytes(hp, HEADER, peer, h)?);
        for k in 0..pieces(len, chunk) {
            let (off, m) = piece(len, chunk, k);
            let parts = seg_parts(&addrs, off, m);
            let p = match parts.as_slice() {
                // An empty message: one empty piece (the address is never read).
                [] => first,
                [(p, _)] => *p as *const u8,
                // A piece over several segments is packed: MPICH's derived datatypes
                // (hindexed, tried) made 16–512 KiB hierarchical all-gathers 1.4–3.5× slower
                // than packing them.
                _ => {
                    let mut b = Staging::take(m);
                    let dst = b.bytes_mut();
                    // SAFETY: the caller's segment bytes (`isendv`'s contract), `m` in all.
                    unsafe { crate::transport::pack_parts(&parts, dst) };
                    let q = dst.as_ptr();
                    // The buffer's heap block stays put when it moves into `packed`.
                    send.packed.push(b);
                    q
                }
            };
            send.reqs.push(self.isend_bytes(p, m, peer, h + 1)?);
        }
        Ok(send)
    }
}

/// A posted message (header and pieces).
pub struct MpiSend {
    core: Arc<Core>,
    reqs: Vec<Req>,
    /// Pieces packed from several segments, kept until their requests end (a request MPI
    /// cannot cancel ends the job before they are freed).
    packed: Vec<Staging>,
    /// The header's bytes, kept until its request ends.
    header: Box<[u64; 3]>,
    peer: usize,
    tag: Tag,
}

impl MpiSend {
    /// Waits until every request ended; on a failure on the board or the deadline, cancels
    /// them and waits for MPI to confirm (or ends the job: see the module documentation).
    pub fn finish(&mut self, deadline: Instant) -> Result<()> {
        let core = self.core.clone();
        for i in 0..self.reqs.len() {
            let what = "sent a message never taken by";
            let mut r = self.reqs[i];
            let res = core.poll(&mut r, self.tag, self.peer, deadline, what);
            self.reqs[i] = r;
            if let Err(e) = res {
                core.note_failure(faults::seq_of(self.tag), e.message());
                self.give_back();
                return Err(e);
            }
        }
        core.note_success(self.tag);
        Ok(())
    }

    /// Cancels what is still live; ends the job if MPI cannot confirm it.
    fn give_back(&mut self) {
        if self.reqs.iter().any(Req::live) {
            let peer = self.peer;
            let mut reqs = std::mem::take(&mut self.reqs);
            self.core.retire_or_die(
                &mut reqs,
                &format!("a send to rank {peer} was never received and could not be cancelled"),
            );
        }
    }
}

impl Drop for MpiSend {
    fn drop(&mut self) {
        // Only a send that was never waited for still has live requests.
        self.give_back();
    }
}
