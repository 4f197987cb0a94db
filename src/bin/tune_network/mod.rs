//! `pccl-tune --transport tcp|ofi` under a launcher (one process per rank, e.g.
//! `scripts/cluster.sh run`): the network's terms measured on the network itself
//! ([`pccl::model::network_fit`]).
//!
//! Every rank takes part; the world needs at least 2 nodes of at least 2 ranks. Measured,
//! one after another (the other ranks wait in a barrier, asleep):
//! * the 2-rank all-gather (ring) between rank 0 and the first rank of node 1, and between
//!   ranks 0 and 1 of node 0, at 1 KiB … 4 MiB;
//! * the whole world's all-gather at 1 KiB and at 64 B per rank with the flat ring, the
//!   hierarchical ring and flat recursive doubling (the slowest rank's time), and its 1 KiB
//!   all-reduce with the two rings (what a reduced message costs beyond a stored one);
//! * every node's 4 MiB ring all-gather inside the node, all nodes at once (the bandwidth a
//!   node's intra-node messages share where its ranks' copies share a machine).
//!
//! The host's own terms (copies, reductions) come from `--base` (a `pccl-tune` profile of one
//! node, threads), else PCCL's defaults. Nodes that share one machine (network namespaces)
//! are found by the kernel's boot id: their ranks share the CPUs their affinity masks allow
//! between them. Every timing is pccl-bench's: each round's slowest rank, the median over
//! rounds.

use pccl::config::Config;
use pccl::model::network_fit::{self, NetworkTimings};
use pccl::model::profile::Profile;
use pccl::{Algorithm, Communicator, ReduceOp};
use std::time::Instant;

mod refit;

/// Sizes of the pairs' all-gathers (bytes per rank).
const PAIR_SIZES: [usize; 5] = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20];
/// The world's all-gathers: algorithms, and bytes per rank of each. At 1 KiB a message
/// between nodes moves its bytes in about the time the world's ranks take to send and wake
/// for it on a busy host; at 64 B (the pieces of a 1 KiB all-reduce on 16 ranks) only the
/// latter is left, which tells the fit how much of a small message's time is core time that
/// runs while its bytes move and how much is added to it.
const WORLD: [(&str, [usize; 2]); 3] = [
    ("ring", [1 << 10, 64]),
    ("hier-ring", [1 << 10, 64]),
    ("rd", [1 << 10, 64]),
];

/// The world's all-reduces (`f32` sums; algorithms and bytes per rank), timed with the
/// same communicators: a 1 KiB ring all-reduce on 16 ranks moves 64-byte pieces, each
/// reduced on arrival, and tells the fit what a reduced message costs beyond a stored one.
const WORLD_REDUCE: [(&str, usize); 2] = [("ring", 1 << 10), ("hier-ring", 1 << 10)];

/// What the caller asked for.
pub struct NetworkArgs<'a> {
    /// `tcp` or `ofi`.
    pub transport: &'a str,
    /// Fewer rounds.
    pub quick: bool,
    /// A profile holding the host's terms.
    pub base: Option<&'a str>,
    /// NICs per node (default: the NICs the topology's NIC map puts a rank on).
    pub nics: Option<usize>,
    /// Bytes each NIC direction passes at once after an idle spell (a shaper's burst; the
    /// base's, 0 by default, without it).
    pub burst: Option<usize>,
}

fn cfg_with(algo: Option<Algorithm>) -> pccl::Result<Config> {
    let mut cfg = Config::from_env()?;
    cfg.algo = algo;
    Ok(cfg)
}

/// The time of one all-gather of `bytes` per rank on `comm` as pccl-bench times it: rounds of
/// back-to-back calls after a barrier, each round's time its slowest rank's (the collective
/// is done when every rank is), the median over rounds. (Until 2026-11-29 it took each rank's
/// median first and then the slowest of those, which drops the round in which some rank was
/// descheduled: with 16 processes on 2 cores that put the world's 1 KiB timings 1.2–1.7×
/// below what pccl-bench measured for the same calls, and the fitted model as far.)
fn slowest(comm: &Communicator, bytes: usize, quick: bool) -> pccl::Result<f64> {
    let n = (bytes / 4).max(1);
    let input = vec![1f32; n];
    let mut output = vec![0f32; n * comm.size()];
    timed(comm, bytes, quick, || comm.all_gather(&input, &mut output))
}

/// [`slowest`] for the all-reduce (`f32` sum) of `bytes` per rank.
fn slowest_reduce(comm: &Communicator, bytes: usize, quick: bool) -> pccl::Result<f64> {
    let n = (bytes / 4).max(1);
    let input = vec![1f32; n];
    let mut output = vec![0f32; n];
    timed(comm, bytes, quick, || {
        comm.all_reduce(&input, &mut output, ReduceOp::Sum)
    })
}

/// `call` (a collective of `bytes` per rank on `comm`) timed as [`slowest`] says.
fn timed(
    comm: &Communicator,
    bytes: usize,
    quick: bool,
    mut call: impl FnMut() -> pccl::Result<()>,
) -> pccl::Result<f64> {
    let per_round = ((4 << 20) / bytes).clamp(2, 20);
    for _ in 0..2 {
        call()?;
    }
    let mut v = Vec::new();
    for _ in 0..if quick { 3 } else { 9 } {
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..per_round {
            call()?;
        }
        v.push(t.elapsed().as_secs_f64() / per_round as f64);
    }
    let mut worst = vec![0f64; v.len()];
    comm.all_reduce(&v, &mut worst, ReduceOp::Max)?;
    worst.sort_by(f64::total_cmp);
    Ok(worst[worst.len() / 2])
}

/// The pair `members` (world ranks) measured over [`PAIR_SIZES`]; the others wait.
fn pair(world: &Communicator, members: [usize; 2], quick: bool) -> pccl::Result<Vec<(usize, f64)>> {
    let me = world.rank();
    let color = members.contains(&me).then_some(0);
    let sub = world.split_with_config(
        color,
        me as i32,
        cfg_with(Some(Algorithm::Flat(pccl::LevelAlgo::Ring)))?,
    )?;
    let mut out = Vec::new();
    if let Some(c) = &sub {
        for s in PAIR_SIZES {
            out.push((s, slowest(c, s, quick)?));
        }
    }
    world.barrier()?;
    // Rank 0 is in both pairs: it holds the result.
    Ok(out)
}

/// Bytes per rank of every node's all-gather inside the node, all at once.
const INTRA_ALL_BYTES: usize = 4 << 20;

/// Every node's ring all-gather of [`INTRA_ALL_BYTES`] per rank inside the node, all nodes
/// at once: the slowest rank's time.
fn intra_all(world: &Communicator, quick: bool) -> pccl::Result<f64> {
    let (node, _) = world.topology().position(world.rank());
    let ring = cfg_with(Some(Algorithm::Flat(pccl::LevelAlgo::Ring)))?;
    let sub = world
        .split_with_config(Some(node as u32), world.rank() as i32, ring)?
        .expect("every rank passed a color");
    world.barrier()?;
    let mine = [slowest(&sub, INTRA_ALL_BYTES, quick)?];
    let mut worst = [0f64];
    world.all_reduce(&mine, &mut worst, ReduceOp::Max)?;
    Ok(worst[0])
}

/// Words of the CPU masks the ranks exchange (CPUs 0…1023).
const MASK_WORDS: usize = 16;

/// The CPUs this process may run on (its affinity mask), as [`MASK_WORDS`] 64-bit words;
/// every CPU the machine has online where the mask cannot be read.
fn cpu_mask() -> [u64; MASK_WORDS] {
    let mut words = [0u64; MASK_WORDS];
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its
    // size into it; CPU_ISSET reads it for CPUs below CPU_SETSIZE only.
    let got = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let ok = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0;
        if ok {
            let n = (MASK_WORDS * 64).min(libc::CPU_SETSIZE as usize);
            for cpu in (0..n).filter(|&c| libc::CPU_ISSET(c, &set)) {
                words[cpu / 64] |= 1 << (cpu % 64);
            }
        }
        ok
    };
    if !got || words.iter().all(|&w| w == 0) {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        for cpu in 0..n.min(MASK_WORDS * 64) {
            words[cpu / 64] |= 1 << (cpu % 64);
        }
    }
    words
}

/// How many nodes of the world run on node 0's machine (same kernel boot id), and how many
/// CPUs their ranks may use between them (the union of their affinity masks: all the
/// machine's CPUs when nothing pins them, the nodes' own shares under `cluster.sh run
/// --pin`, whereas one rank's own mask would count only its own share).
fn host_share(world: &Communicator) -> pccl::Result<(usize, usize)> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let h = id.trim().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut mine = vec![h];
    mine.extend(cpu_mask());
    let w = 1 + MASK_WORDS;
    let mut all = vec![0u64; w * world.size()];
    world.all_gather(&mine, &mut all)?;
    let topo = world.topology();
    let host = |r: usize| all[r * w];
    let first = |n: &Vec<usize>| n.first().map(|&r| host(r));
    let node0 = first(&topo.nodes()[0]);
    let nodes = topo.nodes().iter().filter(|n| first(n) == node0).count();
    let mut union = [0u64; MASK_WORDS];
    for r in (0..world.size()).filter(|&r| Some(host(r)) == node0) {
        for (u, m) in union.iter_mut().zip(&all[r * w + 1..(r + 1) * w]) {
            *u |= m;
        }
    }
    let cpus = union.iter().map(|u| u.count_ones() as usize).sum::<usize>();
    Ok((nodes.max(1), cpus.max(1)))
}

/// Measures on the launched world `world` and returns the profile (on rank 0; `None`
/// elsewhere) and the fit's largest error on the world's timings.
pub fn run(
    world: &Communicator,
    a: &NetworkArgs<'_>,
) -> pccl::Result<Option<(Profile, f64, NetworkTimings)>> {
    let topo = world.topology().clone();
    let nodes = topo.nodes().len();
    let m = topo.nodes().iter().map(Vec::len).min().unwrap_or(0);
    if nodes < 2 || m < 2 || !topo.is_regular() {
        return Err(pccl::Error::invalid(format!(
            "pccl-tune --transport {}: the network's terms need a world of at least 2 nodes \
             of at least 2 ranks each, all alike (this world: {})",
            a.transport,
            topo.describe()
        )));
    }
    let n0 = &topo.nodes()[0];
    let inter = pair(world, [n0[0], topo.nodes()[1][0]], a.quick)?;
    let intra = pair(world, [n0[0], n0[1]], a.quick)?;
    let (mut runs, mut reduces) = (Vec::new(), Vec::new());
    for (name, sizes) in WORLD {
        let algo: Algorithm = name.parse()?;
        // One communicator per algorithm (each builds its own connections), for both sizes.
        let comm = world
            .split_with_config(Some(0), world.rank() as i32, cfg_with(Some(algo))?)?
            .expect("every rank passed a color");
        for bytes in sizes {
            runs.push((algo, bytes, slowest(&comm, bytes, a.quick)?));
        }
        for &(_, bytes) in WORLD_REDUCE.iter().filter(|w| w.0 == name) {
            reduces.push((algo, bytes, slowest_reduce(&comm, bytes, a.quick)?));
        }
    }
    let all_nodes = intra_all(world, a.quick)?;
    let (per_host, host_cpus) = host_share(world)?;
    if world.rank() != 0 {
        return Ok(None);
    }
    let nics = a
        .nics
        .or_else(|| topo.nic_map().map(|n| n.in_use()))
        .unwrap_or(1);
    let timings = NetworkTimings {
        nodes,
        ranks_per_node: m,
        nics,
        cores: host_cpus,
        nodes_per_host: per_host,
        inter_pair: inter,
        intra_pair: intra,
        world: runs,
        world_reduce: reduces,
        intra_all: Some((INTRA_ALL_BYTES, all_nodes)),
    };
    let mut base = match a.base {
        Some(f) => Profile::load(std::path::Path::new(f))?,
        None => Profile::default(),
    };
    if let Some(b) = a.burst {
        base.inter.burst_bytes = b as f64;
    }
    let (mut prof, worst) = network_fit::fit(&base, &timings)?;
    prof.name = format!("measured-network-{nodes}x{m}-{nics}nic");
    let head = format!(
        "pccl-tune --transport {} on {nodes} nodes x {m} ranks ({nics} NICs per node; \
         {per_host} nodes per host of {} cores); host terms from {}",
        a.transport,
        timings.cores,
        a.base.unwrap_or("PCCL's defaults"),
    );
    prof.source = describe(&head, &timings, &prof, worst);
    prof.measured_network = Some(timings.clone());
    prof.measured = None;
    Ok(Some((prof, worst, timings)))
}

/// A fitted network profile's `source`: `head` (what ran where), then what was measured
/// (the form [`refit::timings_of_source`] reads back) and how well the fit holds it.
fn describe(head: &str, t: &NetworkTimings, prof: &Profile, worst: f64) -> String {
    let us = |v: &[(usize, f64)]| {
        v.iter()
            .map(|(s, t)| format!("{s} B {:.1} us", t * 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let list = |w: &[(Algorithm, usize, f64)]| {
        w.iter()
            .map(|(al, b, t)| format!("{al} {b} B {:.1} us", t * 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (all_bytes, all_s) = t.intra_all.unwrap_or((INTRA_ALL_BYTES, 0.0));
    let reduces = match &t.world_reduce[..] {
        [] => String::new(),
        w => format!("; the world's all-reduces: {}", list(w)),
    };
    let burst = match prof.inter.burst_bytes {
        b if b > 0.0 => format!("; NIC burst {b:.0} B"),
        _ => String::new(),
    };
    format!(
        "{head}. Measured: pair between nodes: {}; pair in a node: {}; the world's \
         all-gathers: {}{reduces}; every node's {all_bytes} B all-gather inside it at once: {:.1} ms \
         (a node's messages share {:.2} GB/s; 0: no limit){burst}; fitted within {worst:.2}x",
        us(&t.inter_pair),
        us(&t.intra_pair),
        list(&t.world),
        all_s * 1e3,
        prof.intra.node_bandwidth_gbps
    )
}

/// `pccl-tune --refit`: the network's terms of a profile `pccl-tune --transport` wrote, fitted
/// again to the timings it holds (its `[measured_network]`, or for a profile written before
/// 2026-12-02 the timings its `source` lists) by this build's model, with `burst` bytes of
/// NIC burst where given (else the profile's own). The host's terms are kept.
pub fn refit(old: &Profile, burst: Option<usize>) -> pccl::Result<(Profile, f64)> {
    let timings = match &old.measured_network {
        Some(t) => t.clone(),
        None => refit::timings_of_source(&old.source)?,
    };
    let mut base = old.clone();
    if let Some(b) = burst {
        base.inter.burst_bytes = b as f64;
    }
    let (mut prof, worst) = network_fit::fit(&base, &timings)?;
    let head = old.source.split(". Measured:").next().unwrap_or_default();
    let head = format!("{head}; refitted by pccl-tune --refit");
    prof.source = describe(&head, &timings, &prof, worst);
    prof.measured_network = Some(timings);
    Ok((prof, worst))
}
