//! Ranks as threads of one process, with single-copy rendezvous.
//!
//! A send posts a descriptor of the sender's memory; the receiver copies (or reduces)
//! straight out of it and then marks the send complete. Every byte is read once and written
//! once, the least any transfer can do. A sender that times out revokes its descriptor, so a
//! late receiver never touches memory the sender has released.
//!
//! Device mode ([`ThreadWorld::with_device_direct`], feature `cuda`, opt-in): the transport
//! also moves GPU memory ([`Transport::isend_device`] / [`Transport::recv_device`]) — the
//! receiver copies device to device straight from the sender's buffer (unified addressing;
//! one process, so every device address is valid in every thread). Device collectives then
//! skip pinned host staging; without it they stage through the host, the default. Each
//! message records whether it is device memory, and a host receive of a device send (or the
//! reverse) is an error, never a host copy out of a device address.

use super::faults::{self, Faults};
use super::{fnv1a, hostname, Notice, SendOp, Tag, Transport};
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// Polls (yielding the core) before sleeping on a condition variable.
const SPINS: usize = 64;

const POSTED: u8 = 0;
const CLAIMED: u8 = 1;
const DONE: u8 = 2;
const REVOKED: u8 = 3;
/// The receiver dropped the message: its collective had failed there.
const DROPPED: u8 = 4;

#[derive(Default)]
struct SendState {
    state: Mutex<u8>,
    cv: Condvar,
}

impl SendState {
    fn set(&self, s: u8) {
        *lock(&self.state) = s;
        self.cv.notify_all();
    }
}

struct Envelope {
    tag: Tag,
    ptr: usize,
    len: usize,
    /// A vectored send's host segments `(address, length)`, laid end to end (`len` bytes in
    /// all; `ptr` unused); empty for a contiguous message at `ptr`.
    segs: Vec<(usize, usize)>,
    /// `ptr` is a device address (sent by `isend_device`).
    device: bool,
    state: Arc<SendState>,
}

impl Envelope {
    /// The message's host bytes as `(message offset, bytes)` parts, in order.
    ///
    /// # Safety
    /// The envelope must be claimed (its sender cannot revoke it) and hold host memory; the
    /// slices are valid until its state is set to DONE or DROPPED.
    unsafe fn parts(&self) -> Vec<(usize, &[u8])> {
        let mut out = Vec::with_capacity(self.segs.len().max(1));
        if self.segs.is_empty() {
            if self.len > 0 {
                // SAFETY: as the caller guarantees: the sender's `len` bytes at `ptr`.
                out.push((0, unsafe {
                    std::slice::from_raw_parts(self.ptr as *const u8, self.len)
                }));
            }
            return out;
        }
        let mut at = 0;
        for &(p, n) in self.segs.iter().filter(|s| s.1 > 0) {
            // SAFETY: as above: each of the sender's segments (`isendv`'s contract).
            out.push((at, unsafe { std::slice::from_raw_parts(p as *const u8, n) }));
            at += n;
        }
        out
    }
}

#[derive(Default)]
struct Channel {
    queue: Mutex<VecDeque<Envelope>>,
    cv: Condvar,
    /// The sending rank's transport was dropped (it destroyed its communicator): a receive
    /// that finds nothing queued fails at once instead of waiting out its deadline.
    src_left: AtomicBool,
    /// The receiving rank's transport was dropped: nobody will take what is posted.
    dst_left: AtomicBool,
}

/// The error of a wait on `peer`, which destroyed its communicator.
fn left_error(rank: usize, peer: usize, tag: Tag, what: &str) -> Error {
    Error::remote(format!(
        "rank {peer} left (it destroyed its communicator) while rank {rank} still {what} \
         collective #{}",
        faults::seq_of(tag)
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another rank's thread panicked; the data is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The boards of one (sub-)communicator's ranks, so notices and deaths reach them all.
struct Group {
    /// World rank of each rank of the group.
    world: Arc<Vec<usize>>,
    boards: Vec<Weak<Faults>>,
}

/// The shared state of one group of thread-ranks: the channels between every pair, and
/// every communicator's failure boards.
#[derive(Default)]
pub struct Hub {
    channels: Mutex<HashMap<(u64, usize, usize), Arc<Channel>>>,
    groups: Mutex<HashMap<u64, Group>>,
    /// World ranks that died (fault injection), with how.
    gone: Mutex<HashMap<usize, String>>,
    /// The side of a partition each isolated world rank is on (fault injection `isolate`;
    /// the others are on side 0): messages between sides are lost.
    sides: Mutex<HashMap<usize, u32>>,
    /// Whether any rank was ever isolated (the send path's only check otherwise).
    partitioned: AtomicBool,
}

impl Hub {
    fn channel(&self, ctx: u64, src: usize, dst: usize) -> Arc<Channel> {
        lock(&self.channels)
            .entry((ctx, src, dst))
            .or_default()
            .clone()
    }

    /// Marks (or, for a new transport of the same rank, clears) that world rank `w` of group
    /// `ctx` (world ranks `world`) left, on every channel it sends or receives on, and wakes
    /// their waiters.
    fn set_left(&self, ctx: u64, world: &[usize], w: usize, left: bool) {
        for &o in world.iter().filter(|&&o| o != w) {
            let out = self.channel(ctx, w, o);
            out.src_left.store(left, Ordering::Release);
            let inn = self.channel(ctx, o, w);
            inn.dst_left.store(left, Ordering::Release);
            // Take the queue locks so no waiter misses the wake-up between check and wait.
            drop(lock(&out.queue));
            out.cv.notify_all();
            drop(lock(&inn.queue));
            inn.cv.notify_all();
        }
    }

    /// The board of `rank` of the group `ctx` (world ranks `world`), created and registered.
    fn board(&self, ctx: u64, world: &Arc<Vec<usize>>, rank: usize) -> Arc<Faults> {
        if let Some(&w) = world.get(rank) {
            self.set_left(ctx, world, w, false);
        }
        let f = Arc::new(Faults::default());
        for (i, w) in world.iter().enumerate() {
            if let Some(how) = lock(&self.gone).get(w) {
                f.dead(i, how);
            }
        }
        let mut groups = lock(&self.groups);
        let g = groups.entry(ctx).or_insert_with(|| Group {
            world: world.clone(),
            boards: (0..world.len()).map(|_| Weak::new()).collect(),
        });
        if let Some(slot) = g.boards.get_mut(rank) {
            *slot = Arc::downgrade(&f);
        }
        f
    }

    /// Wakes every waiter of group `ctx` (a board changed).
    fn wake(&self, ctx: u64) {
        for ((c, _, _), ch) in lock(&self.channels).iter() {
            if *c == ctx {
                ch.cv.notify_all();
            }
        }
    }

    /// Whether a message from world rank `a` reaches world rank `b` (same side of any
    /// partition).
    fn reachable(&self, a: usize, b: usize) -> bool {
        if !self.partitioned.load(Ordering::Acquire) {
            return true;
        }
        let sides = lock(&self.sides);
        sides.get(&a).copied().unwrap_or(0) == sides.get(&b).copied().unwrap_or(0)
    }

    /// World rank `w` is gone (`how`): every board of every group holding it learns it.
    fn bury(&self, w: usize, how: &str) {
        lock(&self.gone).insert(w, how.to_string());
        let ctxs: Vec<u64> = {
            let groups = lock(&self.groups);
            for g in groups.values() {
                if let Some(i) = g.world.iter().position(|&x| x == w) {
                    for (j, b) in g.boards.iter().enumerate() {
                        if let (true, Some(b)) = (j != i, b.upgrade()) {
                            b.dead(i, how);
                        }
                    }
                }
            }
            groups.keys().copied().collect()
        };
        for c in ctxs {
            self.wake(c);
        }
    }
}

/// A set of `size` thread-ranks sharing a hub. Create one, then give each thread its
/// [`ThreadWorld::transport`].
#[derive(Clone)]
pub struct ThreadWorld {
    hub: Arc<Hub>,
    size: usize,
    device: bool,
}

impl ThreadWorld {
    /// A world of `size` ranks.
    pub fn new(size: usize) -> Self {
        ThreadWorld {
            hub: Arc::new(Hub::default()),
            size,
            device: false,
        }
    }

    /// Device mode (off by default): with `on` and feature `cuda`, the transports made
    /// afterwards move GPU memory themselves ([`Transport::moves_device_memory`] is true), so
    /// device collectives hand device pointers to the transport (the receiving thread copies
    /// device to device out of the sender's buffer) instead of staging through pinned host
    /// memory — single-process multi-GPU, or the direct path on one GPU. Every rank of the
    /// world must use the same mode; device collectives decide per call with
    /// `PCCL_DEVICE_DIRECT` (`Config::device_direct`). Without feature `cuda` it changes
    /// nothing.
    pub fn with_device_direct(mut self, on: bool) -> Self {
        self.device = on;
        self
    }

    /// Whether device mode is on (see [`ThreadWorld::with_device_direct`]).
    pub fn device_direct(&self) -> bool {
        self.device && cfg!(feature = "cuda")
    }
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }
    /// The transport of `rank`.
    pub fn transport(&self, rank: usize) -> Result<Arc<dyn Transport>> {
        if rank >= self.size {
            return Err(Error::invalid(format!(
                "rank {rank} is outside a world of {} threads",
                self.size
            )));
        }
        let world = Arc::new((0..self.size).collect::<Vec<_>>());
        Ok(Arc::new(ThreadTransport {
            faults: self.hub.board(0, &world, rank),
            hub: self.hub.clone(),
            ctx: 0,
            rank,
            world,
            node: fnv1a(hostname().as_bytes()),
            device: self.device_direct(),
        }))
    }
}

/// The transport of one thread-rank.
pub struct ThreadTransport {
    hub: Arc<Hub>,
    ctx: u64,
    rank: usize,
    /// World id of each rank of this (sub-)communicator.
    world: Arc<Vec<usize>>,
    node: u64,
    /// Device mode: `isend_device`/`recv_device` work.
    device: bool,
    faults: Arc<Faults>,
}

/// A send lost in a partition: it completes at once (the network took it) and arrives nowhere.
struct Lost;

impl SendOp for Lost {
    fn wait(self: Box<Self>, _deadline: Instant) -> Result<()> {
        Ok(())
    }
}

struct ThreadSend {
    state: Arc<SendState>,
    ch: Arc<Channel>,
    rank: usize,
    peer: usize,
    tag: Tag,
    faults: Arc<Faults>,
}

impl SendOp for ThreadSend {
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()> {
        for _ in 0..SPINS {
            if *lock(&self.state.state) == DONE {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let mut s = lock(&self.state.state);
        loop {
            match *s {
                DONE => return Ok(()),
                REVOKED => return Err(Error::internal("send revoked twice")),
                DROPPED => {
                    // The board usually says why (the collective failed there).
                    self.faults.check(self.tag, self.peer)?;
                    return Err(Error::remote(format!(
                        "rank {} dropped this rank's message of collective #{}: that \
                         collective had failed there",
                        self.peer,
                        faults::seq_of(self.tag)
                    )));
                }
                _ => {}
            }
            // A posted send is revoked when its collective failed or its deadline passed; a
            // claimed one (the receiver is copying right now) finishes by itself.
            if *s == POSTED {
                let fault = self.faults.check(self.tag, self.peer).err().or_else(|| {
                    self.ch.dst_left.load(Ordering::Acquire).then(|| {
                        left_error(self.rank, self.peer, self.tag, "had a message for it of")
                    })
                });
                if fault.is_some() || Instant::now() >= deadline {
                    *s = REVOKED;
                    return Err(fault.unwrap_or_else(|| {
                        faults::timed_out(
                            self.rank,
                            self.peer,
                            "sent a message never taken by",
                            true,
                        )
                    }));
                }
            }
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), faults::POLL);
            s = self
                .state
                .cv
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl ThreadTransport {
    /// Posts a descriptor of `len` bytes at address `ptr` (host or device memory) to `peer`.
    fn post(
        &self,
        peer: usize,
        tag: Tag,
        ptr: usize,
        len: usize,
        segs: Vec<(usize, usize)>,
        device: bool,
    ) -> Result<Box<dyn SendOp>> {
        let dst = *self
            .world
            .get(peer)
            .ok_or_else(|| Error::invalid(format!("no rank {peer}")))?;
        self.faults.check(tag, peer)?;
        if !self.hub.reachable(self.world[self.rank], dst) {
            return Ok(Box::new(Lost));
        }
        let ch = self.hub.channel(self.ctx, self.world[self.rank], dst);
        if ch.dst_left.load(Ordering::Acquire) {
            return Err(left_error(self.rank, peer, tag, "had a message for it of"));
        }
        let state = Arc::new(SendState::default());
        lock(&ch.queue).push_back(Envelope {
            tag,
            ptr,
            len,
            segs,
            device,
            state: state.clone(),
        });
        ch.cv.notify_all();
        Ok(Box::new(ThreadSend {
            state,
            ch,
            rank: self.rank,
            peer,
            tag,
            faults: self.faults.clone(),
        }))
    }

    /// Takes the next message of collective `tag` from `peer` and claims it (the sender may
    /// no longer revoke it); the caller must `set(DONE)` on it when done with the sender's
    /// memory. Messages of earlier collectives (that failed somewhere) are dropped; one of a
    /// later collective is left in place for the call it belongs to.
    fn take(&self, peer: usize, tag: Tag, deadline: Instant) -> Result<Envelope> {
        let src = *self
            .world
            .get(peer)
            .ok_or_else(|| Error::invalid(format!("no rank {peer}")))?;
        let ch = self.hub.channel(self.ctx, src, self.world[self.rank]);
        // A short polite spin first: a wake-up through the condition variable costs tens of
        // microseconds, while the peer's message is often only a few away.
        for _ in 0..SPINS {
            if !lock(&ch.queue).is_empty() {
                break;
            }
            std::thread::yield_now();
        }
        let mut q = lock(&ch.queue);
        loop {
            if !self.hub.reachable(src, self.world[self.rank]) {
                // A partition (fault injection): what the other side queued here before it
                // is lost as well, as if still in flight, so the injected partition takes the
                // whole collective whatever the ranks' timing (a rank isolated late could
                // otherwise finish on messages delivered before it was cut off). Their senders
                // see them delivered, as those of the messages lost on the way ([`Lost`]).
                while let Some(old) = q.pop_front() {
                    let mut st = lock(&old.state.state);
                    if *st == POSTED {
                        *st = DONE;
                        old.state.cv.notify_all();
                    }
                }
            }
            if faults::is_control(tag) {
                // The transport's own traffic (the survivors' agreement) passes whatever a
                // failed collective or a point-to-point send left queued; earlier control
                // messages of this pair are stale.
                while let Some(i) = q
                    .iter()
                    .position(|e| faults::is_control(e.tag) && faults::is_stale(e.tag, tag))
                {
                    if let Some(old) = q.remove(i) {
                        let mut st = lock(&old.state.state);
                        if *st == POSTED {
                            *st = DROPPED;
                            old.state.cv.notify_all();
                        }
                    }
                }
                if let Some(i) = q.iter().position(|e| e.tag == tag) {
                    if let Some(env) = q.remove(i) {
                        let mut st = lock(&env.state.state);
                        if *st != REVOKED {
                            *st = CLAIMED;
                            drop(st);
                            return Ok(env);
                        }
                    }
                    continue;
                }
            } else if let Some(head) = q.front() {
                if faults::is_stale(head.tag, tag) {
                    if let Some(old) = q.pop_front() {
                        let mut st = lock(&old.state.state);
                        if *st == POSTED {
                            *st = DROPPED;
                            old.state.cv.notify_all();
                        }
                    }
                    continue;
                }
                if head.tag != tag && *lock(&head.state.state) == REVOKED {
                    // A send its sender gave up (nobody received it in time, or its collective
                    // failed there): it holds no later message back.
                    q.pop_front();
                    continue;
                }
                let failed_here = self.faults.any();
                if head.tag != tag
                    && failed_here
                    && !faults::is_p2p(head.tag)
                    && self
                        .faults
                        .refused_seqs()
                        .contains(&faults::seq_of(head.tag))
                {
                    // A message of a collective some rank refused: nobody will take it.
                    if let Some(old) = q.pop_front() {
                        let mut st = lock(&old.state.state);
                        if *st == POSTED {
                            *st = DROPPED;
                            old.state.cv.notify_all();
                        }
                    }
                    continue;
                }
                let settling = head.tag != tag
                    && failed_here
                    && faults::is_p2p(tag)
                    && !faults::is_p2p(head.tag);
                // `settling`: a point-to-point receive behind a message of a collective that
                // is failing; its sender revokes it (or a refusal names it) in a moment, so
                // wait for that below instead of calling it a mismatch.
                if !settling {
                    if head.tag != tag {
                        // The board usually explains it (the peer gave up this collective).
                        self.faults.check(tag, peer)?;
                        if faults::moved_on(head.tag, tag) {
                            // A later collective's message stays for the call it belongs to;
                            // the refusal that explains it may still be on its way.
                            let got = head.tag;
                            drop(q);
                            self.faults.explain(tag, got, peer, deadline)?;
                            return Err(faults::mismatch(self.rank, peer, tag, got));
                        }
                    }
                    let Some(env) = q.pop_front() else { continue };
                    let mut st = lock(&env.state.state);
                    if *st == REVOKED {
                        drop(st);
                        self.faults.check(tag, peer)?;
                        return Err(Error::remote(format!(
                            "rank {peer} gave up its send of collective #{} to rank {}",
                            faults::seq_of(tag),
                            self.rank
                        )));
                    }
                    *st = CLAIMED;
                    drop(st);
                    return Ok(env);
                }
            }
            self.faults.check(tag, peer)?;
            if ch.src_left.load(Ordering::Acquire) {
                return Err(left_error(
                    self.rank,
                    peer,
                    tag,
                    "expected a message from it of",
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(faults::timed_out(
                    self.rank,
                    peer,
                    "waited in vain for a message from",
                    true,
                ));
            }
            q = ch
                .cv
                .wait_timeout(q, (deadline - now).min(faults::POLL))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Why `env` is not the message a receive of `len` bytes (device memory or not) of
    /// collective `tag` expects, if it is not.
    fn mismatch(
        &self,
        env: &Envelope,
        peer: usize,
        tag: Tag,
        len: usize,
        device: bool,
    ) -> Option<Error> {
        let kind = |d: bool| if d { "device" } else { "host" };
        if env.tag != tag {
            Some(faults::mismatch(self.rank, peer, tag, env.tag))
        } else if env.len != len {
            Some(Error::remote(format!(
                "rank {} expected {len} bytes from rank {peer} but it sent {}: do all ranks pass the \
                 same count and dtype?",
                self.rank, env.len
            )))
        } else if env.device != device {
            Some(Error::remote(format!(
                "rank {} expected {} memory from rank {peer} but it sent {} memory: do all ranks \
                 use the same thread world (device mode) and PCCL_DEVICE_DIRECT setting?",
                self.rank,
                kind(device),
                kind(env.device)
            )))
        } else {
            None
        }
    }

    fn device_mode(&self) -> Result<()> {
        if self.device {
            Ok(())
        } else {
            Err(Error::usage(
                "this thread world does not move device memory: build it with \
                 ThreadWorld::with_device_direct(true) (feature `cuda`)",
            ))
        }
    }
}

/// Copies `len` bytes from device address `src` to device address `dst` and returns when the
/// copy has finished.
///
/// # Safety
/// Both must address `len` valid device bytes (unified addressing; a context current on this
/// thread) that nothing else touches during the call.
#[cfg(feature = "cuda")]
unsafe fn copy_device(dst: u64, src: u64, len: usize) -> Result<()> {
    use cudarc::driver::result;
    // cudarc panics when libcuda is missing: say so as an error first.
    crate::device::cuda::ensure_available()?;
    let err = |what: &str, e: result::DriverError| {
        Error::system(format!(
            "CUDA {what} failed in a device-to-device receive: {e} (is the device's context \
             current on this thread?)"
        ))
    };
    // SAFETY: as the caller guarantees.
    unsafe { result::memcpy_dtod_sync(dst, src, len) }.map_err(|e| err("copy", e))?;
    // cuMemcpyDtoD does not wait on the host for device-to-device copies: wait for the legacy
    // default stream it ran on before the sender may reuse its buffer (PCCL's own streams are
    // non-blocking, so this waits for nothing else).
    // SAFETY: synchronising the legacy default stream (the null handle) of the current context.
    unsafe { result::stream::synchronize(std::ptr::null_mut()) }
        .map_err(|e| err("stream synchronize", e))
}

/// Without feature `cuda` no thread world is in device mode, so this is never reached.
///
/// # Safety
/// None needed: it touches no memory.
#[cfg(not(feature = "cuda"))]
unsafe fn copy_device(_dst: u64, _src: u64, _len: usize) -> Result<()> {
    Err(Error::usage(
        "device-to-device receives need PCCL built with feature `cuda`",
    ))
}

impl Drop for ThreadTransport {
    /// A rank that destroys its communicator tells its peers at once: their waits on it fail
    /// naming it, as a TCP peer's goodbye does, instead of running into their deadlines.
    fn drop(&mut self) {
        if let Some(&w) = self.world.get(self.rank) {
            self.hub.set_left(self.ctx, &self.world, w, true);
        }
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.world.len()
    }
    fn name(&self) -> &'static str {
        "threads"
    }
    fn node_key(&self) -> u64 {
        self.node
    }

    fn faults(&self) -> &Faults {
        &self.faults
    }

    fn notify(&self, notice: &Notice) {
        let boards: Vec<Arc<Faults>> = lock(&self.hub.groups)
            .get(&self.ctx)
            .map(|g| g.boards.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for b in boards.iter().filter(|b| !Arc::ptr_eq(b, &self.faults)) {
            match notice {
                Notice::Refused { seq, why } => {
                    b.refuse(*seq, self.rank, why);
                }
                Notice::Aborted { why } => b.revoked(self.rank, why),
            }
        }
        self.hub.wake(self.ctx);
    }

    fn kill_self(&self) {
        let w = self.world[self.rank];
        self.faults
            .abort("this thread-rank was killed by fault injection (PCCL_FAULT kill)");
        self.hub
            .bury(w, "its thread-rank was killed by fault injection");
    }

    fn drop_links(&self) -> Result<()> {
        let w = self.world[self.rank];
        for r in (0..self.world.len()).filter(|&r| r != self.rank) {
            self.faults.cut_off(
                r,
                "this rank's links were cut by fault injection (PCCL_FAULT drop)",
            );
        }
        self.hub
            .bury(w, "its links were cut by fault injection (PCCL_FAULT drop)");
        Ok(())
    }

    fn isolate(&self, side: u32, _members: &[usize]) -> Result<()> {
        lock(&self.hub.sides).insert(self.world[self.rank], side);
        self.hub.partitioned.store(true, Ordering::Release);
        Ok(())
    }

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.post(peer, tag, ptr as usize, len, Vec::new(), false)
    }

    /// Posts a descriptor of the segments: the receiver copies straight out of them (one copy
    /// per byte, no packing).
    unsafe fn isendv(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*const u8, usize)],
        _piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        let len = segs.iter().map(|s| s.1).sum();
        let v = segs.iter().map(|&(p, n)| (p as usize, n)).collect();
        self.post(peer, tag, 0, len, v, false)
    }

    /// Copies straight from the sender's memory (contiguous or segments) into `segs`.
    unsafe fn recvv_into(
        &self,
        peer: usize,
        tag: Tag,
        segs: &[(*mut u8, usize)],
        _piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let (starts, len) = super::seg_starts(segs);
        self.recv(peer, tag, len, deadline, &mut |off, bytes| {
            super::scatter(segs, &starts, off, bytes)
        })
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let env = self.take(peer, tag, deadline)?;
        let mismatch = self.mismatch(&env, peer, tag, len, false);
        if mismatch.is_none() && len > 0 {
            // SAFETY: the sender keeps its `len` bytes of host memory (`device` is false,
            // checked above) valid and unmodified until its send op completes, which happens
            // only at the `set(DONE)` below (it cannot revoke once the state is CLAIMED).
            for (off, bytes) in unsafe { env.parts() } {
                sink(off, bytes);
            }
        }
        // A rejected message fails its sender too (not a silent success for it).
        env.state
            .set(if mismatch.is_some() { DROPPED } else { DONE });
        match mismatch {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn moves_device_memory(&self) -> bool {
        self.device
    }

    unsafe fn isend_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        self.device_mode()?;
        let addr = usize::try_from(ptr)
            .map_err(|_| Error::invalid(format!("device address {ptr:#x} does not fit")))?;
        self.post(peer, tag, addr, len, Vec::new(), true)
    }

    unsafe fn recv_device(
        &self,
        peer: usize,
        tag: Tag,
        ptr: u64,
        len: usize,
        deadline: Instant,
    ) -> Result<()> {
        self.device_mode()?;
        let env = self.take(peer, tag, deadline)?;
        let mut r = match self.mismatch(&env, peer, tag, len, true) {
            Some(e) => {
                env.state.set(DROPPED);
                return Err(e);
            }
            None => Ok(()),
        };
        if r.is_ok() && len > 0 {
            // SAFETY: the sender's `len` device bytes (`device` checked above) stay valid and
            // unmodified until the `set(DONE)` below, which comes after the copy finished;
            // the caller guarantees `ptr` addresses `len` writable device bytes.
            r = unsafe { copy_device(ptr, env.ptr as u64, len) };
        }
        env.state.set(DONE);
        r
    }

    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        let me = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| Error::internal("subset does not contain this rank"))?;
        let world: Vec<usize> = members.iter().map(|&m| self.world[m]).collect();
        let ctx = fnv1a(&[self.ctx.to_le_bytes(), ctx.to_le_bytes()].concat());
        let world = Arc::new(world);
        Ok(Arc::new(ThreadTransport {
            faults: self.hub.board(ctx, &world, me),
            hub: self.hub.clone(),
            ctx,
            rank: me,
            world,
            node: self.node,
            device: self.device,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[cfg(feature = "cuda")]
    fn soon() -> Instant {
        Instant::now() + std::time::Duration::from_secs(5)
    }

    #[test]
    fn device_mode_is_opt_in_and_kept_by_subsets() {
        let plain = ThreadWorld::new(2);
        let t = plain.transport(0).unwrap();
        assert!(!t.moves_device_memory());
        // SAFETY: refused before any memory is touched.
        let e = unsafe { t.isend_device(1, 0, 0x1000, 4) }.err().unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
        let dev = ThreadWorld::new(2).with_device_direct(true);
        assert_eq!(dev.device_direct(), cfg!(feature = "cuda"));
        let t = dev.transport(1).unwrap();
        assert_eq!(t.moves_device_memory(), cfg!(feature = "cuda"));
        let sub = t.subset(&[1], 7).unwrap();
        assert_eq!(sub.moves_device_memory(), cfg!(feature = "cuda"));
    }

    /// A device send met by a host receive (or the reverse) is an error naming both kinds on
    /// both sides, and neither side touches the other's memory (no GPU needed: nothing is
    /// copied).
    #[cfg(feature = "cuda")]
    #[test]
    fn host_and_device_messages_never_mix() {
        let w = ThreadWorld::new(2).with_device_direct(true);
        let (a, b) = (w.transport(0).unwrap(), w.transport(1).unwrap());
        // SAFETY: the fake device address is never dereferenced: the receive refuses it.
        let op = unsafe { a.isend_device(1, 3, 0xdead_0000, 8) }.unwrap();
        let mut buf = [0u8; 8];
        let e = b.recv_into(0, 3, &mut buf, soon()).unwrap_err();
        assert!(e.message().contains("expected host memory"), "{e}");
        // The rejected message fails its sender too.
        assert_eq!(op.wait(soon()).unwrap_err().kind(), ErrorKind::Remote);
        let data = [1u8; 8];
        // SAFETY: `data` outlives the wait below.
        let op = unsafe { a.isend(1, 4, data.as_ptr(), 8) }.unwrap();
        // SAFETY: refused before the address is used.
        let e = unsafe { b.recv_device(0, 4, 0xdead_0000, 8, soon()) }.unwrap_err();
        assert!(e.message().contains("expected device memory"), "{e}");
        assert_eq!(op.wait(soon()).unwrap_err().kind(), ErrorKind::Remote);
    }

    /// Without libcuda a device-to-device receive is an error naming the driver, not a
    /// panic inside cudarc (on a machine with a driver, the check does not apply).
    #[cfg(feature = "cuda")]
    #[test]
    fn a_device_receive_without_libcuda_is_an_error() {
        if crate::device::cuda::ensure_available().is_ok() {
            println!("skipped: a CUDA driver is present");
            return;
        }
        let w = ThreadWorld::new(2).with_device_direct(true);
        let (a, b) = (w.transport(0).unwrap(), w.transport(1).unwrap());
        // SAFETY: the fake addresses are never dereferenced: the driver check fails first.
        let op = unsafe { a.isend_device(1, 5, 0xdead_0000, 8) }.unwrap();
        // SAFETY: as above.
        let e = unsafe { b.recv_device(0, 5, 0xbeef_0000, 8, soon()) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::System, "{e}");
        assert!(e.message().contains("libcuda"), "{e}");
        drop(op);
    }
}
