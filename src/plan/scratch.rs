//! Scratch blocks renumbered by lifetime.
//!
//! The reduce-scatter plans keep the partial sum of block `j` in scratch block `j` (the
//! layout of the input), so a plan that touches block `P − 1` makes every rank allocate
//! `P` blocks, though far fewer hold a live partial sum at once: recursive halving keeps
//! half of them after its first step and fewer after each, a ring over `M` units one unit
//! per step. [`pack`] gives each scratch block a slot from the phase it is first touched to
//! the phase it is last touched, reusing a slot once its block is done with, and rewrites
//! the plan's scratch spans to the slots: `Plan::scratch_blocks` (what the executors
//! allocate) becomes the most blocks alive in any phase, first-fit over the blocks in order
//! of first use.
//!
//! Safe under a phase's semantics (module docs of [`super`]): a slot's next block is first
//! touched in a later phase than its previous block was last touched, and every step of a
//! phase finishes before the next begins (the flat ring's two rotating slots rely on the
//! same). Messages keep their blocks in the same order, only their addresses change, and the
//! checker ([`super::check`]) proves the rewritten plans as it proves the others.

use super::{push_span, Buf, Plan, Span, Spans};

/// Renumbers `plan`'s scratch blocks by lifetime (see the module docs).
pub fn pack(plan: &mut Plan) {
    let k = plan.pieces.max(1);
    // (first phase, last phase) each scratch block is touched in.
    let mut life: Vec<Option<(usize, usize)>> = Vec::new();
    for (i, ph) in plan.phases.iter().enumerate() {
        for st in &ph.steps {
            for spans in st.span_lists() {
                for sp in spans.iter().filter(|s| s.buf == Buf::Scratch && s.len > 0) {
                    for b in sp.start / k..(sp.start + sp.len).div_ceil(k) {
                        if life.len() <= b {
                            life.resize(b + 1, None);
                        }
                        let l = life[b].get_or_insert((i, i));
                        l.1 = l.1.max(i);
                    }
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..life.len()).filter(|&b| life[b].is_some()).collect();
    order.sort_by_key(|&b| (life[b].map(|l| l.0), b));
    // slot_end[s]: the last phase of the block slot `s` holds now.
    let mut slot_end: Vec<usize> = Vec::new();
    let mut slot = vec![usize::MAX; life.len()];
    for b in order {
        let (first, last) = life[b].expect("only touched blocks are ordered");
        let s = match slot_end.iter().position(|&end| end < first) {
            Some(s) => s,
            None => {
                slot_end.push(0);
                slot_end.len() - 1
            }
        };
        slot_end[s] = last;
        slot[b] = s;
    }
    if slot
        .iter()
        .enumerate()
        .all(|(b, &s)| s == b || s == usize::MAX)
    {
        return; // already dense in order of use
    }
    for ph in &mut plan.phases {
        for st in &mut ph.steps {
            for spans in st.span_lists_mut() {
                let mut out = Spans::with_capacity(spans.len());
                for sp in spans.iter() {
                    if sp.buf != Buf::Scratch {
                        push_span(&mut out, *sp);
                        continue;
                    }
                    // Unit by unit (a block or a piece of one), so a span across blocks
                    // that land in different slots is cut where they part.
                    for u in sp.start..sp.start + sp.len {
                        let unit = slot[u / k] * k + u % k;
                        push_span(&mut out, Span::block(Buf::Scratch, unit));
                    }
                }
                *spans = out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Algorithm, Collective, LevelAlgo, Phase, Step};

    fn plan_of(phases: Vec<Phase>, pieces: usize) -> Plan {
        Plan {
            collective: Collective::ReduceScatter { average: false },
            algorithm: Algorithm::Flat(LevelAlgo::Rd),
            rank: 0,
            nranks: 8,
            phases,
            pieces,
        }
    }

    fn scr(start: usize, len: usize) -> Span {
        Span {
            buf: Buf::Scratch,
            start,
            len,
        }
    }

    fn send(peer: usize, src: Vec<Span>) -> Step {
        Step::Send { peer, src }
    }

    fn recv(peer: usize, dst: Vec<Span>) -> Step {
        Step::Recv { peer, dst }
    }

    #[test]
    fn a_block_done_with_gives_its_slot_to_a_later_one() {
        // Block 6 lives in phases 0-1, block 7 in 1-2, block 3 in 2-3: 6 and 3 share a slot.
        let mut pl = plan_of(
            vec![
                Phase::of(vec![recv(1, vec![scr(6, 1)])]),
                Phase::of(vec![send(1, vec![scr(6, 1)]), recv(2, vec![scr(7, 1)])]),
                Phase::of(vec![send(2, vec![scr(7, 1)]), recv(3, vec![scr(3, 1)])]),
                Phase::of(vec![send(3, vec![scr(3, 1)])]),
            ],
            1,
        );
        assert_eq!(pl.scratch_blocks(), 8);
        pack(&mut pl);
        assert_eq!(pl.scratch_blocks(), 2);
        assert_eq!(pl.phases[2].steps[1], recv(3, vec![scr(0, 1)]));
        assert_eq!(pl.phases[2].steps[0], send(2, vec![scr(1, 1)]));
    }

    #[test]
    fn a_span_across_blocks_is_cut_where_its_blocks_part() {
        // Pieces of 2: units 4..8 are blocks 2 and 3; block 3 is touched first (phase 0),
        // block 2 from phase 1, both alive together in phase 1.
        let mut pl = plan_of(
            vec![
                Phase::of(vec![recv(1, vec![scr(6, 2)])]),
                Phase::of(vec![send(1, vec![scr(4, 4)])]),
            ],
            2,
        );
        pack(&mut pl);
        assert_eq!(pl.scratch_blocks(), 2);
        assert_eq!(pl.phases[1].steps[0], send(1, vec![scr(2, 2), scr(0, 2)]));
    }
}
