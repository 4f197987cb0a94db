//! Broadcast (binomial tree) and barrier (dissemination), both `ceil(lg p)` rounds.

use super::{Buf, Phase, Span, Step};

/// Binomial-tree broadcast of one block from `root`.
pub fn binomial(rank: usize, p: usize, root: usize) -> Vec<Phase> {
    let mut phases = Vec::new();
    let out = vec![Span::block(Buf::Output, 0)];
    if rank == root {
        phases.push(Phase::of(vec![Step::Copy {
            src: vec![Span::block(Buf::Input, 0)],
            dst: out.clone(),
        }]));
    }
    let v = (rank + p - root) % p;
    let mut mask = 1;
    while mask < p {
        if v < mask && v + mask < p {
            phases.push(Phase::of(vec![Step::Send {
                peer: (v + mask + root) % p,
                src: out.clone(),
            }]));
        } else if v >= mask && v < 2 * mask {
            phases.push(Phase::of(vec![Step::Recv {
                peer: (v - mask + root) % p,
                dst: out.clone(),
            }]));
        }
        mask <<= 1;
    }
    phases
}

/// Dissemination barrier: round `j` signals rank `i + 2^j` and waits for rank `i - 2^j`.
pub fn barrier(rank: usize, p: usize) -> Vec<Phase> {
    let mut phases = Vec::new();
    let mut dist = 1;
    while dist < p {
        phases.push(Phase::of(vec![
            Step::Send {
                peer: (rank + dist) % p,
                src: vec![],
            },
            Step::Recv {
                peer: (rank + p - dist) % p,
                dst: vec![],
            },
        ]));
        dist <<= 1;
    }
    phases
}
