//! The receive side of the MPI link: the header and the first pieces posted at once, the
//! header checked, the pieces taken in order (or thrown away when the header does not fit).

use super::{count_of, piece, pieces, seg_parts, Core, Req, DEPTH, HEADER};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::staging::Staging;
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
    bufs: Vec<Staging>,
    sink: &'a mut dyn FnMut(usize, &[u8]),
}

impl<'a> Staged<'a> {
    /// Staging for a `len`-byte message in `chunk`-byte pieces.
    pub fn new(len: usize, chunk: usize, sink: &'a mut dyn FnMut(usize, &[u8])) -> Self {
        let depth = DEPTH.min(pieces(len, chunk));
        // Reused buffers (faulted in once, not per call), of u64 words: every dtype is
        // aligned in them for the reduction kernels.
        let bytes = chunk.min(len).max(1);
        Staged {
            bufs: (0..depth).map(|_| Staging::take(bytes)).collect(),
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
        self.bufs[k % n].bytes_mut().as_mut_ptr()
    }
    fn arrived(&mut self, k: usize, off: usize, m: usize) {
        let n = self.bufs.len();
        (self.sink)(off, &self.bufs[k % n].bytes()[..m]);
    }
    fn leak(&mut self) -> bool {
        for b in std::mem::take(&mut self.bufs) {
            b.leak();
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

/// A receive into the caller's host segments (`Transport::recvv_into`), every piece in
/// flight at once: a piece within one segment is received straight into it, a piece over
/// several into a staging buffer scattered on arrival (as the sender packs it).
pub struct Scattered {
    /// The segments `(address, length)`, laid end to end.
    segs: Vec<(usize, usize)>,
    /// The message length (the segments' total).
    len: usize,
    /// Piece size.
    chunk: usize,
    /// Staging of the pieces over several segments, by piece index.
    packed: Vec<Option<Staging>>,
}

impl Scattered {
    /// A receive of the segments `segs` in `chunk`-byte pieces.
    pub fn new(segs: Vec<(usize, usize)>, chunk: usize) -> Self {
        let len = segs.iter().map(|s| s.1).sum();
        Scattered {
            packed: (0..pieces(len, chunk)).map(|_| None).collect(),
            segs,
            len,
            chunk,
        }
    }

    /// The message length (the segments' total).
    pub fn total(&self) -> usize {
        self.len
    }
}

impl Dest for Scattered {
    fn depth(&self) -> usize {
        pieces(self.len, self.chunk)
    }
    fn slot(&mut self, k: usize, m: usize) -> *mut u8 {
        let (off, _) = piece(self.len, self.chunk, k);
        match seg_parts(&self.segs, off, m).as_slice() {
            [] => std::ptr::null_mut(),
            [(p, _)] => *p as *mut u8,
            _ => self.packed[k]
                .get_or_insert_with(|| Staging::take(m))
                .bytes_mut()
                .as_mut_ptr(),
        }
    }
    fn arrived(&mut self, k: usize, off: usize, m: usize) {
        let Some(b) = self.packed[k].take() else {
            return;
        };
        let mut at = 0;
        for (p, n) in seg_parts(&self.segs, off, m) {
            // SAFETY: the caller's segment, writable and exclusive to this receive
            // (`recvv_into`'s contract); `seg_parts` keeps within it.
            unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
                .copy_from_slice(&b.bytes()[at..at + n]);
            at += n;
        }
    }
    fn leak(&mut self) -> bool {
        false // the caller's memory takes some pieces
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
        let h = self.header_tag(faults::seq_of(tag));
        let waiting = "waited in vain for a message from";
        loop {
            // Every header is HEADER bytes, so its pre-posted receive cannot be truncated.
            let mut header = Box::new([0u64; 3]);
            let mut hreq = [self.irecv(header.as_mut_ptr() as *mut u8, HEADER, peer, h)?];
            let st = match self.poll(&mut hreq[0], tag, peer, deadline, waiting) {
                Ok(s) => s,
                Err(e) => {
                    let (_, live) = self.retire(&mut hreq);
                    self.give_up(live, header);
                    return Err(e);
                }
            };
            let got = count_of(&st);
            let [stamp, hlen, hchunk] = header.map(u64::from_le);
            if got == HEADER && stamp == tag && hlen == len as u64 && hchunk == chunk as u64 {
                return self.take_pieces(peer, tag, len, chunk, deadline, dest);
            }
            // Not the message this receive expects: no piece receive was posted, so its
            // pieces are still unmatched; throw them away (each received at its own size).
            let sent = match (usize::try_from(hlen), usize::try_from(hchunk)) {
                (Ok(l), Ok(c)) if got == HEADER && (1..=i32::MAX as usize).contains(&c) => {
                    pieces(l, c)
                }
                _ => 0,
            };
            // Pieces already posted by the sender are here at once; later ones the janitor takes.
            let until = Instant::now() + Duration::from_millis(200);
            self.drain(peer, h + 1, sent, until);
            if got == HEADER && faults::is_stale(stamp, tag) {
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
    ///
    /// Pieces are matched with `MPI_Improbe` and received with `MPI_Imrecv` into a slot of
    /// exactly the probed size, never with a receive posted before the size is known: a
    /// receive smaller than its message is an error that MPICH 4.0 raises on
    /// `MPI_COMM_WORLD`'s handler (fatal) whatever our communicator's handler, so it must
    /// never happen. A piece of the wrong size is taken into a scratch buffer and reported.
    /// Up to `dest.depth()` pieces are matched ahead, so large messages stay pipelined.
    fn take_pieces(
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
        let t = self.header_tag(faults::seq_of(tag)) + 1;
        let mut reqs: VecDeque<Req> = VecDeque::with_capacity(ahead);
        let mut matched = 0;
        for k in 0..n {
            let res = self.spin(
                tag,
                peer,
                deadline,
                "waited in vain for a message from",
                || {
                    while matched < n.min(k + ahead) {
                        let Some((msg, st)) = self.probe(peer as i32, t) else {
                            break;
                        };
                        let (_, m) = piece(len, chunk, matched);
                        let got = count_of(&st);
                        if got != m {
                            self.take_probed(msg, &st);
                            return Err(Error::remote(format!(
                                "rank {} expected piece {matched} of {m} bytes from rank {peer} \
                             but got {got}: do all ranks pass the same count and dtype?",
                                self.rank
                            )));
                        }
                        reqs.push_back(self.imrecv(msg, dest.slot(matched, m), m)?);
                        matched += 1;
                    }
                    let Some(r) = reqs.front_mut() else {
                        return Ok(None);
                    };
                    Ok(self.test_ok(r)?.then_some(()))
                },
            );
            if let Err(e) = res {
                let mut rs: Vec<Req> = reqs.into_iter().collect();
                self.retire_pieces(&mut rs, dest, peer);
                // The sender's pieces not matched yet are the janitor's.
                self.add_junk(faults::seq_of(tag));
                return Err(e);
            }
            reqs.pop_front();
            let (off, m) = piece(len, chunk, k);
            dest.arrived(k, off, m);
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
}
