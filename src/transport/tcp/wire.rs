//! The frames on a TCP connection, and reads and writes that never block for long.
//!
//! Every frame starts with a 24-byte header: a magic word, the frame's kind, the stamp and
//! the payload length. A data frame's payload is followed by an 8-byte trailer saying whether
//! the payload is the message ([`TRAILER_OK`]) or padding from a sender that gave the send
//! up half-way ([`TRAILER_ABANDONED`]): the receiver then fails (or drops the frame if it
//! is stale) instead of taking the padding as data. Control frames (notices, goodbye) have a
//! short payload and no trailer.
//!
//! Sockets run with short timeouts ([`IO_STEP`]), so every read and write returns at least
//! that often and the caller can look at the failure board in between ([`Got::Idle`]).

use crate::transport::faults;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Bytes of a frame header.
pub const HEADER: usize = 24;
/// Bytes of a data frame's trailer.
pub const TRAILER: usize = 8;
/// A data frame's trailer: the payload is the message.
pub const TRAILER_OK: u64 = 0x4b4f_4c43_4350_0001;
/// A data frame's trailer: the sender gave the message up; the payload is padding.
pub const TRAILER_ABANDONED: u64 = 0x4241_4c43_4350_0002;
/// The longest control payload a receiver accepts (a notice's reason).
pub const MAX_CONTROL: u64 = 64 * 1024;
/// Messages of at least this many bytes of a collective whose stamp asks for it
/// ([`faults::RENDEZVOUS`]: recursive doubling or halving over three nodes or more) wait for
/// the receiver's [`Kind::Ready`] before they leave (rendezvous); all others go at once
/// (eager: a blocking `send` never waits for its receive; a ring or a single exchange has
/// nothing to gain and would pay a round trip per message, and on two nodes BBR turned the
/// idle gap into 35 ms stalls, docs/CLUSTER.md).
/// The default of `PCCL_TCP_RENDEZVOUS`. Both ends of a link use the larger of their two
/// settings (exchanged when the mesh is built), and decide from the stamp and the length
/// alone ([`rendezvous`]), so they never disagree about a message that matches. One that
/// does not match (ranks that disagree) is let go as soon as the receiver says what it
/// waits for instead, and fails there as an eager one does.
///
/// Why: a sender that pushes a large message to a peer still busy receiving from someone
/// else shares that peer's link with the message it is waiting for, and slows the rank that
/// is late already. Recursive doubling meets this whenever its pairwise exchanges drift
/// apart (measured on the emulated cluster, docs/CLUSTER.md: 1.3–2.4x its NIC floor without,
/// about 1.05x with). The price is at most one one-way latency per large message, when the
/// receiver was not waiting yet anyway: worth it where a message takes many round trips to
/// cross its link, not where it takes a few (`PCCL_TCP_RENDEZVOUS` moves the threshold).
pub const RENDEZVOUS: usize = 64 * 1024;
/// Whether a message of `len` bytes stamped `tag` waits for its receiver, on a link whose
/// rendezvous starts at `from` bytes ([`RENDEZVOUS`]).
pub fn rendezvous(tag: u64, len: usize, from: usize) -> bool {
    len >= from && faults::is_rendezvous(tag)
}

/// The frame by which a receive says it waits for a message of `len` bytes stamped `tag`.
pub fn ready(tag: u64, len: usize) -> Vec<u8> {
    let mut v = Header {
        kind: Kind::Ready,
        tag,
        len: 8,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(&(len as u64).to_le_bytes());
    v
}

/// The socket timeout of every read and write: how often a blocked one looks up.
pub const IO_STEP: Duration = Duration::from_millis(10);

const MAGIC: u32 = 0x4c43_4350; // "PCCL"

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A message of a collective (`tag` its stamp), payload and trailer.
    Data,
    /// The sender refused collective `tag` (a sequence number); the payload says why.
    Refused,
    /// The sender aborted the communicator; the payload says why.
    Aborted,
    /// The sender destroyed its communicator: its connection closes next, normally.
    Goodbye,
    /// The sender waits for a message (stamp `tag`, its length in the payload) from this
    /// peer: a rendezvous message that matches may leave (see [`RENDEZVOUS`]).
    Ready,
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::Data => 1,
            Kind::Refused => 2,
            Kind::Aborted => 3,
            Kind::Goodbye => 4,
            Kind::Ready => 5,
        }
    }

    fn from_code(c: u32) -> Option<Kind> {
        Some(match c {
            1 => Kind::Data,
            2 => Kind::Refused,
            3 => Kind::Aborted,
            4 => Kind::Goodbye,
            5 => Kind::Ready,
            _ => return None,
        })
    }
}

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub kind: Kind,
    /// The stamp (data) or sequence number (refusal).
    pub tag: u64,
    /// Payload bytes.
    pub len: u64,
}

impl Header {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.kind.code().to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; `None` for bytes that are not one (a broken stream).
    pub fn decode(b: &[u8; HEADER]) -> Option<Header> {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        if word(0..4) as u32 != MAGIC {
            return None;
        }
        let kind = Kind::from_code(word(4..8) as u32)?;
        let (tag, len) = (word(8..16), word(16..24));
        if kind != Kind::Data && len > MAX_CONTROL {
            return None;
        }
        Some(Header { kind, tag, len })
    }
}

/// A whole control frame (header and payload) ready to write.
pub fn control(kind: Kind, tag: u64, why: &str) -> Vec<u8> {
    let why = &why.as_bytes()[..why.len().min(MAX_CONTROL as usize)];
    let mut v = Header {
        kind,
        tag,
        len: why.len() as u64,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(why);
    v
}

/// What one read or write step did.
pub enum Got {
    /// Moved this many bytes (more than zero).
    Bytes(usize),
    /// Nothing within [`IO_STEP`].
    Idle,
    /// The peer closed its side (reads only).
    Eof,
}

fn idle(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// One read into `bufs` (in order), waiting at most about [`IO_STEP`].
pub fn read_some(s: &mut TcpStream, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<Got> {
    loop {
        return match s.read_vectored(bufs) {
            Ok(0) => Ok(Got::Eof),
            Ok(n) => Ok(Got::Bytes(n)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if idle(&e) => Ok(Got::Idle),
            Err(e) => Err(e),
        };
    }
}

/// One write of `bufs` (in order), waiting at most about [`IO_STEP`].
pub fn write_some(s: &mut TcpStream, bufs: &[IoSlice<'_>]) -> std::io::Result<Got> {
    loop {
        return match s.write_vectored(bufs) {
            Ok(0) => Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "the connection accepts no more bytes",
            )),
            Ok(n) => Ok(Got::Bytes(n)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if idle(&e) => Ok(Got::Idle),
            Err(e) => Err(e),
        };
    }
}

/// The part of `a ++ b` from byte `done` on, as at most two slices.
pub fn rest<'a>(a: &'a mut [u8], b: &'a mut [u8], done: usize) -> [IoSliceMut<'a>; 2] {
    if done < a.len() {
        [IoSliceMut::new(&mut a[done..]), IoSliceMut::new(b)]
    } else {
        let k = (done - a.len()).min(b.len());
        [IoSliceMut::new(&mut b[k..]), IoSliceMut::new(&mut [])]
    }
}

/// The part of `segs[0] ++ segs[1] ++ … ++ tail` from byte `done` on, as slices (the
/// scattered form of [`rest`]; at most [`MAX_IOV`] of them, the rest left to the next read).
pub fn rest_segs<'a>(
    segs: &'a mut [&mut [u8]],
    tail: &'a mut [u8],
    done: usize,
) -> Vec<IoSliceMut<'a>> {
    let mut out = Vec::new();
    let mut skip = done;
    for s in segs.iter_mut() {
        if out.len() == MAX_IOV - 1 {
            return out;
        }
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        out.push(IoSliceMut::new(&mut s[skip..]));
        skip = 0;
    }
    let k = skip.min(tail.len());
    out.push(IoSliceMut::new(&mut tail[k..]));
    out
}

/// The most slices one scattered read is given (Linux's `IOV_MAX` is 1024).
pub const MAX_IOV: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(v: &[IoSliceMut<'_>]) -> Vec<usize> {
        v.iter().map(|s| s.len()).collect()
    }

    #[test]
    fn the_rest_of_scattered_segments_starts_at_the_byte_reached() {
        let (mut a, mut b, mut c, mut t) = (vec![0u8; 5], vec![0u8; 0], vec![0u8; 7], [0u8; 8]);
        let mut segs: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
        assert_eq!(lens(&rest_segs(&mut segs, &mut t, 0)), vec![5, 7, 8]);
        assert_eq!(lens(&rest_segs(&mut segs, &mut t, 3)), vec![2, 7, 8]);
        assert_eq!(lens(&rest_segs(&mut segs, &mut t, 5)), vec![7, 8]);
        assert_eq!(lens(&rest_segs(&mut segs, &mut t, 14)), vec![6]);
        assert_eq!(lens(&rest_segs(&mut segs, &mut t, 20)), vec![0]);
        // More segments than one read takes: the first MAX_IOV - 1, the rest next time.
        let mut many: Vec<Vec<u8>> = (0..100).map(|_| vec![0u8; 2]).collect();
        let mut refs: Vec<&mut [u8]> = many.iter_mut().map(|v| v.as_mut_slice()).collect();
        assert_eq!(rest_segs(&mut refs, &mut t, 0).len(), MAX_IOV - 1);
        assert_eq!(lens(&rest_segs(&mut refs, &mut t, 198)), vec![2, 8]);
    }
}
