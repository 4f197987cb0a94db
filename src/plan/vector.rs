//! Whole-vector recursive doubling all-reduce (the short-message all-reduce of MPICH,
//! Thakur, Rabenseifner & Gropp 2005): `ceil(lg P)` rounds in which every rank exchanges
//! its whole partial vector with partner `i XOR 2^k` and reduces, instead of a
//! reduce-scatter and an all-gather (`2 lg P` rounds moving `1/P` of the vector each).
//! It moves `lg P` whole vectors per rank, so it only pays for latency-bound sizes; the
//! tuner weighs that.
//!
//! Non-powers of two: with `q` the largest power of two below `P`, rank `q + j` first sends
//! its vector to rank `j`, which folds it in; ranks `0..q` run the doubling; rank `j` sends
//! the result back to `q + j` at the end.
//!
//! Phase semantics (see the module docs of [`super`]): a round reads the current partial
//! and writes the next into the other working buffer, alternating `Scratch` and `Output`.
//! The first write goes to `Scratch` (the input may alias the output in the in-place form),
//! so the partial ends in `Output` after an even number of reductions and is copied there
//! after an odd one.

use super::{Buf, Phase, Span, Step};

fn whole(buf: Buf, p: usize) -> Vec<Span> {
    vec![Span {
        buf,
        start: 0,
        len: p,
    }]
}

/// The plan of `rank` among `p` ranks; the vector is the `p` balanced blocks of the
/// all-reduce.
pub fn allreduce(rank: usize, p: usize, average: bool) -> Vec<Phase> {
    let mut phases = Vec::new();
    if p == 1 {
        phases.push(Phase::of(vec![Step::Copy {
            src: whole(Buf::Input, p),
            dst: whole(Buf::Output, p),
        }]));
    } else {
        let q = 1usize << (usize::BITS - 1 - p.leading_zeros());
        let extra = p - q;
        if rank >= q {
            // Folded in by `rank - q`, which sends the result back.
            phases.push(Phase::of(vec![Step::Send {
                peer: rank - q,
                src: whole(Buf::Input, p),
            }]));
            phases.push(Phase::of(vec![Step::Recv {
                peer: rank - q,
                dst: whole(Buf::Output, p),
            }]));
        } else {
            let mut cur = Buf::Input;
            let next = |cur: Buf| {
                if cur == Buf::Scratch {
                    Buf::Output
                } else {
                    Buf::Scratch
                }
            };
            if rank < extra {
                let dst = next(cur);
                phases.push(Phase::of(vec![Step::RecvReduce {
                    peer: q + rank,
                    dst: whole(dst, p),
                    with: whole(cur, p),
                }]));
                cur = dst;
            }
            let mut d = 1;
            while d < q {
                let dst = next(cur);
                phases.push(Phase::of(vec![
                    Step::Send {
                        peer: rank ^ d,
                        src: whole(cur, p),
                    },
                    Step::RecvReduce {
                        peer: rank ^ d,
                        dst: whole(dst, p),
                        with: whole(cur, p),
                    },
                ]));
                cur = dst;
                d <<= 1;
            }
            if cur != Buf::Output {
                phases.push(Phase::of(vec![Step::Copy {
                    src: whole(cur, p),
                    dst: whole(Buf::Output, p),
                }]));
            }
            if rank < extra {
                phases.push(Phase::of(vec![Step::Send {
                    peer: q + rank,
                    src: whole(Buf::Output, p),
                }]));
            }
        }
    }
    if average {
        phases.push(Phase::of(vec![Step::Average {
            dst: whole(Buf::Output, p),
        }]));
    }
    phases
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message_phases(ph: &[Phase]) -> usize {
        ph.iter()
            .filter(|p| p.steps.iter().any(|s| matches!(s, Step::Send { .. })))
            .count()
    }

    #[test]
    fn a_power_of_two_takes_lg_p_rounds_and_others_two_more_at_most() {
        for p in [2usize, 4, 8, 16, 64] {
            for r in 0..p {
                assert_eq!(
                    message_phases(&allreduce(r, p, false)),
                    p.trailing_zeros() as usize
                );
            }
        }
        // p = 6: ranks 0, 1 fold 4, 5 in, run 2 rounds and send back (3 sending phases);
        // ranks 4, 5 send once and wait.
        assert_eq!(message_phases(&allreduce(0, 6, false)), 3);
        assert_eq!(message_phases(&allreduce(3, 6, false)), 2);
        assert_eq!(message_phases(&allreduce(5, 6, false)), 1);
    }

    #[test]
    fn the_first_write_never_targets_the_output() {
        for p in 2..=9 {
            for r in 0..p {
                let ph = allreduce(r, p, false);
                let first_write = ph.iter().flat_map(|x| &x.steps).find_map(|s| match s {
                    Step::RecvReduce { dst, .. } | Step::Recv { dst, .. } => Some(dst[0].buf),
                    _ => None,
                });
                if r < 1 << (usize::BITS - 1 - p.leading_zeros()) {
                    assert_eq!(first_write, Some(Buf::Scratch), "p={p} r={r}");
                }
            }
        }
    }
}
