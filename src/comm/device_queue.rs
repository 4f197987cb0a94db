//! Device collectives of any [`Device`] back end, blocking ([`Communicator::collective_on`])
//! or ordered on the caller's stream without blocking the caller
//! ([`Communicator::enqueue_on`], NCCL's semantics): the per-communicator device state, the
//! collective decision on the vendor's intra-node level, and the stream gate written once
//! for CUDA and HIP.

use super::communicator::{Communicator, RawCollective};
use super::device_run::DeviceCall;
use super::nccl_level::NcclLevel;
use crate::config::DebugLevel;
use crate::device::api::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::exec::device::DeviceStaging;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One communicator's device working space for back end `D`, kept between calls.
pub(crate) struct DeviceState<D: Device> {
    /// Pinned staging and device scratch of the host-staged path.
    pub(crate) staging: Option<DeviceStaging<D>>,
    /// Whether the first device collective has decided on the vendor library's level yet.
    decided: bool,
    /// Whether another rank of the communicator uses this rank's GPU (equal UUIDs), found
    /// with the level decision: its collectives then block instead of gating the stream.
    gpu_shared: bool,
    /// The NCCL-shaped intra-node level (NCCL or RCCL), when in use.
    pub(crate) level: Option<NcclLevel<D>>,
    /// Stream-ordered (enqueued) collectives: per device ordinal, the handle on PCCL's own
    /// stream they run on and the gate the callers' streams wait on.
    queues: Vec<(usize, Arc<D>, D::Gate)>,
    /// The first error of an enqueued collective (sticky, as NCCL's asynchronous error).
    async_error: Arc<Mutex<Option<Error>>>,
    /// Shapes (collective, dtype, count, GPU) run once already: their staging, scratch and
    /// vendor buffers exist. A collective is enqueued only then: the first run of a shape
    /// blocks, because allocating page-locked memory while a caller's stream waits on a gate
    /// can serialise the device behind that stream and never return.
    warm: HashSet<(u8, u64, DType, usize, usize)>,
}

fn shape_key<T: Element>(
    coll: RawCollective,
    count: usize,
    ordinal: usize,
) -> (u8, u64, DType, usize, usize) {
    let (kind, arg) = match coll {
        RawCollective::AllGather => (0, 0),
        RawCollective::ReduceScatter(op) => (1, op as u64),
        RawCollective::AllReduce(op) => (2, op as u64),
        RawCollective::Broadcast(root) => (3, root as u64),
    };
    (kind, arg, T::DTYPE, count, ordinal)
}

type DeviceGuard<'a> = std::sync::MutexGuard<'a, Option<Box<dyn std::any::Any + Send>>>;

/// The state of back end `D` in `slot`, made on first use; a usage error when the
/// communicator already ran collectives of another back end.
fn state_of<'a, D: Device>(slot: &'a mut DeviceGuard<'_>) -> Result<&'a mut DeviceState<D>> {
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
            gpu_shared: false,
            level: None,
            queues: Vec::new(),
            async_error: Arc::new(Mutex::new(None)),
            warm: HashSet::new(),
        }));
    }
    slot.as_mut()
        .and_then(|b| b.downcast_mut::<DeviceState<D>>())
        .ok_or_else(|| Error::internal("device state missing"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Communicator {
    /// A collective on device memory of `dev`, any [`Device`] back end, blocking: returns
    /// once the device work is done, ordered after the work already queued on `dev`'s
    /// stream. `send` and `recv` are device addresses with NCCL's counts and in-place forms
    /// (see [`Communicator::raw_collective_device`] for CUDA's typed front end). The first
    /// call decides, collectively, whether the vendor's NCCL-shaped library (NCCL, RCCL)
    /// runs the intra-node level (`PCCL_NCCL`); otherwise it runs host-staged through the
    /// transport, or direct when the transport moves device memory and `PCCL_DEVICE_DIRECT`
    /// is set. Fails when an earlier enqueued collective failed ([`Communicator::enqueue_on`]).
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
        let tag = self.take_tag();
        // SAFETY: forwarded from the caller.
        unsafe { self.run_device::<T, D>(dev, &call, tag) }
    }

    /// [`Communicator::collective_on`] ordered on `dev`'s stream without blocking the caller,
    /// as NCCL's calls are: the caller's stream waits (on the device, through the vendor's
    /// stream gate, [`Device::Gate`]) until the collective is done, while the communicator's
    /// progress thread runs it on PCCL's own stream once the work queued before it on `dev`'s
    /// stream has finished. Enqueued and blocking collectives of one communicator run in
    /// issue order.
    ///
    /// An error found when the call is made is returned; one met while running is kept and
    /// returned by every later device call of this communicator (the caller's stream is
    /// released either way). The first collective of each shape (collective, dtype, count)
    /// blocks, sizing the buffers; so does every call where the device cannot make a stream
    /// wait on host memory, with `PCCL_DEVICE_ASYNC=0`, and on thread-ranks (several ranks of
    /// one process) unless `PCCL_DEVICE_ASYNC=1`.
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
        let call = self.device_call::<T>(coll, send, recv, count)?;
        let gpu_shared = self.decide_level(dev)?;
        // Enqueueing makes the caller's stream wait on the host: device calls that
        // synchronise the context (page-locked allocations, stream creation) made by another
        // rank of the same process while that rank's progress depends on this one could then
        // wait forever, so thread-ranks sharing a process block unless asked
        // (PCCL_DEVICE_ASYNC=1). Ranks of different processes sharing one GPU block too:
        // FSDP2 with 2 processes on one H200 hung on the gates (an enqueued job's copy stream
        // never finished; which wait closed the cycle is not established: docs/DEVICE.md).
        let enqueue = match std::env::var("PCCL_DEVICE_ASYNC").as_deref().map(str::trim) {
            Ok("0") => false,
            Ok("1") => true,
            _ => self.transport_name() != "threads" && !gpu_shared,
        };
        self.earlier_error::<D>()?;
        let blocking = |comm: &Communicator| {
            comm.wait_idle();
            let tag = comm.take_tag();
            // SAFETY: forwarded from the caller.
            unsafe { comm.run_device::<T, D>(dev, &call, tag) }
        };
        if !enqueue {
            return blocking(self);
        }
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot)?;
        if state
            .warm
            .insert(shape_key::<T>(coll, count, dev.ordinal()))
        {
            // First of its shape: run it now, sizing every buffer it needs.
            drop(slot);
            return blocking(self);
        }
        dev.bind()?;
        let qi = match state.queues.iter().position(|q| q.0 == dev.ordinal()) {
            Some(i) => i,
            None => {
                // Made before any stream is held: creating a stream may synchronise the
                // device, which must not wait for a gated stream.
                let made = dev.open_own().and_then(|own| {
                    let gate = own.new_gate()?;
                    Ok((own, gate))
                });
                match made {
                    Ok((own, gate)) => {
                        state.queues.push((dev.ordinal(), Arc::new(own), gate));
                        state.queues.len() - 1
                    }
                    Err(e) => {
                        drop(slot);
                        return self.block_instead(e, blocking);
                    }
                }
            }
        };
        let ready = dev.new_event()?;
        dev.record(&ready, None)?;
        let (_, own, gate) = &mut state.queues[qi];
        let own = own.clone();
        let ticket = match dev.gate_hold(gate) {
            Ok(t) => t,
            Err(e) => {
                drop(slot);
                return self.block_instead(e, blocking);
            }
        };
        let release = D::gate_releaser(gate);
        let errors = state.async_error.clone();
        drop(slot);
        let tag = self.take_tag();
        let comm = self.handle();
        let job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // Read when the job starts: a set_timeout made meanwhile applies.
                wait_event(&*own, &ready, comm.timeout(), comm.rank())?;
                // SAFETY: the caller keeps the buffers valid until its stream passed the
                // gate, which is released only below, after the collective finished.
                unsafe { comm.run_device::<T, D>(&own, &call, tag) }
            }))
            .unwrap_or_else(|_| Err(Error::internal("a device collective panicked")));
            if let Err(e) = r {
                eprintln!(
                    "PCCL WARN rank {}: enqueued {} collective failed: {e}",
                    comm.rank(),
                    D::VENDOR
                );
                lock(&errors).get_or_insert(e);
            }
            release.release(ticket);
            drop(comm);
        });
        if let Err(e) = self.submit_job(job) {
            // Nobody will run it: let the stream go and report.
            release.release(ticket);
            return Err(e);
        }
        Ok(())
    }

    /// Runs a collective blocking after the stream gate could not be used (`why`).
    fn block_instead(
        &self,
        why: Error,
        blocking: impl FnOnce(&Communicator) -> Result<()>,
    ) -> Result<()> {
        if self.config().debug >= DebugLevel::Info {
            eprintln!("PCCL INFO device collectives block the caller: {why}");
        }
        blocking(self)
    }

    /// The error an enqueued collective met, if any (then every later device call fails).
    fn earlier_error<D: Device>(&self) -> Result<()> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot)?;
        let first = lock(&state.async_error);
        match first.as_ref() {
            Some(e) => Err(Error::new(
                e.kind(),
                format!("an earlier enqueued collective failed: {}", e.message()),
            )),
            None => Ok(()),
        }
    }

    /// On the first device collective, decides (collectively) whether the vendor's library
    /// runs the intra-node level, and learns whether another rank uses this rank's GPU (the
    /// answer). Runs on the caller's thread: the decision takes host collectives.
    fn decide_level<D: Device>(&self, dev: &D) -> Result<bool> {
        let (_, mut slot) = self.device_parts();
        let state = state_of::<D>(&mut slot)?;
        if !state.decided {
            self.wait_idle();
            state.gpu_shared = self.gpu_sharer(dev)?.is_some();
            state.level = NcclLevel::setup(self, dev)?;
            state.decided = true;
        }
        Ok(state.gpu_shared)
    }

    /// Collectively: the first other rank whose GPU has this rank's UUID, if any (`None`
    /// also where a UUID cannot be read). Printed at `PCCL_DEBUG=INFO`.
    fn gpu_sharer<D: Device>(&self, dev: &D) -> Result<Option<usize>> {
        let (rank, p) = (self.rank(), self.size());
        let uuid = dev.uuid().ok();
        let u = uuid.unwrap_or([0; 16]);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let mine = [u64::from(uuid.is_some()), word(&u[..8]), word(&u[8..])];
        let mut all = vec![0u64; 3 * p];
        self.all_gather(&mine, &mut all)?;
        let sharer = uuid.and((0..p).find(|&r| r != rank && all[3 * r..3 * r + 3] == mine));
        if let Some(r) = sharer {
            if self.config().debug >= DebugLevel::Info {
                eprintln!(
                    "PCCL INFO rank {rank}: device collectives block the caller (no stream \
                     gate): rank {r} uses the same GPU; PCCL_DEVICE_ASYNC=1 queues them anyway"
                );
            }
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
        let state = state_of::<D>(&mut slot)?;
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
        let state = state_of::<D>(&mut slot).ok()?;
        state
            .level
            .as_ref()
            .map(|l| l.name_for(coll, count, std::mem::size_of::<T>()))
    }
}

/// Waits, polling, until `ev` completed; a timeout error naming `rank` after `timeout`.
fn wait_event<D: Device>(dev: &D, ev: &D::Event, timeout: Duration, rank: usize) -> Result<()> {
    let t0 = Instant::now();
    let mut spins = 0u32;
    loop {
        if dev.event_done(ev)? {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(Error::timeout(format!(
                "rank {rank}: the work queued on the caller's {} stream before a device \
                 collective did not finish within {timeout:?} (PCCL_TIMEOUT or set_timeout sets \
                 the limit)",
                D::VENDOR
            )));
        }
        spins += 1;
        if spins < 200 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}
