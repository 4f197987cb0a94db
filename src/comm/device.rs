//! Collectives on GPU memory: the device front end of [`Communicator`].
//!
//! The buffers are device memory of one [`CudaDevice`] handle (cudarc `CudaSlice<u8>`s or
//! views of them, holding elements of `T`, as the rest of `device::cuda` takes them; or raw
//! device addresses in [`Communicator::raw_collective_device`]). They run the plans of the
//! host path (same tags, same tuner choice and plan cache, so host and device collectives
//! interleave on one communicator) on the device executor ([`crate::exec::device`]), which
//! stages messages through pinned host memory and reduces on the device. Every rank must use
//! the same `chunk_bytes` setting (the piece size of the staged messages).
//!
//! The calls are blocking: they return once the collective's device work is done, ordered
//! after the work already queued on the handle's stream.

use super::communicator::{Communicator, RawCollective};
use super::device_run::DeviceCall;
use super::nccl_level::NcclLevel;
use crate::config::DebugLevel;
use crate::device::cuda::{CudaDevice, StreamGate};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::device::DeviceStaging;
use crate::transport::Transport;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The device front end's working space of one communicator, kept between calls.
#[derive(Default)]
struct DeviceState {
    /// Pinned staging and device scratch of the host-staged path.
    staging: Option<DeviceStaging<CudaDevice>>,
    /// Whether the first device collective has decided on NCCL yet.
    nccl_decided: bool,
    /// The two-level NCCL path, when in use.
    nccl: Option<NcclLevel<CudaDevice>>,
    /// Stream-ordered (enqueued) collectives: per device ordinal, the handle on PCCL's own
    /// stream they run on and the gate the callers' streams wait on.
    queues: Vec<(usize, CudaDevice, StreamGate)>,
    /// The first error of an enqueued collective (sticky, as NCCL's asynchronous error).
    async_error: Arc<Mutex<Option<Error>>>,
    /// Shapes (collective, dtype, count, GPU) run once already: their staging, scratch and
    /// NCCL buffers exist. A collective is enqueued only then: the first run of a shape
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

fn state_of<'a>(slot: &'a mut DeviceGuard<'_>) -> Result<&'a mut DeviceState> {
    slot.as_mut()
        .and_then(|b| b.downcast_mut::<DeviceState>())
        .ok_or_else(|| Error::internal("device state missing"))
}

fn elems_of<T: Element>(bytes: usize, what: &str) -> Result<usize> {
    let es = std::mem::size_of::<T>();
    if bytes % es != 0 {
        return Err(Error::invalid(format!(
            "{what}: device buffer of {bytes} bytes is not a whole number of {} elements",
            T::DTYPE
        )));
    }
    Ok(bytes / es)
}

fn count_of(n: usize, p: usize, what: &str) -> Result<usize> {
    if n % p != 0 {
        return Err(Error::invalid(format!(
            "{what}: buffer of {n} elements is not {p} equal blocks (one per rank)"
        )));
    }
    Ok(n / p)
}

impl Communicator {
    /// [`Communicator::all_gather`] on device buffers of `dev`: `input` holds `count`
    /// elements of `T`, `output` `count * size()`.
    pub fn all_gather_device<T: Element>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
    ) -> Result<()> {
        let count = elems_of::<T>(input.len(), "all_gather_device")?;
        let out = elems_of::<T>(output.len(), "all_gather_device")?;
        if out != count * self.size() {
            return Err(Error::invalid(format!(
                "all_gather_device: output holds {out} elements but {} ranks x {count} needs {}",
                self.size(),
                count * self.size()
            )));
        }
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: both buffers are borrowed for the whole blocking call and distinct borrows.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllGather, s, r, count) }
    }

    /// [`Communicator::reduce_scatter`] on device buffers: `input` holds `count * size()`
    /// elements, `output` `count`.
    pub fn reduce_scatter_device<T: Element>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(input.len(), "reduce_scatter_device")?;
        let count = elems_of::<T>(output.len(), "reduce_scatter_device")?;
        if n != count * self.size() {
            return Err(Error::invalid(format!(
                "reduce_scatter_device: input holds {n} elements but {} ranks x {count} needs {}",
                self.size(),
                count * self.size()
            )));
        }
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: as in `all_gather_device`.
        unsafe {
            self.raw_collective_device::<T>(dev, RawCollective::ReduceScatter(op), s, r, count)
        }
    }

    /// [`Communicator::all_reduce`] on device buffers of equal length.
    pub fn all_reduce_device<T: Element>(
        &self,
        dev: &CudaDevice,
        input: &impl DevicePtr<u8>,
        output: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(input.len(), "all_reduce_device")?;
        if output.len() != input.len() {
            return Err(Error::invalid(format!(
                "all_reduce_device: input has {} bytes but output has {}; they must match",
                input.len(),
                output.len()
            )));
        }
        let (s, _gs) = input.device_ptr(dev.stream());
        let (r, _gr) = output.device_ptr_mut(dev.stream());
        // SAFETY: as in `all_gather_device`.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllReduce(op), s, r, n) }
    }

    /// In-place [`Communicator::all_reduce_device`].
    pub fn all_reduce_device_in_place<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "all_reduce_device_in_place")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        // SAFETY: `buf` is borrowed for the whole call; send == recv is the in-place form.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllReduce(op), b, b, n) }
    }

    /// In-place reduce-scatter on a device buffer of `count * size()` elements: the result
    /// lands in block `rank()`.
    pub fn reduce_scatter_device_in_place<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
        op: ReduceOp,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "reduce_scatter_device_in_place")?;
        let count = count_of(n, self.size(), "reduce_scatter_device_in_place")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        let r = b + (self.rank() * count * std::mem::size_of::<T>()) as u64;
        // SAFETY: `buf` is borrowed for the whole call; recv = send + rank*count is the
        // in-place form.
        unsafe {
            self.raw_collective_device::<T>(dev, RawCollective::ReduceScatter(op), b, r, count)
        }
    }

    /// In-place all-gather on a device buffer of `count * size()` elements whose block
    /// `rank()` holds this rank's share.
    pub fn all_gather_device_in_place<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "all_gather_device_in_place")?;
        let count = count_of(n, self.size(), "all_gather_device_in_place")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        let s = b + (self.rank() * count * std::mem::size_of::<T>()) as u64;
        // SAFETY: `buf` is borrowed for the whole call; send = recv + rank*count is the
        // in-place form.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::AllGather, s, b, count) }
    }

    /// [`Communicator::broadcast`] of a device buffer.
    pub fn broadcast_device<T: Element>(
        &self,
        dev: &CudaDevice,
        buf: &mut impl DevicePtrMut<u8>,
        root: usize,
    ) -> Result<()> {
        let n = elems_of::<T>(buf.len(), "broadcast_device")?;
        let (b, _g) = buf.device_ptr_mut(dev.stream());
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.raw_collective_device::<T>(dev, RawCollective::Broadcast(root), b, b, n) }
    }

    /// [`Communicator::raw_collective`] on device addresses of `dev`'s context, with NCCL's
    /// count conventions and in-place forms.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory valid for the element counts the collective
    /// implies, untouched by others until the call returns.
    pub unsafe fn raw_collective_device<T: Element>(
        &self,
        dev: &CudaDevice,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let call = self.device_call::<T>(coll, send, recv, count)?;
        self.decide_nccl(dev)?;
        self.wait_idle();
        self.earlier_error()?;
        let tag = self.take_tag();
        self.run_device::<T>(dev, &call, tag)
    }

    /// The error an enqueued collective met, if any (then every later device call fails).
    fn earlier_error(&self) -> Result<()> {
        let (_, mut slot) = self.device_state()?;
        let state = state_of(&mut slot)?;
        let first = lock(&state.async_error);
        match first.as_ref() {
            Some(e) => Err(Error::new(
                e.kind(),
                format!("an earlier enqueued collective failed: {}", e.message()),
            )),
            None => Ok(()),
        }
    }

    /// [`Communicator::raw_collective_device`] ordered on `dev`'s stream without blocking the
    /// caller, as NCCL's calls are: the caller's stream waits (on the device, through a
    /// [`StreamGate`]) until the collective is done, while the communicator's progress thread
    /// runs it on PCCL's own stream once the work queued before it on `dev`'s stream has
    /// finished. Enqueued and blocking collectives of one communicator run in issue order.
    ///
    /// An error found when the call is made is returned; one met while running is kept and
    /// returned by every later device call of this communicator (the caller's stream is
    /// released either way). The first collective of each shape (collective, dtype, count)
    /// blocks, sizing the buffers; so does every call where the driver cannot make a stream
    /// wait on host memory, with `PCCL_DEVICE_ASYNC=0`, and on thread-ranks (several ranks of
    /// one process) unless `PCCL_DEVICE_ASYNC=1`.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory valid for the counts the collective implies,
    /// untouched by other work until `dev`'s stream has passed the collective.
    pub unsafe fn enqueue_collective_device<T: Element>(
        &self,
        dev: &CudaDevice,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let call = self.device_call::<T>(coll, send, recv, count)?;
        self.decide_nccl(dev)?;
        // Enqueueing makes the caller's stream wait on the host: CUDA calls that synchronise
        // the context (page-locked allocations, stream creation) made by another rank of the
        // same process while that rank's progress depends on this one could then wait
        // forever, so thread-ranks sharing a process block unless asked (PCCL_DEVICE_ASYNC=1).
        let enqueue = match std::env::var("PCCL_DEVICE_ASYNC").as_deref().map(str::trim) {
            Ok("0") => false,
            Ok("1") => true,
            _ => self.transport_name() != "threads",
        };
        self.earlier_error()?;
        if !enqueue {
            self.wait_idle();
            let tag = self.take_tag();
            return self.run_device::<T>(dev, &call, tag);
        }
        let (_, mut slot) = self.device_state()?;
        let state = state_of(&mut slot)?;
        if state
            .warm
            .insert(shape_key::<T>(coll, count, dev.ordinal()))
        {
            // First of its shape: run it now, sizing every buffer it needs.
            drop(slot);
            self.wait_idle();
            let tag = self.take_tag();
            return self.run_device::<T>(dev, &call, tag);
        }
        dev.bind()?;
        let qi = match state.queues.iter().position(|q| q.0 == dev.ordinal()) {
            Some(i) => i,
            None => {
                // Made before any stream is held: creating a stream may synchronise the
                // context, which must not wait for a gated stream.
                let own = CudaDevice::open(dev.ordinal())?;
                let gate = StreamGate::new(&own)?;
                state.queues.push((dev.ordinal(), own, gate));
                state.queues.len() - 1
            }
        };
        let ready = dev.new_event()?;
        ready
            .record(dev.stream())
            .map_err(|e| Error::system(format!("CUDA event record failed: {e}")))?;
        let (_, own, gate) = &mut state.queues[qi];
        let own = own.clone();
        let ticket = match gate.hold(dev.stream()) {
            Ok(t) => t,
            Err(e) => {
                drop(slot);
                if self.config().debug >= DebugLevel::Info {
                    eprintln!("PCCL INFO device collectives block the caller: {e}");
                }
                self.wait_idle();
                let tag = self.take_tag();
                return self.run_device::<T>(dev, &call, tag);
            }
        };
        let release = gate.releaser();
        let errors = state.async_error.clone();
        drop(slot);
        let tag = self.take_tag();
        let comm = self.handle();
        let timeout = self.timeout();
        let job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                wait_event(&ready, timeout)?;
                // SAFETY: the caller keeps the buffers valid until its stream passed the
                // gate, which is released only below, after the collective finished.
                unsafe { comm.run_device::<T>(&own, &call, tag) }
            }))
            .unwrap_or_else(|_| Err(Error::internal("a device collective panicked")));
            if let Err(e) = r {
                eprintln!("PCCL WARN enqueued device collective failed: {e}");
                lock(&errors).get_or_insert(e);
            }
            release.release(ticket);
            drop(comm);
        });
        if let Err(e) = self.submit_job(job) {
            // Nobody will run it: let the stream go and report.
            gate_release_on_error(self, dev.ordinal(), ticket);
            return Err(e);
        }
        Ok(())
    }

    /// Locks the device state, creating it on first use.
    fn device_state(&self) -> Result<(&dyn Transport, DeviceGuard<'_>)> {
        let (tr, mut slot) = self.device_parts();
        if slot
            .as_ref()
            .and_then(|b| b.downcast_ref::<DeviceState>())
            .is_none()
        {
            *slot = Some(Box::new(DeviceState::default()));
        }
        Ok((tr, slot))
    }

    /// On the first device collective, decides (collectively) whether NCCL runs the
    /// intra-node level. Runs on the caller's thread: the decision takes host collectives.
    fn decide_nccl(&self, dev: &CudaDevice) -> Result<()> {
        let (_, mut slot) = self.device_state()?;
        let state = state_of(&mut slot)?;
        if !state.nccl_decided {
            self.wait_idle();
            state.nccl = NcclLevel::setup(self, dev)?;
            state.nccl_decided = true;
        }
        Ok(())
    }

    /// Runs a validated device collective with `tag`, on `dev`'s stream, to completion.
    ///
    /// # Safety
    /// As [`Communicator::raw_collective_device`].
    unsafe fn run_device<T: Element>(
        &self,
        dev: &CudaDevice,
        call: &DeviceCall,
        tag: u32,
    ) -> Result<()> {
        let (tr, mut slot) = self.device_state()?;
        let state = state_of(&mut slot)?;
        if let Some(level) = state.nccl.as_mut() {
            return level.run::<T>(dev, call.raw, call.send.0, call.recv.0, call.count);
        }
        self.run_staged::<T, CudaDevice>(tr, dev, call, tag, &mut state.staging)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Releases `ticket` of the gate of device `ordinal` (after a job could not be queued).
fn gate_release_on_error(comm: &Communicator, ordinal: usize, ticket: u32) {
    if let Ok((_, mut slot)) = comm.device_state() {
        if let Ok(state) = state_of(&mut slot) {
            if let Some((_, _, g)) = state.queues.iter().find(|q| q.0 == ordinal) {
                g.releaser().release(ticket);
            }
        }
    }
}

/// Waits, polling, until `ev` completed; a timeout error after `timeout`.
fn wait_event(ev: &cudarc::driver::CudaEvent, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    let mut spins = 0u32;
    loop {
        match ev.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Error::system(format!("CUDA event query failed: {e}"))),
        }
        if t0.elapsed() > timeout {
            return Err(Error::timeout(format!(
                "the work queued before a device collective did not finish within {timeout:?} \
                 (PCCL_TIMEOUT sets the limit)"
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
