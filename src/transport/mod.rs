//! Transports move bytes between the ranks of a communicator. They know nothing of plans.
//!
//! The contract is point-to-point and ordered: messages between one pair of ranks arrive in
//! the order they were posted, and a receive names the exact length it expects (a mismatch is
//! an error naming both ranks, which catches ranks that disagree on counts).

pub mod diagnose;
pub mod faults;
mod gate;
pub mod launch;
mod mesh;
mod rendezvous;
mod secret;
pub mod select;
pub mod shm;
pub mod staging;
pub mod tcp;
pub mod threads;

#[cfg(feature = "mpi")]
pub mod mpi;

#[cfg(feature = "ofi")]
pub mod ofi;

use crate::error::{Error, Result};
pub use faults::{Faults, Tag};
use staging::Staging;
use std::sync::Arc;
use std::time::Instant;

/// What a rank tells every peer when its collectives cannot go on as planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// This rank refused (or abandoned) collective `seq`: every rank fails it.
    Refused {
        /// The collective's sequence number.
        seq: u32,
        /// Why, for the peers' error messages.
        why: String,
    },
    /// This rank aborted the communicator: every later call fails everywhere.
    Aborted {
        /// Why, for the peers' error messages.
        why: String,
    },
}

/// A posted send.
pub trait SendOp: Send {
    /// Blocks until the data has been handed over (the buffer may then be reused), or the
    /// deadline passes.
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()>;
}

/// Point-to-point transport among the ranks of one communicator.
pub trait Transport: Send + Sync {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Short name (`threads`, `mpi`).
    fn name(&self) -> &'static str;
    /// A key equal on ranks that share a node (host), used to build the topology.
    fn node_key(&self) -> u64;

    /// This communicator's record of failures, which every wait of the transport checks
    /// ([`Faults::check`]) and which the transport fills from what it detects (a peer's
    /// notice, a closed connection, a vanished process).
    fn faults(&self) -> &Faults;

    /// Delivers `notice` to every peer (best effort, without blocking on any of them); the
    /// peers record it on their boards. The caller has recorded it on its own board.
    fn notify(&self, notice: &Notice);

    /// Gives up collective `tag` on this rank because of `why`: recorded here and sent to
    /// every peer (once per collective), so every rank's waits for it end.
    fn abandon(&self, tag: Tag, why: &str) {
        let seq = faults::seq_of(tag);
        if !faults::is_control(tag)
            && !faults::is_p2p(tag)
            && self.faults().refuse(seq, self.rank(), why)
        {
            self.notify(&Notice::Refused {
                seq,
                why: why.to_string(),
            });
        }
    }

    /// Aborts the communicator: every wait on this rank ends with an invalid-usage error, and
    /// the peers are told (their waits end with a remote error naming this rank).
    fn abort(&self, why: &str) {
        if self.faults().aborted().is_none() {
            self.faults().abort(why);
            self.notify(&Notice::Aborted {
                why: why.to_string(),
            });
        }
    }

    /// Fault injection (`PCCL_FAULT` kind `kill`): this rank dies as its process would. The
    /// default ends the process at once (no exit handlers); thread-ranks mark only themselves.
    fn kill_self(&self) {
        std::process::abort();
    }

    /// Fault injection (`PCCL_FAULT` kind `drop`): every link of this rank fails (as a cut
    /// cable would), without the process ending. Transports that cannot do it say so.
    fn drop_links(&self) -> Result<()> {
        Err(Error::usage(format!(
            "the {} transport cannot drop its links (fault injection kind `drop`)",
            self.name()
        )))
    }

    /// Fault injection (`PCCL_FAULT` kind `isolate`): a partition. From now on every message
    /// between this rank and a rank not on `side` (whose ranks are `members`, this one
    /// included) is lost without anybody being told; ranks isolated on the same `side` still
    /// reach each other. Transports that cannot do it say so (a real partition is made by the
    /// network: `scripts/cluster.sh partition`).
    fn isolate(&self, side: u32, members: &[usize]) -> Result<()> {
        let _ = (side, members);
        Err(Error::usage(format!(
            "the {} transport cannot isolate a rank (fault injection kind `isolate`; \
             thread-ranks and TCP only)",
            self.name()
        )))
    }

    /// Posts a send of `len` bytes at `ptr` to `peer`.
    ///
    /// # Safety
    /// The `len` bytes at `ptr` must stay valid and unmodified until the returned op's
    /// `wait` has returned (successfully or not).
    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>>;

    /// Receives the next message from `peer`, which must be exactly `len` bytes, handing it to
    /// `sink` as consecutive `(offset, bytes)` pieces in order.
    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()>;

    /// Receives the next message from `peer` straight into `dst` (exactly `dst.len()` bytes).
    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        let len = dst.len();
        self.recv(peer, tag, len, deadline, &mut |off, b| {
            dst[off..off + b.len()].copy_from_slice(b)
        })
    }

    /// [`Transport::isend`] with the message cut in pieces of `piece` bytes (the tuner's
    /// per-call choice) instead of the transport's creation-time `PCCL_CHUNK_SIZE`; `None`
    /// keeps that one. Where the wire format depends on the cut (MPI: the receiver refuses a
    /// header with another piece size) the receiver must pass the same `piece` to
    /// [`Transport::recv_pieces`]. Transports that do not cut messages on the send side
    /// (threads, TCP: one self-describing frame) or negotiate one size at creation (ofi)
    /// ignore it.
    ///
    /// # Safety
    /// As for [`Transport::isend`].
    unsafe fn isend_pieces(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        let _ = piece;
        // SAFETY: forwarded from the caller.
        unsafe { self.isend(peer, tag, ptr, len) }
    }

    /// Says ahead that a receive of `len` bytes stamped `tag` from `peer` follows in this
    /// phase (a transport with rendezvous tells the peer it may send). A hint: nothing
    /// changes for a transport without one.
    fn expect(&self, peer: usize, tag: Tag, len: usize) {
        let _ = (peer, tag, len);
    }

    /// [`Transport::recv`] with the message handed to `sink` in pieces of `piece` bytes
    /// (`None`: the creation-time size); see [`Transport::isend_pieces`].
    fn recv_pieces(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        piece: Option<usize>,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let _ = piece;
        self.recv(peer, tag, len, deadline, sink)
    }

    /// [`Transport::recv_into`] for a message sent with [`Transport::isend_pieces`] and the
    /// same `piece`.
    fn recv_into_pieces(
        &self,
        peer: usize,
        tag: Tag,
        dst: &mut [u8],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let _ = piece;
        self.recv_into(peer, tag, dst, deadline)
    }

    /// Posts one message made of the byte segments `segs` laid end to end (a strided block
    /// list), cut in pieces as [`Transport::isend_pieces`] cuts a contiguous one.
    ///
    /// **Wire contract:** a vectored message is byte for byte the message
    /// [`Transport::isend_pieces`] would send for the segments packed into one buffer, so a
    /// vectored send may be received with [`Transport::recv_pieces`] /
    /// [`Transport::recv_into_pieces`] and a contiguous send with [`Transport::recvv_into`].
    /// Zero-length segments are allowed and carry nothing.
    ///
    /// The default packs the segments into a reused staging buffer (held by the returned op)
    /// and sends that; threads override it (the receiver copies out of the segments) and MPI
    /// (pieces within one segment go as they are, only pieces over several are packed).
    ///
    /// # Safety
    /// Every `(ptr, len)` of `segs` must address `len` readable host bytes (a null `ptr` only
    /// with `len == 0`) that stay valid and unmodified until the returned op's `wait` has
    /// returned (successfully or not); segments may lie in different allocations.
    unsafe fn isendv(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller.
        unsafe { packed_isendv(self, peer, tag, segs, piece) }
    }

    /// Receives the next message from `peer` (exactly the segments' total length, sent with
    /// [`Transport::isendv`] or as one contiguous buffer with the same `piece`) scattered
    /// into the byte segments `segs` in order. See [`Transport::isendv`] for the wire contract.
    ///
    /// The default scatters each received piece into the segments (one copy out of the
    /// transport's pieces).
    ///
    /// # Safety
    /// Every `(ptr, len)` of `segs` must address `len` writable host bytes (a null `ptr` only
    /// with `len == 0`) that nothing else reads or writes during the call; segments must not
    /// overlap.
    unsafe fn recvv_into(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*mut u8, usize)],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let (starts, len) = seg_starts(segs);
        self.recv_pieces(peer, tag, len, piece, deadline, &mut |off, bytes| {
            scatter(segs, &starts, off, bytes)
        })
    }

    /// Whether [`Transport::isend_device`] and [`Transport::recv_device`] work: the transport
    /// reads and writes GPU memory itself (CUDA-aware MPI, thread-ranks in device mode), so
    /// device collectives can skip pinned host staging. Sub-communicators ([`Transport::subset`])
    /// keep the capability.
    fn moves_device_memory(&self) -> bool {
        false
    }

    /// Posts a send of `len` bytes of device memory at device address `ptr` to `peer` (the
    /// receiver takes it with [`Transport::recv_device`]). Only transports whose
    /// [`Transport::moves_device_memory`] is true implement it; the others return an
    /// invalid-usage error.
    ///
    /// # Safety
    /// `ptr` must address `len` bytes of device memory (unified addressing, a context of its
    /// device current on this thread) holding the message: every device work that writes them
    /// must have completed, and they must stay valid and unmodified until the returned op's
    /// `wait` has returned (successfully or not).
    unsafe fn isend_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        let _ = (peer, tag, ptr, len);
        Err(Error::usage(format!(
            "the {} transport cannot move device memory: device collectives on it go through \
             pinned host staging",
            self.name()
        )))
    }

    /// Receives the next message from `peer`, which must be exactly `len` bytes, straight into
    /// device memory at device address `ptr`; returns once the bytes are there. Only
    /// transports whose [`Transport::moves_device_memory`] is true implement it; the others
    /// return an invalid-usage error.
    ///
    /// # Safety
    /// `ptr` must address `len` writable bytes of device memory (unified addressing, a context
    /// of its device current on this thread) that no device work reads or writes until this
    /// call has returned.
    unsafe fn recv_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<()> {
        let _ = (peer, tag, ptr, len, deadline);
        Err(Error::usage(format!(
            "the {} transport cannot move device memory: device collectives on it go through \
             pinned host staging",
            self.name()
        )))
    }

    /// The transport of a sub-communicator made of `members` (ranks of this transport, in
    /// the new rank order; this rank among them). `ctx` is a key every member computed the
    /// same way and no other live sub-communicator of the same parent shares.
    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>>;
}

/// [`Transport::isendv`]'s default: the segments packed into a reused staging buffer (held
/// by the returned op), sent as one contiguous message.
///
/// # Safety
/// As [`Transport::isendv`].
pub(crate) unsafe fn packed_isendv<T: Transport + ?Sized>(
    tr: &T,
    peer: usize,
    tag: Tag,
    segs: &[(*const u8, usize)],
    piece: Option<usize>,
) -> Result<Box<dyn SendOp>> {
    let len: usize = segs.iter().map(|s| s.1).sum();
    let mut packed = Staging::take(len);
    let dst = packed.bytes_mut();
    let mut at = 0;
    for &(p, n) in segs.iter().filter(|s| s.1 > 0) {
        // SAFETY: the caller guarantees `n` readable bytes at `p`.
        dst[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        at += n;
    }
    let ptr = dst.as_ptr();
    // SAFETY: `packed` moves into the returned op (its heap block never moves) and is
    // released only after the inner op, which is waited for (or dropped) first.
    let op = unsafe { tr.isend_pieces(peer, tag, ptr, len, piece) }?;
    Ok(Box::new(PackedSend { op, _buf: packed }))
}

/// A send through a packed staging buffer ([`Transport::isendv`]'s default): the buffer is
/// released after the inner op (field order: `op` drops first).
struct PackedSend {
    op: Box<dyn SendOp>,
    _buf: Staging,
}

impl SendOp for PackedSend {
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()> {
        let PackedSend { op, _buf } = *self;
        op.wait(deadline)
    }
}

/// The parts of `segs` (`(address, length)`, laid end to end) covering message bytes
/// `off..off + m`; zero-length parts are left out. Addresses are plain numbers here.
#[cfg(any(feature = "mpi", feature = "ofi"))]
pub(crate) fn seg_parts(segs: &[(usize, usize)], off: usize, m: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (lo, hi) = (off, off + m);
    let mut pos = 0;
    for &(p, n) in segs {
        let (a, b) = (pos.max(lo), (pos + n).min(hi));
        if a < b {
            out.push((p.wrapping_add(a - pos), b - a));
        }
        pos += n;
        if pos >= hi {
            break;
        }
    }
    out
}

/// Copies the parts `parts` (from [`seg_parts`]) of a message's segments, in order, to the
/// front of `dst`; returns the bytes copied (a piece over several segments, packed).
///
/// # Safety
/// Every part must address readable bytes of the caller's segments ([`Transport::isendv`]'s
/// contract), and their total must fit in `dst`.
#[cfg(any(feature = "mpi", feature = "ofi"))]
pub(crate) unsafe fn pack_parts(parts: &[(usize, usize)], dst: &mut [u8]) -> usize {
    let mut at = 0;
    for &(q, n) in parts {
        // SAFETY: per this function's contract.
        dst[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(q as *const u8, n) });
        at += n;
    }
    at
}

/// Each segment's first message byte, and the message length, of segments laid end to end.
pub(crate) fn seg_starts(segs: &[(*mut u8, usize)]) -> (Vec<usize>, usize) {
    let mut starts = Vec::with_capacity(segs.len());
    let mut pos = 0;
    for s in segs {
        starts.push(pos);
        pos += s.1;
    }
    (starts, pos)
}

/// Copies `bytes` (message bytes `off..off + bytes.len()`) into the parts of `segs` they
/// cover; `starts[i]` is segment `i`'s first message byte.
pub(crate) fn scatter(segs: &[(*mut u8, usize)], starts: &[usize], off: usize, bytes: &[u8]) {
    let end = off + bytes.len();
    let first = starts.partition_point(|&s| s <= off).saturating_sub(1);
    for (i, &(p, n)) in segs.iter().enumerate().skip(first) {
        let (s0, s1) = (starts[i], starts[i] + n);
        if s0 >= end {
            break;
        }
        let (lo, hi) = (off.max(s0), end.min(s1));
        if lo < hi {
            // SAFETY: `recvv_into`'s caller guarantees `n` writable bytes at `p`, and
            // `lo - s0 .. hi - s0` lies within them.
            unsafe { std::slice::from_raw_parts_mut(p.add(lo - s0), hi - lo) }
                .copy_from_slice(&bytes[lo - off..hi - off]);
        }
    }
}

/// A 64-bit FNV-1a hash, used for host-name node keys and sub-communicator contexts.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// This host's name, for node grouping.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
