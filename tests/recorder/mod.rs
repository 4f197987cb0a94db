//! A transport wrapper for tests: records what the executors ask of the transport (every
//! send's length and piece size, every receive's length, piece size and the pieces it handed
//! over) and forwards everything to the wrapped transport.

#![allow(dead_code)] // each test binary uses part of it

use pccl::transport::{Faults, Notice, SendOp, Tag, Transport};
use pccl::Result;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One send as the recorder saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub len: usize,
    /// The piece size the executor asked for (`None`: the transport's creation-time size).
    pub piece: Option<usize>,
}

/// One receive as the recorder saw it.
#[derive(Clone, Copy, Debug)]
pub struct Recv {
    pub len: usize,
    pub piece: Option<usize>,
    /// Pieces the transport handed to the sink (`None`: received straight into memory).
    pub handed: Option<usize>,
}

/// Records and forwards; see the module docs.
pub struct Recorder {
    inner: Arc<dyn Transport>,
    sends: Mutex<Vec<Sent>>,
    recvs: Mutex<Vec<Recv>>,
}

impl Recorder {
    /// Wraps `inner`, nothing recorded yet.
    pub fn new(inner: Arc<dyn Transport>) -> Arc<Self> {
        Arc::new(Recorder {
            inner,
            sends: Mutex::new(Vec::new()),
            recvs: Mutex::new(Vec::new()),
        })
    }

    /// The sends recorded since the last call (and forgets them).
    pub fn take_sends(&self) -> Vec<Sent> {
        std::mem::take(&mut *self.sends.lock().unwrap())
    }

    /// The receives recorded since the last call (and forgets them).
    pub fn take_recvs(&self) -> Vec<Recv> {
        std::mem::take(&mut *self.recvs.lock().unwrap())
    }
}

impl Transport for Recorder {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn node_key(&self) -> u64 {
        self.inner.node_key()
    }
    fn faults(&self) -> &Faults {
        self.inner.faults()
    }
    fn notify(&self, notice: &Notice) {
        self.inner.notify(notice)
    }
    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.isend_pieces(peer, tag, ptr, len, None) }
    }
    unsafe fn isend_pieces(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        self.sends.lock().unwrap().push(Sent { len, piece });
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.isend_pieces(peer, tag, ptr, len, piece) }
    }
    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.recv_pieces(peer, tag, len, None, deadline, sink)
    }
    fn recv_pieces(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        piece: Option<usize>,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let mut handed = 0;
        let r = self
            .inner
            .recv_pieces(peer, tag, len, piece, deadline, &mut |off, b| {
                handed += 1;
                sink(off, b)
            });
        self.recvs.lock().unwrap().push(Recv {
            len,
            piece,
            handed: Some(handed),
        });
        r
    }
    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        self.recv_into_pieces(peer, tag, dst, None, deadline)
    }
    fn recv_into_pieces(
        &self,
        peer: usize,
        tag: Tag,
        dst: &mut [u8],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let len = dst.len();
        let r = self.inner.recv_into_pieces(peer, tag, dst, piece, deadline);
        self.recvs.lock().unwrap().push(Recv {
            len,
            piece,
            handed: None,
        });
        r
    }
    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        self.inner.subset(members, ctx)
    }
}
