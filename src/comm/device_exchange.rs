//! Rooted collectives, all-to-all(v) and point-to-point on device memory, queued on the
//! caller's stream as the collectives are (see `comm::device_queue`): their bytes go through
//! pinned host memory and PCCL's plans (or the transport's point-to-point) on the progress
//! thread, and no call blocks the host.

use super::communicator::{Communicator, P2pOp, RawRooted};
use super::device_program::Program;
use super::device_queue::Kind;
use super::nccl_level::NcclLevel;
use crate::device::api::{DevSpan, Device};
use crate::dtype::Element;
use crate::error::{Error, Result};

impl Communicator {
    /// A rooted collective or all-to-all on device memory (NCCL's conventions, [`RawRooted`]:
    /// `pcclReduce`, `pcclGather`, `pcclScatter`, `pcclAllToAll` with a stream), queued on
    /// `dev`'s stream as [`Communicator::enqueue_on`] queues a collective: the bytes go
    /// through pinned host memory and PCCL's plans on the progress thread. Buffers a rank does
    /// not use may be 0 (the receive buffer of a reduce or gather off the root, the send
    /// buffer of a scatter off the root).
    ///
    /// # Safety
    /// The buffers this rank uses must be device memory of `dev` valid for the counts the
    /// call implies, untouched by other work until `dev`'s stream has passed it.
    pub unsafe fn enqueue_rooted_on<T: Element, D: Device>(
        &self,
        dev: &D,
        coll: RawRooted,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let name = match coll {
            RawRooted::Reduce(..) => "reduce",
            RawRooted::Gather(_) => "gather",
            RawRooted::Scatter(_) => "scatter",
            RawRooted::AllToAll => "all_to_all",
        };
        self.refuse_capture(dev, name)?;
        // A bad argument fails every rank (the peers' part of this call is refused).
        let (s_len, r_len) = self
            .rooted_device_check::<T>(name, coll, send, recv, count)
            .map_err(|e| self.refuse_call(name, e))?;
        if self.size() == 1 {
            self.earlier_error::<D>()?;
            let bytes = s_len.min(r_len);
            if bytes > 0 && send != recv {
                let ord = dev.ordinal();
                // SAFETY: both ranges are device memory of `dev` valid for `bytes` (the
                // caller's promise; checked not to overlap).
                unsafe {
                    dev.copy_dtod(
                        DevSpan::new(recv, bytes, ord)?,
                        DevSpan::new(send, bytes, ord)?,
                    )?
                };
            }
            return Ok(());
        }
        let what = |seq: u32| format!("{name} #{seq} ({count} x {})", T::DTYPE);
        // SAFETY: forwarded from the caller.
        let build = |prog: &mut Program<'_, D>, _: Option<&mut NcclLevel<D>>, _: &D, seq| unsafe {
            prog.rooted::<T>(self.handle(), seq, coll, send, recv, count)
        };
        let blocking = |comm: &Communicator| {
            comm.wait_idle();
            comm.after_queued(dev)?;
            dev.synchronize()?;
            // Through host copies on the calling thread: the stream is idle, nothing queued.
            let ord = dev.ordinal();
            let mut s = vec![0u8; s_len];
            let mut r = vec![0u8; r_len];
            if s_len > 0 {
                // SAFETY: `send` holds `s_len` bytes of `dev` (caller's promise).
                unsafe { dev.copy_dtoh(None, s.as_mut_ptr(), DevSpan::new(send, s_len, ord)?)? };
                dev.synchronize()?;
            }
            let sp = if s_len > 0 {
                s.as_ptr() as *const T
            } else {
                std::ptr::null()
            };
            let rp = if r_len > 0 {
                r.as_mut_ptr() as *mut T
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: host buffers of the lengths the call implies, alive for the call.
            unsafe { comm.raw_rooted::<T>(coll, sp, rp, count)? };
            if r_len > 0 {
                // SAFETY: `recv` holds `r_len` bytes of `dev`; `r` lives until synchronised.
                unsafe { dev.copy_htod(DevSpan::new(recv, r_len, ord)?, r.as_ptr())? };
                dev.synchronize()?;
            }
            Ok(())
        };
        self.queue_staged(dev, Kind::Collective, &what, build, blocking)
    }

    /// Validates a device rooted call; the bytes read from `send` and written to `recv` on
    /// this rank.
    fn rooted_device_check<T: Element>(
        &self,
        name: &str,
        coll: RawRooted,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(usize, usize)> {
        let (p, rank) = (self.size(), self.rank());
        let es = std::mem::size_of::<T>();
        let mul = |a: usize, b: usize| {
            a.checked_mul(b)
                .ok_or_else(|| Error::invalid(format!("{name}: count {a} x {b} overflows")))
        };
        let root = match coll {
            RawRooted::Reduce(op, root) => {
                T::DTYPE.check_op(op)?;
                Some(root)
            }
            RawRooted::Gather(root) | RawRooted::Scatter(root) => Some(root),
            RawRooted::AllToAll => None,
        };
        if let Some(root) = root.filter(|&r| r >= p) {
            return Err(Error::invalid(format!(
                "{name}: root {root} is not a rank of this communicator of {p}"
            )));
        }
        let bytes = mul(count, es)?;
        let (s_len, r_len) = match coll {
            RawRooted::Reduce(_, root) => (bytes, if rank == root { bytes } else { 0 }),
            RawRooted::Gather(root) => (bytes, if rank == root { mul(p, bytes)? } else { 0 }),
            RawRooted::Scatter(root) => (if rank == root { mul(p, bytes)? } else { 0 }, bytes),
            RawRooted::AllToAll => (mul(p, bytes)?, mul(p, bytes)?),
        };
        if (s_len > 0 && send == 0) || (r_len > 0 && recv == 0) {
            return Err(Error::invalid(format!(
                "{name}: a device pointer this rank uses is NULL but the count is above zero"
            )));
        }
        if (s_len > 0 && send % es as u64 != 0) || (r_len > 0 && recv % es as u64 != 0) {
            return Err(Error::invalid(format!(
                "{name}: device buffers of dtype {} must be aligned to {es} bytes",
                T::DTYPE
            )));
        }
        let overlap = s_len > 0
            && r_len > 0
            && send < recv.saturating_add(r_len as u64)
            && recv < send.saturating_add(s_len as u64);
        let inplace = match coll {
            RawRooted::Reduce(..) => send == recv,
            RawRooted::Gather(root) => send == recv + (root * bytes) as u64,
            RawRooted::Scatter(root) => recv == send + (root * bytes) as u64,
            RawRooted::AllToAll => false,
        };
        if overlap && !inplace {
            return Err(Error::invalid(format!(
                "{name}: device send and receive buffers overlap without being the in-place form"
            )));
        }
        Ok((s_len, r_len))
    }

    /// An uneven all-to-all (MPI's `MPI_Alltoallv`, [`Communicator::all_to_all_v`]'s counts
    /// and displacements in elements) between device buffers of `dev`, queued on `dev`'s
    /// stream as [`Communicator::enqueue_rooted_on`] queues an all-to-all. A bad argument, or
    /// counts that disagree between ranks, fail the call on every rank before data moves (a
    /// disagreement found by the host part becomes the communicator's asynchronous error);
    /// only the receive blocks of `recv` are written.
    ///
    /// # Safety
    /// `send` must be device memory of `dev` holding every send block and `recv` every
    /// receive block, untouched by other work until `dev`'s stream has passed the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn enqueue_all_to_all_v_on<T: Element, D: Device>(
        &self,
        dev: &D,
        send: u64,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: u64,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let name = "all_to_all_v";
        self.refuse_capture(dev, name)?;
        let es = std::mem::size_of::<T>();
        let checked = self
            .all_to_all_v_blocks(send_counts, send_displs, recv_counts, recv_displs)
            .and_then(|blocks| {
                let extent = |v: &[(usize, usize)]| -> Result<u64> {
                    let n = v.iter().map(|&(d, c)| d + c).max().unwrap_or(0);
                    n.checked_mul(es)
                        .and_then(|b| u64::try_from(b).ok())
                        .ok_or_else(|| Error::invalid(format!("{name}: the blocks overflow")))
                };
                let (sb, rb) = (extent(&blocks.0)?, extent(&blocks.1)?);
                if (sb > 0 && send == 0) || (rb > 0 && recv == 0) {
                    return Err(Error::invalid(format!(
                        "{name}: a device pointer is NULL but its counts are above zero"
                    )));
                }
                if send % es as u64 != 0 || recv % es as u64 != 0 {
                    return Err(Error::invalid(format!(
                        "{name}: device buffers of dtype {} must be aligned to {es} bytes",
                        T::DTYPE
                    )));
                }
                if sb > 0
                    && rb > 0
                    && send < recv.saturating_add(rb)
                    && recv < send.saturating_add(sb)
                {
                    return Err(Error::invalid(format!(
                        "{name}: device send and receive buffers overlap (no in-place form)"
                    )));
                }
                Ok((blocks, sb as usize, rb as usize))
            });
        let (blocks, s_len, r_len) = checked.map_err(|e| self.refuse_call(name, e))?;
        if self.size() == 1 {
            self.earlier_error::<D>()?;
            let ((sd, sc), (rd, rc)) = (blocks.0[0], blocks.1[0]);
            if sc != rc {
                return Err(Error::invalid(format!(
                    "{name}: rank 0 sends {sc} elements to itself but receives {rc}"
                )));
            }
            if sc > 0 {
                let ord = dev.ordinal();
                // SAFETY: both blocks are device memory of `dev` (the caller's promise),
                // checked not to overlap.
                unsafe {
                    dev.copy_dtod(
                        DevSpan::new(recv + (rd * es) as u64, sc * es, ord)?,
                        DevSpan::new(send + (sd * es) as u64, sc * es, ord)?,
                    )?
                };
            }
            return Ok(());
        }
        let total: usize = blocks.1.iter().map(|&(_, c)| c).sum();
        let what = |seq: u32| format!("{name} #{seq} ({total} x {})", T::DTYPE);
        let for_program = blocks.clone();
        // SAFETY: forwarded from the caller.
        let build = |prog: &mut Program<'_, D>, _: Option<&mut NcclLevel<D>>, _: &D, seq| unsafe {
            prog.all_to_all_v::<T>(self.handle(), seq, send, recv, for_program)
        };
        let blocking = |comm: &Communicator| {
            comm.wait_idle();
            comm.after_queued(dev)?;
            dev.synchronize()?;
            let ord = dev.ordinal();
            // Host copies, 8-byte aligned for every dtype; the receive extent's gaps keep the
            // device's bytes (copied in first).
            let mut s = vec![0u64; s_len.div_ceil(8)];
            let mut r = vec![0u64; r_len.div_ceil(8)];
            // SAFETY: `send` and `recv` hold the extents (caller's promise); the host
            // vectors live until the stream is synchronised.
            unsafe {
                if s_len > 0 {
                    let span = DevSpan::new(send, s_len, ord)?;
                    dev.copy_dtoh(None, s.as_mut_ptr() as *mut u8, span)?;
                }
                if r_len > 0 {
                    let span = DevSpan::new(recv, r_len, ord)?;
                    dev.copy_dtoh(None, r.as_mut_ptr() as *mut u8, span)?;
                }
            }
            dev.synchronize()?;
            let split = |v: &[(usize, usize)]| -> (Vec<usize>, Vec<usize>) {
                (
                    v.iter().map(|b| b.1).collect(),
                    v.iter().map(|b| b.0).collect(),
                )
            };
            let ((sc, sd), (rc, rd)) = (split(&blocks.0), split(&blocks.1));
            // SAFETY: the host vectors hold the extents, aligned for T.
            unsafe {
                comm.raw_all_to_all_v(
                    s.as_ptr() as *const T,
                    &sc,
                    &sd,
                    r.as_mut_ptr() as *mut T,
                    &rc,
                    &rd,
                )?
            };
            if r_len > 0 {
                // SAFETY: `recv` holds `r_len` bytes of `dev`; `r` lives until synchronised.
                unsafe { dev.copy_htod(DevSpan::new(recv, r_len, ord)?, r.as_ptr() as *const u8)? };
                dev.synchronize()?;
            }
            Ok(())
        };
        self.queue_staged(dev, Kind::Collective, &what, build, blocking)
    }

    /// Sends and receives between device buffers of `dev` (NCCL's `ncclSend`/`ncclRecv`,
    /// inside a group or alone), queued on `dev`'s stream: the call returns at once, the
    /// stream goes on once every operation of the batch completed. Not collective: only the
    /// ranks named take part; each pair's messages match in issue order, with this rank's
    /// host sends and receives too (the numbers are taken at the call). As with NCCL, a
    /// send and a receive that depend on each other must be in one batch. A failure becomes
    /// the communicator's asynchronous error and keeps the stream held, as for a collective.
    /// Before a device collective decided it (collectively), a batch queues unless
    /// `PCCL_DEVICE_ASYNC=0` or the ranks are threads of one process (then it blocks).
    ///
    /// # Safety
    /// Each operation's `addr` must be device memory of `dev` valid for its count (read for a
    /// send, written for a receive), untouched by other work until `dev`'s stream has passed
    /// the batch.
    pub unsafe fn enqueue_p2p_on<D: Device>(&self, dev: &D, ops: &[P2pOp]) -> Result<()> {
        let name = if ops.len() == 1 {
            match ops[0].dir {
                super::communicator::Dir::Send => "send",
                super::communicator::Dir::Recv => "recv",
            }
        } else {
            "send/recv group"
        };
        if dev.is_capturing()? {
            return Err(Error::usage(format!(
                "{name}: the {} stream is capturing a graph; PCCL's device sends and receives \
                 run on the host and cannot be captured: issue them outside the capture",
                D::VENDOR
            )));
        }
        self.check_p2p(name, ops)?;
        let label = p2p_label(name, ops);
        let what = |_: u32| label.clone();
        // SAFETY: forwarded from the caller.
        let build = |prog: &mut Program<'_, D>, _: Option<&mut NcclLevel<D>>, _: &D, _| unsafe {
            let batch = self.stamp_p2p(name, ops)?;
            prog.p2p(batch, label.clone())
        };
        let blocking = |comm: &Communicator| {
            comm.wait_idle();
            comm.after_queued(dev)?;
            dev.synchronize()?;
            let ord = dev.ordinal();
            // Host copies, 8-byte aligned for every dtype.
            let mut bufs: Vec<Vec<u64>> = ops
                .iter()
                .map(|op| vec![0u64; (op.count * op.dtype.size()).div_ceil(8)])
                .collect();
            for (op, b) in ops.iter().zip(&mut bufs) {
                let bytes = op.count * op.dtype.size();
                if op.dir == super::communicator::Dir::Send && bytes > 0 {
                    // SAFETY: the send holds `bytes` of `dev` (caller's promise).
                    unsafe {
                        dev.copy_dtoh(
                            None,
                            b.as_mut_ptr() as *mut u8,
                            DevSpan::new(op.addr as u64, bytes, ord)?,
                        )?
                    };
                }
            }
            dev.synchronize()?;
            let host: Vec<P2pOp> = ops
                .iter()
                .zip(&mut bufs)
                .map(|(op, b)| P2pOp {
                    addr: b.as_mut_ptr() as usize,
                    ..*op
                })
                .collect();
            // SAFETY: each host buffer holds its op's bytes and lives for the call.
            unsafe { comm.raw_p2p(name, &host)? };
            for (op, b) in ops.iter().zip(&bufs) {
                let bytes = op.count * op.dtype.size();
                if op.dir == super::communicator::Dir::Recv && bytes > 0 {
                    // SAFETY: the receive holds `bytes` of `dev`; `b` lives until synchronised.
                    unsafe {
                        dev.copy_htod(
                            DevSpan::new(op.addr as u64, bytes, ord)?,
                            b.as_ptr() as *const u8,
                        )?
                    };
                }
            }
            dev.synchronize()
        };
        self.queue_staged(dev, Kind::P2p, &what, build, blocking)
    }

    /// Queues a host-staged program (see `Communicator::queue_program`) and makes `dev`'s
    /// stream wait for its end: the caller's stream goes on after the call, as with a
    /// collective.
    fn queue_staged<D: Device>(
        &self,
        dev: &D,
        kind: Kind,
        what: &dyn Fn(u32) -> String,
        build: impl FnOnce(&mut Program<'_, D>, Option<&mut NcclLevel<D>>, &D, u32) -> Result<()>,
        blocking: impl FnOnce(&Communicator) -> Result<()>,
    ) -> Result<()> {
        let path = |_: Option<&NcclLevel<D>>| "host-staged".to_string();
        if let Some(end) = self.queue_program(dev, kind, what, path, build, blocking)? {
            dev.wait_on(&end)?;
        }
        Ok(())
    }
}

/// How a batch of sends and receives is named in messages: `send to rank 1 (1024 x f32)`, or
/// `send/recv group (2 sends, 2 receives)`.
fn p2p_label(name: &str, ops: &[P2pOp]) -> String {
    use super::communicator::Dir;
    if let [op] = ops {
        let way = match op.dir {
            Dir::Send => "send to",
            Dir::Recv => "recv from",
        };
        return format!("{way} rank {} ({} x {})", op.peer, op.count, op.dtype);
    }
    let sends = ops.iter().filter(|o| o.dir == Dir::Send).count();
    format!("{name} ({sends} sends, {} receives)", ops.len() - sends)
}
