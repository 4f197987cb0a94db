//! Ranks as threads of one process, with single-copy rendezvous.
//!
//! A send posts a descriptor of the sender's memory; the receiver copies (or reduces)
//! straight out of it and then marks the send complete. Every byte is read once and written
//! once, the least any transfer can do. A sender that times out revokes its descriptor, so a
//! late receiver never touches memory the sender has released.

use super::{fnv1a, hostname, SendOp, Tag, Transport};
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Polls (yielding the core) before sleeping on a condition variable.
const SPINS: usize = 64;

const POSTED: u8 = 0;
const CLAIMED: u8 = 1;
const DONE: u8 = 2;
const REVOKED: u8 = 3;

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
    state: Arc<SendState>,
}

#[derive(Default)]
struct Channel {
    queue: Mutex<VecDeque<Envelope>>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another rank's thread panicked; the data is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shared state of one group of thread-ranks: the channels between every pair.
#[derive(Default)]
pub struct Hub {
    channels: Mutex<HashMap<(u64, usize, usize), Arc<Channel>>>,
}

impl Hub {
    fn channel(&self, ctx: u64, src: usize, dst: usize) -> Arc<Channel> {
        lock(&self.channels)
            .entry((ctx, src, dst))
            .or_default()
            .clone()
    }
}

/// A set of `size` thread-ranks sharing a hub. Create one, then give each thread its
/// [`ThreadWorld::transport`] (or use [`ThreadWorld::run`]).
#[derive(Clone)]
pub struct ThreadWorld {
    hub: Arc<Hub>,
    size: usize,
}

impl ThreadWorld {
    /// A world of `size` ranks.
    pub fn new(size: usize) -> Self {
        ThreadWorld {
            hub: Arc::new(Hub::default()),
            size,
        }
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
        Ok(Arc::new(ThreadTransport {
            hub: self.hub.clone(),
            ctx: 0,
            rank,
            world: Arc::new((0..self.size).collect()),
            node: fnv1a(hostname().as_bytes()),
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
}

struct ThreadSend {
    state: Arc<SendState>,
    peer: usize,
}

impl SendOp for ThreadSend {
    fn wait(self: Box<Self>, deadline: Instant) -> Result<()> {
        for _ in 0..SPINS {
            if *lock(&self.state.state) == DONE {
                break;
            }
            std::thread::yield_now();
        }
        let mut s = lock(&self.state.state);
        loop {
            match *s {
                DONE => return Ok(()),
                REVOKED => return Err(Error::internal("send revoked twice")),
                _ => {}
            }
            let now = Instant::now();
            // Past the deadline a posted send is revoked; a claimed one (the receiver is
            // copying right now) finishes by itself.
            if now >= deadline && *s == POSTED {
                *s = REVOKED;
                return Err(Error::timeout(format!(
                    "rank {} never received a message this rank sent it; it may have died or be \
                     running a different collective (raise PCCL_TIMEOUT if it is only slow)",
                    self.peer
                )));
            }
            let wait = deadline
                .saturating_duration_since(now)
                .max(std::time::Duration::from_millis(1));
            s = self
                .state
                .cv
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
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

    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        let dst = *self
            .world
            .get(peer)
            .ok_or_else(|| Error::invalid(format!("no rank {peer}")))?;
        let ch = self.hub.channel(self.ctx, self.world[self.rank], dst);
        let state = Arc::new(SendState::default());
        lock(&ch.queue).push_back(Envelope {
            tag,
            ptr: ptr as usize,
            len,
            state: state.clone(),
        });
        ch.cv.notify_all();
        Ok(Box::new(ThreadSend { state, peer }))
    }

    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
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
        let env = {
            let mut q = lock(&ch.queue);
            loop {
                if let Some(e) = q.pop_front() {
                    break e;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::timeout(format!(
                        "rank {} waited for a message from rank {peer} that never came; that rank may \
                         have died, or be running a different collective (raise PCCL_TIMEOUT if it is \
                         only slow)",
                        self.rank
                    )));
                }
                q = ch
                    .cv
                    .wait_timeout(q, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        {
            let mut s = lock(&env.state.state);
            if *s == REVOKED {
                return Err(Error::timeout(format!(
                    "rank {peer} gave up on its send to rank {}",
                    self.rank
                )));
            }
            *s = CLAIMED;
        }
        let mismatch = if env.tag != tag {
            Some(Error::remote(format!(
                "rank {} expected collective #{tag} from rank {peer} but got #{}: ranks called \
                 collectives in different orders",
                self.rank, env.tag
            )))
        } else if env.len != len {
            Some(Error::remote(format!(
                "rank {} expected {len} bytes from rank {peer} but it sent {}: do all ranks pass the \
                 same count and dtype?",
                self.rank, env.len
            )))
        } else {
            None
        };
        if mismatch.is_none() && len > 0 {
            // SAFETY: the sender keeps these `len` bytes valid and unmodified until its send
            // op completes, which happens only at the `set(DONE)` below (it cannot revoke once
            // the state is CLAIMED).
            let bytes = unsafe { std::slice::from_raw_parts(env.ptr as *const u8, env.len) };
            sink(0, bytes);
        }
        env.state.set(DONE);
        match mismatch {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        let me = members
            .iter()
            .position(|&m| m == self.rank)
            .ok_or_else(|| Error::internal("subset does not contain this rank"))?;
        let world: Vec<usize> = members.iter().map(|&m| self.world[m]).collect();
        Ok(Arc::new(ThreadTransport {
            hub: self.hub.clone(),
            ctx: fnv1a(&[self.ctx.to_le_bytes(), ctx.to_le_bytes()].concat()),
            rank: me,
            world: Arc::new(world),
            node: self.node,
        }))
    }
}
