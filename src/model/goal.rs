//! Export of PCCL's plans as a GOAL schedule, the text format read by LogGOPSim's `txt2bin`
//! and by ATLAHS, so an outside simulator can replay exactly the schedule PCCL runs.
//!
//! Each rank's plan becomes one `rank r { … }` block of labelled operations:
//!
//! * a message of `b` bytes becomes `⌈b / piece⌉` `send`/`recv` operations of at most one
//!   piece each (the executor's transports move pieces), tagged with the phase index so a
//!   phase's messages can never match another phase's;
//! * packing a strided message, local copies, and the reduction of each received piece
//!   become `calc` operations whose value is the profile's time for them in nanoseconds;
//! * the executor's phase boundary becomes a `calc 0` join that `requires` every operation of
//!   the phase, and every operation of the next phase `requires` the join.
//!
//! [`check_schedule`] replays a schedule with MPI matching rules (sends eager, a receive
//! completes when its message is there) and reports a deadlock or an unmatched message, so
//! the export is tested without LogGOPSim itself.

use super::profile::{DeviceKind, Profile};
use super::traffic::{of_plan, PhaseWork, Send};
use crate::error::{Error, Result};
use crate::plan::{build, Algorithm, Collective};
use crate::topology::Topology;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

/// What to export.
#[derive(Clone, Copy, Debug)]
pub struct GoalJob<'a> {
    /// The collective.
    pub coll: Collective,
    /// Its (concrete) algorithm.
    pub algo: Algorithm,
    /// Bytes of one block (a rank's share for all-gather / reduce-scatter, `1/P` of an
    /// all-reduce vector).
    pub block_bytes: u64,
    /// Link and compute parameters (piece size, copy and reduction rates).
    pub prof: &'a Profile,
    /// Where reductions run.
    pub device: DeviceKind,
    /// Element type name for the reduction rate.
    pub dtype: &'a str,
}

/// Counts of what a schedule holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoalStats {
    /// `send` operations.
    pub sends: usize,
    /// `recv` operations.
    pub recvs: usize,
    /// `calc` operations (joins included).
    pub calcs: usize,
    /// Bytes sent in all.
    pub bytes: u64,
}

/// The most operations a schedule may hold (about 1 GB of text).
pub const MAX_OPS: usize = 20_000_000;

/// The GOAL schedule of `job` on `topo`: every rank's plan, as text. A schedule that would
/// exceed [`MAX_OPS`] operations (estimated from rank 0's) is refused with an error.
pub fn schedule(topo: &Topology, job: &GoalJob<'_>) -> Result<(String, GoalStats)> {
    let p = topo.nranks();
    let piece = job.prof.piece_bytes.max(1) as u64;
    let copy_ns = 1e9 / (job.prof.copy_gbps * 1e9);
    let reduce_ns = 1e9 / job.prof.reduce_rate(job.device, job.dtype);
    let mut out = String::new();
    let mut st = GoalStats::default();
    let _ = writeln!(
        out,
        "/* PCCL {} {} on {} ranks ({}), {} B per block, pieces of {} B */",
        coll_name(job.coll),
        job.algo.name(),
        p,
        topo.describe(),
        job.block_bytes,
        piece
    );
    let _ = writeln!(out, "num_ranks {p}");
    // Rank 0's plan times P estimates the size before anything is written.
    let plan0 = build(job.coll, job.algo, topo, 0)?;
    // An overlapped hierarchy's plans address blocks cut in `pieces` (balanced) sub-blocks.
    let bb = job.block_bytes / plan0.pieces.max(1) as u64;
    let est = estimate_ops(&of_plan(&plan0), bb, piece).saturating_mul(p as u64);
    if est > MAX_OPS as u64 {
        return Err(Error::invalid(format!(
            "a GOAL schedule of {} with {} B blocks on {p} ranks would hold about {est} \
             operations (limit {MAX_OPS}): export fewer ranks, a smaller size, or a profile \
             with a larger piece_bytes",
            job.algo.name(),
            job.block_bytes,
        )));
    }
    for r in 0..p {
        let plan = build(job.coll, job.algo, topo, r)?;
        let mut rk = RankWriter::default();
        let node = topo.position(r).0;
        let packs = |s: &Send| {
            let same = topo.position(s.peer).0 == node;
            s.spans > 1 && job.prof.packs(bb as f64, s.blocks, s.spans, same)
        };
        let _ = writeln!(out, "\nrank {r} {{");
        for (k, w) in of_plan(&plan).iter().enumerate() {
            rk.phase(&mut out, k, w, bb, piece, copy_ns, reduce_ns, &packs);
        }
        let _ = writeln!(out, "}}");
        st.sends += rk.sends;
        st.recvs += rk.recvs;
        st.calcs += rk.calcs;
        st.bytes += rk.bytes;
    }
    Ok((out, st))
}

fn coll_name(c: Collective) -> &'static str {
    match c {
        Collective::AllGather => "allgather",
        Collective::ReduceScatter { .. } => "reducescatter",
        Collective::AllReduce { .. } => "allreduce",
        Collective::Broadcast { .. } => "broadcast",
        Collective::Barrier => "barrier",
        Collective::Reduce { .. } => "reduce",
        Collective::Gather { .. } => "gather",
        Collective::Scatter { .. } => "scatter",
        Collective::AllToAll { .. } => "alltoall",
    }
}

/// Label allocation and the running join of one rank.
#[derive(Default)]
struct RankWriter {
    next: usize,
    join: Option<usize>,
    sends: usize,
    recvs: usize,
    calcs: usize,
    bytes: u64,
}

impl RankWriter {
    fn op(&mut self, out: &mut String, text: String, after: &[usize]) -> usize {
        self.next += 1;
        let l = self.next;
        let _ = writeln!(out, "l{l}: {text}");
        for a in after.iter().chain(self.join.iter()) {
            let _ = writeln!(out, "l{l} requires l{a}");
        }
        l
    }

    #[allow(clippy::too_many_arguments)]
    fn phase(
        &mut self,
        out: &mut String,
        k: usize,
        w: &PhaseWork,
        bb: u64,
        piece: u64,
        copy_ns: f64,
        reduce_ns: f64,
        packs: &dyn Fn(&Send) -> bool,
    ) {
        let mut ends = Vec::new();
        let ns = |bytes: u64, per: f64| (bytes as f64 * per).ceil() as u64;
        let pack = w.packed_blocks(packs) as u64 * bb;
        let packed = (pack > 0).then(|| {
            self.calcs += 1;
            self.op(out, format!("calc {}", ns(pack, copy_ns)), &[])
        });
        if w.copy_blocks > 0 {
            self.calcs += 1;
            let c = self.op(
                out,
                format!("calc {}", ns(w.copy_blocks as u64 * bb, copy_ns)),
                &[],
            );
            ends.push(c);
        }
        for s in &w.sends {
            let after: Vec<usize> = if packs(s) {
                packed.into_iter().collect()
            } else {
                Vec::new()
            };
            for len in pieces(s.blocks as u64 * bb, piece) {
                self.sends += 1;
                self.bytes += len;
                let l = self.op(out, format!("send {len}b to {} tag {k}", s.peer), &after);
                ends.push(l);
            }
        }
        for rv in &w.recvs {
            let mut last_calc: Option<usize> = None;
            for len in pieces(rv.blocks as u64 * bb, piece) {
                self.recvs += 1;
                let l = self.op(out, format!("recv {len}b from {} tag {k}", rv.peer), &[]);
                if rv.reduce {
                    // Pieces are reduced in arrival order, one after the other.
                    let after: Vec<usize> = std::iter::once(l).chain(last_calc).collect();
                    self.calcs += 1;
                    let c = self.op(out, format!("calc {}", ns(len, reduce_ns)), &after);
                    last_calc = Some(c);
                    ends.push(c);
                } else {
                    ends.push(l);
                }
            }
        }
        if ends.is_empty() {
            return;
        }
        // The join depends on this phase only: drop the previous join from its requirements.
        self.join = None;
        self.calcs += 1;
        let j = self.op(out, "calc 0".to_string(), &ends);
        self.join = Some(j);
    }
}

/// Operations one rank's phases become (see [`RankWriter::phase`]).
fn estimate_ops(work: &[PhaseWork], bb: u64, piece: u64) -> u64 {
    let n = |blocks: usize| (blocks as u64 * bb).div_ceil(piece).max(1);
    work.iter()
        .map(|w| {
            let s: u64 = w.sends.iter().map(|s| n(s.blocks)).sum();
            let r: u64 = w
                .recvs
                .iter()
                .map(|r| n(r.blocks) * if r.reduce { 2 } else { 1 })
                .sum();
            s + r + 3
        })
        .sum()
}

/// The piece lengths of a `bytes`-byte message (one zero-length piece for an empty one).
fn pieces(bytes: u64, piece: u64) -> Vec<u64> {
    if bytes == 0 {
        return vec![0];
    }
    let n = bytes.div_ceil(piece);
    (0..n)
        .map(|i| piece.min(bytes - i * piece))
        .collect::<Vec<_>>()
}

#[derive(Clone, Debug)]
enum Op {
    Send { to: usize, tag: u64, bytes: u64 },
    Recv { from: usize, tag: u64, bytes: u64 },
    Calc,
}

/// Replays a GOAL schedule with MPI matching (per sender and tag, in order; sends eager) and
/// returns the operations completed, or an error naming a deadlocked rank's first blocked
/// operation, a size mismatch, or a message never received.
pub fn check_schedule(text: &str) -> Result<usize> {
    let bad = |m: String| Error::invalid(format!("GOAL schedule: {m}"));
    // Per rank: its operations and, per operation, the operations it requires.
    type Ops = (Vec<Op>, Vec<Vec<usize>>);
    let mut ranks: Vec<Ops> = Vec::new();
    let mut cur: Option<(Ops, HashMap<String, usize>)> = None;
    for (no, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with("/*") || line.starts_with("num_ranks") {
            continue;
        }
        let err = |m: &str| bad(format!("line {}: {m}: {line}", no + 1));
        if line.starts_with("rank ") {
            cur = Some(((Vec::new(), Vec::new()), HashMap::new()));
            continue;
        }
        if line == "}" {
            let (ops, _) = cur.take().ok_or_else(|| err("`}` outside a rank"))?;
            ranks.push(ops);
            continue;
        }
        let ((ops, deps), labels) = cur.as_mut().ok_or_else(|| err("outside a rank"))?;
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() == 3 && w[1] == "requires" {
            let a = *labels.get(w[0]).ok_or_else(|| err("unknown label"))?;
            let b = *labels.get(w[2]).ok_or_else(|| err("unknown label"))?;
            deps[a].push(b);
            continue;
        }
        let label = w[0].strip_suffix(':').ok_or_else(|| err("no label"))?;
        let num = |s: &str| {
            s.trim_end_matches('b')
                .parse::<u64>()
                .map_err(|_| err("number"))
        };
        let op = match (w.get(1).copied(), w.len()) {
            (Some("send"), 7) => Op::Send {
                bytes: num(w[2])?,
                to: num(w[4])? as usize,
                tag: num(w[6])?,
            },
            (Some("recv"), 7) => Op::Recv {
                bytes: num(w[2])?,
                from: num(w[4])? as usize,
                tag: num(w[6])?,
            },
            (Some("calc"), 3) => Op::Calc,
            _ => return Err(err("unknown operation")),
        };
        labels.insert(label.to_string(), ops.len());
        ops.push(op);
        deps.push(Vec::new());
    }
    let p = ranks.len();
    // Messages in flight per (from, to, tag), in send order.
    let mut wire: HashMap<(usize, usize, u64), VecDeque<u64>> = HashMap::new();
    let mut done: Vec<Vec<bool>> = ranks.iter().map(|(o, _)| vec![false; o.len()]).collect();
    let mut left: usize = ranks.iter().map(|(o, _)| o.len()).sum();
    let total = left;
    loop {
        let mut progress = false;
        for r in 0..p {
            let (ops, deps) = &ranks[r];
            for i in 0..ops.len() {
                if done[r][i] || deps[i].iter().any(|&d| !done[r][d]) {
                    continue;
                }
                let ok = match &ops[i] {
                    Op::Send { to, tag, bytes } => {
                        if *to >= p {
                            return Err(bad(format!("rank {r} sends to rank {to} of {p}")));
                        }
                        wire.entry((r, *to, *tag)).or_default().push_back(*bytes);
                        true
                    }
                    Op::Recv { from, tag, bytes } => {
                        match wire.get_mut(&(*from, r, *tag)).and_then(|q| q.pop_front()) {
                            Some(b) if b == *bytes => true,
                            Some(b) => {
                                return Err(bad(format!(
                                    "rank {r} receives {bytes} B from rank {from} tag {tag} \
                                     but {b} B were sent"
                                )))
                            }
                            None => false,
                        }
                    }
                    Op::Calc => true,
                };
                if ok {
                    done[r][i] = true;
                    left -= 1;
                    progress = true;
                }
            }
        }
        if left == 0 {
            break;
        }
        if !progress {
            let (r, i) = (0..p)
                .flat_map(|r| (0..done[r].len()).map(move |i| (r, i)))
                .find(|&(r, i)| !done[r][i])
                .unwrap_or((0, 0));
            return Err(bad(format!(
                "deadlock: rank {r} operation {:?} never completes",
                ranks[r].0[i]
            )));
        }
    }
    if let Some(((f, t, tag), q)) = wire.iter().find(|(_, q)| !q.is_empty()) {
        return Err(bad(format!(
            "{} message(s) from rank {f} to rank {t} tag {tag} never received",
            q.len()
        )));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::LevelAlgo;

    fn job(coll: Collective, algo: Algorithm, prof: &Profile, bb: u64) -> GoalJob<'_> {
        GoalJob {
            coll,
            algo,
            block_bytes: bb,
            prof,
            device: DeviceKind::Host,
            dtype: "f32",
        }
    }

    #[test]
    fn every_algorithm_exports_a_schedule_that_replays_without_deadlock() {
        let prof = Profile::default();
        let hier = Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Ring,
        };
        for (p, m) in [(2, 2), (4, 2), (6, 3), (8, 4), (5, 5), (12, 4)] {
            let topo = Topology::uniform(p, m);
            for coll in [
                Collective::AllGather,
                Collective::ReduceScatter { average: false },
                Collective::AllReduce { average: true },
            ] {
                for algo in [
                    Algorithm::Flat(LevelAlgo::Ring),
                    Algorithm::Flat(LevelAlgo::Rd),
                    hier,
                    hier.overlapped(3).unwrap(),
                ] {
                    let j = job(coll, algo, &prof, 3 * prof.piece_bytes as u64 + 5);
                    let (text, st) = schedule(&topo, &j).unwrap();
                    assert_eq!(st.sends, st.recvs, "{p}x{m} {coll:?} {algo:?}");
                    let n = check_schedule(&text)
                        .unwrap_or_else(|e| panic!("{p}x{m} {coll:?} {algo:?}: {e}\n{text}"));
                    assert!(n >= st.sends + st.recvs);
                }
            }
        }
    }

    #[test]
    fn ring_all_gather_sends_p_minus_one_blocks_in_pieces() {
        let prof = Profile {
            piece_bytes: 1000,
            ..Profile::default()
        };
        let topo = Topology::uniform(4, 4);
        let j = job(
            Collective::AllGather,
            Algorithm::Flat(LevelAlgo::Ring),
            &prof,
            2500,
        );
        let (text, st) = schedule(&topo, &j).unwrap();
        // 4 ranks × 3 steps × 3 pieces (1000, 1000, 500).
        assert_eq!(st.sends, 36);
        assert_eq!(st.bytes, 4 * 3 * 2500);
        assert!(
            text.contains("l3: send 1000b to 1 tag 1\nl3 requires l2\n"),
            "{text}"
        );
        assert!(text.contains("send 500b to 1 tag 1"), "{text}");
        assert!(text.starts_with("/* PCCL allgather ring"));
        assert!(text.contains("num_ranks 4"));
    }

    #[test]
    fn a_schedule_too_large_to_write_is_refused_early() {
        let prof = Profile::default();
        let topo = Topology::uniform(4096, 8);
        let j = job(
            Collective::AllGather,
            Algorithm::Flat(LevelAlgo::Ring),
            &prof,
            1 << 30,
        );
        let t = std::time::Instant::now();
        let e = schedule(&topo, &j).unwrap_err().to_string();
        assert!(e.contains("limit") && e.contains("4096 ranks"), "{e}");
        assert!(t.elapsed().as_secs() < 2);
    }

    #[test]
    fn the_checker_reports_deadlocks_and_mismatches() {
        let dead = "num_ranks 2\nrank 0 {\nl1: recv 8b from 1 tag 0\nl2: send 8b to 1 tag 0\n\
                    l2 requires l1\n}\nrank 1 {\nl1: recv 8b from 0 tag 0\nl2: send 8b to 0 tag 0\n\
                    l2 requires l1\n}\n";
        let e = check_schedule(dead).unwrap_err().to_string();
        assert!(e.contains("deadlock"), "{e}");
        let size = "num_ranks 2\nrank 0 {\nl1: send 8b to 1 tag 0\n}\nrank 1 {\n\
                    l1: recv 4b from 0 tag 0\n}\n";
        let e = check_schedule(size).unwrap_err().to_string();
        assert!(e.contains("4 B") && e.contains("8 B"), "{e}");
        let lost = "num_ranks 2\nrank 0 {\nl1: send 8b to 1 tag 3\n}\nrank 1 {\n}\n";
        let e = check_schedule(lost).unwrap_err().to_string();
        assert!(e.contains("never received"), "{e}");
        let ok = "num_ranks 2\nrank 0 {\nl1: send 8b to 1 tag 0\nl2: calc 5\nl2 requires l1\n}\n\
                  rank 1 {\nl1: recv 8b from 0 tag 0\n}\n";
        assert_eq!(check_schedule(ok).unwrap(), 3);
    }
}
