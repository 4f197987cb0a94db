//! The vendor-neutral part of the device front end: validating a device collective
//! ([`DeviceCall`]) and running it through the staged or direct executor on any
//! [`Device`] (the blocking and enqueued entry points are in [`super::device_queue`]).

use super::communicator::{Communicator, RawCollective};
use crate::device::api::{DevSpan, Device};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::device::{execute_device, DeviceExecOptions, DeviceMemory, DeviceStaging};
use crate::exec::BlockLayout;
use crate::plan::{Buf, Collective};
use crate::transport::faults as stamps;
use crate::transport::Transport;

/// A validated device collective: the C-style call and what the plan executor needs.
#[derive(Clone, Copy)]
pub(crate) struct DeviceCall {
    pub(crate) raw: RawCollective,
    pub(crate) coll: Collective,
    pub(crate) op: ReduceOp,
    pub(crate) block_bytes: usize,
    pub(crate) send: (u64, usize, BlockLayout),
    pub(crate) recv: (u64, usize, BlockLayout),
    pub(crate) scratch: BlockLayout,
    pub(crate) count: usize,
}

impl Communicator {
    /// Validates a device collective and works out its plan inputs.
    pub(crate) fn device_call<T: Element>(
        &self,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<DeviceCall> {
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
        Ok(DeviceCall {
            raw: coll,
            coll: c,
            op,
            block_bytes,
            send: (send, in_len, inl),
            recv: (recv, out_len, outl),
            scratch: scl,
            count,
        })
    }

    /// Runs a validated device collective with `tag` through the staged (or direct)
    /// executor on `dev`'s stream, to completion, with `staging` as working space.
    ///
    /// # Safety
    /// As [`Communicator::collective_on`].
    pub(crate) unsafe fn run_staged<T: Element, D: Device>(
        &self,
        tr: &dyn Transport,
        dev: &D,
        call: &DeviceCall,
        tag: u32,
        staging: &mut Option<DeviceStaging<D>>,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let (c, op, block_bytes, scl, none) = (
            call.coll,
            call.op,
            call.block_bytes,
            call.scratch,
            BlockLayout::Uniform { count: 0, parts: 0 },
        );
        let (send, in_len, inl) = call.send;
        let (recv, out_len, outl) = call.recv;
        let plan = self.plan_of(c, block_bytes)?;
        // Only the scratch blocks the plan touches (the ring reduce-scatter: two).
        let scl = scl.first(plan.scratch_blocks());
        if !staging.as_ref().is_some_and(|st| st.serves(dev)) {
            *staging = None;
            *staging = Some(DeviceStaging::new(dev)?);
        }
        let st = staging
            .as_mut()
            .ok_or_else(|| Error::internal("device staging missing"))?;
        let uses_scratch = plan.phases.iter().flat_map(|ph| &ph.steps).any(|s| {
            s.span_lists()
                .into_iter()
                .flatten()
                .any(|sp| sp.buf == Buf::Scratch)
        });
        let scratch = if uses_scratch && scl.total() > 0 {
            (st.scratch(dev, scl.total() * es)?, scl)
        } else {
            (DevSpan::empty(dev.ordinal()), none)
        };
        let ord = dev.ordinal();
        let mem = DeviceMemory::new(
            (DevSpan::new(send, in_len * es, ord)?, inl),
            (DevSpan::new(recv, out_len * es, ord)?, outl),
            scratch,
            es,
        )?
        .with_pieces(plan.pieces);
        // Device collectives are stamped as such (number, dtype, op, counts, algorithm), so a
        // rank running a host collective at the same number fails instead of pairing.
        let detail = [
            in_len as u64,
            out_len as u64,
            plan.algorithm.code(),
            plan.nranks as u64,
        ];
        let fp = stamps::fingerprint(7, T::DTYPE as u32 + 1, op as u32 + 1, &detail);
        let opt = DeviceExecOptions {
            tag: stamps::stamp(tag, fp),
            timeout: self.timeout(),
            op,
            // The host path's rule: explicit PCCL_CHUNK_SIZE, else the tuner's piece.
            piece_bytes: self.piece_bytes_of(c, block_bytes),
            direct: self.config().device_direct,
        };
        execute_device::<T, D>(&plan, tr, dev, &mem, st, &opt)
    }
}
