//! The endpoint's locked state: posting operations, reading the completion queue (the
//! provider progresses only when it is read), cancelling, and the drain receives that take a
//! failed collective's leftover messages. Opening the fabric, domain and endpoint: [`open`].
//!
//! Every libfabric call of one endpoint happens under its lock (the domain is opened with
//! `FI_THREAD_DOMAIN`), so threads of one rank can post and wait concurrently. Operations are
//! identified by their context (a boxed, provider-usable `fi_context2`); completions read by
//! any waiter are filed by context for their owner.

mod open;

use super::mr::{self, Iface, Mem, MrCache};
use super::sys::{self, Comp, Desc, FiInfo, RawEp};
use crate::error::{Error, Result};
use crate::transport::faults::{self, Tag};
use crate::transport::staging::Staging;
pub use open::{domain_choice, offers, open_endpoint, providers, Offer};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CString};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

/// Bits of a stamp that receives match: the sequence number and the control / point-to-point
/// flags. The rest (the call's fingerprint) is checked on arrival, so a mismatched call is an
/// error naming both calls instead of a receive that never matches.
pub const IGNORE: u64 = 0x3fff_ffff;

/// Failed collectives whose leftover messages are drained.
const JUNK_KEPT: usize = 16;
/// Failed collectives remembered as drained already.
const JUNK_SEEN: usize = 256;

/// What the chosen provider offers.
#[derive(Clone, Debug)]
pub struct Caps {
    /// Provider name (`tcp;ofi_rxm`, `shm`).
    pub provider: String,
    /// Fabric name.
    pub fabric: String,
    /// Domain name (the NIC, or `lo`/`eth0` for tcp).
    pub domain: String,
    /// The provider moves device memory (`FI_HMEM`).
    pub hmem: bool,
    /// Buffers are registered (the provider asks for `FI_MR_LOCAL`, or `PCCL_OFI_MR=1`).
    pub register: bool,
    /// Remote completion data of 8 bytes is available (each message carries its length).
    pub cq_data: bool,
    /// Idle waits block on the completion queue's file descriptor (woken by the provider's
    /// traffic) instead of polling it on a timer (`PCCL_OFI_WAIT`).
    pub wait_fd: bool,
}

/// A provider operation's context: `fi_context2` space the provider may use while the
/// operation is in flight (its address identifies the operation).
pub type Ctx = Box<[usize; 8]>;

/// A fresh context.
pub fn ctx() -> Ctx {
    Box::new([0; 8])
}

/// The key of a context (its address, as completions report it).
pub fn key(c: &Ctx) -> usize {
    &**c as *const [usize; 8] as usize
}

/// An endpoint and what its waiters share.
pub struct State {
    raw: RawEp,
    /// Completions read but not yet taken by their operation.
    done: HashMap<usize, Comp>,
    /// Why the endpoint was closed (then every operation fails with it).
    broken: Option<String>,
    /// Operations posted and not yet completed (registrations may be dropped only at 0).
    in_flight: usize,
    /// Memory registrations.
    pub cache: MrCache,
    /// Sends carry their message's length as remote completion data.
    cq_data: bool,
    /// Drain receives of failed collectives: sequence number, context.
    junk: VecDeque<(u32, Ctx)>,
    /// Collectives ever given drain receives (the newest [`JUNK_SEEN`]), so one is drained
    /// once, and the board's generation last looked at ([`State::drain_refused`]).
    junk_seen: VecDeque<u32>,
    board_gen: u64,
    /// Operations given up on (failed collectives, retired drain receives) whose completion
    /// has not come: their contexts, and the owned buffers they target, live here until it
    /// comes (reaped by [`State::progress`]) or the endpoint is closed.
    limbo: HashMap<usize, Parked>,
    /// The buffer every drain receive writes into (one piece: nothing is truncated, which
    /// some providers handle badly for large messages); its contents are never read.
    scratch: Vec<u8>,
    /// Sends not yet taken by the provider (its queue was full), posted in order by whoever
    /// progresses the endpoint next, so a posted send never waits for its own wait.
    backlog: VecDeque<Pending>,
    /// The completion queue's file descriptor, where idle waits block ([`State::may_block`]).
    wait_fd: Option<i32>,
}

/// An operation in limbo: what must stay alive until its completion (never read).
struct Parked {
    _ctx: Ctx,
    _buf: Option<Arc<Staging>>,
}

/// Operations in limbo beyond which the endpoint is closed: the provider is not ending
/// anything, and each entry holds memory.
const LIMBO_MAX: usize = 4096;

/// A send piece waiting to be posted (its memory and context belong to its send op).
struct Pending {
    ptr: usize,
    len: usize,
    dest: u64,
    tag: Tag,
    total: u64,
    ctx: usize,
    mem: Mem,
}

// SAFETY: the raw libfabric objects are used only under the endpoint's mutex (the domain is
// opened FI_THREAD_DOMAIN: any thread may call as long as calls are serialised).
unsafe impl Send for State {}

/// One libfabric endpoint (fabric, domain, CQ, AV, RDM endpoint).
pub struct Endpoint {
    state: Mutex<State>,
    /// What the provider offers.
    pub caps: Caps,
    /// This endpoint's address (`fi_getname`).
    pub name: Vec<u8>,
    /// Registrations made, shared with the cache (for tests).
    pub registrations: Arc<AtomicU64>,
}

impl State {
    /// The descriptor to block on if the provider says nothing is left to progress now
    /// (`fi_trywait`); `None` where waits poll, or when completions are pending. Block on it
    /// only after releasing the lock, and only briefly: the failure board does not signal it.
    pub fn may_block(&mut self) -> Option<i32> {
        let fd = self.wait_fd?;
        if self.is_closed() {
            return None;
        }
        // SAFETY: `raw` is open (checked above), under the endpoint's lock.
        (unsafe { sys::pccl_ofi_trywait(&mut self.raw) } == 0).then_some(fd)
    }

    /// Whether idle waits block on a descriptor ([`State::may_block`]).
    pub fn blocks(&self) -> bool {
        self.wait_fd.is_some()
    }

    fn usable(&self) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(why) => Err(Error::system(format!(
                "the libfabric endpoint was closed to new operations: {why}"
            ))),
        }
    }

    /// Inserts peer addresses (in rank order); returns their `fi_addr_t`s.
    pub fn insert(&mut self, names: &[Vec<u8>]) -> Result<Vec<u64>> {
        self.usable()?;
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            let mut a = 0u64;
            // SAFETY: `n` holds an address of this fabric's format (checked by the caller's
            // exchange); one address is inserted and its handle written to `a`.
            let ret =
                unsafe { sys::pccl_ofi_av_insert(&mut self.raw, n.as_ptr().cast(), 1, &mut a) };
            if ret != 1 {
                return Err(Error::system(format!(
                    "libfabric: fi_av_insert of a peer address failed ({})",
                    sys::strerror(i64::from(ret.min(0)))
                )));
            }
            out.push(a);
        }
        Ok(out)
    }

    /// Whether this domain registers memory of `iface` ([`mr::probe`]).
    pub fn probe_hmem(&mut self, iface: Iface) -> std::result::Result<(), String> {
        if self.is_closed() {
            return Err("the endpoint is closed".into());
        }
        let key = self.cache.next_key();
        mr::probe(&mut self.raw, iface, key)
    }

    /// Queues a tagged send piece of memory `mem` and posts what the provider takes now.
    ///
    /// # Safety
    /// `len` bytes at `ptr` stay valid and unmodified, and `c` alive, until the operation's
    /// completion has been taken, it was withdrawn ([`State::withdraw`]), or the endpoint
    /// closed.
    #[allow(clippy::too_many_arguments)] // the fields of a `Pending` piece, queued as given
    pub unsafe fn send(
        &mut self,
        ptr: *const u8,
        len: usize,
        dest: u64,
        tag: Tag,
        total: u64,
        c: &Ctx,
        mem: Mem,
    ) -> Result<()> {
        self.usable()?;
        self.backlog.push_back(Pending {
            ptr: ptr as usize,
            len,
            dest,
            tag,
            total,
            ctx: key(c),
            mem,
        });
        self.flush()
    }

    /// Posts queued sends until the provider's queue is full.
    fn flush(&mut self) -> Result<()> {
        while let Some(p) = self.backlog.front() {
            let (ptr, len, dest, tag, total, k) = (p.ptr, p.len, p.dest, p.tag, p.total, p.ctx);
            let mem = p.mem;
            let idle = self.in_flight == 0;
            let desc = self.cache.desc(&mut self.raw, ptr, len, mem, idle)?;
            // SAFETY: per `send`'s contract (the piece is still queued, so its memory and
            // context are alive).
            let ret = unsafe {
                sys::pccl_ofi_tsend(
                    &mut self.raw,
                    ptr as *const c_void,
                    len,
                    desc,
                    dest,
                    tag,
                    i32::from(self.cq_data),
                    total,
                    k as *mut c_void,
                )
            };
            if !self.posted(ret, "fi_tsend")? {
                return Ok(());
            }
            self.backlog.pop_front();
        }
        Ok(())
    }

    /// Removes the queued (not yet posted) pieces of contexts `keys`; returns the contexts
    /// that were posted (and must be cancelled or completed).
    pub fn withdraw(&mut self, keys: &[usize]) -> Vec<usize> {
        self.backlog.retain(|p| !keys.contains(&p.ctx));
        let queued: Vec<usize> = self.backlog.iter().map(|p| p.ctx).collect();
        keys.iter()
            .copied()
            .filter(|k| !queued.contains(k))
            .collect()
    }

    /// Posts a tagged receive into memory `mem` matching `tag` (ignoring [`IGNORE`]) from
    /// `src`; `Ok(false)` when the queue is full.
    ///
    /// # Safety
    /// `len` bytes at `ptr` stay valid and writable by the provider only, and `c` alive, until
    /// the operation's completion has been taken (or the endpoint closed).
    pub unsafe fn recv(
        &mut self,
        ptr: *mut u8,
        len: usize,
        src: u64,
        tag: Tag,
        c: &Ctx,
        mem: Mem,
    ) -> Result<bool> {
        self.usable()?;
        let idle = self.in_flight == 0;
        let desc = self
            .cache
            .desc(&mut self.raw, ptr as usize, len, mem, idle)?;
        // SAFETY: per this function's contract.
        let ret = unsafe {
            sys::pccl_ofi_trecv(
                &mut self.raw,
                ptr.cast(),
                len,
                desc,
                src,
                tag,
                IGNORE,
                key(c) as *mut c_void,
            )
        };
        self.posted(ret, "fi_trecv")
    }

    fn posted(&mut self, ret: isize, what: &str) -> Result<bool> {
        if ret == 0 {
            self.in_flight += 1;
            return Ok(true);
        }
        if ret as i64 == -sys::FI_EAGAIN {
            return Ok(false);
        }
        sys::check(what, ret as i64).map(|_| false)
    }

    /// Reads every available completion (driving the provider), filing them by context;
    /// drain receives are re-posted.
    pub fn progress(&mut self) {
        if self.raw.ep.is_null() {
            return; // closed (a retired endpoint is still progressed: limbo drains)
        }
        let mut buf = [Comp::default(); 32];
        let mut msg = [0 as std::ffi::c_char; 256];
        loop {
            // SAFETY: `raw` is open (not broken); `buf` and `msg` have the given capacities.
            let n = unsafe {
                sys::pccl_ofi_poll(
                    &mut self.raw,
                    buf.as_mut_ptr(),
                    buf.len(),
                    msg.as_mut_ptr(),
                    msg.len(),
                )
            };
            if n <= 0 {
                if n < 0 {
                    let why = format!(
                        "reading its completion queue failed: {}",
                        sys::strerror(n as i64)
                    );
                    self.close_with(why);
                } else if !self.backlog.is_empty() {
                    if let Err(e) = self.flush() {
                        self.close_with(format!("posting a send failed: {e}"));
                    }
                }
                return;
            }
            for c in &buf[..n as usize] {
                self.in_flight = self.in_flight.saturating_sub(1);
                if self.limbo.remove(&c.ctx).is_some() {
                    continue;
                }
                if let Some(i) = self.junk.iter().position(|(_, x)| key(x) == c.ctx) {
                    self.repost_junk(i);
                    continue;
                }
                self.done.insert(c.ctx, *c);
            }
        }
    }

    /// Takes the completion of the operation of context `c`, if it has completed.
    pub fn take(&mut self, c: &Ctx) -> Option<Comp> {
        self.done.remove(&key(c))
    }

    /// Asks the provider to cancel the operation of context `c` (its completion, cancelled
    /// or not, still comes).
    pub fn cancel(&mut self, c: &Ctx) {
        if !self.is_closed() {
            // SAFETY: `raw` is open; `c` identifies an operation posted on it.
            unsafe { sys::pccl_ofi_cancel(&mut self.raw, key(c) as *mut c_void) };
        }
    }

    /// Parks the operation of context `c` (cancelled or given up on, not yet ended): its
    /// context, and `buf` (the owned buffer it targets), live until its completion comes or
    /// the endpoint is closed; nobody waits for it. Closes the endpoint when limbo is full.
    pub fn park(&mut self, c: Ctx, buf: Option<Arc<Staging>>) {
        if self.is_closed() || self.done.remove(&key(&c)).is_some() {
            return; // already ended (or the provider let go of everything)
        }
        self.limbo.insert(key(&c), Parked { _ctx: c, _buf: buf });
        if self.limbo.len() > LIMBO_MAX {
            self.close_with(format!(
                "{LIMBO_MAX} operations of failed collectives never ended (the provider does \
                 not complete or cancel them); create a new communicator"
            ));
        }
    }

    /// Operations in limbo (parked, not yet ended).
    #[allow(dead_code)]
    pub fn parked(&self) -> usize {
        self.limbo.len()
    }

    /// Whether the endpoint was closed (operations then never complete: their memory is
    /// free). A retired endpoint is not closed.
    pub fn is_closed(&self) -> bool {
        self.raw.ep.is_null()
    }

    /// Retires the endpoint because of `why`: every later operation fails with `why`, but the
    /// endpoint stays open (and progressed) until the transport is dropped, so the limbo
    /// can still drain and peers never lose an endpoint they may be writing to (1.17's shm
    /// crashes a peer that sends to a closed one).
    pub fn retire(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
    }

    /// Closes the endpoint because of `why`: the provider lets go of every buffer of every
    /// operation in flight; every later operation fails with `why`.
    pub fn close_with(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
        if !self.is_closed() {
            self.close();
        }
    }

    fn close(&mut self) {
        // The endpoint first (the provider lets go of every operation's buffers), then the
        // registrations, then the rest (the shim nulls what it closed).
        // SAFETY: `raw` was opened by pccl_ofi_open; closing twice is a no-op.
        unsafe { sys::pccl_ofi_close_ep(&mut self.raw) };
        self.cache.clear();
        // SAFETY: as above.
        unsafe { sys::pccl_ofi_close(&mut self.raw) };
        self.done.clear();
        self.backlog.clear();
        self.in_flight = 0;
        self.wait_fd = None; // closed with the completion queue
                             // The provider let go of every operation: limbo's buffers and contexts may go.
        self.limbo.clear();
    }

    /// Drains the leftover messages of collective `seq` (failed on this rank): a receive from
    /// any peer of that sequence number is kept posted (the newest [`JUNK_KEPT`] collectives),
    /// so peers' sends of it complete and the provider's queue of unexpected messages does not
    /// grow.
    pub fn add_junk(&mut self, seq: u32, piece: usize) {
        if self.is_closed() || self.junk_seen.contains(&seq) {
            return;
        }
        if self.junk_seen.len() == JUNK_SEEN {
            self.junk_seen.pop_front();
        }
        self.junk_seen.push_back(seq);
        if self.scratch.is_empty() {
            self.scratch = vec![0u8; piece];
        } else if self.scratch.len() < piece {
            return; // the piece size is fixed per endpoint: not reached
        }
        if self.junk.len() == JUNK_KEPT {
            if let Some((_, c)) = self.junk.pop_front() {
                self.cancel(&c);
                self.park(c, None);
            }
        }
        self.junk.push_back((seq, ctx()));
        let i = self.junk.len() - 1;
        self.repost_junk(i);
    }

    /// Drains the collectives that some rank refused, as the board (`faults`) tells, whether
    /// or not this rank's own waits of them failed: a rank that learns of a refusal before
    /// it starts the collective fails it without posting anything, and its peers' sends of it
    /// must still end. Cheap when the board did not change.
    pub fn drain_refused(&mut self, faults: &faults::Faults, piece: usize) {
        let g = faults.generation();
        if g == self.board_gen || self.is_closed() {
            return;
        }
        self.board_gen = g;
        for seq in faults.refused_seqs() {
            self.add_junk(seq, piece);
        }
    }

    fn repost_junk(&mut self, i: usize) {
        let (seq, c) = &self.junk[i];
        let tag = faults::stamp(*seq, 0);
        let k = key(c);
        let (ptr, len) = (self.scratch.as_mut_ptr(), self.scratch.len());
        // SAFETY: the scratch buffer lives in this state and is never reallocated once
        // allocated; the context lives in `junk` (or `limbo`) until the
        // receive's completion is read or the endpoint is closed.
        let ret = unsafe {
            sys::pccl_ofi_trecv(
                &mut self.raw,
                ptr.cast(),
                len,
                std::ptr::null_mut(),
                sys::fi_addr_unspec(),
                tag,
                IGNORE,
                k as *mut c_void,
            )
        };
        if ret == 0 {
            self.in_flight += 1;
        } else {
            // Could not post now (queue full): forget it; later waits still fail cleanly.
            self.junk.remove(i);
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // Idempotent: an endpoint closed earlier has only null handles left.
        self.close();
    }
}
