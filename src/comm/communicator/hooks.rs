//! What the device front end (`comm::device`), the C ABI and the torch backend need of a
//! [`Communicator`] beyond its collectives: tags, plans, the worker's queues, the device
//! error slot, the abort hooks, and the queries of its state (scratch bytes, the
//! asynchronous error).

use super::{lock, Call, Communicator, RawCollective};
use crate::comm::progress::Worker;
use crate::comm::request::lost;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::plan::{Collective, Plan};
use crate::transport::Transport;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

impl Communicator {
    /// The tag of the next collective in issue order.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn take_tag(&self) -> u32 {
        self.inner.next_seq()
    }

    /// The plan of `coll` (tuned, cached), without waiting for queued work.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn plan_of(&self, coll: Collective, block_bytes: usize) -> Result<Arc<Plan>> {
        Ok(self.inner.plan(coll, block_bytes, false, false)?.plan)
    }

    /// The piece size of a call of `coll` with blocks of `block_bytes`, as the host path
    /// cuts it: an explicit `PCCL_CHUNK_SIZE`, else the tuner's choice for the call (after
    /// [`Communicator::plan_of`] tuned it), else `PCCL_CHUNK_SIZE`'s default.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn piece_bytes_of(&self, coll: Collective, block_bytes: usize) -> usize {
        self.inner
            .piece_of(coll, block_bytes)
            .unwrap_or(self.inner.cfg.chunk_bytes)
    }

    /// Runs `coll` on host memory (NCCL's counts and in-place forms) as collective `seq`, a
    /// number taken earlier with [`Communicator::take_tag`], on the calling thread and
    /// without waiting for queued work: the host part of a queued device collective, run by
    /// the progress worker in issue order. A failure is made known to every peer.
    ///
    /// # Safety
    /// The buffers must be valid for the counts `coll` implies until the call returns.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) unsafe fn host_collective_as<T: Element>(
        &self,
        coll: RawCollective,
        send: *const T,
        recv: *mut T,
        count: usize,
        seq: u32,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        self.run_as(unsafe { self.raw_call(coll, send, recv, count) }, seq)
    }

    /// Runs a built call as collective `seq` on this thread, without waiting for queued
    /// work (see [`Communicator::host_collective_as`]); a failure is made known to every peer.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(super) fn run_as<T: Element>(&self, call: Result<Call<T>>, seq: u32) -> Result<()> {
        let call = call.map_err(|e| self.inner.refuse(seq, "collective", e))?;
        let p = self
            .inner
            .plan(call.coll, call.block_bytes, false, call.out_of_place())
            .map_err(|e| self.inner.refuse(seq, "planning", e))?;
        self.inner.execute(&p.plan, call, seq, p.piece)
    }

    /// Bytes of host scratch this communicator's collectives have needed at most (the
    /// executor's working space for partial sums): what `pccl-bench --memory` reports per
    /// rank. The space itself is kept between calls in a pool shared with the communicators
    /// split from this one, and held once for calls that do not overlap.
    pub fn scratch_bytes(&self) -> usize {
        self.inner.scratch_peak.load(Ordering::Relaxed)
    }

    /// Bytes of host scratch kept between calls by the pool this communicator shares with
    /// the communicators split from it (or it from them), counting only buffers no call is
    /// using now: as large as the largest call's need when calls never overlapped.
    pub fn scratch_pool_bytes(&self) -> usize {
        self.inner.scratch.idle_bytes()
    }

    /// The error a collective queued on a device stream met while running, if any (NCCL's
    /// `ncclCommGetAsyncError`): the stream it was queued on stays held, and every later
    /// device call fails, until the communicator is aborted or destroyed.
    pub fn async_error(&self) -> Option<Error> {
        lock(&self.inner.device_error).clone()
    }

    /// Where queued device collectives keep their first error (see
    /// [`Communicator::async_error`]).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn device_errors(&self) -> Arc<Mutex<Option<Error>>> {
        self.inner.device_error.clone()
    }

    /// The communicator's transport (the device front end tells the peers through it).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn inner_transport(&self) -> Arc<dyn Transport> {
        self.inner.transport.clone()
    }

    /// The transport's key of this rank's host (equal on ranks of one host).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn node_key(&self) -> u64 {
        self.inner.transport.node_key()
    }

    /// Refuses collective `seq` (taken earlier) on every rank with `err` (what: the call).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn refuse_seq(&self, seq: u32, what: &str, err: Error) {
        self.inner.refuse(seq, what, err);
    }

    /// Runs `hook` when the communicator is aborted (the device front end releases its
    /// stream gates then).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn on_abort(&self, hook: Box<dyn Fn() + Send + Sync>) {
        lock(&self.inner.abort_hooks).push(hook);
    }

    /// Another handle on this communicator (for a job of the progress worker).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn handle(&self) -> Communicator {
        Communicator {
            inner: self.inner.clone(),
        }
    }

    /// Queues `job` on the progress worker behind the collectives already queued; it counts
    /// as outstanding (blocking collectives wait for it) until it returns.
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn submit_job(&self, job: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        self.queue_job(job, true)
    }

    /// [`Communicator::submit_job`] for a point-to-point job (which keeps each pair's order
    /// itself: it does not wait for earlier receives).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn submit_p2p_job(&self, job: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        self.queue_job(job, false)
    }

    /// [`Communicator::submit_job`]; `after_recvs`: the job first waits for earlier
    /// point-to-point receives (every job but a point-to-point one, which keeps the per-pair
    /// order itself).
    pub(super) fn queue_job(
        &self,
        job: Box<dyn FnOnce() + Send + 'static>,
        after_recvs: bool,
    ) -> Result<()> {
        let inner = self.inner.clone();
        inner.outstanding.add();
        let me = inner.clone();
        let wrapped = Box::new(move || {
            if after_recvs {
                // Earlier point-to-point receives take their messages first (per-pair order).
                me.recvs.wait_idle();
            }
            // A panicking job must not leave blocking callers waiting for it forever.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            me.outstanding.done();
        });
        let mut w = lock(&inner.worker);
        if w.is_none() {
            *w = Some(
                Worker::start(format!("pccl-progress-{}", inner.transport.rank()))
                    .inspect_err(|_| inner.outstanding.done())?,
            );
        }
        match w.as_ref() {
            Some(worker) => worker
                .submit(wrapped)
                .inspect_err(|_| inner.outstanding.done()),
            None => {
                inner.outstanding.done();
                Err(lost())
            }
        }
    }

    /// Waits until the queued non-blocking collectives have finished (device collectives that
    /// take no plan from [`Communicator::next_collective`] keep issue order this way).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn wait_idle(&self) {
        self.inner.quiesce();
    }

    /// The transport, and the device front end's working space (locked for one collective).
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(dead_code))]
    pub(crate) fn device_parts(
        &self,
    ) -> (
        &dyn Transport,
        std::sync::MutexGuard<'_, Option<Box<dyn std::any::Any + Send>>>,
    ) {
        (self.inner.transport.as_ref(), lock(&self.inner.device))
    }
}
