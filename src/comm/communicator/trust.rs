//! The trust side of the communicator: one call at a time, refusals that keep the ranks in
//! step, stamps (sequence number + call fingerprint), fault injection, abort and shrink.
//! (`docs/ARCHITECTURE.md`, "Trust".)

use super::{Call, Communicator, Inner};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::fault::{self, FaultKind};
use crate::plan::{Collective, Plan};
use crate::topology::Topology;
use crate::transport::faults::{self as stamps, stamp, Tag};
use crate::transport::fnv1a;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// An application thread inside a call; leaving clears the mark.
pub(super) struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Communicator {
    /// A non-blocking call on an owned input and output: `build` gets their pointers and
    /// lengths; the request owns both until the collective completes and gives them back.
    pub(super) fn nonblocking_io<T, I, O>(
        &self,
        what: &str,
        input: I,
        mut output: O,
        build: impl FnOnce(*const T, usize, *mut T, usize) -> Result<Call<T>>,
    ) -> Result<crate::Request<(I, O)>>
    where
        T: Element,
        I: AsRef<[T]> + Send + 'static,
        O: AsMut<[T]> + Send + 'static,
    {
        let (i, o) = (input.as_ref(), output.as_mut());
        let (ip, il, op, ol) = (i.as_ptr(), i.len(), o.as_mut_ptr(), o.len());
        // SAFETY: the job owns `input` and `output` until it completes; moving them does not
        // move their heap contents, which is what the call points into.
        unsafe { self.nonblocking(what, || build(ip, il, op, ol), (input, output)) }
    }

    /// Takes this rank's turn at the next collective and refuses it with `err`: every peer's
    /// call of that collective fails with a remote error naming this rank and `what`, and
    /// the ranks stay in step for the next one. For front ends that reject a call before it
    /// reaches the communicator (the C ABI's argument checks); returns `err`.
    pub fn refuse_call(&self, what: &str, err: Error) -> Error {
        let Ok(_one) = self.inner.enter(what) else {
            return err;
        };
        let seq = self.inner.next_seq();
        self.inner.refuse(seq, what, err)
    }

    /// Aborts the communicator, from any thread: every call in progress or queued on it (on
    /// this rank) ends within a fraction of a second with an invalid-usage error, every later
    /// call fails the same way, and the peers are told (their calls fail with a remote error
    /// naming this rank) where the transport can reach them.
    pub fn abort(&self) {
        let why = format!("aborted by the application on rank {}", self.rank());
        self.inner.transport.abort(&why);
        for hook in self
            .inner
            .abort_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            hook();
        }
    }

    /// Ranks this communicator knows to be dead, with how each was detected (what to pass
    /// to [`Communicator::shrink`]).
    pub fn dead_ranks(&self) -> Vec<usize> {
        self.inner
            .transport
            .faults()
            .dead_ranks()
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// A new communicator of the ranks not in `excluded` (ranks renumbered in order, the
    /// hierarchy recomputed; nodes of unequal size allowed), made by the survivors without
    /// the excluded ranks taking part: the way on after a rank died. Every surviving rank
    /// must call it with the same `excluded`; the new communicator checks that they did.
    pub fn shrink(&self, excluded: &[usize]) -> Result<Communicator> {
        let _one = self.inner.enter("shrink")?;
        let p = self.size();
        let mut ex: Vec<usize> = excluded.to_vec();
        ex.sort_unstable();
        ex.dedup();
        if let Some(&bad) = ex.iter().find(|&&r| r >= p) {
            return Err(Error::invalid(format!(
                "shrink: rank {bad} is not a rank of this communicator of {p}"
            )));
        }
        if ex.binary_search(&self.rank()).is_ok() {
            return Err(Error::invalid(format!(
                "shrink: rank {} excluded itself; only the ranks that stay call shrink",
                self.rank()
            )));
        }
        // Survivors may have seen the failure at different collectives (and so taken
        // different sequence numbers): the new context counts shrinks instead.
        let nth = self.inner.shrinks.fetch_add(1, Ordering::SeqCst);
        let members: Vec<usize> = (0..p).filter(|r| ex.binary_search(r).is_err()).collect();
        let words: Vec<u8> = ex.iter().flat_map(|&r| (r as u64).to_le_bytes()).collect();
        let agreed = fnv1a(&words);
        let ctx = fnv1a(&[b"shrink".as_slice(), &nth.to_le_bytes(), &words].concat());
        let transport = self.inner.transport.subset(&members, ctx)?;
        let keys: Vec<u64> = members
            .iter()
            .map(|&r| self.inner.topo.position(r).0 as u64)
            .collect();
        let mut cfg = self.inner.cfg.clone();
        cfg.faults.clear();
        let topo = Topology::from_node_keys(&keys)
            .inherit_nic_map(&self.inner.topo, &members)
            .inherit_groups(&self.inner.topo, &members);
        let child = self.child(transport, topo, cfg);
        let mut all = vec![0u64; members.len()];
        child.all_gather(&[agreed], &mut all)?;
        if let Some(r) = all.iter().position(|&h| h != agreed) {
            return Err(Error::invalid(format!(
                "shrink: rank {} (rank {r} of the new communicator) excluded other ranks than \
                 rank {}; every surviving rank must pass the same list",
                members[r],
                self.rank()
            )));
        }
        Ok(child)
    }
}

impl Inner {
    /// Marks an application thread inside a call; a second one gets an invalid-usage error.
    pub(super) fn enter(&self, what: &str) -> Result<Busy<'_>> {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(Error::usage(format!(
                "{what}: another thread is inside a call on this communicator (rank {}); a \
                 communicator takes one call at a time: serialise the calls, or give each \
                 thread a communicator of its own (split)",
                self.transport.rank()
            )));
        }
        Ok(Busy(&self.busy))
    }

    /// This rank's next collective sequence number (every call takes one, failed or not).
    pub(super) fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Refuses collective `seq` on every rank because of `err` (this rank's own error).
    pub(super) fn refuse(&self, seq: u32, what: &str, err: Error) -> Error {
        let why = format!(
            "{what} on rank {}: {}",
            self.transport.rank(),
            err.message()
        );
        self.transport.abandon(stamp(seq, 0), &why);
        err
    }

    /// The stamp of collective `seq` running `call` with `plan`: its number and a
    /// fingerprint of the call (collective, dtype, op, counts, root, algorithm).
    pub(super) fn stamp_of<T: Element>(&self, plan: &Plan, call: &Call<T>, seq: u32) -> Tag {
        let rendezvous = if plan.algorithm.rendezvous(self.topo.nodes().len()) {
            stamps::RENDEZVOUS
        } else {
            0
        };
        if !self.cfg.checks {
            return stamp(seq, rendezvous);
        }
        let op = call.op as u32 + 1;
        let (kind, op, root) = match call.coll {
            Collective::Barrier => (0, 0, 0),
            Collective::AllGather => (1, 0, 0),
            Collective::ReduceScatter { .. } => (2, op, 0),
            Collective::AllReduce { .. } => (3, op, 0),
            Collective::Broadcast { root } => (4, 0, root as u64),
            Collective::Reduce { root, .. } => (8, op, root as u64),
            Collective::Gather { root } => (9, 0, root as u64),
            Collective::Scatter { root } => (10, 0, root as u64),
            Collective::AllToAll { .. } => (11, 0, 0),
        };
        let dtype = if kind == 0 { 0 } else { T::DTYPE as u32 + 1 };
        let algo = plan.algorithm.code();
        // Rooted collectives: buffers off the root are unused (any length); the block size is
        // what every rank must agree on.
        let (a, b) = if call.coll.fixed_algorithm() {
            (call.block_bytes as u64, 0)
        } else {
            (call.input.1 as u64, call.output.1 as u64)
        };
        let detail = [a, b, root, algo, plan.nranks as u64];
        stamp(
            seq,
            stamps::fingerprint(kind, dtype, op, &detail) | rendezvous,
        )
    }

    /// Injects the fault `PCCL_FAULT` asks of this rank at collective `seq`, if any; returns
    /// whether the collective's messages must leave with a damaged stamp.
    pub(super) fn inject(&self, seq: u32) -> Result<bool> {
        let rank = self.transport.rank();
        match fault::at(&self.cfg.faults, rank, seq) {
            None => Ok(false),
            Some(FaultKind::Kill) => {
                eprintln!("PCCL WARN rank {rank}: killed at collective #{seq} (PCCL_FAULT)");
                self.transport.kill_self();
                Err(Error::usage(format!(
                    "rank {rank} was killed by fault injection at collective #{seq}"
                )))
            }
            Some(FaultKind::Stall) => {
                let end = Instant::now() + 2 * self.timeout();
                while Instant::now() < end && self.transport.faults().aborted().is_none() {
                    self.transport.faults().nap(Duration::from_millis(50));
                }
                Ok(false)
            }
            Some(FaultKind::Slow) => {
                std::thread::sleep(Duration::from_millis(fault::SLOW_MS));
                Ok(false)
            }
            Some(FaultKind::Drop) => {
                self.transport.drop_links()?;
                Ok(false)
            }
            Some(FaultKind::Corrupt) => Ok(true),
            Some(FaultKind::Isolate) => {
                eprintln!("PCCL WARN rank {rank}: isolated at collective #{seq} (PCCL_FAULT)");
                // The ranks isolated at the same collective share a side.
                let members: Vec<usize> = (0..self.transport.size())
                    .filter(|&r| fault::at(&self.cfg.faults, r, seq) == Some(FaultKind::Isolate))
                    .collect();
                self.transport
                    .isolate(seq.wrapping_add(1).max(1), &members)?;
                Ok(false)
            }
        }
    }
}
