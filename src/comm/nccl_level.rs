//! Device collectives in two levels: NCCL inside a node, PCCL's transport between nodes.
//!
//! A communicator of N nodes x M ranks keeps, once its first device collective decided to use
//! NCCL, two things per rank: an NCCL communicator of its node (ordered by local index `m`,
//! created from a unique id that local rank 0 sends over PCCL's own transport), and a PCCL
//! sub-communicator of the N ranks with the same local index (ordered by node `n`) whose
//! device collectives run host-staged through the transport. All M inter-node groups work at
//! once, each on 1/M of the data:
//!
//! - all-gather: inter-node all-gather of the rank's block (N blocks), then NCCL all-gather
//!   of those N blocks across the node, giving the `[m][n]` grid, which the transpose kernel
//!   turns into rank order (no transpose when ranks are numbered `m * N + n`).
//! - reduce-scatter: transpose the input to `[m][n]`, NCCL reduce-scatter across the node (the
//!   rank keeps the N blocks of its local index, summed over the node), then inter-node
//!   reduce-scatter of those N blocks.
//! - all-reduce: NCCL reduce-scatter of the vector cut in M parts, inter-node all-reduce of
//!   the rank's part, NCCL all-gather of the parts.
//! - broadcast: inter-node broadcast among the root's local index, then NCCL broadcast in
//!   every node.
//!
//! Averages are taken as sums divided once by the communicator size at the end, as the
//! host path does. Everything is queued on the caller's stream; the host waits for it where
//! the inter-node level needs the data (the staged executor) and at the end of the call,
//! polling NCCL's asynchronous error and the communicator's timeout.

use super::communicator::{Communicator, RawCollective};
use crate::config::{DebugLevel, NcclMode};
use crate::device::cuda::CudaDevice;
use crate::device::nccl::{self, NcclComm, NcclUniqueId};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr};
use std::time::{Duration, Instant};

/// How the communicator numbers the ranks of the N x M grid.
enum Placement {
    /// `rank = n * M + m` (consecutive ranks share a node): gathered grids need a transpose.
    NodeMajor,
    /// `rank = m * N + n` (round-robin): the `[m][n]` grid is already rank order.
    LocalMajor,
    /// Anything else: `nodes[n][m]` gives the rank; blocks are copied one by one.
    General(Vec<Vec<usize>>),
}

/// One rank's state of the two-level device path.
pub(crate) struct NcclLevel {
    nccl: NcclComm,
    inter: Communicator,
    ordinal: usize,
    /// N and M.
    nodes: usize,
    local: usize,
    /// This rank's `m`.
    lrank: usize,
    size: usize,
    placement: Placement,
    scratch: Option<CudaSlice<u8>>,
    done: CudaEvent,
    timeout: Duration,
    /// Set after a timeout or asynchronous NCCL error: the NCCL communicator is unusable.
    broken: Option<String>,
}

impl NcclLevel {
    /// Decides, collectively over `comm`, whether its device collectives use NCCL, and sets
    /// the level up when they do. `Ok(None)`: they run host-staged (PCCL_NCCL=0, or `auto`
    /// and some rank cannot use NCCL: the reason is printed at PCCL_DEBUG=INFO).
    pub(crate) fn setup(comm: &Communicator, dev: &CudaDevice) -> Result<Option<NcclLevel>> {
        let cfg = comm.config();
        if cfg.nccl == NcclMode::Off {
            return Ok(None);
        }
        let topo = comm.topology();
        let p = comm.size();
        let (n, m) = topo.position(comm.rank());
        let local_reason = if !topo.is_regular() {
            Some("nodes have unequal numbers of ranks".to_string())
        } else {
            nccl::version().err().map(|e| e.message().to_string())
        };
        // Every rank learns every rank's node, GPU and verdict, and decides the same.
        let mine = [
            n as u64,
            dev.ordinal() as u64,
            local_reason.is_none() as u64,
        ];
        let mut all = vec![0u64; 3 * p];
        comm.all_gather(&mine, &mut all)?;
        let mut reason = None;
        for r in 0..p {
            if all[3 * r + 2] == 0 {
                reason = Some(match (&local_reason, r == comm.rank()) {
                    (Some(why), true) => why.clone(),
                    _ => format!("rank {r} cannot use NCCL"),
                });
                break;
            }
            if let Some(o) =
                (0..r).find(|&o| all[3 * o] == all[3 * r] && all[3 * o + 1] == all[3 * r + 1])
            {
                reason = Some(format!(
                    "ranks {o} and {r} share GPU {} on node {} (NCCL needs one GPU per rank of a \
                     node; set PCCL_RANKS_PER_NODE=1 to treat each rank as a node)",
                    all[3 * r + 1],
                    all[3 * r]
                ));
                break;
            }
        }
        if let Some(why) = reason {
            if cfg.nccl == NcclMode::On {
                return Err(Error::usage(format!(
                    "PCCL_NCCL=1 but NCCL cannot be used: {why}"
                )));
            }
            if cfg.debug >= DebugLevel::Info && comm.rank() == 0 {
                eprintln!("PCCL INFO device collectives run host-staged, not on NCCL: {why}");
            }
            return Ok(None);
        }
        let nodes = topo.nodes().to_vec();
        let (nn, mm) = (nodes.len(), nodes[0].len());
        let placement = if (0..nn).all(|a| (0..mm).all(|b| nodes[a][b] == b * nn + a)) {
            Placement::LocalMajor
        } else if (0..nn).all(|a| (0..mm).all(|b| nodes[a][b] == a * mm + b)) {
            Placement::NodeMajor
        } else {
            Placement::General(nodes)
        };
        let mut inter_cfg = cfg.clone();
        inter_cfg.nccl = NcclMode::Off;
        let inter = comm
            .split_with_config(Some(m as u32), n as i32, inter_cfg.clone())?
            .ok_or_else(|| Error::internal("inter-node group missing"))?;
        let intra = comm
            .split_with_config(Some(n as u32), m as i32, inter_cfg)?
            .ok_or_else(|| Error::internal("node group missing"))?;
        // Local rank 0 makes the id; byte 128 says whether it could.
        let mut msg = [0u8; 129];
        let mut root_err = None;
        if m == 0 {
            match nccl::unique_id() {
                Ok(id) => {
                    msg[..128].copy_from_slice(&id.to_bytes());
                    msg[128] = 1;
                }
                Err(e) => root_err = Some(e),
            }
        }
        intra.broadcast(&mut msg, 0)?;
        if let Some(e) = root_err {
            return Err(e);
        }
        if msg[128] != 1 {
            return Err(Error::remote(
                "local rank 0 of this node could not create an NCCL unique id",
            ));
        }
        let mut id_bytes = [0u8; 128];
        id_bytes.copy_from_slice(&msg[..128]);
        dev.bind()?;
        let nccl = NcclComm::init(&NcclUniqueId::from_bytes(&id_bytes), mm, m)?;
        if cfg.debug >= DebugLevel::Info && comm.rank() == 0 {
            eprintln!(
                "PCCL INFO device collectives: NCCL {} ({}) inside {nn} node(s) of {mm}, \
                 host-staged {} between nodes",
                nccl::version().unwrap_or(0),
                nccl::library_path().unwrap_or("?"),
                inter.transport_name()
            );
        }
        Ok(Some(NcclLevel {
            nccl,
            inter,
            ordinal: dev.ordinal(),
            nodes: nn,
            local: mm,
            lrank: m,
            size: p,
            placement,
            scratch: None,
            done: dev.new_event()?,
            timeout: cfg.timeout,
            broken: None,
        }))
    }

    fn scratch(&mut self, dev: &CudaDevice, bytes: usize) -> Result<u64> {
        if self.scratch.as_ref().is_none_or(|s| s.len() < bytes) {
            self.scratch = None;
            self.scratch = Some(dev.alloc_zeroed(bytes.max(16))?);
        }
        let s = self
            .scratch
            .as_ref()
            .ok_or_else(|| Error::internal("NCCL level scratch missing"))?;
        let (ptr, _sync) = s.device_ptr(dev.stream());
        Ok(ptr)
    }

    /// Runs one validated collective (the checks of `raw_collective_device` passed).
    ///
    /// # Safety
    /// As [`Communicator::raw_collective_device`].
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        dev: &CudaDevice,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::usage(format!(
                "this communicator's NCCL level failed earlier ({why}); destroy the communicator"
            )));
        }
        if dev.ordinal() != self.ordinal {
            return Err(Error::usage(format!(
                "this communicator runs its device collectives on GPU {} (its NCCL communicator \
                 lives there); it was called with a buffer of GPU {}",
                self.ordinal,
                dev.ordinal()
            )));
        }
        if count == 0 {
            return Ok(());
        }
        dev.bind()?;
        let r = match coll {
            RawCollective::AllGather => self.all_gather::<T>(dev, send, recv, count),
            RawCollective::ReduceScatter(op) => {
                self.reduce_scatter::<T>(dev, send, recv, count, op)
            }
            RawCollective::AllReduce(op) => self.all_reduce::<T>(dev, send, recv, count, op),
            RawCollective::Broadcast(root) => self.broadcast::<T>(dev, send, recv, count, root),
        };
        r.and_then(|()| self.finish(dev))
    }

    /// Waits for the call's device work, watching NCCL's asynchronous errors and the timeout.
    fn finish(&mut self, dev: &CudaDevice) -> Result<()> {
        self.done
            .record(dev.stream())
            .map_err(|e| Error::system(format!("CUDA event record failed: {e}")))?;
        let t0 = Instant::now();
        loop {
            match self.done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(Error::system(format!("CUDA event query failed: {e}"))),
            }
            if let Err(e) = self.nccl.async_error() {
                self.broken = Some(e.message().to_string());
                return Err(e);
            }
            if t0.elapsed() > self.timeout {
                let msg = format!(
                    "NCCL collective did not complete within {:?} (a node peer is stuck or gone; \
                     PCCL_TIMEOUT sets the limit)",
                    self.timeout
                );
                self.broken = Some(msg.clone());
                return Err(Error::timeout(msg));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn stream(dev: &CudaDevice) -> *mut std::ffi::c_void {
        dev.stream().cu_stream() as *mut std::ffi::c_void
    }

    /// Copies grid `[m][n]` at `src` into rank order at `dst` (`to_ranks`), or rank order at
    /// `src` into `[m][n]` at `dst`.
    unsafe fn regrid(
        &self,
        dev: &CudaDevice,
        src: u64,
        dst: u64,
        block: usize,
        to_ranks: bool,
    ) -> Result<()> {
        let (nn, mm) = (self.nodes, self.local);
        match &self.placement {
            Placement::LocalMajor => dev.copy_dtod_raw(dst, src, nn * mm * block),
            Placement::NodeMajor if to_ranks => dev.transpose_raw(src, dst, mm, nn, block),
            Placement::NodeMajor => dev.transpose_raw(src, dst, nn, mm, block),
            Placement::General(nodes) => {
                for (a, node) in nodes.iter().enumerate() {
                    for (b, &rank) in node.iter().enumerate() {
                        let grid = ((b * nn + a) * block) as u64;
                        let ranked = (rank * block) as u64;
                        if to_ranks {
                            dev.copy_dtod_raw(dst + ranked, src + grid, block)?;
                        } else {
                            dev.copy_dtod_raw(dst + grid, src + ranked, block)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Scratch of the all-gather and reduce-scatter: `N` blocks of `block` bytes (the
    /// inter-node level's buffer) and, unless the placement is already rank order, the
    /// `M x N` grid. Returns (no grid needed, N-block address, grid address).
    fn grid_scratch(&mut self, dev: &CudaDevice, block: usize) -> Result<(bool, u64, u64)> {
        let direct = matches!(self.placement, Placement::LocalMajor);
        let a_bytes = self.nodes * block;
        let b_bytes = if direct { 0 } else { self.local * a_bytes };
        let tmp = self.scratch(dev, a_bytes + b_bytes)?;
        Ok((direct, tmp, tmp + a_bytes as u64))
    }

    unsafe fn all_gather<T: Element>(
        &mut self,
        dev: &CudaDevice,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let nn = self.nodes;
        let (direct, tmp_a, tmp_b) = self.grid_scratch(dev, count * es)?;
        self.inter
            .raw_collective_device::<T>(dev, RawCollective::AllGather, send, tmp_a, count)?;
        let grid = if direct { recv } else { tmp_b };
        self.nccl
            .all_gather(tmp_a, grid, nn * count, T::DTYPE, Self::stream(dev))?;
        if !direct {
            self.regrid(dev, tmp_b, recv, count * es, true)?;
        }
        Ok(())
    }

    unsafe fn reduce_scatter<T: Element>(
        &mut self,
        dev: &CudaDevice,
        send: u64,
        recv: u64,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let nn = self.nodes;
        let (direct, tmp_a, tmp_b) = self.grid_scratch(dev, count * es)?;
        let sum = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let grid = if direct {
            send
        } else {
            self.regrid(dev, send, tmp_b, count * es, false)?;
            tmp_b
        };
        self.nccl
            .reduce_scatter(grid, tmp_a, nn * count, T::DTYPE, sum, Self::stream(dev))?;
        self.inter.raw_collective_device::<T>(
            dev,
            RawCollective::ReduceScatter(sum),
            tmp_a,
            recv,
            count,
        )?;
        if op == ReduceOp::Avg {
            dev.divide_raw(T::DTYPE, recv, count * es, self.size)?;
        }
        Ok(())
    }

    unsafe fn all_reduce<T: Element>(
        &mut self,
        dev: &CudaDevice,
        send: u64,
        recv: u64,
        count: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let mm = self.local;
        let part = count.div_ceil(mm);
        let padded = part * mm != count;
        let a_bytes = part * es;
        let p_bytes = if padded { mm * a_bytes } else { 0 };
        let tmp = self.scratch(dev, a_bytes + p_bytes)?;
        let (tmp_a, tmp_p) = (tmp, tmp + a_bytes as u64);
        let sum = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let whole = if padded {
            // The padding's results are never read.
            dev.copy_dtod_raw(tmp_p, send, count * es)?;
            tmp_p
        } else {
            send
        };
        self.nccl
            .reduce_scatter(whole, tmp_a, part, T::DTYPE, sum, Self::stream(dev))?;
        self.inter.raw_collective_device::<T>(
            dev,
            RawCollective::AllReduce(sum),
            tmp_a,
            tmp_a,
            part,
        )?;
        if op == ReduceOp::Avg {
            dev.divide_raw(T::DTYPE, tmp_a, part * es, self.size)?;
        }
        let out = if padded { tmp_p } else { recv };
        self.nccl
            .all_gather(tmp_a, out, part, T::DTYPE, Self::stream(dev))?;
        if padded {
            dev.copy_dtod_raw(recv, tmp_p, count * es)?;
        }
        Ok(())
    }

    unsafe fn broadcast<T: Element>(
        &mut self,
        dev: &CudaDevice,
        send: u64,
        recv: u64,
        count: usize,
        root: usize,
    ) -> Result<()> {
        let (rn, rm) = self.position_of(root);
        if self.lrank == rm {
            self.inter.raw_collective_device::<T>(
                dev,
                RawCollective::Broadcast(rn),
                send,
                recv,
                count,
            )?;
        }
        self.nccl
            .broadcast(recv, recv, count, T::DTYPE, rm, Self::stream(dev))
    }

    fn position_of(&self, rank: usize) -> (usize, usize) {
        let (nn, mm) = (self.nodes, self.local);
        match &self.placement {
            Placement::NodeMajor => (rank / mm, rank % mm),
            Placement::LocalMajor => (rank % nn, rank / nn),
            Placement::General(nodes) => nodes
                .iter()
                .enumerate()
                .find_map(|(a, node)| node.iter().position(|&r| r == rank).map(|b| (a, b)))
                .unwrap_or((0, 0)),
        }
    }
}
