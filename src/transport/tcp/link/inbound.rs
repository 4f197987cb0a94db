//! The inbound stream of a link: frames read from the socket (control frames handled on the
//! way), small frames read ahead whole by the monitor, and one read step with its patience.

use super::super::wire::{self, Got, Header, Kind, HEADER, TRAILER};
use super::{Early, Inbox, Link, Pace, Stop, CONTROL_PATIENCE, EARLY_CAP, EARLY_MAX};
use crate::error::{Error, Result};
use std::io::IoSliceMut;
use std::net::TcpStream;
use std::time::Instant;

impl Link {
    // ---- the inbound stream ------------------------------------------------------------
    //
    // `idle` (the board and the deadline) is called whenever a read step brings nothing, and
    // also at least every `faults::POLL` while bytes keep trickling in: a link slowed to a
    // crawl (a few bytes per step) must not outlive the collective's deadline.

    /// The next data frame's header; control frames met on the way are handled. `idle` is
    /// called whenever nothing arrived for a step; its error ends the read (the position
    /// in the stream is kept).
    pub(in crate::transport::tcp) fn next(
        &self,
        ib: &mut Inbox,
        idle: &mut dyn FnMut() -> Result<()>,
    ) -> std::result::Result<Header, Stop> {
        let mut pace = Pace::new();
        let wait = !ib.peek;
        loop {
            if let Some(h) = ib.pending.take() {
                return Ok(h);
            }
            if ib.closed {
                return Err(Stop::Closed);
            }
            while ib.skip > 0 {
                let n = ib.skip.min(256 * 1024) as usize;
                let words = n.div_ceil(8);
                if ib.scratch.len() < words {
                    ib.scratch.resize(words, 0);
                }
                let Inbox {
                    s, scratch, closed, ..
                } = &mut *ib;
                let buf = &mut bytemuck::cast_slice_mut::<u64, u8>(scratch)[..n];
                match self.read_if(wait, s, closed, &mut [IoSliceMut::new(buf)])? {
                    Some(k) => {
                        ib.skip -= k as u64;
                        // Only while bytes are still owed: a reader (the monitor) that
                        // stopped with the socket drained but input in hand would not be
                        // woken by poll(2) again.
                        if ib.skip > 0 && pace.due() {
                            idle()?
                        }
                    }
                    None => idle()?,
                }
            }
            let mut started = None;
            while ib.got < HEADER {
                let Inbox {
                    s,
                    head,
                    got,
                    closed,
                    ..
                } = &mut *ib;
                match self.read_if(wait, s, closed, &mut [IoSliceMut::new(&mut head[*got..])])? {
                    Some(k) => {
                        ib.got += k;
                        // A whole header is handled at once (see above): left in `head`,
                        // a notice would wait for the next receive from this peer.
                        if ib.got < HEADER && pace.due() {
                            idle()?
                        }
                    }
                    None if ib.got > 0 => {
                        // A header that started arriving finishes soon, or the link is broken.
                        let t = *started.get_or_insert_with(Instant::now);
                        if t.elapsed() > CONTROL_PATIENCE {
                            return Err(self.broken_stream(ib, "it stopped in a frame header"));
                        }
                        idle()?
                    }
                    None => idle()?,
                }
            }
            ib.got = 0;
            let Some(h) = Header::decode(&ib.head) else {
                return Err(self.broken_stream(ib, "it sent bytes that are not PCCL frames"));
            };
            if h.kind == Kind::Data {
                return Ok(h);
            }
            let mut payload = vec![0u8; h.len as usize];
            let mut done = 0;
            let give_up = Instant::now() + CONTROL_PATIENCE;
            while done < payload.len() {
                match self.read(
                    &mut ib.s,
                    &mut ib.closed,
                    &mut [IoSliceMut::new(&mut payload[done..])],
                )? {
                    Some(k) => done += k,
                    None if Instant::now() > give_up => {
                        return Err(self.broken_stream(ib, "it stopped in a control frame"));
                    }
                    None => {}
                }
            }
            self.on_control(&h, &payload);
        }
    }

    /// Reads the rest of the small frame being read ahead (`ib.filling`); once whole it
    /// joins `ib.early`. Interrupted by `idle`, it stays where it got to.
    pub(super) fn fill(
        &self,
        ib: &mut Inbox,
        idle: &mut dyn FnMut() -> Result<()>,
    ) -> std::result::Result<(), Stop> {
        let mut pace = Pace::new();
        let wait = !ib.peek;
        let Inbox {
            s,
            closed,
            filling,
            early,
            ..
        } = ib;
        let Some(e) = filling.as_mut() else {
            return Ok(());
        };
        while !e.complete() {
            let n = e.head.len as usize + TRAILER;
            let buf = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut e.words)[e.got..n];
            match self.read_if(wait, s, closed, &mut [IoSliceMut::new(buf)])? {
                Some(k) => {
                    e.got += k;
                    if !e.complete() && pace.due() {
                        idle()?
                    }
                }
                None => idle()?,
            }
        }
        early.extend(filling.take());
        Ok(())
    }

    /// Whether the socket has bytes to read now.
    fn readable(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd record for the duration of the call; the descriptor
        // belongs to the socket this link keeps open.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    /// What the monitor does with a socket that has bytes and no reader: handles control
    /// frames and reads small data frames whole into `early` until nothing more is there,
    /// and stops at a large frame's header (kept as `pending`, its payload left in the
    /// socket for its receive, which is under way: a large frame follows this rank's
    /// "ready").
    pub(in crate::transport::tcp) fn read_ahead(&self, ib: &mut Inbox) {
        ib.peek = true;
        self.read_ahead_now(ib);
        ib.peek = false;
    }

    fn read_ahead_now(&self, ib: &mut Inbox) {
        let mut not_now = || Err(Error::internal("nothing more to read now"));
        // Never waits for bytes: a read would hold the inbox (and the receive that wants it)
        // for a whole socket step.
        while ib.pending.is_none() && self.readable() {
            if self.fill(ib, &mut not_now).is_err() {
                return;
            }
            let Ok(h) = self.next(ib, &mut not_now) else {
                return;
            };
            if h.len < EARLY_MAX && ib.early_bytes + h.len as usize <= EARLY_CAP {
                ib.early_bytes += h.len as usize;
                ib.filling = Some(Early::new(h));
            } else {
                ib.pending = Some(h);
            }
        }
    }

    fn broken_stream(&self, ib: &mut Inbox, what: &str) -> Stop {
        ib.closed = true;
        self.on_failure(what);
        Stop::Closed
    }

    /// [`Self::read`], or nothing at once when `wait` is false and no byte is there.
    fn read_if(
        &self,
        wait: bool,
        s: &mut TcpStream,
        closed: &mut bool,
        bufs: &mut [IoSliceMut<'_>],
    ) -> std::result::Result<Option<usize>, Stop> {
        if !wait && !self.readable() {
            return Ok(None);
        }
        self.read(s, closed, bufs)
    }

    /// One read step from `s`: `Some(bytes)` or `None` when nothing came; EOF and errors
    /// set `closed` (and record the peer's death unless it said goodbye).
    pub(super) fn read(
        &self,
        s: &mut TcpStream,
        closed: &mut bool,
        bufs: &mut [IoSliceMut<'_>],
    ) -> std::result::Result<Option<usize>, Stop> {
        match wire::read_some(s, bufs) {
            Ok(Got::Bytes(n)) => {
                let one: libc::c_int = 1;
                // SAFETY: sets an int socket option from a valid local on our socket.
                unsafe {
                    libc::setsockopt(
                        self.fd,
                        libc::IPPROTO_TCP,
                        libc::TCP_QUICKACK,
                        (&one as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                Ok(Some(n))
            }
            Ok(Got::Idle) => Ok(None),
            Ok(Got::Eof) => {
                *closed = true;
                self.on_eof();
                Err(Stop::Closed)
            }
            Err(e) => {
                *closed = true;
                self.on_failure(&e.to_string());
                Err(Stop::Closed)
            }
        }
    }
}
