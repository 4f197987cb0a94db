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

mod ops;

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
