//! Device collectives in two levels: the vendor's NCCL-shaped library inside a node (NCCL on
//! CUDA, RCCL on ROCm: [`Device::collectives`]), PCCL's transport between nodes. Written once,
//! generic over the [`Device`] back end.
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
//!
//! "Do these ranks share a GPU" is decided by the GPUs' UUIDs ([`Device::uuid`]), exchanged
//! between ranks: ordinals are per process (two processes that each see their GPU as device 0
//! may or may not share it).

use super::communicator::{Communicator, RawCollective};
use super::device_program::Program;
use crate::config::{DebugLevel, NcclMode};
use crate::device::api::{DevSpan, Device};
use crate::device::nccl_abi::{AsyncErrorProbe, NcclApi, NcclComm, NcclUniqueId};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan::Collective;
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

/// Words per rank of the setup exchange: node, UUID (two words), usable.
const WORDS: usize = 4;

/// The first pair of ranks `(o, r)`, `o < r`, on one node with the same GPU UUID, from the
/// setup exchange (`WORDS` words per rank).
fn shared_gpu(all: &[u64]) -> Option<(usize, usize)> {
    let p = all.len() / WORDS;
    let key = |r: usize| &all[WORDS * r..WORDS * r + 3];
    (0..p).find_map(|r| (0..r).find(|&o| key(o) == key(r)).map(|o| (o, r)))
}

impl<D: Device> Drop for NcclLevel<D> {
    fn drop(&mut self) {
        if self.broken.is_some() {
            // A timed-out or failed vendor communicator may have work stuck waiting for a
            // peer: ncclCommDestroy would wait for it, ncclCommAbort ends it.
            self.nccl.abort();
        }
    }
}

/// One rank's state of the two-level device path.
pub(crate) struct NcclLevel<D: Device> {
    api: &'static NcclApi,
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
    scratch: Option<D::Memory>,
    /// Scratch buffers outgrown (freed with the level, see `scratch`).
    retired: Vec<D::Memory>,
    done: D::Event,
    /// Set after a timeout or asynchronous error: the vendor communicator is unusable.
    broken: Option<String>,
}

impl<D: Device> NcclLevel<D> {
    /// Decides, collectively over `comm`, whether its device collectives use the vendor's
    /// library, and sets the level up when they do. `Ok(None)`: they run host-staged
    /// (PCCL_NCCL=0, or `auto` and some rank cannot use it: the reason is printed at
    /// PCCL_DEBUG=INFO).
    pub(crate) fn setup(comm: &Communicator, dev: &D) -> Result<Option<NcclLevel<D>>> {
        let cfg = comm.config();
        if cfg.nccl == NcclMode::Off {
            return Ok(None);
        }
        let topo = comm.topology();
        let p = comm.size();
        let (n, m) = topo.position(comm.rank());
        let api = D::collectives();
        let uuid = dev.uuid();
        let local_reason = if !topo.is_regular() {
            Some("nodes have unequal numbers of ranks".to_string())
        } else if let Err(e) = &api {
            Some(e.message().to_string())
        } else if let Err(e) = &uuid {
            Some(format!("its GPU's UUID cannot be read: {}", e.message()))
        } else {
            None
        };
        let lib = api.as_ref().map(|a| a.name()).unwrap_or(match D::VENDOR {
            "HIP" => "RCCL",
            _ => "NCCL",
        });
        // Every rank learns every rank's node, GPU UUID and verdict, and decides the same.
        let u = uuid.unwrap_or([0; 16]);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let mine = [
            n as u64,
            word(&u[..8]),
            word(&u[8..]),
            local_reason.is_none() as u64,
        ];
        let mut all = vec![0u64; WORDS * p];
        comm.all_gather(&mine, &mut all)?;
        let reason = match (0..p).find(|&r| all[WORDS * r + 3] == 0) {
            Some(r) => Some(match (&local_reason, r == comm.rank()) {
                (Some(why), true) => format!("rank {r}: {why}"),
                _ => format!("rank {r} cannot use {lib}"),
            }),
            None => shared_gpu(&all).map(|(o, r)| {
                format!(
                    "ranks {o} and {r} share one GPU (UUID {:016x}{:016x}) on node {} ({lib} \
                     needs one GPU per rank of a node; set PCCL_RANKS_PER_NODE=1 to treat each \
                     rank as a node)",
                    u64::from_be_bytes(all[WORDS * r + 1].to_le_bytes()),
                    u64::from_be_bytes(all[WORDS * r + 2].to_le_bytes()),
                    all[WORDS * r]
                )
            }),
        };
        if let Some(why) = reason {
            if cfg.nccl == NcclMode::On {
                return Err(Error::usage(format!(
                    "PCCL_NCCL=1 but {lib} cannot be used: {why}"
                )));
            }
            if cfg.debug >= DebugLevel::Info && comm.rank() == 0 {
                eprintln!("PCCL INFO device collectives run host-staged, not on {lib}: {why}");
            }
            return Ok(None);
        }
        let api = api?;
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
            match api.unique_id() {
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
            return Err(Error::remote(format!(
                "local rank 0 of node {n} could not create an {lib} unique id"
            )));
        }
        let mut id_bytes = [0u8; 128];
        id_bytes.copy_from_slice(&msg[..128]);
        dev.bind()?;
        let nccl = NcclComm::init_with(api, &NcclUniqueId::from_bytes(&id_bytes), mm, m)?;
        if cfg.debug >= DebugLevel::Info && comm.rank() == 0 {
            eprintln!(
                "PCCL INFO device collectives: {lib} {} ({}) inside {nn} node(s) of {mm}, \
                 host-staged {} between nodes",
                api.version(),
                api.path(),
                inter.transport_name()
            );
        }
        Ok(Some(NcclLevel {
            api,
            nccl,
            inter,
            ordinal: dev.ordinal(),
            nodes: nn,
            local: mm,
            lrank: m,
            size: p,
            placement,
            scratch: None,
            retired: Vec::new(),
            done: dev.new_event()?,
            broken: None,
        }))
    }

    /// `len` bytes of device memory at `addr` on this level's GPU.
    ///
    /// # Safety
    /// The range must be device memory of that GPU, valid while the span is used.
    unsafe fn span(&self, addr: u64, len: usize) -> Result<DevSpan> {
        DevSpan::new(addr, len, self.ordinal)
    }

    fn scratch(&mut self, dev: &D, bytes: usize) -> Result<u64> {
        if self
            .scratch
            .as_ref()
            .is_none_or(|s| dev.span_of(s).len() < bytes)
        {
            // The old buffer is kept, not freed: freeing device memory waits for the whole
            // device (queued collectives and the caller's work), which a queued call must
            // never do. Sizes double, so what is kept is at most what is in use.
            let size = bytes.max(16).checked_next_power_of_two().unwrap_or(bytes);
            let new = dev.alloc_zeroed(size)?;
            if let Some(old) = self.scratch.replace(new) {
                self.retired.push(old);
            }
        }
        let s = self
            .scratch
            .as_ref()
            .ok_or_else(|| Error::internal("NCCL level scratch missing"))?;
        Ok(dev.span_of(s).addr())
    }

    /// Runs one validated collective (the checks of `device_call` passed).
    ///
    /// `timeout` is the communicator's at the time of the call (`set_timeout` applies), for
    /// the vendor's part and for the inter-node level.
    ///
    /// # Safety
    /// As [`Communicator::raw_collective_device`].
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        dev: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
        timeout: Duration,
    ) -> Result<()> {
        if self.inter.timeout() != timeout {
            self.inter.set_timeout(timeout)?;
        }
        self.usable(dev)?;
        if count == 0 {
            return Ok(());
        }
        dev.bind()?;
        let r = match coll {
            RawCollective::AllGather => self.all_gather::<T>(dev, send, recv, count, None),
            RawCollective::ReduceScatter(op) => {
                self.reduce_scatter::<T>(dev, send, recv, count, op, None)
            }
            RawCollective::AllReduce(op) => self.all_reduce::<T>(dev, send, recv, count, op, None),
            RawCollective::Broadcast(root) => {
                self.broadcast::<T>(dev, send, recv, count, root, None)
            }
        };
        r.and_then(|()| self.finish(dev, timeout))
    }

    /// Queues [`NcclLevel::run`]'s device work on `own`'s stream (PCCL's stream), the
    /// inter-node level as host sections of `prog`, without waiting for anything: the
    /// caller then holds the stream until the returned probe of the vendor communicator
    /// reports no asynchronous error once the work is done.
    ///
    /// # Safety
    /// As [`Communicator::enqueue_on`], the buffers valid until the program's end.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn program<T: Element>(
        &mut self,
        own: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
        prog: &mut Program<'_, D>,
    ) -> Result<AsyncErrorProbe> {
        self.usable(own)?;
        if count > 0 {
            own.bind()?;
            let p = Some(prog);
            match coll {
                RawCollective::AllGather => self.all_gather::<T>(own, send, recv, count, p),
                RawCollective::ReduceScatter(op) => {
                    self.reduce_scatter::<T>(own, send, recv, count, op, p)
                }
                RawCollective::AllReduce(op) => self.all_reduce::<T>(own, send, recv, count, op, p),
                RawCollective::Broadcast(root) => {
                    self.broadcast::<T>(own, send, recv, count, root, p)
                }
            }?;
        }
        // SAFETY: the vendor communicator lives as long as this level, which the device state
        // keeps until the communicator (held by the program's job) is gone.
        Ok(unsafe { self.nccl.probe() })
    }

    /// Marks the vendor communicator unusable (it is aborted, not destroyed, when dropped).
    pub(crate) fn mark_broken(&mut self, why: &str) {
        self.broken.get_or_insert_with(|| why.to_string());
    }

    /// An error when the level cannot run a call on `dev` (broken earlier, another GPU).
    fn usable(&self, dev: &D) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::usage(format!(
                "this communicator's {} level failed earlier ({why}); destroy the communicator",
                self.api.name()
            )));
        }
        if dev.ordinal() != self.ordinal {
            return Err(Error::usage(format!(
                "this communicator runs its device collectives on {} device {} (its {} \
                 communicator lives there); it was called with a buffer of device {}",
                D::VENDOR,
                self.ordinal,
                self.api.name(),
                dev.ordinal()
            )));
        }
        Ok(())
    }

    /// The name of what runs `coll` of `count` elements of `es` bytes: `rccl-level` (one
    /// node) or `rccl-level+<inter-node algorithm>`, for reports (pccl-bench's `algo`).
    pub(crate) fn name_for(&self, coll: RawCollective, count: usize, es: usize) -> String {
        let lib = format!("{}-level", self.api.name().to_lowercase());
        if self.nodes <= 1 {
            return lib;
        }
        let (inter, block) = match coll {
            RawCollective::AllGather => (Collective::AllGather, count * es),
            RawCollective::ReduceScatter(_) => {
                (Collective::ReduceScatter { average: false }, count * es)
            }
            RawCollective::AllReduce(_) => (
                Collective::AllReduce { average: false },
                count.div_ceil(self.local).div_ceil(self.nodes) * es,
            ),
            RawCollective::Broadcast(root) => (
                Collective::Broadcast {
                    root: self.position_of(root).0,
                },
                count * es,
            ),
        };
        match self.inter.algorithm_for(inter, block) {
            Ok(a) => format!("{lib}+{}", a.name()),
            Err(_) => lib,
        }
    }

    /// Waits for the call's device work, watching the library's asynchronous errors and the
    /// timeout.
    fn finish(&mut self, dev: &D, timeout: Duration) -> Result<()> {
        dev.record(&self.done, None)?;
        let t0 = Instant::now();
        loop {
            // Checked after the event too: a call that ended because a peer failed (or the
            // communicator was aborted) completes without its result.
            let done = dev.event_done(&self.done)?;
            if let Err(e) = self.nccl.async_error() {
                self.broken = Some(e.message().to_string());
                return Err(e);
            }
            if done {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                let msg = format!(
                    "{} collective did not complete within {timeout:?} (a node peer is stuck or \
                     gone; PCCL_TIMEOUT or set_timeout sets the limit)",
                    self.api.name(),
                );
                self.broken = Some(msg.clone());
                return Err(Error::timeout(msg));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Copies `len` bytes device to device.
    ///
    /// # Safety
    /// Both ranges must be device memory of this level's GPU.
    unsafe fn copy(&self, dev: &D, dst: u64, src: u64, len: usize) -> Result<()> {
        dev.copy_dtod(self.span(dst, len)?, self.span(src, len)?)
    }

    /// Copies grid `[m][n]` at `src` into rank order at `dst` (`to_ranks`), or rank order at
    /// `src` into `[m][n]` at `dst`.
    unsafe fn regrid(
        &self,
        dev: &D,
        src: u64,
        dst: u64,
        block: usize,
        to_ranks: bool,
    ) -> Result<()> {
        let (nn, mm) = (self.nodes, self.local);
        let whole = nn * mm * block;
        match &self.placement {
            Placement::LocalMajor => self.copy(dev, dst, src, whole),
            Placement::NodeMajor => {
                let (s, d) = (self.span(src, whole)?, self.span(dst, whole)?);
                if to_ranks {
                    dev.transpose(s, d, mm, nn, block)
                } else {
                    dev.transpose(s, d, nn, mm, block)
                }
            }
            Placement::General(nodes) => {
                for (a, node) in nodes.iter().enumerate() {
                    for (b, &rank) in node.iter().enumerate() {
                        let grid = ((b * nn + a) * block) as u64;
                        let ranked = (rank * block) as u64;
                        if to_ranks {
                            self.copy(dev, dst + ranked, src + grid, block)?;
                        } else {
                            self.copy(dev, dst + grid, src + ranked, block)?;
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
    fn grid_scratch(&mut self, dev: &D, block: usize) -> Result<(bool, u64, u64)> {
        let direct = matches!(self.placement, Placement::LocalMajor);
        let a_bytes = self.nodes * block;
        let b_bytes = if direct { 0 } else { self.local * a_bytes };
        let tmp = self.scratch(dev, a_bytes + b_bytes)?;
        Ok((direct, tmp, tmp + a_bytes as u64))
    }

    /// Divides the `count` elements at `addr` by the communicator size (finishing an average).
    unsafe fn average<T: Element>(&self, dev: &D, addr: u64, count: usize) -> Result<()> {
        let span = self.span(addr, count * std::mem::size_of::<T>())?;
        dev.divide(T::DTYPE, span, self.size)
    }

    /// The inter-node level of `coll` (`count` elements per rank, NCCL's conventions): on one
    /// node a device copy (every collective of one rank is one), so that nothing waits on
    /// the host for the stream the vendor's call is queued on; else the host-staged (or
    /// direct) collective of the inter-node communicator.
    ///
    /// # Safety
    /// As [`NcclLevel::run`]; `send` and `recv` hold `count` elements.
    #[allow(clippy::too_many_arguments)]
    unsafe fn inter_level<T: Element>(
        &self,
        dev: &D,
        coll: RawCollective,
        send: u64,
        recv: u64,
        count: usize,
        prog: Option<&mut Program<'_, D>>,
    ) -> Result<()> {
        if self.nodes == 1 {
            return self.copy(dev, recv, send, count * std::mem::size_of::<T>());
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            match prog {
                // A host section on the program's stream, collective number taken now.
                Some(p) => {
                    let seq = self.inter.take_tag();
                    p.collective::<T>(self.inter.handle(), seq, coll, send, recv, count)
                }
                None => self
                    .inter
                    .collective_on::<T, D>(dev, coll, send, recv, count),
            }
        }
    }

    unsafe fn all_gather<T: Element>(
        &mut self,
        dev: &D,
        send: u64,
        recv: u64,
        count: usize,
        prog: Option<&mut Program<'_, D>>,
    ) -> Result<()> {
        let es = std::mem::size_of::<T>();
        let nn = self.nodes;
        let (direct, tmp_a, tmp_b) = self.grid_scratch(dev, count * es)?;
        self.inter_level::<T>(dev, RawCollective::AllGather, send, tmp_a, count, prog)?;
        let grid = if direct { recv } else { tmp_b };
        self.nccl
            .all_gather(tmp_a, grid, nn * count, T::DTYPE, dev.raw_stream())?;
        if !direct {
            self.regrid(dev, tmp_b, recv, count * es, true)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce_scatter<T: Element>(
        &mut self,
        dev: &D,
        send: u64,
        recv: u64,
        count: usize,
        op: ReduceOp,
        prog: Option<&mut Program<'_, D>>,
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
            .reduce_scatter(grid, tmp_a, nn * count, T::DTYPE, sum, dev.raw_stream())?;
        self.inter_level::<T>(
            dev,
            RawCollective::ReduceScatter(sum),
            tmp_a,
            recv,
            count,
            prog,
        )?;
        if op == ReduceOp::Avg {
            self.average::<T>(dev, recv, count)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn all_reduce<T: Element>(
        &mut self,
        dev: &D,
        send: u64,
        recv: u64,
        count: usize,
        op: ReduceOp,
        prog: Option<&mut Program<'_, D>>,
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
            self.copy(dev, tmp_p, send, count * es)?;
            tmp_p
        } else {
            send
        };
        self.nccl
            .reduce_scatter(whole, tmp_a, part, T::DTYPE, sum, dev.raw_stream())?;
        self.inter_level::<T>(dev, RawCollective::AllReduce(sum), tmp_a, tmp_a, part, prog)?;
        if op == ReduceOp::Avg {
            self.average::<T>(dev, tmp_a, part)?;
        }
        let out = if padded { tmp_p } else { recv };
        self.nccl
            .all_gather(tmp_a, out, part, T::DTYPE, dev.raw_stream())?;
        if padded {
            self.copy(dev, recv, tmp_p, count * es)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn broadcast<T: Element>(
        &mut self,
        dev: &D,
        send: u64,
        recv: u64,
        count: usize,
        root: usize,
        prog: Option<&mut Program<'_, D>>,
    ) -> Result<()> {
        let (rn, rm) = self.position_of(root);
        if self.lrank == rm {
            self.inter_level::<T>(dev, RawCollective::Broadcast(rn), send, recv, count, prog)?;
        }
        self.nccl
            .broadcast(recv, recv, count, T::DTYPE, rm, dev.raw_stream())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The setup exchange of ranks at (node, UUID).
    fn exchange(ranks: &[(u64, u128)]) -> Vec<u64> {
        ranks
            .iter()
            .flat_map(|&(n, u)| [n, u as u64, (u >> 64) as u64, 1])
            .collect()
    }

    #[test]
    fn ranks_share_a_gpu_only_with_the_same_uuid_on_the_same_node() {
        // Four processes that each see their GPU as device 0: distinct UUIDs, no sharing.
        assert_eq!(
            shared_gpu(&exchange(&[(0, 1), (0, 2), (0, 3), (0, 4)])),
            None
        );
        // Two ranks of node 0 on one GPU.
        assert_eq!(
            shared_gpu(&exchange(&[(0, 7), (0, 9), (0, 7 | 1 << 64), (0, 9)])),
            Some((1, 3))
        );
        // The same UUID on two nodes (each rank its own node) is not sharing within a node.
        assert_eq!(shared_gpu(&exchange(&[(0, 5), (1, 5)])), None);
    }
}
