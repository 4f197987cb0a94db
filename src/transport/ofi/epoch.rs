//! Moving every rank to a fresh endpoint (a new *epoch*) after one rank retired its own.
//!
//! A rank retires its endpoint when a send to a live peer never ends after a failed
//! collective (1.17's shm, `link.rs`): every later operation on it would fail. It then asks
//! for epoch *e*+1 on the control plane ([`request`], `Notice::Epoch`), which every rank's
//! board records. From then on:
//! - a rank *inside* a collective fails it (its waits see the request on the board, as they
//!   see refusals): its peers may be waiting at the gate below and post nothing of it;
//! - at the first operation of its next collective (the *gate*, [`OfiTransport::shared_for`])
//!   a rank that knows of the request opens a fresh endpoint and runs one control-plane round
//!   with every rank: each sends its new address and the sequence number *x* of the
//!   collective it is about to start (nothing of it posted yet), then a barrier, so no data
//!   reaches an endpoint before its peers' addresses are inserted. Every rank then knows
//!   F = the latest *x*; collectives before F fail on the ranks that reach them afterwards
//!   (some rank had already passed them, so they cannot complete: an error names that rank
//!   and the epoch), and collectives from F on run on the new endpoint.
//!
//! Why no wrong data and no hang: a rank at the gate posts nothing before the round ends, so
//! no collective is ever split across two epochs; a rank that has not heard of the request
//! yet posts on the old endpoint only collectives before its own *x* ≤ F, which its peers
//! either ran on the old endpoint too or skip; every rank reaches the gate eventually (its
//! next call), or dies (the control plane sees it: the round fails naming it) or never calls
//! again (the round runs out the collective's deadline, as any collective would).
//!
//! Cost: none while nothing failed (one relaxed store per operation); after any failure an
//! uncontended lock per operation; one control round per switch. Old endpoints stay open and
//! progressed until the transport drops (closing a shm endpoint under a live peer crashed
//! that peer); their leftovers are drained there.

use super::{connect_all, debug_info, exchange, fabric, ready, OfiTransport, Shared};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::{Notice, Transport};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Marks [`OfiTransport::last`] as holding a sequence number.
pub(super) const POSTED: u64 = 1 << 32;

/// What the gate remembers.
#[derive(Default)]
pub(super) struct Gate {
    /// The collective whose operations the gate last let through.
    seq: Option<u32>,
    /// Where the last switch put the first collective of the new epoch.
    skip: Option<Skip>,
}

/// The outcome of a switch: collectives before `from` fail here.
struct Skip {
    from: u32,
    epoch: u32,
    /// A rank that had reached `from` at the switch.
    by: usize,
}

/// Whether sequence number `a` comes before `b` (they wrap).
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Asks every rank to move past the endpoint of `sh` (retired or closed here because of
/// `why`): recorded on this rank's board and sent to every peer, once per epoch. A request
/// about an endpoint older than the current one changes nothing.
pub(super) fn request(sh: &Shared, why: &str) {
    let epoch = sh.epoch + 1;
    if sh.ctl.faults().want_epoch(epoch, sh.rank, why) {
        if debug_info() {
            eprintln!(
                "pccl: rank {}: asking every rank to move to a fresh libfabric endpoint (epoch \
                 {epoch}): {why}",
                sh.rank
            );
        }
        sh.ctl.notify(&Notice::Epoch {
            epoch,
            why: why.to_string(),
        });
    }
}

impl OfiTransport {
    /// The endpoint an operation stamped `tag` runs on: the current one, after the gate
    /// (see the module documentation) for a collective's operations once anything failed.
    /// `deadline` bounds a switch.
    pub(super) fn shared_for(&self, tag: Tag, deadline: Instant) -> Result<Arc<Shared>> {
        if faults::is_control(tag) || faults::is_p2p(tag) {
            return Ok(self.eps.current());
        }
        let seq = faults::seq_of(tag);
        let mark = u64::from(seq) | POSTED;
        if !self.faults().any() {
            self.last.store(mark, Ordering::Relaxed);
            return Ok(self.eps.current());
        }
        let mut g = lock(&self.gate);
        // New: no operation of it was posted yet (on the fast path either).
        let new = self.last.swap(mark, Ordering::Relaxed) != mark && g.seq != Some(seq);
        g.seq = Some(seq);
        if let Some((epoch, by, why)) = self.faults().wanted_epoch() {
            if !new {
                // Under way: some of it may be posted on the old endpoint, and peers at the
                // gate post none of it.
                return Err(faults::epoch_error(seq, epoch, by, &why));
            }
            // A dead or aborting rank cannot join the round: that error instead.
            let f = self.faults();
            f.check(faults::stamp(0, faults::CONTROL), self.rank)?;
            if !f.dead_ranks().is_empty() {
                f.check(tag, self.rank)?;
            }
            self.switch(seq, &mut g, by, &why, deadline)?;
        }
        if let Some(s) = g.skip.as_ref().filter(|s| before(seq, s.from)) {
            // Peers may have sent some of it on an old endpoint before hearing of the switch.
            for sh in self.eps.all() {
                sh.ep.lock().add_junk(seq, self.piece);
            }
            return Err(Error::remote(format!(
                "collective #{seq} fails on rank {}: when every rank moved to a fresh libfabric \
                 endpoint (epoch {}), rank {} had already passed it (it had reached collective \
                 #{}); collectives from #{} on run normally",
                self.rank, s.epoch, s.by, s.from, s.from
            )));
        }
        Ok(self.eps.current())
    }

    /// The round at the gate of collective `seq` (nothing of it posted): a fresh endpoint,
    /// addresses and sequence numbers exchanged with every rank, a barrier. `by`/`why`: who
    /// asked and why (for messages).
    fn switch(
        &self,
        seq: u32,
        g: &mut Gate,
        by: usize,
        why: &str,
        deadline: Instant,
    ) -> Result<()> {
        let t0 = Instant::now();
        let epoch = self.eps.current().epoch + 1;
        let ctl = self.ctl.as_ref();
        let failed = |e: Error| {
            Error::new(
                e.kind(),
                format!(
                    "rank {}: moving to a fresh libfabric endpoint (epoch {epoch}, asked for by \
                     rank {by}: {why}) failed at collective #{seq}: {}",
                    self.rank,
                    e.message()
                ),
            )
        };
        let ep = fabric::open_endpoint().map_err(failed)?;
        let tag = faults::stamp(epoch, faults::CONTROL | 0x0f1f_0010);
        let step = exchange(ctl, &ep, u64::from(seq), tag, deadline).and_then(|(names, xs)| {
            let addrs = ep.lock().insert(&names)?;
            let tag = faults::stamp(epoch, faults::CONTROL | 0x0f1f_0011);
            ready(ctl, tag, deadline)?;
            Ok((addrs, xs))
        });
        let (addrs, xs) = match step {
            Ok(v) => v,
            Err(e) => {
                // Peers may know its address already: it stays open until the transport drops.
                lock(&self.eps.spare).push(ep);
                return Err(failed(e));
            }
        };
        let sh = Arc::new(Shared {
            ep,
            ctl: self.ctl.clone(),
            addrs,
            rank: self.rank,
            piece: self.piece,
            bounce: Mutex::new(Vec::new()),
            epoch,
        });
        lock(&self.eps.list).push(sh.clone());
        self.faults().set_epoch(epoch);
        let (mut by_rank, mut from) = (self.rank, seq);
        for (j, &x) in xs.iter().enumerate() {
            if before(from, x as u32) {
                (by_rank, from) = (j, x as u32);
            }
        }
        g.skip = Some(Skip {
            from,
            epoch,
            by: by_rank,
        });
        // Connections first, as at bootstrap (every rank is past the barrier).
        connect_all(&sh, deadline).map_err(failed)?;
        if debug_info() {
            eprintln!(
                "pccl: rank {}: moved to libfabric endpoint epoch {epoch} at collective #{seq} \
                 in {} ms; collectives from #{from} on run on it",
                self.rank,
                t0.elapsed().as_millis()
            );
        }
        Ok(())
    }

    /// Retires this rank's current endpoint because of `why`, as a send that a live peer
    /// never took does on shm: every rank moves to a fresh one at its next collective (the
    /// collectives under way then fail). For tests of the switch and for operators who see
    /// an endpoint misbehave.
    pub fn retire_endpoint(&self, why: &str) {
        let sh = self.eps.current();
        sh.ep.lock().retire(format!("rank {}: {why}", self.rank));
        request(&sh, why);
    }

    /// The epoch of the endpoint collectives run on now: 0 from the bootstrap, one more per
    /// switch.
    pub fn epoch(&self) -> u32 {
        self.eps.current().epoch
    }
}
