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

use super::profile::{DeviceKind, Profile, ReceiveReduce};
use super::traffic::PhaseWork;
use crate::error::Result;
use crate::plan::{Algorithm, Collective, LevelAlgo};
use crate::topology::{NicMap, Topology};

mod events;
mod phases;

pub use phases::Summary;

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

    /// Local time of rank `r`'s phase before its messages can move: packing, then copies.
    fn local(&self, r: usize, w: &PhaseWork, bb: f64, speed: f64) -> (f64, f64) {
        let rate = self.prof.copy_gbps * 1e9 * speed;
        let node = self.topo.position(r).0;
        let packed = w.packed_blocks(|s| {
            let same = self.topo.position(s.peer).0 == node;
            self.prof.packs(bb, s.blocks, s.spans, same)
        });
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
}
