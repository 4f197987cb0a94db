//! The simulator: the planner's real plans replayed on a modelled cluster.
//!
//! Two engines give the same answer where both apply (tests check it):
//!
//! * [`Engine::Events`] — every rank's plan, as an event simulation: a rank enters a phase when
//!   it has finished the previous one; a message starts when its sender and receiver are both
//!   in the phase (plus packing and latency α), then shares the links it crosses with every
//!   other message in flight (max-min fair, [`super::contention`]); a received message is
//!   reduced piece by piece as it arrives (pipelined pieces). Cost: all `P` plans, so meant for
//!   small and medium `P`.
//! * [`Engine::Phases`] — the ranks of *one* node, phase by phase. The algorithms are
//!   node-symmetric (every node does what node 0 does, on its own NICs; all ranks run the same
//!   phase at once), so the load on any node's NICs and links equals node 0's: a message from
//!   node 0 to node k crosses node 0's send side and node k's receive side, which looks like
//!   node 0's receive side. Each distinct phase is timed once and reused (a ring's `P−1`
//!   phases are all alike), so 32768 ranks take milliseconds to seconds.

use super::contention::{run_batch, Fluid};
use super::profile::{DeviceKind, Profile, ReceiveReduce};
use super::shaper::Buckets;
use super::traffic::{of_plan, PhaseWork};
use crate::error::{Error, Result};
use crate::plan::{build, Algorithm, Collective, LevelAlgo};
use crate::topology::{NicMap, Topology};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// Core time in the fluid's units: nanoseconds. The fluid ends a flow once less than its
/// rounding guard (10⁻⁶ units) is left, which in seconds would drop overheads of a
/// microsecond or less entirely (until 2026-12-02 a message's 1 µs overhead cost nothing and
/// every overhead ended 1 µs early).
const CORE_NS: f64 = 1e9;

/// Which simulation engine to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Full event simulation of every rank.
    Events,
    /// One node's ranks, phase by phase, distinct phases timed once.
    Phases,
    /// `Events` up to 128 ranks or on irregular nodes, else `Phases`.
    Auto,
}

/// What is being simulated.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// The collective.
    pub coll: Collective,
    /// Its algorithm.
    pub algo: Algorithm,
    /// Bytes of one block (per-rank shard for all-gather / reduce-scatter).
    pub block_bytes: f64,
    /// Where reductions run.
    pub device: DeviceKind,
    /// Element type name for the reduction rate.
    pub dtype: &'static str,
}

impl Job {
    /// A host `f32` job.
    pub fn new(coll: Collective, algo: Algorithm, block_bytes: f64) -> Self {
        Job {
            coll,
            algo,
            block_bytes,
            device: DeviceKind::Host,
            dtype: "f32",
        }
    }
}

/// A simulation's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Predicted seconds until the last rank finishes.
    pub seconds: f64,
    /// Phases in a rank's plan.
    pub phases: usize,
    /// Distinct phases actually timed (the `Phases` engine's reuse).
    pub distinct_phases: usize,
    /// The engine that ran.
    pub engine: Engine,
}

/// The modelled machine: a topology (nodes, NIC map) and a profile.
pub struct Cluster<'a> {
    topo: &'a Topology,
    prof: &'a Profile,
    nics: NicMap,
    m: usize,
    /// Extra latency of every message from ranks outnumbering a host's cores (seconds).
    oversub: f64,
    /// How many times slower host byte rates run from ranks outnumbering a host's cores.
    slowdown: f64,
    /// How many times slower a rank's own reduction runs: its share of a core when ranks
    /// outnumber them, or `slowdown` where that is more.
    cpu_slowdown: f64,
}

impl<'a> Cluster<'a> {
    /// The cluster of `topo` with `prof`'s links; without a NIC map in the topology the local
    /// ranks are spread evenly over the profile's NICs. On one host (`one_host`: pretend
    /// nodes) every rank has a "NIC" of its own: a message between pretend nodes is a copy
    /// its ranks make, like any other, and what such copies share is the host's memory bus
    /// (the bus resource), not a network port. (One shared port per pretend node charged two
    /// concurrent inter-node messages double: the model then put MPI's flat recursive
    /// doubling at 2× its measured time on 4 ranks as 2 × 2 and picked rings 2× slower.)
    pub fn new(topo: &'a Topology, prof: &'a Profile) -> Self {
        let m = topo.nodes().iter().map(Vec::len).max().unwrap_or(1);
        let nics = if prof.one_host {
            NicMap::even(m, m)
        } else {
            topo.nic_map()
                .cloned()
                .unwrap_or_else(|| NicMap::even(m, prof.inter.nics))
        };
        // The ranks of one host: all of them when the "nodes" are pretend ones on one host,
        // those of `nodes_per_host` nodes where nodes share a host's cores.
        let local = if prof.one_host {
            topo.nranks()
        } else {
            (m * prof.oversub.nodes_per_host).min(topo.nranks())
        };
        Cluster {
            topo,
            prof,
            nics,
            m,
            oversub: prof.oversub_seconds(local),
            slowdown: prof.oversub_slowdown(local),
            cpu_slowdown: prof.oversub_cpu_share(local),
        }
    }

    /// Simulates `job` with `engine`.
    pub fn simulate(&self, job: &Job, engine: Engine) -> Result<Outcome> {
        let engine = match engine {
            // One shared bus is not node-symmetric: only the event engine models it.
            Engine::Auto | Engine::Phases if self.prof.one_host => Engine::Events,
            Engine::Auto if self.topo.nranks() <= 128 || !self.topo.is_regular() => Engine::Events,
            Engine::Auto => Engine::Phases,
            e => e,
        };
        match engine {
            Engine::Events => self.events(job),
            _ => self.phases(job),
        }
    }

    fn nccl_ring(&self, job: &Job) -> bool {
        self.prof.nccl_ring && job.algo == Algorithm::Flat(LevelAlgo::Ring)
    }

    /// The cache tier's speed-up of every host byte rate for `job` ([`Profile::cache_speedup`]).
    ///
    /// The working set is the input and output buffers of every rank sharing one host's
    /// last-level cache (all ranks on `one_host`: thread-ranks of one process, or MPI processes
    /// of one machine; else the ranks of a node). Not one phase's traffic: collectives are
    /// called again and again on the same buffers (a benchmark loop, a training step), and
    /// between two touches of a byte of an input or output the call touches every other byte
    /// of every local rank's buffers, so whether that byte is still cached depends on the
    /// whole footprint. (A ring's forwarded block is re-read one phase after it arrived, but it
    /// was written there first, and that write is what the footprint decides.) Transport
    /// staging is piece-sized and left out. Device buffers get no cache tier.
    ///
    /// Ranks outnumbering the host's cores slow all of it down by
    /// [`Profile::oversub_slowdown`] (host buffers only: device copies are the device's).
    fn speed(&self, job: &Job) -> f64 {
        self.speeds(job).0
    }

    /// [`Self::speed`] for copies and reductions, and the transfers' own speed-up
    /// ([`Profile::link_speedup`]: the share of the cache's gain a transport's messages get).
    fn speeds(&self, job: &Job) -> (f64, f64) {
        if job.device != DeviceKind::Host {
            return (1.0, 1.0);
        }
        let slow = self.slowdown;
        if self.prof.cache.bytes == 0 {
            return (1.0 / slow, 1.0 / slow);
        }
        let p = self.topo.nranks() as f64;
        let local = if self.prof.one_host { p } else { self.m as f64 };
        let b = job.block_bytes;
        let per_rank = match job.coll {
            Collective::AllGather | Collective::ReduceScatter { .. } => (p + 1.0) * b,
            Collective::AllReduce { .. } | Collective::AllToAll { .. } => 2.0 * p * b,
            _ => 2.0 * b,
        };
        let ws = local * per_rank;
        (
            self.prof.cache_speedup(ws) / slow,
            self.prof.link_speedup(ws) / slow,
        )
    }

    /// Dragonfly groups among `nodes` nodes (1 without groups).
    fn groups(&self, nodes: usize) -> usize {
        match self.prof.inter.group_nodes {
            0 => 1,
            g => nodes.div_ceil(g).max(1),
        }
    }

    /// Whether a message between nodes `na` and `nb` crosses the global links: every
    /// inter-node one on a flat network, only those between groups on a dragonfly.
    fn crosses_global(&self, na: usize, nb: usize) -> bool {
        match self.prof.inter.group_nodes {
            0 => na != nb,
            g => na / g != nb / g,
        }
    }

    /// The bandwidth of the hierarchy's intra level when PCCL hands it to the vendor library
    /// (the profile's `[vendor] intra_ring_gbps`): its rings spread over every link of the
    /// node, where PCCL's own plan would cross one link per message. A three-level hierarchy
    /// hands both inner levels to it (a communicator of the node's groups, one of each
    /// group); links faster than that rate (a pair's) keep their own ([`Self::caps`]).
    fn vendor_intra(&self, algo: Algorithm) -> Option<f64> {
        let hier = matches!(
            crate::plan::effective_algorithm(algo, self.topo),
            Algorithm::Hier { .. } | Algorithm::Overlap { .. } | Algorithm::Deep { .. }
        );
        self.prof
            .vendor
            .as_ref()
            .filter(|_| hier && !self.prof.one_host)
            .map(|v| v.intra_ring_gbps * 1e9)
    }

    /// Resource table for `nodes` nodes: NIC send sides, NIC receive sides, the global
    /// network (one per dragonfly group, each carrying `taper` of its nodes' injection; one
    /// for all without groups), each node's shared intra-node bus, each node's `m × m` intra
    /// links (at `intra` where the vendor library runs the level, or their own rate where
    /// that is faster); host rates (intra links,
    /// the bus, the "NICs" of one host) sped up `speed` times by the cache (the transfers'
    /// share of it, [`Self::speeds`]).
    fn caps(&self, nodes: usize, global_nodes: usize, speed: f64, intra: Option<f64>) -> Vec<f64> {
        let k = self.nics.nics();
        let nic = self.prof.nic_rate() * if self.prof.one_host { speed } else { 1.0 };
        let mut c = vec![nic; 2 * nodes * k];
        let taper = self.prof.inter.taper * k as f64 * nic;
        match self.prof.inter.group_nodes {
            0 => c.push(taper * global_nodes as f64),
            g => {
                for gi in 0..self.groups(nodes) {
                    let members = g.min(global_nodes.saturating_sub(gi * g)).max(1);
                    c.push(taper * members as f64);
                }
            }
        }
        let bus = self.prof.intra.node_bandwidth_gbps * 1e9 * self.prof.efficiency * speed;
        c.extend(std::iter::repeat_n(
            if bus > 0.0 { bus } else { f64::INFINITY },
            nodes,
        ));
        for _ in 0..nodes {
            for a in 0..self.m {
                for b in 0..self.m {
                    let own = self.prof.intra_rate(a, b);
                    c.push(intra.map_or(own, |v| v.max(own)) * speed);
                }
            }
        }
        // Each node's cores (core-seconds per second), for the messages' overheads, then
        // each rank's own core (a rank's overheads run on one core at a time).
        debug_assert_eq!(c.len(), self.cpu_base(nodes));
        if let Some((_, cores)) = self.prof.message_cpu_seconds(true) {
            c.extend(std::iter::repeat_n(cores * CORE_NS, nodes));
            c.extend(std::iter::repeat_n(CORE_NS, nodes * self.m));
        }
        c
    }

    /// Index of node 0's cores among [`Self::caps`]' resources (node `i`'s: `+ i`; rank
    /// `(i, l)`'s own core: `+ nodes + i·m + l`). Their capacities are in core-nanoseconds
    /// per second and the flows on them in core-nanoseconds ([`CORE_NS`]).
    fn cpu_base(&self, nodes: usize) -> usize {
        2 * nodes * self.nics.nics() + self.groups(nodes) + nodes + nodes * self.m * self.m
    }

    /// The overhead of a message from the rank at `(node, local)` on its node's cores and
    /// its own core, as a flow (core-seconds, the resources), when the profile has the term.
    fn cpu_flow(
        &self,
        nodes: usize,
        (na, la): (usize, usize),
        inter: bool,
    ) -> Option<(f64, [u32; 2])> {
        let (secs, _) = self.prof.message_cpu_seconds(inter)?;
        let base = self.cpu_base(nodes);
        let na = na % nodes;
        (secs > 0.0).then(|| {
            (
                secs * CORE_NS,
                [(base + na) as u32, (base + nodes + na * self.m + la) as u32],
            )
        })
    }

    /// The core time of reducing a received message beyond its bytes
    /// ([`super::profile::Oversub::reduce_cpu_us`]) on the receiving rank `(node, local)`'s
    /// node's cores and its own core, as a flow, when the profile has the term.
    fn reduce_flow(&self, nodes: usize, (nb, lb): (usize, usize)) -> Option<(f64, [u32; 2])> {
        let secs = self.prof.oversub.reduce_cpu_us * 1e-6;
        self.prof.message_cpu_seconds(true)?;
        let base = self.cpu_base(nodes);
        let nb = nb % nodes;
        (secs > 0.0).then(|| {
            (
                secs * CORE_NS,
                [(base + nb) as u32, (base + nodes + nb * self.m + lb) as u32],
            )
        })
    }

    /// The resources of a message, as (bytes share, resources) sub-flows: NCCL-like rings
    /// spread an inter-node message over all NICs.
    /// `cross`: the message crosses the global links ([`Self::crosses_global`]).
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        nodes: usize,
        (na, la): (usize, usize),
        (nb, lb): (usize, usize),
        spread: bool,
        cross: bool,
        out: &mut Vec<(f64, Vec<u32>)>,
    ) {
        let k = self.nics.nics();
        let global_base = (2 * nodes * k) as u32;
        let after = global_base + self.groups(nodes) as u32;
        let inter = na != nb;
        // The phase engine passes nodes = 1 and peer node 1: every node's resources fold
        // onto node 0's (by symmetry they carry the same load).
        let (na, nb) = (na % nodes, nb % nodes);
        let global = match self.prof.inter.group_nodes {
            0 => global_base,
            g => global_base + (na / g) as u32,
        };
        let wan = |mut v: Vec<u32>| {
            if cross {
                v.push(global);
            }
            v
        };
        // One host: a single bus (node 0's) carries every message.
        let bus = after + if self.prof.one_host { 0 } else { na as u32 };
        if !inter {
            let link = after + nodes as u32 + (na * self.m * self.m + la * self.m + lb) as u32;
            let mut res = vec![link, bus];
            if self.prof.one_host {
                // One host: every message is a copy its ranks' own cores make, so a rank's
                // messages share its ports whichever "level" they belong to (an overlapped
                // hierarchy's two levels do not each get a core of their own).
                res.push((na * k + self.nics.nic_of(la)) as u32);
                res.push((nodes * k + nb * k + self.nics.nic_of(lb)) as u32);
            }
            out.push((1.0, res));
        } else if spread {
            for j in 0..k {
                out.push((
                    1.0 / k as f64,
                    wan(vec![(na * k + j) as u32, (nodes * k + nb * k + j) as u32]),
                ));
            }
        } else {
            let tx = (na * k + self.nics.nic_of(la)) as u32;
            let rx = (nodes * k + nb * k + self.nics.nic_of(lb)) as u32;
            let mut res = wan(vec![tx, rx]);
            if self.prof.one_host {
                res.push(bus);
            }
            out.push((1.0, res));
        }
    }

    /// Start-up time of one message of `bytes`: the level's latency, the transport's cost
    /// per extra piece it cuts the message into, a rendezvous handshake, the oversubscription
    /// term. `split`: the pieces the plan cuts each block into (an overlapped hierarchy): each
    /// such message is one of `split` pieces of a block that would otherwise move whole, and
    /// pays `(1 − 1/split)` of the per-piece cost `pccl-tune` measured (the same cost of
    /// cutting a message, made by the plan instead of the transport).
    fn alpha(&self, inter: bool, bytes: f64, nccl: bool, split: usize) -> f64 {
        if nccl {
            return 0.0; // paid once per hop, after the fact
        }
        let a = if inter {
            self.prof.inter.alpha_us
        } else {
            self.prof.intra.alpha_us
        };
        let pieces = (bytes / self.prof.piece_bytes as f64).ceil().max(1.0);
        // A rendezvous handshake is one more message through both ranks' progress.
        let rdv = self
            .prof
            .rendezvous_seconds(bytes.min(self.prof.piece_bytes as f64));
        let handshake = if rdv > 0.0 { rdv + self.oversub } else { 0.0 };
        let plan_cut = 1.0 - 1.0 / split.max(1) as f64;
        (a + (pieces - 1.0 + plan_cut) * self.prof.piece_overhead_us) * 1e-6
            + self.oversub
            + handshake
    }

    /// Local time of a phase before its messages can move: packing, then copies.
    fn local(&self, w: &PhaseWork, bb: f64, speed: f64) -> (f64, f64) {
        let rate = self.prof.copy_gbps * 1e9 * speed;
        let packed = if self.prof.packs(bb) {
            w.packed_blocks()
        } else {
            0
        };
        let pack = packed as f64 * bb / rate;
        (pack, pack + w.copy_blocks as f64 * bb / rate)
    }

    /// Seconds the receiving rank spends reducing `bytes` (0 without a reduction).
    fn reduce_seconds(&self, job: &Job, bytes: f64, reduce: bool) -> f64 {
        if !reduce || bytes == 0.0 {
            return 0.0;
        }
        let mut r = bytes / (self.prof.reduce_rate(job.device, job.dtype) * self.speed(job));
        if job.device == DeviceKind::Host {
            // `speed` holds `slowdown` already; the reduction is the rank's own core's work.
            r *= (self.cpu_slowdown / self.slowdown).max(1.0);
        }
        r
    }

    /// End of a received message's processing: pieces reduced as they arrive. `busy_until`:
    /// when the receiving rank's earlier work of the phase (its local copies, the reductions
    /// of messages that arrived before) ends; the executor runs a rank's reductions one after
    /// another on its own thread (or stream), so two messages of a phase (an overlapped
    /// hierarchy's two levels) are not reduced at once.
    fn recv_end(
        &self,
        job: &Job,
        bytes: f64,
        reduce: bool,
        (t0, t1): (f64, f64),
        busy_until: f64,
    ) -> f64 {
        let r = self.reduce_seconds(job, bytes, reduce);
        if r == 0.0 {
            return t1;
        }
        let c = match self.prof.receive_reduce {
            ReceiveReduce::Pieces => (self.prof.piece_bytes as f64 / bytes).min(1.0),
            ReceiveReduce::Fused => return t1.max(t0 + r).max(busy_until + r),
            ReceiveReduce::After => 1.0,
        };
        (t1 + r * c).max(t0 + (t1 - t0) * c + r).max(busy_until + r)
    }

    /// Per-hop latency of an NCCL-like pipelined ring, per pass through the ring.
    fn nccl_latency(&self, job: &Job, msg_phases: usize) -> f64 {
        let p = self.topo.nranks();
        let n = self.topo.nodes().len();
        if !self.nccl_ring(job) || p < 2 {
            return 0.0;
        }
        let per_pass = (self.prof.inter.alpha_us * (n - 1) as f64
            + self.prof.intra.alpha_us * (p - n) as f64)
            * 1e-6;
        per_pass * msg_phases as f64 / (p - 1) as f64
    }

    /// The event engine. With NICs that have a free burst ([`super::shaper`]) the call is
    /// timed in the buckets' steady state: a benchmark's calls run back to back, so a call
    /// finds its NICs' buckets as the calls before it left them — full where the NICs idle
    /// most of the time, drained where they are the bottleneck (a 1 KiB pair's loop drains
    /// 32 KiB within a few dozen calls and is then held to the NIC's rate). That state is the
    /// largest level `θ·burst`, the same on every NIC, that no NIC's bucket ends a call below
    /// (within 1% of the burst): found from full, else by bisection over θ.
    fn events(&self, job: &Job) -> Result<Outcome> {
        let (full, left) = self.events_from(job, None)?;
        let Some(left) = left else {
            return Ok(full);
        };
        let burst = self.prof.inter.burst_bytes;
        let keeps = |start: f64, end: &[f64]| end.iter().all(|&e| e >= start - 0.01 * burst);
        if keeps(burst, &left) {
            return Ok(full);
        }
        let at = |theta: f64| self.events_from(job, Some(&vec![theta * burst; left.len()]));
        let (mut best, mut lo, mut hi) = (at(0.0)?.0, 0.0, 1.0);
        for _ in 0..5 {
            let mid = (lo + hi) / 2.0;
            let (out, end) = at(mid)?;
            if keeps(mid * burst, end.as_deref().unwrap_or_default()) {
                (best, lo) = (out, mid);
            } else {
                hi = mid;
            }
        }
        Ok(best)
    }

    /// One call of the event engine, its NICs' buckets holding `tokens` at the start (full
    /// when `None`); also what the buckets hold at its end (`None` without buckets).
    fn events_from(
        &self,
        job: &Job,
        tokens: Option<&[f64]>,
    ) -> Result<(Outcome, Option<Vec<f64>>)> {
        let p = self.topo.nranks();
        let nodes = self.topo.nodes().len();
        let nccl = self.nccl_ring(job);
        let plans: Vec<_> = (0..p)
            .map(|r| build(job.coll, job.algo, self.topo, r))
            .collect::<Result<_>>()?;
        // Plans of an overlapped hierarchy address pieces of blocks.
        let split = plans.first().map_or(1, |pl| pl.pieces);
        let bb = job.block_bytes / split as f64;
        let work: Vec<Vec<PhaseWork>> = plans.iter().map(of_plan).collect();
        drop(plans);
        let nphases = work.first().map_or(0, Vec::len);
        let msg_phases = work
            .first()
            .map_or(0, |w| w.iter().filter(|x| !x.sends.is_empty()).count());
        let (speed, link_speed) = self.speeds(job);
        let mut fluid =
            Fluid::new(self.caps(nodes, nodes, link_speed, self.vendor_intra(job.algo)));
        // The NICs (both directions of each) are the caps' first resources.
        let burst = self.prof.inter.burst_bytes;
        let mut buckets = (burst > 0.0 && !self.prof.one_host)
            .then(|| Buckets::new(2 * nodes * self.nics.nics(), burst, tokens));
        // On one host a rank's core does its reductions and its side of every copy: with
        // MPI's reduction after the whole message (`ReceiveReduce::After`), a reduction is
        // work on the rank's receive port, shared with the messages still arriving there
        // (else an overlapped hierarchy would reduce one level's piece "for free" while the
        // other level's arrives: 10% faster predicted, 1.3–1.6× slower measured for MPI
        // reduce-scatters of 16–64 MiB on 4 processes of the 2-core VM).
        let core_port = |r: usize| -> Option<u32> {
            let (nb, lb) = self.topo.position(r);
            let k = self.nics.nics();
            let port = nodes * k + nb * k + self.nics.nic_of(lb);
            (self.prof.one_host
                && job.device == DeviceKind::Host
                && self.prof.receive_reduce == ReceiveReduce::After)
                .then_some(port as u32)
        };
        let mut heap: BinaryHeap<Ev> = BinaryHeap::new();
        let mut st = vec![RankState::default(); p];
        // Per ordered pair: posted sends (ready time, blocks) and receives (ready, reduce).
        let mut sends: HashMap<(usize, usize), VecDeque<(f64, usize)>> = HashMap::new();
        let mut recvs: HashMap<(usize, usize), VecDeque<(f64, bool)>> = HashMap::new();
        // Fluid id -> the message it carries, or the rank whose reduction it is.
        let mut flows: HashMap<usize, Flow> = HashMap::new();
        let mut msgs: Vec<MsgState> = Vec::new();
        let mut sub = Vec::new();
        let mut now = 0.0;
        let mut finished = 0usize;
        let mut end = 0.0f64;
        let mut ready: Vec<usize> = (0..p).collect(); // ranks entering their next phase now

        loop {
            // Ranks whose phase is complete enter the next one at `now`.
            while let Some(r) = ready.pop() {
                let s = &mut st[r];
                if s.phase == work[r].len() {
                    finished += 1;
                    end = end.max(now);
                    continue;
                }
                let w = &work[r][s.phase];
                s.phase += 1;
                let (pack, local) = self.local(w, bb, speed);
                s.busy_until = s.busy_until.max(now + local);
                s.pending = w.sends.len() + w.recvs.len() + 1;
                heap.push(Ev {
                    t: now + local,
                    what: What::Item(r),
                });
                for snd in &w.sends {
                    let key = (r, snd.peer);
                    if let Some((rt, reduce)) = recvs.get_mut(&key).and_then(VecDeque::pop_front) {
                        let t = (now + pack).max(rt);
                        self.post(
                            &mut heap,
                            &mut msgs,
                            (r, snd.peer),
                            t,
                            snd.blocks,
                            reduce,
                            nccl,
                            (bb, split),
                        );
                    } else {
                        sends
                            .entry(key)
                            .or_default()
                            .push_back((now + pack, snd.blocks));
                    }
                }
                for rcv in &w.recvs {
                    let key = (rcv.peer, r);
                    if let Some((stt, blocks)) = sends.get_mut(&key).and_then(VecDeque::pop_front) {
                        if blocks != rcv.blocks {
                            return Err(Error::internal(format!(
                                "simulator: rank {} sends {blocks} blocks to rank {r}, which expects {}",
                                rcv.peer, rcv.blocks
                            )));
                        }
                        let t = stt.max(now + local);
                        self.post(
                            &mut heap,
                            &mut msgs,
                            key,
                            t,
                            blocks,
                            rcv.reduce,
                            nccl,
                            (bb, split),
                        );
                    } else {
                        recvs
                            .entry(key)
                            .or_default()
                            .push_back((now + local, rcv.reduce));
                    }
                }
            }
            if finished == p {
                break;
            }
            let fin = fluid.next_finish();
            let next_ev = heap.peek().map_or(f64::INFINITY, |e| e.t);
            // Step by the flow's own remaining time when it comes first: `now + fin - now`
            // may round to zero and never finish it.
            let dt = if now + fin <= next_ev {
                fin
            } else {
                next_ev - now
            };
            if !dt.is_finite() {
                return Err(Error::internal(
                    "simulator: the plans deadlock (a receive without its send)",
                ));
            }
            let t = (now + dt).max(now);
            // Reductions start after the loop: a new flow may reuse an id still in `done`.
            let mut reductions: Vec<(usize, u32, f64)> = Vec::new();
            let done = fluid.advance(dt.max(0.0));
            for id in done {
                let mi = match flows.remove(&id).expect("a flow of a message or reduction") {
                    Flow::Msg(mi) => mi,
                    Flow::Reduce(r) => {
                        heap.push(Ev {
                            t,
                            what: What::Item(r),
                        });
                        continue;
                    }
                };
                let m = &mut msgs[mi];
                m.parts -= 1;
                if m.parts == 0 {
                    heap.push(Ev {
                        t,
                        what: What::Item(m.src),
                    });
                    let r = self.reduce_seconds(job, m.bytes, m.reduce);
                    let port = core_port(m.dst).filter(|&q| r > 0.0 && fluid.cap(q).is_finite());
                    if let Some(port) = port {
                        reductions.push((m.dst, port, r * fluid.cap(port)));
                        continue;
                    }
                    let busy = &mut st[m.dst].busy_until;
                    let e = self.recv_end(job, m.bytes, m.reduce, (m.t0, t), *busy);
                    *busy = busy.max(e);
                    heap.push(Ev {
                        t: e,
                        what: What::Item(m.dst),
                    });
                }
            }
            for (r, port, work) in reductions {
                let id = fluid.add(work, &[port]);
                flows.insert(id, Flow::Reduce(r));
            }
            now = t;
            while heap.peek().is_some_and(|e| e.t <= now) {
                let ev = heap.pop().expect("peeked");
                match ev.what {
                    What::Item(r) => {
                        let s = &mut st[r];
                        s.pending -= 1;
                        if s.pending == 0 {
                            ready.push(r);
                        }
                    }
                    What::Start(mi) => {
                        let m = &msgs[mi];
                        sub.clear();
                        let (pa, pb) = (self.topo.position(m.src), self.topo.position(m.dst));
                        let cross = self.crosses_global(pa.0, pb.0);
                        self.route(nodes, pa, pb, nccl, cross, &mut sub);
                        let mut n = sub.len();
                        // An eager message's bytes take longer (copied through the library's
                        // own shared cells): more work through the same links.
                        let work = m.bytes * self.prof.eager_factor(m.bytes);
                        for (share, res) in &sub {
                            let mut bytes = work * share;
                            if let Some(b) = buckets.as_mut() {
                                bytes -= b.take(now, bytes, res, &fluid);
                            }
                            let id = fluid.add(bytes, res);
                            flows.insert(id, Flow::Msg(mi));
                        }
                        // Its overhead on the sender node's cores, while its bytes move: one
                        // more part of the message.
                        if let Some((work, res)) = self.cpu_flow(nodes, pa, pa.0 != pb.0) {
                            let id = fluid.add(work, &res);
                            flows.insert(id, Flow::Msg(mi));
                            n += 1;
                        }
                        // A reduced message's fixed cost on the receiver's core, likewise.
                        if let Some((work, res)) =
                            self.reduce_flow(nodes, pb).filter(|_| msgs[mi].reduce)
                        {
                            let id = fluid.add(work, &res);
                            flows.insert(id, Flow::Msg(mi));
                            n += 1;
                        }
                        msgs[mi].parts = n;
                        msgs[mi].t0 = now;
                    }
                }
            }
        }
        let left = buckets.map(|mut b| b.at(end, &fluid));
        let out = Outcome {
            seconds: end + self.nccl_latency(job, msg_phases),
            phases: nphases,
            distinct_phases: nphases,
            engine: Engine::Events,
        };
        Ok((out, left))
    }

    #[allow(clippy::too_many_arguments)]
    fn post(
        &self,
        heap: &mut BinaryHeap<Ev>,
        msgs: &mut Vec<MsgState>,
        (src, dst): (usize, usize),
        t: f64,
        blocks: usize,
        reduce: bool,
        nccl: bool,
        (bb, split): (f64, usize),
    ) {
        let bytes = blocks as f64 * bb;
        let inter = self.topo.position(src).0 != self.topo.position(dst).0;
        msgs.push(MsgState {
            src,
            dst,
            bytes,
            reduce,
            parts: 0,
            t0: 0.0,
        });
        heap.push(Ev {
            t: t + self.alpha(inter, bytes, nccl, split),
            what: What::Start(msgs.len() - 1),
        });
    }

    fn phases(&self, job: &Job) -> Result<Outcome> {
        let s = Summary::new(self, job.coll, job.algo)?;
        Ok(s.outcome(self, job))
    }
}

/// A plan set reduced to node 0's distinct phases with their multiplicity (the `Phases`
/// engine's input; independent of the message size, so one summary serves every size).
pub struct Summary {
    /// Distinct phases (node 0's local ranks' work, peers as `(node, local)`), with counts.
    phases: Vec<(Vec<LocalWork>, usize)>,
    total: usize,
    msg_phases: usize,
    algo: Algorithm,
    /// Pieces per block of the plans (their spans address sub-blocks).
    pieces: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct LocalWork {
    // (peer node is 0, crosses the global links, peer local, blocks) per send; (peer node
    // is 0, peer local, blocks, reduce) per receive; copies and packed blocks.
    sends: Vec<(bool, bool, usize, usize)>,
    recvs: Vec<(bool, usize, usize, bool)>,
    copy_blocks: usize,
    packed: usize,
}

impl Summary {
    /// Builds node 0's plans and groups their phases. Needs nodes of equal size.
    pub fn new(cl: &Cluster<'_>, coll: Collective, algo: Algorithm) -> Result<Self> {
        let topo = cl.topo;
        if !topo.is_regular() {
            return Err(Error::invalid(format!(
                "the phase engine needs nodes of equal size, not {}",
                topo.describe()
            )));
        }
        let node0 = &topo.nodes()[0];
        let plans: Vec<_> = node0
            .iter()
            .map(|&r| build(coll, algo, topo, r))
            .collect::<Result<_>>()?;
        let pieces = plans.first().map_or(1, |pl| pl.pieces);
        let works: Vec<Vec<PhaseWork>> = plans.iter().map(of_plan).collect();
        drop(plans);
        // Ranks of a node may have different phase counts (non-power-of-two recursive
        // doubling, uneven nodes): a rank without phase k does nothing in it.
        let n = works.iter().map(Vec::len).max().unwrap_or(0);
        let empty = PhaseWork {
            sends: Vec::new(),
            recvs: Vec::new(),
            copy_blocks: 0,
        };
        let mut index: HashMap<Vec<LocalWork>, usize> = HashMap::new();
        let mut phases: Vec<(Vec<LocalWork>, usize)> = Vec::new();
        let mut msg_phases = 0;
        for k in 0..n {
            let sig: Vec<LocalWork> = works
                .iter()
                .map(|w| {
                    let w = w.get(k).unwrap_or(&empty);
                    LocalWork {
                        sends: w
                            .sends
                            .iter()
                            .map(|s| {
                                let (nb, lb) = topo.position(s.peer);
                                (nb == 0, cl.crosses_global(0, nb), lb, s.blocks)
                            })
                            .collect(),
                        recvs: w
                            .recvs
                            .iter()
                            .map(|r| {
                                let (nb, lb) = topo.position(r.peer);
                                (nb == 0, lb, r.blocks, r.reduce)
                            })
                            .collect(),
                        copy_blocks: w.copy_blocks,
                        packed: w.packed_blocks(),
                    }
                })
                .collect();
            if sig.iter().any(|l| !l.sends.is_empty()) {
                msg_phases += 1;
            }
            match index.get(&sig) {
                Some(&i) => phases[i].1 += 1,
                None => {
                    index.insert(sig.clone(), phases.len());
                    phases.push((sig, 1));
                }
            }
        }
        Ok(Summary {
            phases,
            total: n,
            msg_phases,
            algo: crate::plan::effective_algorithm(algo, topo),
            pieces,
        })
    }

    /// Times the summary's phases for `job` (its block size and reduction rate).
    pub fn outcome(&self, cl: &Cluster<'_>, job: &Job) -> Outcome {
        let job = Job {
            algo: self.algo,
            ..*job
        };
        let nccl = cl.nccl_ring(&job);
        let (speed, link_speed) = cl.speeds(&job);
        let caps = cl.caps(1, 1, link_speed, cl.vendor_intra(job.algo));
        let bb = job.block_bytes / self.pieces as f64;
        let mut seconds = 0.0;
        let mut flows: Vec<(f64, f64, Vec<u32>)> = Vec::new();
        let mut owner: Vec<(usize, usize, usize)> = Vec::new(); // (sender local, receiver local, inter)
        let mut sub = Vec::new();
        for (sig, count) in &self.phases {
            flows.clear();
            owner.clear();
            let local: Vec<(f64, f64)> = sig
                .iter()
                .map(|l| {
                    let rate = cl.prof.copy_gbps * 1e9 * speed;
                    let packed = if cl.prof.packs(bb) { l.packed } else { 0 };
                    let pack = packed as f64 * bb / rate;
                    (pack, pack + l.copy_blocks as f64 * bb / rate)
                })
                .collect();
            for (la, l) in sig.iter().enumerate() {
                for &(same, cross, lb, blocks) in &l.sends {
                    let bytes = blocks as f64 * bb;
                    let start = local[la].0.max(local.get(lb).map_or(0.0, |x| x.1))
                        + cl.alpha(!same, bytes, nccl, self.pieces);
                    // Node 0's messages share its cores: each one's overhead runs there
                    // while its bytes move, and the message ends when both have.
                    if let Some((work, res)) = cl.cpu_flow(1, (0, la), !same) {
                        flows.push((start, work, res.to_vec()));
                        owner.push((la, lb, usize::from(!same)));
                    }
                    // Its receiver's fixed cost of reducing it, on the receiver's core (the
                    // receiver on another node looks like node 0's rank `lb`).
                    let reduced = sig.get(lb).is_some_and(|r| {
                        r.recvs
                            .iter()
                            .any(|&(s, lq, _, reduce)| s == same && lq == la && reduce)
                    });
                    if let Some((work, res)) = cl.reduce_flow(1, (0, lb)).filter(|_| reduced) {
                        flows.push((start, work, res.to_vec()));
                        owner.push((la, lb, usize::from(!same)));
                    }
                    sub.clear();
                    // Another node's receive side looks like node 0's (symmetry): one node.
                    cl.route(1, (0, la), (usize::from(!same), lb), nccl, cross, &mut sub);
                    let work = bytes * cl.prof.eager_factor(bytes);
                    for (share, res) in &sub {
                        flows.push((start, work * share, res.clone()));
                        owner.push((la, lb, usize::from(!same)));
                    }
                }
            }
            let ends = run_batch(&caps, &flows);
            let mut msg_end: HashMap<(usize, usize, usize), (f64, f64)> = HashMap::new();
            for (i, o) in owner.iter().enumerate() {
                let e = msg_end.entry(*o).or_insert((f64::INFINITY, 0.0));
                e.0 = e.0.min(flows[i].0);
                e.1 = e.1.max(ends[i]);
            }
            let slowest = ends.iter().copied().fold(0.0, f64::max);
            let mut phase = 0.0f64;
            let mut arrivals = Vec::new();
            for (lr, l) in sig.iter().enumerate() {
                phase = phase.max(local[lr].1);
                // This rank's receives in the order they arrive, reduced one after another.
                arrivals.clear();
                for &(same, lq, blocks, reduce) in &l.recvs {
                    let span = msg_end
                        .get(&(lq, lr, usize::from(!same)))
                        .copied()
                        .unwrap_or((0.0, slowest));
                    arrivals.push((span, blocks as f64 * bb, reduce));
                }
                arrivals.sort_by(|a, b| a.0 .1.total_cmp(&b.0 .1));
                let mut busy = local[lr].1;
                for &(span, bytes, reduce) in &arrivals {
                    busy = busy.max(cl.recv_end(&job, bytes, reduce, span, busy));
                    phase = phase.max(busy);
                }
            }
            phase = phase.max(slowest);
            seconds += phase * *count as f64;
        }
        Outcome {
            seconds: seconds + cl.nccl_latency(&job, self.msg_phases),
            phases: self.total,
            distinct_phases: self.phases.len(),
            engine: Engine::Phases,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct RankState {
    phase: usize,
    pending: usize,
    /// When the rank's own work (local copies, reductions) queued so far ends.
    busy_until: f64,
}

struct MsgState {
    src: usize,
    dst: usize,
    bytes: f64,
    reduce: bool,
    parts: usize,
    t0: f64,
}

#[derive(Clone, Copy, Debug)]
enum What {
    Start(usize),
    Item(usize),
}

/// What a flow of the events engine's fluid carries.
enum Flow {
    /// A part of message `msgs[i]`.
    Msg(usize),
    /// The reduction of a received message by rank `r` on its core (one host).
    Reduce(usize),
}

struct Ev {
    t: f64,
    what: What,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        self.t == o.t
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    /// Earliest first in a max-heap.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t)
    }
}
