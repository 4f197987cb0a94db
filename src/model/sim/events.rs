//! The event engine ([`super::Engine::Events`]): every rank's plan replayed as events, each
//! message sharing the links it crosses with every other message in flight.

use super::{Cluster, Engine, Job, Outcome};
use crate::error::{Error, Result};
use crate::model::contention::Fluid;
use crate::model::profile::{DeviceKind, ReceiveReduce};
use crate::model::shaper::Buckets;
use crate::model::traffic::{of_plan, PhaseWork};
use crate::plan::build;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

impl Cluster<'_> {
    /// The event engine. With NICs that have a free burst ([`super::shaper`]) the call is
    /// timed in the buckets' steady state: a benchmark's calls run back to back, so a call
    /// finds its NICs' buckets as the calls before it left them — full where the NICs idle
    /// most of the time, drained where they are the bottleneck (a 1 KiB pair's loop drains
    /// 32 KiB within a few dozen calls and is then held to the NIC's rate). That state is the
    /// largest level `θ·burst`, the same on every NIC, that no NIC's bucket ends a call below
    /// (within 1% of the burst): found from full, else by bisection over θ.
    pub(super) fn events(&self, job: &Job) -> Result<Outcome> {
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
                let (pack, local) = self.local(r, w, bb, speed);
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
