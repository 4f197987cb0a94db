//! Moving every rank to a fresh endpoint (a new *epoch*) after one rank retired its own.
//!
//! A rank retires its endpoint when a send to a live peer never ends after a failed
//! collective (1.17's shm, `link.rs`): every later operation on it would fail. It then asks
//! for epoch *e*+1 on the control plane ([`request`], `Notice::Epoch`), which every rank's
//! board records. From then on:
//! - a rank *inside* a collective fails it (its waits see the request on the board, as they
//!   see refusals): its peers may be waiting at the gate below and post nothing of it;
//! - as soon as a rank hears of the request, a background thread opens a fresh endpoint and
//!   runs one control-plane round with every rank (the first operation of each collective,
//!   the *gate*, [`OfiTransport::shared_for`], waits for a round under way): each sends its new address and the sequence number *x* of the
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

use super::{connect_all, debug_info, exchange, fabric, ready, Epochs, OfiTransport, Shared};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::{Notice, Transport};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Marks [`Epochs::last`] as holding a sequence number.
pub(super) const POSTED: u64 = 1 << 32;

/// Sequence number of a switch's control messages, plus the epoch: half the sequence space
/// away from every other control message, so that a round's leftovers (a round that failed
/// half-way when a rank died) count as stale for any later control receive (shrink, goodbye,
/// a later round) and are dropped instead of mismatching it.
const ROUND_SEQ: u32 = 0x8000_0000;

/// What the gate remembers.
#[derive(Default)]
pub(super) struct Gate {
    /// The collective whose operations the gate last let through.
    seq: Option<u32>,
    /// Where the last switch put the first collective of the new epoch.
    skip: Option<Skip>,
    /// The epoch of the switch under way (this rank's record sent, the round not ended).
    running: Option<u32>,
    /// Why a switch failed (every later collective fails with it: a rank died or hung).
    failed: Option<Error>,
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

impl Epochs {
    /// Starts the round of a switch asked for on the board, if none runs: called by the
    /// progress thread (so a rank between collectives takes part at once) and by the gate.
    /// `next`: the first collective this rank has not posted anything of (and will not
    /// before the round ends).
    fn start_switch(self: &Arc<Self>, g: &mut Gate, next: Option<u32>) {
        if g.running.is_some() || g.failed.is_some() {
            return;
        }
        let cur = self.current();
        let Some((wanted, by, why)) = cur.ctl.faults().wanted_epoch() else {
            return;
        };
        let epoch = cur.epoch + 1;
        if wanted < epoch {
            return;
        }
        let next = next.unwrap_or_else(|| {
            let l = self.last.load(Ordering::Relaxed);
            if l & POSTED == 0 {
                0
            } else {
                (l as u32).wrapping_add(1)
            }
        });
        g.running = Some(epoch);
        let eps = self.clone();
        let spawned = std::thread::Builder::new()
            .name("pccl-ofi-switch".into())
            .spawn(move || eps.run_switch(&cur, epoch, next, by, &why));
        if let Err(e) = spawned {
            g.running = None;
            g.failed = Some(Error::system(format!(
                "cannot start the libfabric endpoint switch: {e}"
            )));
        }
    }

    /// The round (module documentation): a fresh endpoint, addresses and next collectives
    /// exchanged with every rank, a barrier, connections; then the gate opens.
    fn run_switch(&self, cur: &Shared, epoch: u32, next: u32, by: usize, why: &str) {
        let t0 = Instant::now();
        let deadline = t0 + self.timeout;
        let ctl = cur.ctl.as_ref();
        let rank = cur.rank;
        let failed = |e: Error| {
            Error::new(
                e.kind(),
                format!(
                    "rank {rank}: moving every rank to a fresh libfabric endpoint (epoch \
                     {epoch}, asked for by rank {by}: {why}) failed: {}",
                    e.message()
                ),
            )
        };
        let result = (|| {
            let ep = fabric::open_endpoint()?;
            let tag = faults::stamp(ROUND_SEQ.wrapping_add(epoch), faults::CONTROL | 0x0f1f_0010);
            let step = exchange(ctl, &ep, u64::from(next), tag, deadline).and_then(|(n, xs, _)| {
                let addrs = ep.lock().insert(&n)?;
                ready(
                    ctl,
                    faults::stamp(epoch, faults::CONTROL | 0x0f1f_0011),
                    deadline,
                )?;
                Ok((addrs, xs))
            });
            let (addrs, xs) = match step {
                Ok(v) => v,
                Err(e) => {
                    // Peers may know its address: it stays open until the transport drops.
                    lock(&self.spare).push(ep);
                    return Err(e);
                }
            };
            let sh = Arc::new(Shared {
                ep,
                ctl: cur.ctl.clone(),
                addrs,
                rank,
                piece: cur.piece,
                bounce: Mutex::new(Vec::new()),
                // A fresh window of the same longest wait (its history was the old endpoint's).
                spin: super::spin::Spin::new(cur.spin.max_us()),
                epoch,
            });
            // Connections first, as at bootstrap (every rank is past the barrier).
            let r = connect_all(&sh, deadline);
            lock(&self.list).push(sh);
            r?;
            let (mut k, mut from) = (rank, next);
            for (j, &x) in xs.iter().enumerate() {
                if before(from, x as u32) {
                    (k, from) = (j, x as u32);
                }
            }
            Ok((k, from))
        })();
        let mut g = lock(&self.gate);
        g.running = None;
        match result {
            Ok((k, from)) => {
                cur.ctl.faults().set_epoch(epoch);
                g.skip = Some(Skip { from, epoch, by: k });
                if debug_info() {
                    eprintln!(
                        "pccl: rank {rank}: moved to libfabric endpoint epoch {epoch} in {} ms \
                         (asked for by rank {by}); collectives from #{from} on run on it",
                        t0.elapsed().as_millis()
                    );
                }
            }
            Err(e) => g.failed = Some(failed(e)),
        }
        self.opened.notify_all();
    }

    /// Starts a switch asked for on the board (the progress thread's check; cheap while
    /// nothing failed).
    pub(super) fn poll_switch(self: &Arc<Self>, faults: &faults::Faults) {
        if faults.any() && faults.wanted_epoch().is_some() {
            let mut g = lock(&self.gate);
            self.start_switch(&mut g, None);
        }
    }
}

impl OfiTransport {
    /// The endpoint an operation stamped `tag` runs on: the current one, after the gate
    /// (see the module documentation) for a collective's operations once anything failed.
    /// `deadline` bounds the wait for a switch under way.
    pub(super) fn shared_for(&self, tag: Tag, deadline: Instant) -> Result<Arc<Shared>> {
        if faults::is_control(tag) || faults::is_p2p(tag) {
            return Ok(self.eps.current());
        }
        let seq = faults::seq_of(tag);
        let mark = u64::from(seq) | POSTED;
        if !self.faults().any() {
            self.eps.last.store(mark, Ordering::Relaxed);
            return Ok(self.eps.current());
        }
        let mut g = lock(&self.eps.gate);
        // New: no operation of it was posted yet (on the fast path either).
        let new = self.eps.last.swap(mark, Ordering::Relaxed) != mark && g.seq != Some(seq);
        g.seq = Some(seq);
        self.eps
            .start_switch(&mut g, Some(if new { seq } else { seq.wrapping_add(1) }));
        if !new {
            if let Some((epoch, by, why)) = self.faults().latest_epoch() {
                if epoch > self.eps.current().epoch || g.running.is_some() {
                    // Under way: some of it may be posted on the old endpoint, and peers
                    // post none of it there.
                    return Err(faults::epoch_error(seq, epoch, by, &why));
                }
            }
        }
        while g.running.is_some() {
            // Nothing of this collective is posted: wait for the round to end.
            let f = self.faults();
            f.check(faults::stamp(0, faults::CONTROL), self.rank)?;
            if !f.dead_ranks().is_empty() {
                f.check(tag, self.rank)?;
            }
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "rank {}: collective #{seq} waited in vain for every rank to move to a \
                     fresh libfabric endpoint; a rank may be stuck outside PCCL (raise \
                     PCCL_TIMEOUT if it is only slow)",
                    self.rank
                )));
            }
            g = self
                .eps
                .opened
                .wait_timeout(g, faults::POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if let Some(e) = &g.failed {
            return Err(e.clone());
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
