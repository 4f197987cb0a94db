//! Ring all-gather and reduce-scatter: `k-1` steps, each moving one unit to the next member.

use super::{Level, Partials, Phase, Spans, Step};

/// Ring all-gather: at step `t` member `i` forwards unit `i-t` and receives unit `i-t-1`.
pub fn allgather(lvl: Level<'_>, units: &[Spans]) -> Vec<Phase> {
    let k = lvl.size();
    let i = lvl.me;
    (0..k.saturating_sub(1))
        .map(|t| {
            let su = (i + k - t) % k;
            let ru = (i + 2 * k - t - 1) % k;
            Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(i + 1),
                    src: units[su].clone(),
                },
                Step::Recv {
                    peer: lvl.peer(i + k - 1),
                    dst: units[ru].clone(),
                },
            ])
        })
        .collect()
}

/// Ring reduce-scatter: at step `t` member `i` sends its partial sum of unit `i-t-1` and folds
/// the received partial of unit `i-t-2` into its own; the last step lands unit `i` in `out`.
pub fn reduce_scatter(lvl: Level<'_>, src: &[Spans], work: &[Spans], out: &Spans) -> Vec<Phase> {
    let k = lvl.size();
    let i = lvl.me;
    let mut parts = Partials::new(src, work);
    (0..k - 1)
        .map(|t| {
            let su = (i + 2 * k - t - 1) % k;
            let ru = (i + 2 * k - t - 2) % k;
            let send = parts.current(su).clone();
            let with = parts.current(ru).clone();
            let dst = if t == k - 2 {
                out.clone()
            } else {
                parts.next(ru).clone()
            };
            Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(i + 1),
                    src: send,
                },
                Step::RecvReduce {
                    peer: lvl.peer(i + k - 1),
                    dst,
                    with,
                },
            ])
        })
        .collect()
}

/// [`reduce_scatter`] whose partial sums live in two rotating work slots instead of one work
/// unit each: step `t` folds into `slots[t % 2]` what step `t + 1` sends, while the slot
/// written at step `t - 1` is being sent (a phase waits for its sends before the next one
/// starts). Scratch bounded by two units whatever the member count; every unit must be the
/// size of a slot (uniform blocks). The plan checker proves it like any plan.
pub fn reduce_scatter_two_slots(
    lvl: Level<'_>,
    src: &[Spans],
    slots: &[Spans; 2],
    out: &Spans,
) -> Vec<Phase> {
    let k = lvl.size();
    let i = lvl.me;
    // Where each unit's current partial sum is: its source until folded once.
    let mut at: Vec<Option<usize>> = vec![None; k];
    (0..k - 1)
        .map(|t| {
            let su = (i + 2 * k - t - 1) % k;
            let ru = (i + 2 * k - t - 2) % k;
            let current = |u: usize, at: &[Option<usize>]| match at[u] {
                Some(slot) => slots[slot].clone(),
                None => src[u].clone(),
            };
            let send = current(su, &at);
            let with = current(ru, &at);
            let dst = if t == k - 2 {
                out.clone()
            } else {
                at[ru] = Some(t % 2);
                slots[t % 2].clone()
            };
            Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(i + 1),
                    src: send,
                },
                Step::RecvReduce {
                    peer: lvl.peer(i + k - 1),
                    dst,
                    with,
                },
            ])
        })
        .collect()
}
