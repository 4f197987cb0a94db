//! Transports move bytes between the ranks of a communicator. They know nothing of plans.
//!
//! The contract is point-to-point and ordered: messages between one pair of ranks arrive in
//! the order they were posted, and a receive names the exact length it expects (a mismatch is
//! an error naming both ranks, which catches ranks that disagree on counts).

pub mod faults;
mod gate;
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
