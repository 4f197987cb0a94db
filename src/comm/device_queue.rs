//! Device collectives of any [`Device`] back end, blocking ([`Communicator::collective_on`])
//! or ordered on the caller's stream without blocking the caller
//! ([`Communicator::enqueue_on`], NCCL's semantics): the per-communicator device state, the
//! collective decision on the vendor's intra-node level, and the stream gate written once
//! for CUDA and HIP.

use super::communicator::{Communicator, RawCollective};
use super::device_events::EventPool;
use super::device_program::{coll_name, DevicePool, GateTickets, PinnedPool, Program};
use super::device_run::DeviceCall;
use super::nccl_level::NcclLevel;
use crate::config::DebugLevel;
use crate::device::api::{DevSpan, Device};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::exec::device::DeviceStaging;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One communicator's device working space for back end `D`, kept between calls.
pub(crate) struct DeviceState<D: Device> {
    /// Pinned staging and device scratch of the host-staged path.
    pub(crate) staging: Option<DeviceStaging<D>>,
    /// Whether the first device collective has decided on the vendor library's level yet.
    decided: bool,
    /// Another rank of this process on this rank's GPU (then collectives block), found with
    /// the level decision.
    thread_sharer: Option<usize>,
    /// Whether calls with a stream are queued (else they block): `PCCL_DEVICE_ASYNC`, else
    /// unless `thread_sharer`.
    queue: bool,
    /// The NCCL-shaped intra-node level (NCCL or RCCL), when in use.
    pub(crate) level: Option<NcclLevel<D>>,
    /// Stream programs (queued collectives): per device ordinal, PCCL's own stream and gate.
    queues: Vec<Queue<D>>,
    /// The pinned buffers of the programs' host sections.
    pool: PinnedPool<D>,
    /// The first error of a queued collective (sticky, as NCCL's asynchronous error).
    async_error: Arc<Mutex<Option<Error>>>,
}

/// What a program runs: a collective (it takes the communicator's next collective number,
/// and its first call decides the vendor level, collectively), or a batch of sends and
/// receives (neither: only the ranks it names take part).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Collective,
    P2p,
}

/// PCCL's stream of one device: the handle whose stream runs the programs, the gate they
/// wait on, its tickets, and the end event of the newest program.
struct Queue<D: Device> {
    ordinal: usize,
    own: Arc<D>,
    gate: D::Gate,
    tickets: Arc<GateTickets>,
    last_end: Option<Arc<D::Event>>,
    /// Free events of the device, reused from call to call.
    events: Arc<EventPool<D>>,
    /// Device scratch of the programs that run kernels.
    scratch: DevicePool<D>,
}

impl<D: Device> Drop for DeviceState<D> {
    fn drop(&mut self) {
        if lock(&self.async_error).is_some() {
            if let Some(level) = self.level.as_mut() {
                // A queued vendor call may still wait for a peer: abort, don't destroy.
                level.mark_broken("a queued collective failed");
            }
        }
        // Streams still waiting on a gate must pass it before its counter is freed (freeing
        // page-locked memory waits for the device's work).
        for q in &self.queues {
            q.tickets.release_all();
        }
    }
}

type DeviceGuard<'a> = std::sync::MutexGuard<'a, Option<Box<dyn std::any::Any + Send>>>;

/// The state of back end `D` in `slot`, made on first use; a usage error when the
/// communicator already ran collectives of another back end.
fn state_of<'a, D: Device>(
    slot: &'a mut DeviceGuard<'_>,
    errors: &Arc<Mutex<Option<Error>>>,
) -> Result<&'a mut DeviceState<D>> {
    if slot
        .as_ref()
        .and_then(|b| b.downcast_ref::<DeviceState<D>>())
        .is_none()
    {
        if slot.is_some() {
            return Err(Error::usage(format!(
                "this communicator already ran device collectives of another back end; {} \
                 collectives need a communicator of their own",
                D::VENDOR
            )));
        }
        **slot = Some(Box::new(DeviceState::<D> {
            staging: None,
            decided: false,
            thread_sharer: None,
            queue: true,
            level: None,
            queues: Vec::new(),
            pool: PinnedPool::default(),
            async_error: errors.clone(),
        }));
    }
    slot.as_mut()
        .and_then(|b| b.downcast_mut::<DeviceState<D>>())
        .ok_or_else(|| Error::internal("device state missing"))
}

/// Keeps `e` as the communicator's asynchronous error unless one is kept already; whether it
/// was the first.
fn first_error(errors: &Mutex<Option<Error>>, e: &Error) -> bool {
    let mut slot = lock(errors);
    let first = slot.is_none();
    slot.get_or_insert_with(|| e.clone());
    first
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Communicator {
    /// A collective on device memory of `dev`, any [`Device`] back end, blocking: returns
    /// once the device work is done, ordered after the work already queued on `dev`'s
    /// stream (and after the collectives this communicator queued before). `send` and `recv`
    /// are device addresses with NCCL's counts and in-place forms (see
    /// [`Communicator::raw_collective_device`] for CUDA's typed front end). The first call
    /// decides, collectively, whether the vendor's NCCL-shaped library (NCCL, RCCL) runs the
    /// intra-node level (`PCCL_NCCL`); otherwise it runs host-staged through the transport, or
    /// direct when the transport moves device memory and `PCCL_DEVICE_DIRECT` is set. Fails
    /// when an earlier queued collective failed ([`Communicator::enqueue_on`]).
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of `dev` valid for the element counts the
    /// collective implies, untouched by others until the call returns.
    pub unsafe fn collective_on<T: Element, D: Device>(
        &self,
        dev: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let call = self.device_call::<T>(coll, send, recv, count)?;
        self.decide_level(dev)?;
        self.wait_idle();
        self.earlier_error::<D>()?;
        self.after_queued(dev)?;
        let tag = self.take_tag();
        // SAFETY: forwarded from the caller.
        unsafe { self.run_device::<T, D>(dev, &call, tag) }
    }

    /// [`Communicator::collective_on`] ordered on `dev`'s stream without blocking the caller,
    /// as NCCL's calls are. The collective runs on PCCL's own stream of the device, after an
    /// event recorded on `dev`'s stream; `dev`'s stream then waits (on the device, an event)
    /// for the collective's end. Everything it does on the device is queued here, at the
    /// call: the progress thread only moves bytes between pinned host buffers and releases a
    /// stream gate (see `comm::device_program`), so no allocation or synchronisation made by
    /// any thread meanwhile can wait on it forever. Nothing here waits for the device.
    ///
    /// An error found when the call is made is returned; one met while running is kept and
    /// returned by every later device call of this communicator, and the stream stays held
    /// (work queued after the collective does not run on a wrong result) until the
    /// communicator is aborted or destroyed. On one rank the call is one device copy (none in
    /// place). A stream that is capturing a graph is refused (on every rank). With
    /// `PCCL_DEVICE_ASYNC=0` (or where the device cannot make a stream wait on host memory)
    /// the call blocks instead.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory valid for the counts the collective implies,
    /// untouched by other work until `dev`'s stream has passed the collective.
    pub unsafe fn enqueue_on<T: Element, D: Device>(
        &self,
        dev: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        let end = unsafe { self.enqueue_program::<T, D>(dev, coll, send, recv, count)? };
        if let Some(end) = end {
            dev.wait_on(&end)?;
        }
        Ok(())
    }

    /// [`Communicator::enqueue_on`] without making `dev`'s stream wait: the collective is
    /// ordered after the work queued on `dev`'s stream, and the returned [`DeviceWork`] makes
    /// any stream wait for its end ([`DeviceWork::wait_on`], torch's `work.wait()` with
    /// `async_op=True`), tells whether it ended, or waits for it on the host.
    ///
    /// # Safety
    /// As [`Communicator::enqueue_on`], until the work has ended.
    pub unsafe fn enqueue_async_on<T: Element, D: Device>(
        &self,
        dev: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<DeviceWork<D>> {
        // SAFETY: forwarded from the caller.
        let end = unsafe { self.enqueue_program::<T, D>(dev, coll, send, recv, count)? };
        let end = match end {
            Some(e) => e,
            None => {
                // Ran blocking, or on one rank on `dev`'s own stream: its end is there.
                let e = Arc::new(dev.new_event()?);
                dev.record(&e, None)?;
                e
            }
        };
        let (_, mut slot) = self.device_parts();
        let errors = state_of::<D>(&mut slot, &self.device_errors())?
            .async_error
            .clone();
        Ok(DeviceWork {
            end,
            errors,
            timeout: self.timeout(),
        })
    }

    /// Queues the stream program of a collective; its end event (None: it ran to completion
    /// already, or on one rank on `dev`'s stream itself).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_on`].
    unsafe fn enqueue_program<T: Element, D: Device>(
        &self,
        dev: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<Option<Arc<D::Event>>> {
        let name = coll_name(coll);
        self.refuse_capture(dev, name)?;
        let call = self.device_call::<T>(coll, send, recv, count)?;
        if self.size() == 1 {
            self.earlier_error::<D>()?;
            // SAFETY: forwarded from the caller.
            unsafe { self.one_rank::<T, D>(dev, &call)? };
            return Ok(None);
        }
        let blocking = |comm: &Communicator| {
            comm.wait_idle();
            comm.after_queued(dev)?;
            let tag = comm.take_tag();
            // SAFETY: forwarded from the caller.
            unsafe { comm.run_device::<T, D>(dev, &call, tag) }
        };
        let what = |seq: u32| format!("{name} #{seq} ({count} x {})", T::DTYPE);
        let path = |level: Option<&NcclLevel<D>>| match level {
            Some(l) => l.name_for(coll, count, std::mem::size_of::<T>()),
            None => "host-staged".to_string(),
        };
        // SAFETY: forwarded from the caller: the buffers stay valid until the program's end.
        let build = |prog: &mut Program<'_, D>, level: Option<&mut NcclLevel<D>>, own: &D, seq| unsafe {
            match level {
                Some(l) => l
                    .program::<T>(own, call.raw, send, recv, count, prog)
                    .and_then(|probe| prog.hold_until_checked(Some(probe), what(seq))),
                None => prog.collective::<T>(self.handle(), seq, call.raw, send, recv, count),
            }
        };
        self.queue_program(dev, Kind::Collective, &what, path, build, blocking)
    }

    /// Refuses, on every rank, a call made while `dev`'s stream is capturing a graph.
    pub(super) fn refuse_capture<D: Device>(&self, dev: &D, name: &str) -> Result<()> {
        if dev.is_capturing()? {
            return Err(self.refuse_call(
                name,
                Error::usage(format!(
                    "{name}: the {} stream is capturing a graph; PCCL's device collectives run \
                     their inter-rank part on the host and cannot be captured: issue it outside \
                     the capture (torch.cuda.graph / cudaStreamBeginCapture)",
                    D::VENDOR
                )),
            ));
        }
        Ok(())
    }

    /// Queues a program on PCCL's stream of `dev`'s device after `dev`'s stream: `build` adds
    /// its steps (given the vendor level, PCCL's stream and the collective number: 0 for
    /// point-to-point, which takes none), the job of its host part goes to the progress
    /// thread; `blocking` runs the call instead where it must not be queued. Returns the
    /// program's end event (None: it ran blocking).
    pub(super) fn queue_program<D: Device>(
        &self,
        dev: &D,
        kind: Kind,
        what: &dyn Fn(u32) -> String,
        path: impl FnOnce(Option<&NcclLevel<D>>) -> String,
        build: impl FnOnce(&mut Program<'_, D>, Option<&mut NcclLevel<D>>, &D, u32) -> Result<()>,
        blocking: impl FnOnce(&Communicator) -> Result<()>,
    ) -> Result<Option<Arc<D::Event>>> {
        match kind {
            Kind::Collective => self.decide_level(dev)?,
            Kind::P2p => self.decide_queueing_alone::<D>()?,
        }
        self.earlier_error::<D>()?;
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors())?;
        if !state.queue {
            drop(slot);
            return blocking(self).map(|()| None);
        }
        let qi = match state.queues.iter().position(|q| q.ordinal == dev.ordinal()) {
            Some(i) => i,
            None => match self.open_queue(dev) {
                Ok(q) => {
                    state.queues.push(q);
                    state.queues.len() - 1
                }
                Err(e) => {
                    drop(slot);
                    self.say(&format!("device collectives block the caller: {e}"));
                    return blocking(self).map(|()| None);
                }
            },
        };
        let DeviceState {
            level,
            queues,
            pool,
            async_error,
            ..
        } = state;
        let q = &mut queues[qi];
        let own = q.own.clone();
        // The caller's stream's point: PCCL's stream waits for it, then it is free again (a
        // wait takes the record current at the call).
        let ready = q.events.take(&*own)?;
        dev.record(&ready, None)?;
        own.wait_on(&ready)?;
        q.events.give(ready);
        let mut prog = Program::new(
            &*own,
            &mut q.gate,
            &q.tickets,
            (pool, &mut q.scratch),
            q.events.clone(),
        );
        let timeout = self.timeout();
        let seq = match kind {
            Kind::Collective => self.take_tag(),
            Kind::P2p => 0,
        };
        let what = what(seq);
        let refusable = level.is_none() && kind == Kind::Collective;
        let built = build(&mut prog, level.as_mut(), &own, seq);
        let host_bytes = prog.host_bytes;
        let ended = built.and_then(|()| {
            prog.end(
                timeout,
                self.rank(),
                async_error.clone(),
                own.clone(),
                self.tell_peers_on_failure(),
            )
        });
        let (end, job) = match ended {
            Ok(x) => x,
            Err(e) => {
                // Parts of the program may be queued with tickets nobody will release: keep
                // them shut and fail every later call.
                q.tickets.shut();
                let e = Error::new(e.kind(), format!("queueing {what}: {}", e.message()));
                let first = first_error(async_error, &e);
                if refusable {
                    self.refuse_seq(seq, &what, e.clone());
                }
                if first {
                    self.tell_peers_on_failure()(&e);
                }
                return Err(e);
            }
        };
        q.last_end = Some(end.clone());
        let tickets = q.tickets.clone();
        let errors = async_error.clone();
        let path = path(level.as_ref());
        drop(slot);
        if self.config().debug >= DebugLevel::Info && self.rank() == 0 {
            eprintln!(
                "PCCL INFO {what}: queued on PCCL's {} stream of device {} after the caller's \
                 stream ({path}; {host_bytes} bytes through pinned host memory)",
                D::VENDOR,
                dev.ordinal()
            );
        }
        if let Some(job) = job {
            let submitted = match kind {
                Kind::Collective => self.submit_job(job),
                Kind::P2p => self.submit_p2p_job(job),
            };
            if let Err(e) = submitted {
                // Nobody will run it: the stream stays held, every later call fails.
                tickets.shut();
                if first_error(&errors, &e) {
                    self.tell_peers_on_failure()(&e);
                }
                return Err(e);
            }
        }
        Ok(Some(end))
    }

    /// What a queued program does when its failure is this communicator's first
    /// asynchronous error: the communicator is unusable from then on (every later device call
    /// fails with that error, the streams stay held until abort), so its peers are told at
    /// once, as by an abort: their waits on this rank end naming it, instead of running out
    /// `PCCL_TIMEOUT` on a message it will never send (a receive matched to a send this rank
    /// now refuses). Local streams are not released (that takes [`Communicator::abort`]).
    fn tell_peers_on_failure(&self) -> super::device_program::OnFail {
        let transport = self.inner_transport();
        Arc::new(move |e: &Error| {
            transport.abort(&format!("its queued device work failed: {}", e.message()));
        })
    }

    /// PCCL's stream of `dev`'s device: a handle with a stream of its own, and a gate. Made
    /// before any stream of this communicator waits on anything.
    fn open_queue<D: Device>(&self, dev: &D) -> Result<Queue<D>> {
        dev.bind()?;
        let own = dev.open_own()?;
        let gate = own.new_gate()?;
        let tickets = Arc::new(GateTickets::new(D::gate_releaser(&gate)));
        let t = tickets.clone();
        self.on_abort(Box::new(move || t.release_all()));
        Ok(Queue {
            ordinal: dev.ordinal(),
            own: Arc::new(own),
            gate,
            tickets,
            last_end: None,
            events: Arc::default(),
            scratch: DevicePool::default(),
        })
    }

    /// Makes `dev`'s stream wait for the collectives queued on PCCL's stream of its device
    /// (a blocking collective shares their scratch and buffers).
    pub(super) fn after_queued<D: Device>(&self, dev: &D) -> Result<()> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors())?;
        if let Some(end) = state
            .queues
            .iter()
            .find(|q| q.ordinal == dev.ordinal())
            .and_then(|q| q.last_end.as_ref())
        {
            dev.wait_on(end)?;
        }
        Ok(())
    }

    /// A collective of one rank on `dev`'s stream: one device copy out of place, nothing in
    /// place (an average over one rank is the value itself).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_on`].
    unsafe fn one_rank<T: Element, D: Device>(&self, dev: &D, call: &DeviceCall) -> Result<()> {
        let (send, in_len, _) = call.send;
        let (recv, out_len, _) = call.recv;
        let es = std::mem::size_of::<T>();
        let bytes = in_len.min(out_len) * es;
        if bytes == 0 || send == recv {
            return Ok(());
        }
        let ord = dev.ordinal();
        // SAFETY: both ranges are device memory of `dev` valid for `bytes` (the caller's
        // promise, checked not to partly overlap by `device_call`).
        unsafe {
            dev.copy_dtod(
                DevSpan::new(recv, bytes, ord)?,
                DevSpan::new(send, bytes, ord)?,
            )
        }
    }

    /// Prints `msg` at `PCCL_DEBUG=INFO`.
    fn say(&self, msg: &str) {
        if self.config().debug >= DebugLevel::Info {
            eprintln!("PCCL INFO rank {}: {msg}", self.rank());
        }
    }

    /// The error a queued collective met, if any (then every later device call fails).
    pub(super) fn earlier_error<D: Device>(&self) -> Result<()> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors())?;
        let first = lock(&state.async_error);
        match first.as_ref() {
            Some(e) => Err(Error::new(
                e.kind(),
                format!("an earlier queued collective failed: {}", e.message()),
            )),
            None => Ok(()),
        }
    }

    /// On the first device collective, decides (collectively) whether the vendor's library
    /// runs the intra-node level. Runs on the caller's thread: the decision takes host
    /// collectives (once per communicator).
    fn decide_level<D: Device>(&self, dev: &D) -> Result<()> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors())?;
        if !state.decided {
            self.wait_idle();
            state.thread_sharer = self.thread_sharer(dev)?;
            // Read once, not on every call.
            state.queue = match std::env::var("PCCL_DEVICE_ASYNC").as_deref().map(str::trim) {
                Ok("0") => false,
                Ok("1") => true,
                _ => state.thread_sharer.is_none(),
            };
            state.level = NcclLevel::setup(self, dev)?;
            state.decided = true;
        }
        Ok(())
    }

    /// Before the first device collective decided it, whether point-to-point calls queue,
    /// decided by this rank alone (point-to-point is not collective): `PCCL_DEVICE_ASYNC`,
    /// else queued unless the ranks are threads of one process (which may share a GPU:
    /// see [`Communicator::thread_sharer`]).
    fn decide_queueing_alone<D: Device>(&self) -> Result<()> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors())?;
        if !state.decided {
            state.queue = match std::env::var("PCCL_DEVICE_ASYNC").as_deref().map(str::trim) {
                Ok("0") => false,
                Ok("1") => true,
                _ => self.transport_name() != "threads",
            };
        }
        Ok(())
    }

    /// Collectively: another rank of this process whose GPU has this rank's UUID, if any.
    /// Such ranks block instead of queueing: under CUDA's implicit synchronisation one
    /// rank's allocation orders the other's later program behind its own pending
    /// collective, which waits for that program (processes sharing a GPU have contexts of
    /// their own and queue).
    fn thread_sharer<D: Device>(&self, dev: &D) -> Result<Option<usize>> {
        let (rank, p) = (self.rank(), self.size());
        let node = self.node_key();
        let uuid = dev.uuid().ok();
        let u = uuid.unwrap_or([0; 16]);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let mine = [
            u64::from(uuid.is_some()),
            word(&u[..8]),
            word(&u[8..]),
            u64::from(std::process::id()),
            node,
        ];
        let mut all = vec![0u64; 5 * p];
        self.all_gather(&mine, &mut all)?;
        let sharer = uuid.and((0..p).find(|&r| r != rank && all[5 * r..5 * r + 5] == mine));
        if let Some(r) = sharer {
            self.say(&format!(
                "device collectives block the caller: rank {r} of this process uses the same \
                 GPU (ranks of one process on one GPU cannot queue: docs/DEVICE.md)"
            ));
        }
        Ok(sharer)
    }

    /// Runs a validated device collective with `tag`, on `dev`'s stream, to completion.
    ///
    /// # Safety
    /// As [`Communicator::collective_on`].
    unsafe fn run_device<T: Element, D: Device>(
        &self,
        dev: &D,
        call: &DeviceCall,
        tag: u32,
    ) -> Result<()> {
        let (tr, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors())?;
        if let Some(level) = state.level.as_mut() {
            // The level reads the communicator's timeout at every call (set_timeout).
            // SAFETY: forwarded from the caller.
            return unsafe {
                level.run::<T>(
                    dev,
                    call.raw,
                    call.send.0,
                    call.recv.0,
                    call.count,
                    self.timeout(),
                )
            };
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.run_staged::<T, D>(tr, dev, call, tag, &mut state.staging) }
    }

    /// What runs the device collectives of back end `D` on this communicator, for reports:
    /// `None` before the first one or when they run host-staged (the plan's algorithm then
    /// names it); else the vendor level and the inter-node algorithm, e.g. `rccl-level` or
    /// `nccl-level+rd`, for `coll` of `count` elements of `T`.
    pub fn device_level_name<T: Element, D: Device>(
        &self,
        coll: RawCollective,
        count: usize,
    ) -> Option<String> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot, &self.device_errors()).ok()?;
        state
            .level
            .as_ref()
            .map(|l| l.name_for(coll, count, std::mem::size_of::<T>()))
    }
}

/// A collective queued with [`Communicator::enqueue_async_on`]: its end event on PCCL's
/// stream and the communicator's asynchronous error.
pub struct DeviceWork<D: Device> {
    end: Arc<D::Event>,
    errors: Arc<Mutex<Option<Error>>>,
    timeout: Duration,
}

impl<D: Device> std::fmt::Debug for DeviceWork<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWork")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<D: Device> DeviceWork<D> {
    /// The error of a failed queued collective of the communicator, if any.
    fn failed(&self) -> Result<()> {
        match lock(&self.errors).as_ref() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Makes `dev`'s stream wait (on the device) for the collective's end; an error, and no
    /// wait, when a queued collective of the communicator failed.
    pub fn wait_on(&self, dev: &D) -> Result<()> {
        self.failed()?;
        dev.wait_on(&self.end)
    }

    /// Whether the collective ended (its output is ready); an error when it, or an earlier
    /// queued collective, failed.
    pub fn is_completed(&self, dev: &D) -> Result<bool> {
        self.failed()?;
        dev.event_done(&self.end)
    }

    /// Waits on the host until the collective ended: an error when it failed (a stuck
    /// collective fails within the communicator's timeout), or when it has not ended within
    /// twice that and a second (from this call: a watchdog behind the collective's own).
    pub fn synchronize(&self, dev: &D) -> Result<()> {
        let t0 = Instant::now();
        let limit = self.timeout * 2 + Duration::from_secs(1);
        loop {
            if self.is_completed(dev)? {
                return Ok(());
            }
            if t0.elapsed() > limit {
                return Err(Error::timeout(format!(
                    "a queued {} collective did not end within {limit:?} (twice the \
                     communicator's timeout and a second: PCCL_TIMEOUT or set_timeout sets it)",
                    D::VENDOR,
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
