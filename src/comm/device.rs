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
use super::nccl_level::NcclLevel;
use crate::device::cuda::CudaDevice;
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::device::{execute_device, DeviceExecOptions, DeviceMemory, DeviceStaging};
use crate::exec::BlockLayout;
use crate::plan::{Buf, Collective, Step};
use cudarc::driver::{DevicePtr, DevicePtrMut};

/// The device front end's working space of one communicator, kept between calls.
#[derive(Default)]
struct DeviceState {
    /// Pinned staging and device scratch of the host-staged path.
    staging: Option<DeviceStaging>,
    /// Whether the first device collective has decided on NCCL yet.
    nccl_decided: bool,
    /// The two-level NCCL path, when in use.
    nccl: Option<NcclLevel>,
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
        let p = self.size();
        let es = std::mem::size_of::<T>();
        let mul = |a: usize, b: usize| {
            a.checked_mul(b)
                .ok_or_else(|| Error::invalid(format!("count {a} x {b} overflows")))
        };
        let (in_len, out_len) = match coll {
            RawCollective::AllGather => (count, mul(count, p)?),
            RawCollective::ReduceScatter(_) => (mul(count, p)?, count),
            RawCollective::AllReduce(_) | RawCollective::Broadcast(_) => (count, count),
        };
        mul(in_len.max(out_len), es)?;
        let needs_send = match coll {
            RawCollective::Broadcast(root) => root == self.rank(),
            _ => true,
        };
        if (needs_send && in_len > 0 && send == 0) || (out_len > 0 && recv == 0) {
            return Err(Error::invalid(
                "a device pointer is NULL but the count is above zero",
            ));
        }
        if (needs_send && in_len > 0 && send % es as u64 != 0)
            || (out_len > 0 && recv % es as u64 != 0)
        {
            return Err(Error::invalid(format!(
                "device buffers of dtype {} must be aligned to {es} bytes",
                T::DTYPE
            )));
        }
        let (s0, s1) = (send, send + (in_len * es) as u64);
        let (r0, r1) = (recv, recv + (out_len * es) as u64);
        let overlap = needs_send && in_len > 0 && out_len > 0 && s0 < r1 && r0 < s1;
        let rank_off = (self.rank() * count * es) as u64;
        let inplace = match coll {
            RawCollective::AllGather => s0 == r0 + rank_off,
            RawCollective::ReduceScatter(_) => r0 == s0 + rank_off,
            RawCollective::AllReduce(_) | RawCollective::Broadcast(_) => s0 == r0,
        };
        if overlap && !inplace {
            return Err(Error::invalid(
                "device send and receive buffers overlap without being the in-place form",
            ));
        }
        let uni = |count, parts| BlockLayout::Uniform { count, parts };
        let none = uni(0, 0);
        let (c, op, block_bytes, inl, outl, scl) = match coll {
            RawCollective::AllGather => (
                Collective::AllGather,
                ReduceOp::Sum,
                count * es,
                uni(count, 1),
                uni(count, p),
                none,
            ),
            RawCollective::ReduceScatter(op) => {
                T::DTYPE.check_op(op)?;
                (
                    Collective::ReduceScatter {
                        average: op == ReduceOp::Avg,
                    },
                    op,
                    count * es,
                    uni(count, p),
                    uni(count, 1),
                    uni(count, p),
                )
            }
            RawCollective::AllReduce(op) => {
                T::DTYPE.check_op(op)?;
                let lay = BlockLayout::Balanced {
                    total: count,
                    parts: p,
                };
                (
                    Collective::AllReduce {
                        average: op == ReduceOp::Avg,
                    },
                    op,
                    count.div_ceil(p) * es,
                    lay,
                    lay,
                    lay,
                )
            }
            RawCollective::Broadcast(root) => {
                if root >= p {
                    return Err(Error::invalid(format!(
                        "broadcast: root {root} is not a rank of this communicator of {p}"
                    )));
                }
                (
                    Collective::Broadcast { root },
                    ReduceOp::Sum,
                    count * es,
                    uni(count, 1),
                    uni(count, 1),
                    none,
                )
            }
        };
        let send = if needs_send { send } else { recv };
        let (tr, mut slot) = self.device_parts();
        if slot
            .as_ref()
            .and_then(|b| b.downcast_ref::<DeviceState>())
            .is_none()
        {
            *slot = Some(Box::new(DeviceState::default()));
        }
        let state = slot
            .as_mut()
            .and_then(|b| b.downcast_mut::<DeviceState>())
            .ok_or_else(|| Error::internal("device state missing"))?;
        if !state.nccl_decided {
            self.wait_idle();
            state.nccl = NcclLevel::setup(self, dev)?;
            state.nccl_decided = true;
        }
        if let Some(level) = state.nccl.as_mut() {
            self.wait_idle();
            return level.run::<T>(dev, coll, send, recv, count);
        }
        let (tag, plan) = self.next_collective(c, block_bytes)?;
        if !state.staging.as_ref().is_some_and(|st| st.serves(dev)) {
            state.staging = None;
            state.staging = Some(DeviceStaging::new(dev)?);
        }
        let st = state
            .staging
            .as_mut()
            .ok_or_else(|| Error::internal("device staging missing"))?;
        let uses_scratch = plan.phases.iter().flat_map(|ph| &ph.steps).any(|s| {
            let spans: Vec<_> = match s {
                Step::Send { src, .. } => src.iter().collect(),
                Step::Recv { dst, .. } | Step::Average { dst } => dst.iter().collect(),
                Step::RecvReduce { dst, with, .. } => dst.iter().chain(with).collect(),
                Step::Copy { src, dst } => src.iter().chain(dst).collect(),
            };
            spans.iter().any(|sp| sp.buf == Buf::Scratch)
        });
        let scratch = if uses_scratch && scl.total() > 0 {
            (st.scratch(dev, scl.total() * es)?, scl.total(), scl)
        } else {
            (0, 0, none)
        };
        let mem = DeviceMemory::from_raw((send, in_len, inl), (recv, out_len, outl), scratch, es)?;
        let opt = DeviceExecOptions {
            tag,
            timeout: self.config().timeout,
            op,
            piece_bytes: self.config().chunk_bytes,
        };
        execute_device::<T>(&plan, tr, dev, &mem, st, &opt)
    }
}
