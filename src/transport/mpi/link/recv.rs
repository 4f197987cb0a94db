//! The receive side of the MPI link: the header and the first pieces posted at once, the
//! header checked, the pieces taken in order (or thrown away when the header does not fit).

use super::{count_of, null_req, piece, pieces, Core, Req, DEPTH, HEADER};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Where the pieces of a receive go.
pub trait Dest {
    /// How many pieces may be in flight at once.
    fn depth(&self) -> usize;
    /// The address piece `k` (of `m` bytes) is received at.
    fn slot(&mut self, k: usize, m: usize) -> *mut u8;
    /// Piece `k` (`m` bytes at message offset `off`) has arrived at its slot.
    fn arrived(&mut self, k: usize, off: usize, m: usize);
    /// Gives up the slots' memory for good (MPI may still write it), if it is PCCL's own;
    /// returns false when it is the caller's (which cannot be given up).
    fn leak(&mut self) -> bool;
}

/// A receive into staging buffers of PCCL's own, handed to a sink piece by piece.
pub struct Staged<'a> {
    bufs: Vec<Vec<u64>>,
    sink: &'a mut dyn FnMut(usize, &[u8]),
}

impl<'a> Staged<'a> {
    /// Staging for a `len`-byte message in `chunk`-byte pieces.
    pub fn new(len: usize, chunk: usize, sink: &'a mut dyn FnMut(usize, &[u8])) -> Self {
        let depth = DEPTH.min(pieces(len, chunk));
        // u64 words keep every dtype aligned for the reduction kernels.
        let words = chunk.min(len).div_ceil(8).max(1);
        Staged {
            bufs: (0..depth).map(|_| vec![0u64; words]).collect(),
            sink,
        }
    }
}

impl Dest for Staged<'_> {
    fn depth(&self) -> usize {
        self.bufs.len()
    }
    fn slot(&mut self, k: usize, _m: usize) -> *mut u8 {
        let n = self.bufs.len();
        self.bufs[k % n].as_mut_ptr() as *mut u8
    }
    fn arrived(&mut self, k: usize, off: usize, m: usize) {
        let n = self.bufs.len();
        let bytes: &[u8] = bytemuck::cast_slice(&self.bufs[k % n]);
        (self.sink)(off, &bytes[..m]);
    }
    fn leak(&mut self) -> bool {
        for b in std::mem::take(&mut self.bufs) {
            std::mem::forget(b);
        }
        true
    }
}

/// A receive straight into the caller's memory (host, or device for a CUDA-aware MPI), every
/// piece in flight at once.
pub struct Direct {
    /// The first byte (only handed to MPI).
    pub base: *mut u8,
    /// The message length.
    pub len: usize,
    /// Piece size.
    pub chunk: usize,
}

impl Dest for Direct {
    fn depth(&self) -> usize {
        pieces(self.len, self.chunk)
    }
    fn slot(&mut self, k: usize, m: usize) -> *mut u8 {
        let (off, _) = piece(self.len, self.chunk, k);
        // `wrapping_add`: the address may be device memory, which Rust never reads.
        if m == 0 {
            self.base
        } else {
            self.base.wrapping_add(off)
        }
    }
    fn arrived(&mut self, _k: usize, _off: usize, _m: usize) {}
    fn leak(&mut self) -> bool {
        false
    }
}

impl Core {
    /// Receives the message stamped `tag` (exactly `len` bytes, cut in `chunk`-byte pieces as
    /// the sender cut it) from `peer` into `dest`.
    pub fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        chunk: usize,
        deadline: Instant,
        dest: &mut dyn Dest,
    ) -> Result<()> {
        if peer >= self.size {
            return Err(Error::invalid(format!("no rank {peer}")));
        }
        self.seen(tag);
        let r = self.recv_inner(peer, tag, len, chunk, deadline, dest);
        match &r {
            Ok(()) => self.note_success(tag),
            Err(e) => self.note_failure(faults::seq_of(tag), e.message()),
        }
        r
    }

    fn recv_inner(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        chunk: usize,
        deadline: Instant,
        dest: &mut dyn Dest,
    ) -> Result<()> {
        let n = pieces(len, chunk);
        let ahead = dest.depth().clamp(1, n);
        let h = self.header_tag(faults::seq_of(tag));
        let waiting = "waited in vain for a message from";
        loop {
            let mut header = Box::new([0u64; 3]);
            let mut hreq = [self.irecv(header.as_mut_ptr() as *mut u8, HEADER, peer, h)?];
            let mut reqs: VecDeque<Req> = VecDeque::with_capacity(ahead);
            for k in 0..ahead {
                let (_, m) = piece(len, chunk, k);
                match self.irecv(dest.slot(k, m), m, peer, h + 1) {
                    Ok(r) => reqs.push_back(r),
                    Err(e) => {
                        self.abandon_recv(&mut hreq, header, &mut reqs, dest, peer);
                        return Err(e);
                    }
                }
            }
            let st = match self.poll(&mut hreq[0], tag, peer, deadline, waiting) {
                Ok(s) => s,
                Err(e) => {
                    self.abandon_recv(&mut hreq, header, &mut reqs, dest, peer);
                    return Err(e);
                }
            };
            let got = count_of(&st);
            let [stamp, hlen, hchunk] = header.map(u64::from_le);
            if got == HEADER && stamp == tag && hlen == len as u64 && hchunk == chunk as u64 {
                return self.take_pieces(peer, tag, len, chunk, deadline, dest, reqs, ahead);
            }
            // Not the message this receive expects: take back our piece receives, then throw
            // away the rest of the sender's pieces.
            let sent = match (usize::try_from(hlen), usize::try_from(hchunk)) {
                (Ok(l), Ok(c)) if got == HEADER && (1..=i32::MAX as usize).contains(&c) => {
                    pieces(l, c)
                }
                _ => 0,
            };
            let mut rs: Vec<Req> = reqs.into_iter().collect();
            let matched = self.retire_pieces(&mut rs, dest, peer);
            // Pieces already posted by the sender are here at once; later ones the janitor takes.
            let until = Instant::now() + Duration::from_millis(200);
            self.drain(peer, h + 1, sent.saturating_sub(matched), until);
            if got == HEADER && faults::is_stale(stamp, tag) && matched <= sent {
                // A leftover of a collective `window` sequence numbers back: dropped.
                self.add_junk(faults::seq_of(stamp));
                continue;
            }
            self.faults.check(tag, peer)?;
            return Err(if got != HEADER {
                Error::remote(format!(
                    "rank {} got a malformed {got}-byte message header from rank {peer}",
                    self.rank
                ))
            } else if stamp != tag {
                faults::mismatch(self.rank, peer, tag, stamp)
            } else if hchunk != chunk as u64 {
                Error::remote(format!(
                    "rank {} cuts this message in pieces of {chunk} bytes but rank {peer} in \
                     pieces of {hchunk}: do all ranks set the same PCCL_CHUNK_SIZE and \
                     PCCL_TUNE_FILE (the tuner picks the piece size per call)?",
                    self.rank
                ))
            } else {
                Error::remote(format!(
                    "rank {} expected {len} bytes from rank {peer} but it sent {hlen}: do all \
                     ranks pass the same count and dtype?",
                    self.rank
                ))
            });
        }
    }

    /// Takes the pieces of a message whose header checked out.
    #[allow(clippy::too_many_arguments)]
    fn take_pieces(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        chunk: usize,
        deadline: Instant,
        dest: &mut dyn Dest,
        mut reqs: VecDeque<Req>,
        ahead: usize,
    ) -> Result<()> {
        let n = pieces(len, chunk);
        let h = self.header_tag(faults::seq_of(tag));
        for k in 0..n {
            let (off, m) = piece(len, chunk, k);
            let mut r = reqs.pop_front().unwrap_or(Req(null_req()));
            let res = self
                .poll(
                    &mut r,
                    tag,
                    peer,
                    deadline,
                    "waited in vain for a message from",
                )
                .and_then(|st| {
                    let got = count_of(&st);
                    if got == m {
                        Ok(())
                    } else {
                        Err(Error::remote(format!(
                            "rank {} expected a piece of {m} bytes from rank {peer} but got \
                             {got}: do all ranks pass the same count and dtype?",
                            self.rank
                        )))
                    }
                });
            if let Err(e) = res {
                let mut rs: Vec<Req> = std::iter::once(r).chain(reqs).collect();
                self.retire_pieces(&mut rs, dest, peer);
                return Err(e);
            }
            dest.arrived(k, off, m);
            if k + ahead < n {
                let (_, m2) = piece(len, chunk, k + ahead);
                match self.irecv(dest.slot(k + ahead, m2), m2, peer, h + 1) {
                    Ok(r) => reqs.push_back(r),
                    Err(e) => {
                        let mut rs: Vec<Req> = reqs.into_iter().collect();
                        self.retire_pieces(&mut rs, dest, peer);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Cancels a receive's piece requests; returns how many matched a message anyway.
    fn retire_pieces(&self, rs: &mut [Req], dest: &mut dyn Dest, peer: usize) -> usize {
        let (matched, live) = self.retire(rs);
        if live > 0 {
            if dest.leak() {
                self.give_up(live, ());
            } else {
                self.fatal(&format!(
                    "a receive from rank {peer} into the caller's buffer could not be cancelled"
                ));
            }
        }
        matched
    }

    /// Takes back a receive's header and piece requests after a failure.
    fn abandon_recv(
        &self,
        hreq: &mut [Req; 1],
        header: Box<[u64; 3]>,
        reqs: &mut VecDeque<Req>,
        dest: &mut dyn Dest,
        peer: usize,
    ) {
        let (_, live) = self.retire(hreq);
        self.give_up(live, header);
        let mut rs: Vec<Req> = reqs.drain(..).collect();
        self.retire_pieces(&mut rs, dest, peer);
    }
}
