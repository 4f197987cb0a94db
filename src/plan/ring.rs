//! Ring all-gather and reduce-scatter: `k-1` steps, each moving one unit to the next member.

use super::{Level, Phase, Spans, Step};

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
    ring_reduce_scatter(lvl, src, out, |u, _| work[u].clone())
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
    ring_reduce_scatter(lvl, src, out, |_, t| slots[t % 2].clone())
}

/// The ring reduce-scatter with the partial sum of unit `u` folded at step `t` into
/// `work(u, t)`.
fn ring_reduce_scatter(
    lvl: Level<'_>,
    src: &[Spans],
    out: &Spans,
    mut work: impl FnMut(usize, usize) -> Spans,
) -> Vec<Phase> {
    let k = lvl.size();
    let i = lvl.me;
    // Where each unit's current partial sum is: its source until folded once.
    let mut at: Vec<Option<Spans>> = vec![None; k];
    (0..k - 1)
        .map(|t| {
            let su = (i + 2 * k - t - 1) % k;
            let ru = (i + 2 * k - t - 2) % k;
            let send = at[su].clone().unwrap_or_else(|| src[su].clone());
            let with = at[ru].clone().unwrap_or_else(|| src[ru].clone());
            let dst = if t == k - 2 {
                out.clone()
            } else {
                let w = work(ru, t);
                at[ru] = Some(w.clone());
                w
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
