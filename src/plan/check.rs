//! Symbolic plan checker: runs the plans of every rank on symbolic data, with no processes
//! and no transport, and proves that each output block receives exactly the right
//! contributions (each exactly once), that no phase has a read/write hazard, that messages
//! match in count and order, that no rank waits forever, and that no message is left unread.
//!
//! It also runs the in-place forms by aliasing the buffers the way NCCL defines them.

use super::{blocks, Buf, Collective, Plan, Span, Step};
use smallvec::SmallVec;
use std::collections::VecDeque;
// FxHash for the message queues' small integer keys: SipHash took a fifth of the time of a
// check at thousands of ranks, and no key here comes from outside.
use rustc_hash::FxHashMap;

/// A set of ranks, as sorted disjoint half-open ranges.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct RankSet(SmallVec<[(u32, u32); 2]>);

impl RankSet {
    fn one(r: usize) -> Self {
        RankSet(SmallVec::from_slice(&[(r as u32, r as u32 + 1)]))
    }
    fn all(p: usize) -> Self {
        if p == 0 {
            return RankSet::default();
        }
        RankSet(SmallVec::from_slice(&[(0, p as u32)]))
    }
    /// Union; `Err` if the sets overlap (a contribution would be counted twice).
    fn union_disjoint(&self, other: &RankSet) -> Result<RankSet, ()> {
        let mut v: SmallVec<[(u32, u32); 4]> =
            self.0.iter().chain(other.0.iter()).copied().collect();
        v.sort_unstable();
        let mut out: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        for (a, b) in v {
            if let Some(last) = out.last_mut() {
                if a < last.1 {
                    return Err(());
                }
                if a == last.1 {
                    last.1 = b;
                    continue;
                }
            }
            out.push((a, b));
        }
        Ok(RankSet(out))
    }
    /// Union allowing overlap.
    fn union(&self, other: &RankSet) -> RankSet {
        let mut v: SmallVec<[(u32, u32); 4]> =
            self.0.iter().chain(other.0.iter()).copied().collect();
        v.sort_unstable();
        let mut out: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        for (a, b) in v {
            if let Some(last) = out.last_mut() {
                if a <= last.1 {
                    last.1 = last.1.max(b);
                    continue;
                }
            }
            out.push((a, b));
        }
        RankSet(out)
    }
}

/// What a block holds: which logical block, summed over which ranks, averaged or not.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Content {
    block: u32,
    from: RankSet,
    avg: bool,
}

type Cell = Option<Content>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phys {
    In,
    Out,
    Scr,
}

struct Layout {
    coll: Collective,
    p: usize,
    inplace: bool,
    /// Pieces per block ([`Plan::pieces`]): positions are sub-blocks, logical blocks too.
    k: usize,
}

impl Layout {
    /// Physical location of logical block `(buf, idx)` on `rank`.
    fn phys(&self, rank: usize, buf: Buf, idx: usize) -> (Phys, usize) {
        match (buf, self.coll, self.inplace) {
            (Buf::Scratch, _, _) => (Phys::Scr, idx),
            (Buf::Input, Collective::AllGather, true) => (Phys::Out, rank * self.k + idx),
            (Buf::Output, Collective::ReduceScatter { .. }, true) => {
                (Phys::In, rank * self.k + idx)
            }
            (Buf::Input, Collective::AllReduce { .. }, true) => (Phys::Out, idx),
            (Buf::Input, Collective::Broadcast { .. }, true) => (Phys::Out, idx),
            (Buf::Input, Collective::Reduce { root, .. }, true) if rank == root => (Phys::Out, idx),
            (Buf::Input, Collective::Gather { root }, true) if rank == root => {
                (Phys::Out, root + idx)
            }
            (Buf::Output, Collective::Scatter { root }, true) if rank == root => {
                (Phys::In, root + idx)
            }
            (Buf::Input, _, _) => (Phys::In, idx),
            (Buf::Output, _, _) => (Phys::Out, idx),
        }
    }
    fn len(&self, rank: usize, ph: Phys) -> usize {
        let p = self.p;
        let at_root = |root: usize, n: usize| if rank == root { n } else { 0 };
        match (self.coll, ph) {
            (Collective::Reduce { root, .. }, Phys::Out) => at_root(root, 1),
            (Collective::Reduce { .. }, _) => 1,
            (Collective::Gather { .. }, Phys::In) => 1,
            (Collective::Gather { root }, Phys::Out) => at_root(root, p),
            (Collective::Gather { .. }, Phys::Scr) => p,
            (Collective::Scatter { root }, Phys::In) => at_root(root, p),
            (Collective::Scatter { .. }, Phys::Out) => 1,
            (Collective::Scatter { .. }, Phys::Scr) => p,
            (Collective::AllToAll { .. }, Phys::Scr) => 0,
            (Collective::AllToAll { .. }, _) => p,
            (Collective::Barrier, _) => 0,
            (Collective::Broadcast { .. }, _) => 1,
            (Collective::AllGather, Phys::In) => self.k,
            (Collective::AllGather, _) => p * self.k,
            (Collective::ReduceScatter { .. }, Phys::Out) => self.k,
            (Collective::ReduceScatter { .. }, _) => p * self.k,
            (Collective::AllReduce { .. }, _) => p * self.k,
        }
    }
    /// The initial content of input position `idx` on `rank`.
    fn pristine(&self, rank: usize, idx: usize) -> Cell {
        let (block, from) = match self.coll {
            Collective::AllGather => (rank * self.k + idx, rank),
            Collective::ReduceScatter { .. } | Collective::AllReduce { .. } => (idx, rank),
            Collective::Broadcast { root } if rank == root => (0, root),
            Collective::Reduce { .. } => (0, rank),
            Collective::Gather { .. } => (rank, rank),
            Collective::Scatter { root } if rank == root => (idx, root),
            Collective::AllToAll { .. } => (idx, rank),
            _ => return None,
        };
        Some(Content {
            block: block as u32,
            from: RankSet::one(from),
            avg: false,
        })
    }
    /// The logical block a position must hold, where positions are tied to blocks.
    fn expected_block(&self, rank: usize, ph: Phys, idx: usize) -> Option<u32> {
        match (self.coll, ph) {
            (Collective::AllGather, Phys::Out) | (Collective::AllGather, Phys::Scr) => {
                Some(idx as u32)
            }
            (Collective::Gather { .. }, Phys::Out | Phys::Scr) => Some(idx as u32),
            (Collective::Scatter { .. }, Phys::In | Phys::Scr) => Some(idx as u32),
            (Collective::Scatter { .. }, Phys::Out) | (Collective::AllToAll { .. }, Phys::Out) => {
                Some(rank as u32)
            }
            (Collective::Reduce { .. }, _) => Some(0),
            // The reduce-scatter's scratch blocks and its (out-of-place) output are all one
            // block's size (a uniform layout): any block's partial sum may use any of them
            // (the ring rotates two, one of them the output out of place); combining
            // partials of different blocks is still caught (`combine`), and `verify` checks
            // which block the output holds at the end. In place the output is the rank's
            // input block, still tied to its block.
            (Collective::ReduceScatter { .. }, Phys::Scr | Phys::Out) => None,
            (Collective::ReduceScatter { .. }, _) | (Collective::AllReduce { .. }, _) => {
                Some(idx as u32)
            }
            _ => None,
        }
    }
}

struct RankState {
    /// Input positions written so far (`None`: still the pristine input).
    input: Vec<Option<Cell>>,
    out: Vec<Cell>,
    scr: Vec<Cell>,
    heard: RankSet,
}

struct Msg {
    id: usize,
    cells: Vec<Cell>,
    heard: RankSet,
}

fn positions(spans: &[Span]) -> impl Iterator<Item = (Buf, usize)> + '_ {
    spans
        .iter()
        .flat_map(|s| (s.start..s.start + s.len).map(move |i| (s.buf, i)))
}

struct Sim<'a> {
    lay: Layout,
    plans: &'a [Plan],
    st: Vec<RankState>,
}

impl Sim<'_> {
    fn read(&self, rank: usize, buf: Buf, idx: usize) -> Result<Cell, String> {
        let (ph, i) = self.lay.phys(rank, buf, idx);
        if i >= self.lay.len(rank, ph) {
            return Err(format!(
                "rank {rank} reads {buf:?}[{idx}] outside its buffer"
            ));
        }
        let s = &self.st[rank];
        Ok(match ph {
            Phys::In => match &s.input[i] {
                Some(c) => c.clone(),
                None => self.lay.pristine(rank, i),
            },
            Phys::Out => s.out[i].clone(),
            Phys::Scr => s.scr[i].clone(),
        })
    }
    fn read_spans(&self, rank: usize, spans: &[Span]) -> Result<Vec<Cell>, String> {
        positions(spans)
            .map(|(b, i)| self.read(rank, b, i))
            .collect()
    }
    fn write(&mut self, rank: usize, buf: Buf, idx: usize, c: Cell) -> Result<(), String> {
        let (ph, i) = self.lay.phys(rank, buf, idx);
        if i >= self.lay.len(rank, ph) {
            return Err(format!(
                "rank {rank} writes {buf:?}[{idx}] outside its buffer"
            ));
        }
        if let (Some(want), Some(got)) = (self.lay.expected_block(rank, ph, i), c.as_ref()) {
            if want != got.block {
                return Err(format!(
                    "rank {rank}: block {} lands at {buf:?}[{idx}], which holds block {want}",
                    got.block
                ));
            }
        }
        let s = &mut self.st[rank];
        match ph {
            Phys::In => s.input[i] = Some(c),
            Phys::Out => s.out[i] = c,
            Phys::Scr => s.scr[i] = c,
        }
        Ok(())
    }
    fn write_spans(&mut self, rank: usize, spans: &[Span], cells: Vec<Cell>) -> Result<(), String> {
        let pos: Vec<(Buf, usize)> = positions(spans).collect();
        if pos.len() != cells.len() {
            return Err(format!(
                "rank {rank}: {} blocks written into {} positions",
                cells.len(),
                pos.len()
            ));
        }
        for ((b, i), c) in pos.into_iter().zip(cells) {
            self.write(rank, b, i, c)?;
        }
        Ok(())
    }
}

fn combine(rank: usize, a: &Cell, b: &Cell) -> Result<Cell, String> {
    match (a, b) {
        (Some(x), Some(y)) => {
            if x.block != y.block {
                return Err(format!(
                    "rank {rank} reduces block {} with block {}",
                    x.block, y.block
                ));
            }
            if x.avg || y.avg {
                return Err(format!(
                    "rank {rank} reduces an already averaged block {}",
                    x.block
                ));
            }
            let from = x.from.union_disjoint(&y.from).map_err(|_| {
                format!(
                    "rank {rank}: block {} would count a contribution twice ({:?} + {:?})",
                    x.block, x.from, y.from
                )
            })?;
            Ok(Some(Content {
                block: x.block,
                from,
                avg: false,
            }))
        }
        _ => Err(format!("rank {rank} reduces an uninitialised block")),
    }
}

/// Checks that no phase of `plan` writes a position another step of the phase reads or
/// writes (an in-place reduction of a position into itself is allowed).
fn check_hazards(lay: &Layout, plan: &Plan) -> Result<(), String> {
    let r = plan.rank;
    // Per position: (phase + 1, step) of its last reader and writer; an entry of an
    // earlier phase counts as none, so nothing is cleared between phases.
    let lens = [Phys::In, Phys::Out, Phys::Scr].map(|ph| lay.len(r, ph));
    let slot = |ph: Phys, i: usize| -> usize {
        match ph {
            Phys::In => i,
            Phys::Out => lens[0] + i,
            Phys::Scr => lens[0] + lens[1] + i,
        }
    };
    let total = lens.iter().sum::<usize>();
    let mut reads: Vec<(usize, usize)> = vec![(0, 0); total];
    let mut writes: Vec<(usize, usize)> = vec![(0, 0); total];
    for (pi, phase) in plan.phases.iter().enumerate() {
        let stamp = pi + 1;
        for (si, step) in phase.steps.iter().enumerate() {
            let mut rd = |ph: Phys, i: usize| -> Result<(), String> {
                if i >= lay.len(r, ph) {
                    return Err(format!(
                        "rank {r} phase {pi}: reads {ph:?}[{i}] outside its buffer"
                    ));
                }
                reads[slot(ph, i)] = (stamp, si);
                Ok(())
            };
            match step {
                Step::Send { src, .. } | Step::Copy { src, .. } => {
                    for (b, i) in positions(src) {
                        let (ph, j) = lay.phys(r, b, i);
                        rd(ph, j)?;
                    }
                }
                Step::RecvReduce { dst, with, .. } => {
                    if blocks(dst) != blocks(with) {
                        return Err(format!(
                            "rank {r} phase {pi}: reduce operand and target differ in length"
                        ));
                    }
                    for ((wb, wi), (db, di)) in positions(with).zip(positions(dst)) {
                        let w = lay.phys(r, wb, wi);
                        if w != lay.phys(r, db, di) {
                            rd(w.0, w.1)?;
                        }
                    }
                }
                _ => {}
            }
        }
        for (si, step) in phase.steps.iter().enumerate() {
            let dst = match step {
                Step::Recv { dst, .. }
                | Step::RecvReduce { dst, .. }
                | Step::Copy { dst, .. }
                | Step::Average { dst } => dst,
                Step::Send { .. } => continue,
            };
            if let Step::Copy { src, .. } = step {
                if blocks(src) != blocks(dst) {
                    return Err(format!(
                        "rank {r} phase {pi}: copy of {} blocks into {}",
                        blocks(src),
                        blocks(dst)
                    ));
                }
            }
            let copy_to_itself = matches!(step, Step::Copy { src, .. }
                if positions(src).zip(positions(dst)).all(|(s, d)| lay.phys(r, s.0, s.1) == lay.phys(r, d.0, d.1)));
            for (b, i) in positions(dst) {
                let (ph, j) = lay.phys(r, b, i);
                if j >= lay.len(r, ph) {
                    return Err(format!(
                        "rank {r} phase {pi}: writes {b:?}[{i}] outside its buffer"
                    ));
                }
                let at = slot(ph, j);
                if writes[at].0 == stamp {
                    return Err(format!("rank {r} phase {pi}: {b:?}[{i}] written twice"));
                }
                writes[at] = (stamp, si);
                let (rstamp, reader) = reads[at];
                if rstamp == stamp && !(reader == si && copy_to_itself) {
                    return Err(format!(
                        "rank {r} phase {pi}: {b:?}[{i}] is written while read"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs `plans` (one per rank, index = rank) on symbolic data and checks the collective's
/// postcondition. `inplace` aliases the buffers as NCCL's in-place forms do.
pub fn check_plans(coll: Collective, plans: &[Plan], inplace: bool) -> Result<(), String> {
    let p = plans.len();
    let k = plans.first().map_or(1, |pl| pl.pieces);
    if k == 0 || plans.iter().any(|pl| pl.pieces != k) {
        return Err("plans disagree on the pieces per block (or claim none)".into());
    }
    let lay = Layout {
        coll,
        p,
        inplace,
        k,
    };
    for (r, plan) in plans.iter().enumerate() {
        if plan.rank != r || plan.nranks != p {
            return Err(format!(
                "plan {r} claims rank {} of {}",
                plan.rank, plan.nranks
            ));
        }
        check_hazards(&lay, plan)?;
    }
    let st = (0..p)
        .map(|r| RankState {
            input: vec![None; lay.len(r, Phys::In)],
            out: vec![None; lay.len(r, Phys::Out)],
            scr: vec![None; lay.len(r, Phys::Scr)],
            heard: RankSet::one(r),
        })
        .collect();
    let mut sim = Sim { lay, plans, st };
    // In-place forms: the input starts out inside the output buffer.
    let in_blocks = match coll {
        Collective::AllGather => k,
        Collective::ReduceScatter { .. } | Collective::AllReduce { .. } => p * k,
        Collective::Broadcast { .. } | Collective::Reduce { .. } | Collective::Gather { .. } => 1,
        Collective::Barrier => 0,
        _ => p,
    };
    for r in 0..p {
        for i in 0..in_blocks {
            let (ph, pi) = sim.lay.phys(r, Buf::Input, i);
            if ph != Phys::In {
                let c = sim.lay.pristine(r, i);
                match ph {
                    Phys::Out => sim.st[r].out[pi] = c,
                    _ => sim.st[r].scr[pi] = c,
                }
            }
        }
    }
    let mut queues: FxHashMap<(usize, usize), VecDeque<Msg>> = FxHashMap::default();
    let mut consumed: Vec<bool> = Vec::new();
    let mut phase = vec![0usize; p];
    let mut posted = vec![false; p];
    let mut sent: Vec<Vec<usize>> = vec![Vec::new(); p];
    let mut recv_done: Vec<Vec<bool>> = vec![Vec::new(); p];
    loop {
        let mut progress = false;
        let mut all_done = true;
        for r in 0..p {
            let plan = &sim.plans[r];
            let Some(ph) = plan.phases.get(phase[r]) else {
                continue;
            };
            all_done = false;
            if !posted[r] {
                // Reads see the state at the start of the phase: take them all first.
                let mut copies = Vec::new();
                sent[r].clear();
                for step in &ph.steps {
                    match step {
                        Step::Send { peer, src } => {
                            if *peer >= p || *peer == r {
                                return Err(format!("rank {r} sends to invalid peer {peer}"));
                            }
                            let cells = sim.read_spans(r, src)?;
                            let id = consumed.len();
                            consumed.push(false);
                            sent[r].push(id);
                            let heard = sim.st[r].heard.clone();
                            queues.entry((r, *peer)).or_default().push_back(Msg {
                                id,
                                cells,
                                heard,
                            });
                        }
                        Step::Copy { src, dst } => {
                            copies.push((dst.clone(), sim.read_spans(r, src)?))
                        }
                        _ => {}
                    }
                }
                for (dst, cells) in copies {
                    sim.write_spans(r, &dst, cells)?;
                }
                for step in &ph.steps {
                    if let Step::Average { dst } = step {
                        for (b, i) in positions(dst) {
                            let c = sim.read(r, b, i)?;
                            match c {
                                Some(mut c) if !c.avg && c.from == RankSet::all(p) => {
                                    c.avg = true;
                                    sim.write(r, b, i, Some(c))?;
                                }
                                other => {
                                    return Err(format!(
                                        "rank {r} averages {b:?}[{i}] holding {other:?}"
                                    ));
                                }
                            }
                        }
                    }
                }
                recv_done[r] = vec![false; ph.steps.len()];
                posted[r] = true;
                progress = true;
            }
            for (si, step) in ph.steps.iter().enumerate() {
                if recv_done[r][si] {
                    continue;
                }
                let (peer, dst, with) = match step {
                    Step::Recv { peer, dst } => (*peer, dst, None),
                    Step::RecvReduce { peer, dst, with } => (*peer, dst, Some(with)),
                    _ => continue,
                };
                let Some(msg) = queues.get_mut(&(peer, r)).and_then(|q| q.pop_front()) else {
                    continue;
                };
                consumed[msg.id] = true;
                if msg.cells.len() != blocks(dst) {
                    return Err(format!(
                        "rank {r} expects {} blocks from rank {peer} but the message has {}",
                        blocks(dst),
                        msg.cells.len()
                    ));
                }
                sim.st[r].heard = sim.st[r].heard.union(&msg.heard);
                let cells = match with {
                    None => msg.cells,
                    Some(with) => {
                        let mine = sim.read_spans(r, with)?;
                        mine.iter()
                            .zip(&msg.cells)
                            .map(|(a, b)| combine(r, a, b))
                            .collect::<Result<Vec<_>, _>>()?
                    }
                };
                sim.write_spans(r, dst, cells)?;
                recv_done[r][si] = true;
                progress = true;
            }
            let recvs_done = ph.steps.iter().enumerate().all(|(si, s)| {
                !matches!(s, Step::Recv { .. } | Step::RecvReduce { .. }) || recv_done[r][si]
            });
            if recvs_done && sent[r].iter().all(|&id| consumed[id]) {
                phase[r] += 1;
                posted[r] = false;
                progress = true;
            }
        }
        if all_done {
            break;
        }
        if !progress {
            let stuck: Vec<String> = (0..p)
                .filter(|&r| phase[r] < sim.plans[r].phases.len())
                .take(8)
                .map(|r| format!("rank {r} in phase {}", phase[r]))
                .collect();
            return Err(format!("deadlock: {}", stuck.join(", ")));
        }
    }
    if let Some(((s, d), _)) = queues.iter().find(|(_, q)| !q.is_empty()) {
        return Err(format!(
            "message from rank {s} to rank {d} was never received"
        ));
    }
    verify(&sim, coll, p, k)
}

fn verify(sim: &Sim<'_>, coll: Collective, p: usize, k: usize) -> Result<(), String> {
    let all = RankSet::all(p);
    for r in 0..p {
        let expect = |idx: usize, block: usize, from: RankSet, avg: bool| -> Result<(), String> {
            let got = sim.read(r, Buf::Output, idx)?;
            let want = Some(Content {
                block: block as u32,
                from,
                avg,
            });
            if got != want {
                return Err(format!(
                    "rank {r}: Output[{idx}] holds {got:?}, expected {want:?}"
                ));
            }
            Ok(())
        };
        match coll {
            Collective::AllGather => {
                for b in 0..p * k {
                    expect(b, b, RankSet::one(b / k), false)?;
                }
            }
            Collective::ReduceScatter { average } => {
                for j in 0..k {
                    expect(j, r * k + j, all.clone(), average)?;
                }
            }
            Collective::AllReduce { average } => {
                for b in 0..p * k {
                    expect(b, b, all.clone(), average)?;
                }
            }
            Collective::Broadcast { root } => expect(0, 0, RankSet::one(root), false)?,
            Collective::Reduce { root, average } => {
                if r == root {
                    expect(0, 0, all.clone(), average)?;
                }
            }
            Collective::Gather { root } => {
                if r == root {
                    for b in 0..p {
                        expect(b, b, RankSet::one(b), false)?;
                    }
                }
            }
            Collective::Scatter { root } => expect(0, r, RankSet::one(root), false)?,
            Collective::AllToAll { .. } => {
                for i in 0..p {
                    expect(i, r, RankSet::one(i), false)?;
                }
            }
            Collective::Barrier => {
                if sim.st[r].heard != all {
                    return Err(format!(
                        "rank {r} leaves the barrier having heard only from {:?}",
                        sim.st[r].heard
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{build, Algorithm, LevelAlgo, Phase};
    use crate::topology::Topology;

    fn plans(coll: Collective, algo: Algorithm, topo: &Topology) -> Vec<Plan> {
        (0..topo.nranks())
            .map(|r| build(coll, algo, topo, r).unwrap())
            .collect()
    }

    #[test]
    fn checker_rejects_a_plan_that_drops_a_step() {
        let topo = Topology::uniform(4, 4);
        let mut ps = plans(
            Collective::AllGather,
            Algorithm::Flat(LevelAlgo::Ring),
            &topo,
        );
        ps[2].phases.pop();
        assert!(check_plans(Collective::AllGather, &ps, false).is_err());
    }

    #[test]
    fn checker_rejects_double_counting() {
        let topo = Topology::uniform(2, 2);
        let coll = Collective::ReduceScatter { average: false };
        let mut ps = plans(coll, Algorithm::Flat(LevelAlgo::Ring), &topo);
        assert!(check_plans(coll, &ps, false).is_ok());
        // Each rank folds the peer's contribution into its result a second time.
        for (r, p) in ps.iter_mut().enumerate() {
            let out = vec![Span::block(Buf::Output, 0)];
            p.phases.push(Phase::of(vec![
                Step::Send {
                    peer: 1 - r,
                    src: vec![Span::block(Buf::Input, 1 - r)],
                },
                Step::RecvReduce {
                    peer: 1 - r,
                    dst: out.clone(),
                    with: out,
                },
            ]));
        }
        let e = check_plans(coll, &ps, false).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn checker_detects_deadlock() {
        let topo = Topology::uniform(2, 2);
        let mut ps = plans(Collective::Barrier, Algorithm::Flat(LevelAlgo::Ring), &topo);
        ps[0].phases = vec![Phase::of(vec![Step::Recv {
            peer: 1,
            dst: vec![],
        }])];
        ps[1].phases = vec![Phase::of(vec![Step::Recv {
            peer: 0,
            dst: vec![],
        }])];
        let e = check_plans(Collective::Barrier, &ps, false).unwrap_err();
        assert!(e.contains("deadlock"), "{e}");
    }
}
