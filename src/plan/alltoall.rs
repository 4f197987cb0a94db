//! All-to-all by pairwise exchange: `p - 1` rounds; in round `k` a rank sends its block for
//! one peer and receives that peer's block for it. For a power-of-two `p` the partner is
//! `rank XOR k` (one peer both ways); otherwise the rank sends to `rank + k` and receives
//! from `rank - k` (mod `p`). Input block `j` is destined for rank `j`; output block `i`
//! comes from rank `i`.

use super::{Buf, Phase, Span, Step};

/// The peers of round `k` (1..p) of `rank`: `(send to, receive from)`.
pub fn round_peers(rank: usize, p: usize, k: usize) -> (usize, usize) {
    if p.is_power_of_two() {
        (rank ^ k, rank ^ k)
    } else {
        ((rank + k) % p, (rank + p - k) % p)
    }
}

/// The pairwise-exchange all-to-all of `rank`.
pub fn pairwise(rank: usize, p: usize) -> Vec<Phase> {
    let mut phases = vec![Phase::of(vec![Step::Copy {
        src: vec![Span::block(Buf::Input, rank)],
        dst: vec![Span::block(Buf::Output, rank)],
    }])];
    for k in 1..p {
        let (to, from) = round_peers(rank, p, k);
        phases.push(Phase::of(vec![
            Step::Send {
                peer: to,
                src: vec![Span::block(Buf::Input, to)],
            },
            Step::Recv {
                peer: from,
                dst: vec![Span::block(Buf::Output, from)],
            },
        ]));
    }
    phases
}
