//! Device collectives as **stream programs**: everything a queued collective does on the GPU
//! is queued, on the caller's thread and at the call, on PCCL's own stream of the device; the
//! progress thread then only waits for events, moves bytes between pinned host buffers over
//! the transport, and releases tickets of a stream gate. It makes no device call that queues
//! work, allocates or synchronises.
//!
//! Why: a stream that waits on a host-written value (a gate) closes a cycle as soon as work
//! the host still has to queue is needed to release it. CUDA orders work queued after a
//! page-locked or device allocation (any thread of the process: torch's caching allocator,
//! FSDP2's unshard buffers) behind all work queued before it ("implicit synchronisation" in
//! the CUDA programming guide), and `cudaFree` waits for the whole device. A progress thread
//! that queued its device-to-host copies after such a call saw them wait behind the gated
//! stream, which waited for the progress thread: the FSDP2 hang of 2026-11-26 (two ranks on
//! one H200; `tests/rocm_fake_program.rs` reproduces the rule on the fake runtime). Queued
//! up front, the device work a gate's release depends on always precedes the gate.
//!
//! A program on PCCL's stream `own` of one device:
//! ```text
//! wait(ready: recorded on the caller's stream)
//! [vendor-library steps (NCCL/RCCL) on own]
//! host section:  copy device -> pinned; record(staged); wait(gate >= t); copy pinned -> device
//! [vendor-library steps]
//! [record(done); wait(gate >= t_end)]        (when a vendor library ran: its failure holds)
//! record(end)                                (the caller's stream, or a Work, waits on it)
//! ```
//! The job on the progress thread, per host section: waits for `staged`, runs the host
//! collective on the pinned buffer (PCCL's plans and host reductions, the collective number
//! taken at the call), releases `t`; then waits for `done` watching the vendor library's
//! asynchronous error, and releases `t_end`. A failure releases nothing: the gate stays shut
//! (and every later ticket with it) until the communicator is aborted or destroyed, so work
//! that depends on the output never runs on wrong data; the error is kept and returned by
//! every later call (NCCL's asynchronous error).

use super::communicator::{
    AllToAllBlocks, Communicator, Dir, RawCollective, RawRooted, StampedP2p,
};
use super::device_events::EventPool;
use crate::device::api::{DevSpan, Device, GateReleaser, PinnedHost};
use crate::device::nccl_abi::AsyncErrorProbe;
use crate::dtype::Element;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tickets of one stream gate: taken in program order on the caller's thread, released
/// in the same order by the progress thread, never after a failure (until
/// [`GateTickets::release_all`]: abort or destruction).
pub(crate) struct GateTickets {
    releaser: GateReleaser,
    state: Mutex<TicketState>,
}

#[derive(Default)]
struct TicketState {
    taken: u32,
    released: u32,
    shut: bool,
}

// SAFETY: the releaser writes the gate's counter; every write happens under `state`'s lock,
// and the gate (owned next to this in the device state) outlives it.
unsafe impl Sync for GateTickets {}

impl GateTickets {
    pub(crate) fn new(releaser: GateReleaser) -> GateTickets {
        GateTickets {
            releaser,
            state: Mutex::new(TicketState::default()),
        }
    }

    /// Notes that ticket `t` was taken (the newest).
    fn taken(&self, t: u32) {
        lock(&self.state).taken = t;
    }

    /// Lets the streams waiting for `t` and earlier tickets go on, unless the gate was shut.
    pub(crate) fn release(&self, t: u32) {
        let mut s = lock(&self.state);
        if !s.shut {
            self.releaser.release(t);
            s.released = t;
        }
    }

    /// Keeps every taken ticket unreleased (a collective failed).
    pub(crate) fn shut(&self) {
        lock(&self.state).shut = true;
    }

    /// Releases every ticket taken and shuts the gate for good: the communicator is aborted
    /// or destroyed (as after `ncclCommAbort`, work behind it runs on whatever the buffers
    /// hold; the error was returned first).
    pub(crate) fn release_all(&self) {
        let mut s = lock(&self.state);
        self.releaser.release(s.taken);
        s.released = s.taken;
        s.shut = true;
    }
}

/// A buffer of a pool and the end event of the last program that used it.
struct PoolEntry<D: Device, M> {
    mem: M,
    until: Option<Arc<D::Event>>,
    taken: bool,
}

/// Buffers of stream programs (`M`: page-locked host memory, or device memory), reused once
/// the program that used one has ended. Sizes are rounded up to powers of two so that a new
/// shape rarely allocates.
pub(crate) struct Pool<D: Device, M> {
    entries: Vec<PoolEntry<D, M>>,
}

/// The page-locked buffers of host sections.
pub(crate) type PinnedPool<D> = Pool<D, <D as Device>::Pinned>;

/// The device scratch of programs that run kernels (one pool per device: a queue's).
pub(crate) type DevicePool<D> = Pool<D, <D as Device>::Memory>;

impl<D: Device, M> Default for Pool<D, M> {
    fn default() -> Self {
        Pool {
            entries: Vec::new(),
        }
    }
}

impl<D: Device, M> Pool<D, M> {
    /// A free buffer of at least `bytes` (`len`: a buffer's size; `alloc`: a new one of the
    /// size given): its index and the buffer.
    fn acquire(
        &mut self,
        dev: &D,
        bytes: usize,
        len: impl Fn(&M) -> usize,
        alloc: impl FnOnce(usize) -> Result<M>,
    ) -> Result<(usize, &mut M)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.entries.iter_mut().enumerate() {
            if e.taken || len(&e.mem) < bytes {
                continue;
            }
            if let Some(until) = &e.until {
                if !dev.event_done(until)? {
                    continue;
                }
                e.until = None;
            }
            if best.is_none_or(|(_, l)| l > len(&e.mem)) {
                best = Some((i, len(&e.mem)));
            }
        }
        let i = match best {
            Some((i, _)) => i,
            None => {
                let size = bytes
                    .max(1 << 16)
                    .checked_next_power_of_two()
                    .unwrap_or(bytes);
                self.entries.push(PoolEntry {
                    mem: alloc(size)?,
                    until: None,
                    taken: false,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.taken = true;
        Ok((i, &mut e.mem))
    }

    /// Marks the buffers a program took as busy until its `end` event.
    fn settle(&mut self, taken: &[usize], end: &Arc<D::Event>) {
        for &i in taken {
            if let Some(e) = self.entries.get_mut(i) {
                e.taken = false;
                e.until = Some(end.clone());
            }
        }
    }
}

/// A device-to-host copy of a host section: source address, bytes, offset in the buffer.
pub(crate) type InCopy = (u64, usize, usize);

/// A host-to-device copy of a host section: offset in the buffer, destination, bytes.
pub(crate) type OutCopy = (usize, u64, usize);

/// What [`Program::end`] hands back: the end event, and the job of the host part.
type Ended<D> = (Arc<<D as Device>::Event>, Option<Box<dyn FnOnce() + Send>>);

/// The host part of a program: after `staged` completed, `run` moves the bytes (a host
/// collective on the pinned buffer), then ticket `ticket` lets the stream copy them back.
struct HostSection<D: Device> {
    staged: D::Event,
    ticket: u32,
    what: String,
    run: Box<dyn FnOnce() -> Result<()> + Send>,
    /// Tells the peers this rank will not run the section (an earlier one failed).
    refuse: Box<dyn FnOnce(Error) + Send>,
}

/// The end of a program whose vendor-library steps must succeed before the stream goes on.
struct Finish<D: Device> {
    done: D::Event,
    ticket: u32,
    probe: Option<AsyncErrorProbe>,
    what: String,
}

/// A program being queued on PCCL's stream of one device (see the module docs).
pub(crate) struct Program<'a, D: Device> {
    own: &'a D,
    events: Arc<EventPool<D>>,
    gate: &'a mut D::Gate,
    tickets: &'a Arc<GateTickets>,
    pool: &'a mut PinnedPool<D>,
    scratch: &'a mut DevicePool<D>,
    sections: Vec<HostSection<D>>,
    finish: Option<Finish<D>>,
    taken: Vec<usize>,
    scratch_taken: Vec<usize>,
    /// Host sections queued (for `PCCL_DEBUG=INFO`).
    pub(crate) host_bytes: usize,
}

/// A raw pointer moved into a job: the pinned buffer it points into lives in the pool of the
/// device state, which the job's communicator handle keeps alive, and is not reused before
/// the program's end event.
#[derive(Clone, Copy)]
struct HostPtr(*mut u8);
// SAFETY: see the type's docs; the job is the only user while the program runs.
unsafe impl Send for HostPtr {}

impl<'a, D: Device> Program<'a, D> {
    pub(crate) fn new(
        own: &'a D,
        gate: &'a mut D::Gate,
        tickets: &'a Arc<GateTickets>,
        (pool, scratch): (&'a mut PinnedPool<D>, &'a mut DevicePool<D>),
        events: Arc<EventPool<D>>,
    ) -> Self {
        Program {
            own,
            events,
            gate,
            tickets,
            pool,
            scratch,
            sections: Vec::new(),
            finish: None,
            taken: Vec::new(),
            scratch_taken: Vec::new(),
            host_bytes: 0,
        }
    }

    /// Queues `coll` (NCCL's counts and in-place forms, device buffers `send`/`recv`) as a
    /// host section run on `comm` as its collective `seq`: the input copied to a pinned
    /// buffer, the host collective in place there, the result copied to `recv`.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of the stream's device valid for the counts
    /// `coll` implies until the program's end event completed.
    pub(crate) unsafe fn collective<T: Element>(
        &mut self,
        comm: Communicator,
        seq: u32,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let (p, rank) = (comm.size(), comm.rank());
        let bytes = count * es;
        // What goes in, where it lands in the pinned buffer; what comes out.
        let (total, d2h, h2d): (usize, Option<InCopy>, (usize, usize)) = match coll {
            RawCollective::AllGather => {
                (p * bytes, Some((send, bytes, rank * bytes)), (0, p * bytes))
            }
            RawCollective::ReduceScatter(_) => {
                (p * bytes, Some((send, p * bytes, 0)), (rank * bytes, bytes))
            }
            RawCollective::AllReduce(_) => (bytes, Some((send, bytes, 0)), (0, bytes)),
            RawCollective::Broadcast(root) => (
                bytes,
                (root == rank).then_some((send, bytes, 0)),
                (0, bytes),
            ),
        };
        let what = format!("{} #{seq} ({count} x {})", coll_name(coll), T::DTYPE);
        let out = Some((h2d.0, recv, h2d.1));
        // SAFETY: forwarded from the caller.
        unsafe {
            self.seq_section(comm, seq, what, total, d2h, out, move |comm, b| {
                let b = b as *mut T;
                // The in-place form of `coll` in the pinned buffer: all-gather's block at
                // `rank`, reduce-scatter's result at block `rank`.
                let (s, r) = match coll {
                    RawCollective::AllGather => (b.add(rank * count) as *const T, b),
                    RawCollective::ReduceScatter(_) => (b as *const T, b.add(rank * count)),
                    _ => (b as *const T, b),
                };
                comm.host_collective_as::<T>(coll, s, r, count, seq)
            })
        }
    }

    /// Queues a rooted collective or all-to-all (NCCL's conventions, [`RawRooted`]) as a host
    /// section on `comm` as its collective `seq`, as [`Program::collective`] does: buffers a
    /// rank does not use (the receive buffer of a reduce or gather off the root, the send
    /// buffer of a scatter off the root) are neither read nor written.
    ///
    /// # Safety
    /// As [`Program::collective`], for the buffers `coll` uses on this rank.
    pub(crate) unsafe fn rooted<T: Element>(
        &mut self,
        comm: Communicator,
        seq: u32,
        coll: RawRooted,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let (p, rank) = (comm.size(), comm.rank());
        let bytes = count * es;
        // (pinned bytes, copy in, copy out (offset, bytes)), and the host call's form:
        // in place in the pinned buffer, `recv` at element `r_at` (None: no receive buffer).
        // The send buffer at element `s_at` (None: none), the receive buffer at `r_at`.
        type Form = (
            usize,
            Option<InCopy>,
            Option<(usize, usize)>,
            Option<usize>,
            Option<usize>,
        );
        let (total, d2h, h2d, s_at, r_at): Form = match coll {
            RawRooted::Reduce(_, root) => (
                bytes,
                Some((send, bytes, 0)),
                (rank == root).then_some((0, bytes)),
                Some(0),
                (rank == root).then_some(0),
            ),
            RawRooted::Gather(root) if rank == root => (
                p * bytes,
                Some((send, bytes, root * bytes)),
                Some((0, p * bytes)),
                Some(root * count),
                Some(0),
            ),
            RawRooted::Gather(_) => (bytes, Some((send, bytes, 0)), None, Some(0), None),
            RawRooted::Scatter(root) if rank == root => (
                p * bytes,
                Some((send, p * bytes, 0)),
                Some((root * bytes, bytes)),
                Some(0),
                Some(root * count),
            ),
            RawRooted::Scatter(_) => (bytes, None, Some((0, bytes)), None, Some(0)),
            RawRooted::AllToAll => (
                2 * p * bytes,
                Some((send, p * bytes, 0)),
                Some((p * bytes, p * bytes)),
                Some(0),
                Some(p * count),
            ),
        };
        let name = match coll {
            RawRooted::Reduce(..) => "reduce",
            RawRooted::Gather(_) => "gather",
            RawRooted::Scatter(_) => "scatter",
            RawRooted::AllToAll => "all_to_all",
        };
        let what = format!("{name} #{seq} ({count} x {})", T::DTYPE);
        let out = h2d.map(|(at, len)| (at, recv, len));
        // SAFETY: forwarded from the caller.
        unsafe {
            self.seq_section(comm, seq, what, total, d2h, out, move |comm, b| {
                let b = b as *mut T;
                let s = s_at.map_or(std::ptr::null(), |at| b.add(at) as *const T);
                let r = r_at.map_or(std::ptr::null_mut(), |at| b.add(at));
                comm.host_rooted_as::<T>(coll, s, r, count, seq)
            })
        }
    }

    /// Queues an uneven all-to-all of checked `blocks` (in elements) between device buffers
    /// `send` and `recv` as a host section on `comm` as its collective `seq`: the send extent
    /// copied to a pinned buffer, the exchange there, and each received block copied back
    /// alone (the gaps between receive blocks are not written).
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of the stream's device holding every block
    /// `blocks` names, valid until the program's end event completed.
    pub(crate) unsafe fn all_to_all_v<T: Element>(
        &mut self,
        comm: Communicator,
        seq: u32,
        send: u64,
        recv: u64,
        blocks: AllToAllBlocks,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let extent = |v: &[(usize, usize)]| v.iter().map(|&(d, c)| (d + c) * es).max();
        let s_len = extent(&blocks.0).unwrap_or(0);
        let r_at = s_len.next_multiple_of(8);
        let r_len = extent(&blocks.1).unwrap_or(0);
        let d2h: Vec<InCopy> = (s_len > 0)
            .then_some((send, s_len, 0))
            .into_iter()
            .collect();
        let h2d: Vec<OutCopy> = blocks
            .1
            .iter()
            .filter(|&&(_, c)| c > 0)
            .map(|&(d, c)| (r_at + d * es, recv + (d * es) as u64, c * es))
            .collect();
        let what = format!("all_to_all_v #{seq} ({} x {})", r_len / es, T::DTYPE);
        let refuser = comm.handle();
        let what2 = what.clone();
        let refuse = Box::new(move |e: Error| refuser.refuse_seq(seq, &what2, e));
        let run = Box::new(move |b: *mut u8| {
            // SAFETY: the pinned buffer holds the send extent at 0 and the receive extent at
            // `r_at` (sized below), not reused before the program's end.
            unsafe {
                comm.host_all_to_all_v_as::<T>(b as *const T, b.add(r_at) as *mut T, blocks, seq)
            }
        });
        // SAFETY: forwarded from the caller.
        unsafe { self.section(what, r_at + r_len, &d2h, &h2d, run, refuse) }
    }

    /// Queues a batch of sends and receives between device buffers (the batch's operations
    /// name device addresses; its message numbers were taken at the call) as a host
    /// section: the sends' buffers copied to a pinned buffer, the batch run there by the
    /// transport, the received bytes copied back. Dropped unrun (an earlier collective
    /// failed), the batch gives its receive turns back.
    ///
    /// # Safety
    /// Every operation's address must be device memory of the stream's device valid for its
    /// count, until the program's end event completed.
    pub(crate) unsafe fn p2p(&mut self, batch: StampedP2p, what: String) -> Result<()> {
        let mut at = 0usize;
        let mut offsets = Vec::with_capacity(batch.ops().len());
        let (mut d2h, mut h2d): (Vec<InCopy>, Vec<OutCopy>) = (Vec::new(), Vec::new());
        for op in batch.ops() {
            let bytes = op.count * op.dtype.size();
            offsets.push(at);
            if bytes > 0 {
                match op.dir {
                    Dir::Send => d2h.push((op.addr as u64, bytes, at)),
                    Dir::Recv => h2d.push((at, op.addr as u64, bytes)),
                }
            }
            at += bytes.next_multiple_of(8);
        }
        let run = Box::new(move |b: *mut u8| {
            let addrs: Vec<usize> = offsets.iter().map(|&o| b as usize + o).collect();
            // SAFETY: operation i's bytes lie at offset i of the pinned buffer (sized
            // below), not reused before the program's end.
            unsafe { batch.run_at(&addrs) }
        });
        // The peers' receives from this rank end by their deadline (point-to-point messages
        // cannot be refused as a collective is).
        let refuse = Box::new(|_: Error| {});
        // SAFETY: forwarded from the caller.
        unsafe { self.section(what, at, &d2h, &h2d, run, refuse) }
    }

    /// [`Program::section`] for collective `seq` of `comm`: `run(comm, buffer)`, and a
    /// refusal of `seq` to the peers when it will not run.
    ///
    /// # Safety
    /// As [`Program::section`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn seq_section(
        &mut self,
        comm: Communicator,
        seq: u32,
        what: String,
        total: usize,
        d2h: Option<InCopy>,
        h2d: Option<OutCopy>,
        run: impl FnOnce(&Communicator, *mut u8) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let refuser = comm.handle();
        let what2 = what.clone();
        let refuse = Box::new(move |e: Error| refuser.refuse_seq(seq, &what2, e));
        let run = Box::new(move |b: *mut u8| run(&comm, b));
        let (d2h, h2d): (Vec<InCopy>, Vec<OutCopy>) =
            (d2h.into_iter().collect(), h2d.into_iter().collect());
        // SAFETY: forwarded from the caller.
        unsafe { self.section(what, total, &d2h, &h2d, run, refuse) }
    }

    /// Queues one host section: each of `d2h` (device address, bytes, offset) copied into a
    /// pinned buffer of `total` bytes, an event, a ticket, each of `h2d` (offset, device
    /// address, bytes) copied back; `run(buffer)` runs on the progress thread between the
    /// two, or `refuse` when it will not run.
    ///
    /// # Safety
    /// The device ranges must be memory of the stream's device, valid until the program's
    /// end event completed; `run` may touch only the `total` bytes of the buffer.
    pub(crate) unsafe fn section(
        &mut self,
        what: String,
        total: usize,
        d2h: &[InCopy],
        h2d: &[OutCopy],
        run: Box<dyn FnOnce(*mut u8) -> Result<()> + Send>,
        refuse: Box<dyn FnOnce(Error) + Send>,
    ) -> Result<()> {
        let ord = self.own.ordinal();
        let (slot, base) = self.pool.acquire(
            self.own,
            total.max(1),
            |m| m.len(),
            |size| self.own.pinned(size),
        )?;
        let base = base.as_mut_ptr();
        self.taken.push(slot);
        let own = self.own;
        for &(src, len, at) in d2h {
            debug_assert!(at + len <= total);
            // SAFETY: `src` holds `len` bytes of the device (caller's promise); the pinned
            // buffer holds `total >= at + len` bytes and is not reused before the end event.
            unsafe { own.copy_dtoh(None, base.add(at), DevSpan::new(src, len, ord)?)? };
        }
        let staged = self.events.take(own)?;
        own.record(&staged, None)?;
        let ticket = own.gate_hold(self.gate)?;
        self.tickets.taken(ticket);
        for &(from, dst, len) in h2d {
            debug_assert!(from + len <= total);
            // SAFETY: `dst` holds `len` bytes (caller's promise); the pinned bytes are
            // written by the host section before the ticket this copy waits behind is
            // released.
            unsafe { own.copy_htod(DevSpan::new(dst, len, ord)?, base.add(from))? };
        }
        self.host_bytes += total;
        let ptr = HostPtr(base);
        let run = Box::new(move || {
            let b = ptr;
            run(b.0)
        });
        self.sections.push(HostSection {
            staged,
            ticket,
            what,
            run,
            refuse,
        });
        Ok(())
    }

    /// Device memory of at least `bytes` on the stream's device (not zeroed), this program's
    /// until its end event: scratch for kernels the program queues (`own()`'s stream).
    pub(crate) fn device_scratch(&mut self, bytes: usize) -> Result<DevSpan> {
        let own = self.own;
        let (slot, mem) = self.scratch.acquire(
            own,
            bytes.max(1),
            |m| own.span_of(m).len(),
            |size| own.alloc_zeroed(size),
        )?;
        let span = own.span_of(mem).sub(0, bytes)?;
        self.scratch_taken.push(slot);
        Ok(span)
    }

    /// PCCL's handle of the stream's device: kernels and copies it queues run on the
    /// program's stream.
    pub(crate) fn own(&self) -> &D {
        self.own
    }

    /// Ends the vendor-library steps: the stream then waits until the progress thread saw
    /// them complete without an asynchronous error (`probe`), so a failed call never
    /// releases the work behind it.
    pub(crate) fn hold_until_checked(
        &mut self,
        probe: Option<AsyncErrorProbe>,
        what: String,
    ) -> Result<()> {
        let done = self.events.take(self.own)?;
        self.own.record(&done, None)?;
        let ticket = self.own.gate_hold(self.gate)?;
        self.tickets.taken(ticket);
        self.finish = Some(Finish {
            done,
            ticket,
            probe,
            what,
        });
        Ok(())
    }

    /// Records the program's end event and hands back the job that runs its host part (None
    /// when it has none).
    ///
    /// `on_fail` runs once, on the progress thread, when this program's failure is the
    /// communicator's first asynchronous error (the communicator tells its peers).
    pub(crate) fn end(
        self,
        timeout: Duration,
        rank: usize,
        errors: Arc<Mutex<Option<Error>>>,
        own: Arc<D>,
        on_fail: OnFail,
    ) -> Result<Ended<D>> {
        let end = Arc::new(self.own.new_event()?);
        self.own.record(&end, None)?;
        self.pool.settle(&self.taken, &end);
        self.scratch.settle(&self.scratch_taken, &end);
        if self.sections.is_empty() && self.finish.is_none() {
            return Ok((end, None));
        }
        let tickets = self.tickets.clone();
        let (sections, finish, events) = (self.sections, self.finish, self.events);
        let job = Box::new(move || {
            run_job::<D>(
                &own,
                sections,
                finish,
                (&tickets, &errors, &*on_fail, &events),
                timeout,
                rank,
            );
        });
        Ok((end, Some(job)))
    }
}

/// What a program's job does with the communicator's first asynchronous error: tell the
/// peers (see [`Program::end`]).
pub(crate) type OnFail = Arc<dyn Fn(&Error) + Send + Sync>;

/// What a program's job shares with its communicator: the gate's tickets, the asynchronous
/// error, what to do on the first one, the device's free events.
type Shared<'a, D> = (
    &'a GateTickets,
    &'a Mutex<Option<Error>>,
    &'a (dyn Fn(&Error) + Sync),
    &'a EventPool<D>,
);

/// The progress thread's part of one program.
fn run_job<D: Device>(
    own: &D,
    sections: Vec<HostSection<D>>,
    finish: Option<Finish<D>>,
    (tickets, errors, on_fail, events): Shared<'_, D>,
    timeout: Duration,
    rank: usize,
) {
    let fail = |e: Error| {
        tickets.shut();
        eprintln!(
            "PCCL WARN rank {rank}: queued {} collective failed: {e}",
            D::VENDOR
        );
        let first = {
            let mut slot = lock(errors);
            let first = slot.is_none();
            slot.get_or_insert(e.clone());
            first
        };
        if first {
            on_fail(&e);
        }
    };
    for s in sections {
        if let Some(earlier) = lock(errors).clone() {
            (s.refuse)(Error::new(
                earlier.kind(),
                format!("an earlier queued collective failed: {}", earlier.message()),
            ));
            continue;
        }
        let staged = poll(own, &s.staged, None, timeout, || {
            format!(
                "rank {rank}: the device work queued before it (on the caller's {} stream, or \
                 the copy of its input) did not finish within {timeout:?} (PCCL_TIMEOUT or \
                 set_timeout sets the limit)",
                D::VENDOR
            )
        });
        let r = match staged {
            // The peers learn at once that this rank will not run it.
            Err(e) => {
                (s.refuse)(e.clone());
                Err(e)
            }
            Ok(()) => {
                events.give(s.staged);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(s.run))
                    .unwrap_or_else(|_| Err(Error::internal("a queued device collective panicked")))
            }
        };
        match r {
            Ok(()) => tickets.release(s.ticket),
            Err(e) => fail(Error::new(e.kind(), format!("{}: {}", s.what, e.message()))),
        }
    }
    if let Some(f) = finish {
        if lock(errors).is_some() {
            return;
        }
        let r = poll(own, &f.done, f.probe.as_ref(), timeout, || {
            format!(
                "rank {rank}: {} did not complete within {timeout:?} (a peer is stuck or gone; \
                 PCCL_TIMEOUT or set_timeout sets the limit)",
                f.what
            )
        });
        match r {
            Ok(()) => {
                events.give(f.done);
                tickets.release(f.ticket);
            }
            Err(e) => fail(Error::new(e.kind(), format!("{}: {}", f.what, e.message()))),
        }
    }
}

/// Waits, polling, until `ev` completed (checking `probe` too); a timeout error with
/// `late()`'s message after `timeout`.
fn poll<D: Device>(
    own: &D,
    ev: &D::Event,
    probe: Option<&AsyncErrorProbe>,
    timeout: Duration,
    late: impl Fn() -> String,
) -> Result<()> {
    let t0 = Instant::now();
    let mut spins = 0u32;
    loop {
        let done = own.event_done(ev)?;
        // Checked after the event too: a vendor call that ended because a peer failed
        // completes without its result.
        if let Some(p) = probe {
            p.check()?;
        }
        if done {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(Error::timeout(late()));
        }
        spins += 1;
        if spins < 200 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// The C-style name of a collective, for messages.
pub(crate) fn coll_name(coll: RawCollective) -> &'static str {
    match coll {
        RawCollective::AllGather => "all_gather",
        RawCollective::ReduceScatter(_) => "reduce_scatter",
        RawCollective::AllReduce(_) => "all_reduce",
        RawCollective::Broadcast(_) => "broadcast",
    }
}
