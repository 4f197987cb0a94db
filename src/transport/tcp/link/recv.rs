//! The receive of one message on a link, over the socket or the shared-memory ring: stale
//! messages dropped, a later collective's left for its call, a payload read into its target
//! with the board checked while it waits.

use super::super::wire::{self, TRAILER, TRAILER_OK};
use super::{deliver, lock, scatter_at, superseded, Inbox, Link, Pace, Stop, Target, WakeMonitor};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::shm::{Patience, Ring, ABANDONED, NAP};
use std::time::Instant;

impl Link {
    /// Reads a data frame's payload of `len` bytes into `target`, then its trailer, which it
    /// returns. Interrupted (by `idle`), the rest of the frame is left to skip.
    fn payload(
        &self,
        ib: &mut Inbox,
        len: usize,
        target: Target<'_>,
        idle: &mut dyn FnMut() -> Result<()>,
    ) -> std::result::Result<u64, Stop> {
        let total = len + TRAILER;
        let mut trailer = [0u8; TRAILER];
        let mut done = 0;
        let mut pace = Pace::new();
        // On an interruption, the rest of the frame is discarded by the next reader.
        let interrupted = |ib: &mut Inbox, done: usize, e: Stop| {
            ib.skip = (total - done) as u64;
            e
        };
        // Straight into the caller's memory: one read over the segments' rest and the trailer.
        let mut direct = |ib: &mut Inbox, segs: &mut [&mut [u8]], trailer: &mut [u8]| {
            while done < total {
                // One segment (most receives) needs no list of slices built per read.
                let got = match segs {
                    [one] => self.read(
                        &mut ib.s,
                        &mut ib.closed,
                        &mut wire::rest(one, trailer, done),
                    ),
                    _ => self.read(
                        &mut ib.s,
                        &mut ib.closed,
                        &mut wire::rest_segs(segs, trailer, done),
                    ),
                };
                match got {
                    Ok(Some(k)) if !pace.due() => done += k,
                    Ok(Some(k)) => {
                        done += k;
                        if let Err(e) = idle() {
                            return Err(interrupted(ib, done, e.into()));
                        }
                    }
                    Ok(None) => {
                        if let Err(e) = idle() {
                            return Err(interrupted(ib, done, e.into()));
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        match target {
            Target::Into(dst) => direct(ib, &mut [dst], &mut trailer)?,
            Target::Scatter(segs) => direct(ib, segs, &mut trailer)?,
            Target::Sink(sink, chunk) => {
                let chunk = chunk.clamp(4096, len.max(4096));
                let mut buf = std::mem::take(&mut ib.scratch);
                let words = chunk.min(len).div_ceil(8).max(1);
                if buf.len() < words {
                    buf.resize(words, 0);
                }
                let r = (|| {
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
                    let mut off = 0;
                    loop {
                        let n = chunk.min(len - off);
                        let last = off + n == len;
                        let mut got = 0;
                        let want = n + if last { TRAILER } else { 0 };
                        while got < want {
                            let tail: &mut [u8] = if last { &mut trailer } else { &mut [] };
                            let rest = &mut wire::rest(&mut bytes[..n], tail, got);
                            match self.read(&mut ib.s, &mut ib.closed, rest) {
                                Ok(Some(k)) if !pace.due() => got += k,
                                Ok(Some(k)) => {
                                    got += k;
                                    if let Err(e) = idle() {
                                        return Err(interrupted(ib, off + got, e.into()));
                                    }
                                }
                                Ok(None) => {
                                    if let Err(e) = idle() {
                                        return Err(interrupted(ib, off + got, e.into()));
                                    }
                                }
                                Err(e) => return Err(e),
                            }
                        }
                        if n > 0 {
                            sink(off, &bytes[..n]);
                        }
                        off += n;
                        if last {
                            return Ok(());
                        }
                    }
                })();
                ib.scratch = buf;
                r?;
            }
        }
        Ok(u64::from_le_bytes(trailer))
    }

    // ---- receives ----------------------------------------------------------------------

    /// Receives the next message of collective `tag` (exactly `len` bytes) into `target`:
    /// drops stale messages, leaves a later collective's message for its call, and ends
    /// with the board's error, the deadline, or the peer's death.
    pub(in crate::transport::tcp) fn recv(
        &self,
        tag: Tag,
        len: usize,
        deadline: Instant,
        target: Target<'_>,
    ) -> Result<()> {
        self.touch();
        let since = Instant::now();
        // A receive without rendezvous that waits long tells the peer what it waits for
        // anyway: a peer holding a large message for it (ranks that disagree about the
        // length) lets it go, so the disagreement fails here at once, not at the deadline.
        let mut said = wire::rendezvous(tag, len, self.rendezvous)
            || faults::is_p2p(tag)
            || faults::is_control(tag)
            || self.ring_in.is_some();
        let mut idle = || -> Result<()> {
            self.faults.check(tag, self.peer)?;
            if !said && since.elapsed() >= faults::POLL {
                said = true;
                self.send_control(wire::ready(tag, len));
            }
            if Instant::now() >= deadline {
                return Err(faults::timed_out(
                    self.rank,
                    self.peer,
                    "waited in vain for a message from",
                    true,
                ));
            }
            Ok(())
        };
        if self.silenced() {
            // Across a partition nothing arrives: the wait ends with the board or the
            // deadline, as a real partition's does.
            loop {
                idle()?;
                self.faults.nap(faults::POLL);
            }
        }
        if let Some(ring) = &self.ring_in {
            let _one = lock(&self.ring_rx);
            return self.recv_ring(ring, tag, len, deadline, target, &mut idle);
        }
        if wire::rendezvous(tag, len, self.rendezvous) && !self.take_announced(tag, len) {
            // The sender holds a large message until this receive is under way.
            self.send_control(wire::ready(tag, len));
        }
        // Declared before the inbox guard, so it runs after the guard is dropped.
        let _wake = WakeMonitor(self);
        let mut ib = lock(&self.inbox);
        let stop = |s: Stop| match s {
            Stop::Fail(e) => e,
            Stop::Closed => self.closed_error(tag),
        };
        loop {
            // Frames read ahead come first: they are next in the stream.
            if let Some(e) = ib.early.pop_front() {
                ib.early_bytes -= e.head.len as usize;
                if superseded(e.head.tag, tag) {
                    continue;
                }
                if e.head.tag != tag || e.head.len != len as u64 {
                    let (got, got_len) = (e.head.tag, e.head.len);
                    ib.early_bytes += e.head.len as usize;
                    ib.early.push_front(e);
                    drop(ib);
                    self.faults.explain(tag, got, self.peer, deadline)?;
                    return Err(self.wrong_message(tag, len, got, got_len));
                }
                if e.trailer() != TRAILER_OK {
                    return Err(self.abandoned(tag));
                }
                deliver(target, e.payload());
                self.read_ahead(&mut ib);
                return Ok(());
            }
            if ib.filling.is_some() {
                self.fill(&mut ib, &mut idle).map_err(stop)?;
                continue;
            }
            let h = self.next(&mut ib, &mut idle).map_err(stop)?;
            if superseded(h.tag, tag) {
                ib.skip = h.len + TRAILER as u64;
                continue;
            }
            if h.tag != tag || h.len != len as u64 {
                ib.pending = Some(h);
                drop(ib);
                self.faults.explain(tag, h.tag, self.peer, deadline)?;
                return Err(self.wrong_message(tag, len, h.tag, h.len));
            }
            let trailer = self
                .payload(&mut ib, len, target, &mut idle)
                .map_err(stop)?;
            if trailer != TRAILER_OK {
                return Err(self.abandoned(tag));
            }
            // What follows the message (often the peer's "ready" for this rank's next
            // send) is handled now rather than by the monitor after a wake-up.
            self.read_ahead(&mut ib);
            return Ok(());
        }
    }

    fn abandoned(&self, tag: Tag) -> Error {
        if let Err(e) = self.faults.check(tag, self.peer) {
            return e;
        }
        Error::remote(format!(
            "rank {} gave up its message of collective #{} to rank {} half-way (its collective \
             failed)",
            self.peer,
            faults::seq_of(tag),
            self.rank
        ))
    }

    fn wrong_message(&self, tag: Tag, len: usize, got: Tag, got_len: u64) -> Error {
        if got != tag {
            return faults::mismatch(self.rank, self.peer, tag, got);
        }
        Error::remote(format!(
            "rank {} expected {len} bytes from rank {} but it sent {got_len}: do all ranks pass \
             the same count and dtype?",
            self.rank, self.peer
        ))
    }

    /// The shared-memory form of [`Link::recv`].
    fn recv_ring(
        &self,
        ring: &Ring,
        tag: Tag,
        len: usize,
        deadline: Instant,
        mut target: Target<'_>,
        idle: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let mut off = 0u64;
        let mut started = false;
        loop {
            let h = self.wait_slot(ring, tag, idle)?;
            if !started {
                // Leftovers of a message given up half-way, and stale messages, go.
                if h.off != 0 || h.flags & ABANDONED != 0 || superseded(h.tag, tag) {
                    ring.skip();
                    continue;
                }
                if h.tag != tag || h.len != len as u64 {
                    self.faults.explain(tag, h.tag, self.peer, deadline)?;
                    return Err(self.wrong_message(tag, len, h.tag, h.len));
                }
                started = true;
            } else if h.tag != tag || h.off != off {
                // The message ended early without a mark: the producer's side is broken.
                self.faults.check(tag, self.peer)?;
                return Err(self.abandoned(tag));
            }
            if h.flags & ABANDONED != 0 {
                ring.skip();
                return Err(self.abandoned(tag));
            }
            let at = off as usize;
            ring.take(&h, |bytes| match &mut target {
                Target::Into(dst) => {
                    if let Some(d) = dst.get_mut(at..at + bytes.len()) {
                        d.copy_from_slice(bytes);
                    }
                }
                Target::Scatter(segs) => scatter_at(segs, at, bytes),
                Target::Sink(sink, _) => {
                    if !bytes.is_empty() {
                        sink(at, bytes)
                    }
                }
            });
            off += h.n;
            if off >= len as u64 {
                return Ok(());
            }
        }
    }

    /// Waits for the next published slot of the inbound ring: spins briefly, then sleeps on
    /// the ring (woken by the producer's publish), looking at the board, the peer's state
    /// and the deadline (`idle`) at least every [`NAP`].
    fn wait_slot(
        &self,
        ring: &Ring,
        tag: Tag,
        idle: &mut dyn FnMut() -> Result<()>,
    ) -> Result<crate::transport::shm::SlotHead> {
        let mut patience = Patience::default();
        loop {
            if let Some(h) = ring.peek() {
                return Ok(h);
            }
            if self.faults.any() {
                self.faults.check(tag, self.peer)?;
            }
            if patience.busy() {
                continue;
            }
            if ring.is_closed() {
                self.on_failure("it cut its shared-memory ring");
                return Err(self.closed_error(tag));
            }
            if self.left() || self.broken() {
                // What the peer published before it left comes first.
                if let Some(h) = ring.peek() {
                    return Ok(h);
                }
                return Err(self.closed_error(tag));
            }
            idle()?;
            ring.wait_published(NAP);
        }
    }
}
