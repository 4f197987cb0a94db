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

/// The default largest block (bytes per peer) for which all-to-all runs [`direct`]
/// (`PCCL_ALLTOALL_DIRECT` changes it): below it a
/// call is latency-bound and one phase of `P - 1` concurrent messages beats `P - 1`
/// phases; above it the pairwise order keeps every rank's link to one peer at a time.
/// The block size is equal on every rank of an all-to-all (the call's fingerprint checks
/// it), so every rank makes the same choice; ranks with different limits still exchange
/// correctly (each plan sends one message to and takes one from every peer).
pub const DIRECT_MAX_BLOCK_BYTES: usize = 16 << 10;

/// Whether an all-to-all of `block_bytes` per peer among `p` ranks runs [`direct`] under
/// the limit `max_block_bytes` (0: never).
pub fn use_direct(block_bytes: usize, p: usize, max_block_bytes: usize) -> bool {
    p > 2 && max_block_bytes > 0 && block_bytes <= max_block_bytes
}

/// The one-phase all-to-all of `rank`: the own block copied, every other block sent, and
/// every peer's block received, all in one phase. Sends go to `rank + k` and receives come
/// from `rank - k` in the order `k = 1, 2, ...`, so the first message a rank waits for is
/// the first its sender posts.
pub fn direct(rank: usize, p: usize) -> Vec<Phase> {
    let mut steps = vec![Step::Copy {
        src: vec![Span::block(Buf::Input, rank)],
        dst: vec![Span::block(Buf::Output, rank)],
    }];
    for k in 1..p {
        let to = (rank + k) % p;
        steps.push(Step::Send {
            peer: to,
            src: vec![Span::block(Buf::Input, to)],
        });
    }
    for k in 1..p {
        let from = (rank + p - k) % p;
        steps.push(Step::Recv {
            peer: from,
            dst: vec![Span::block(Buf::Output, from)],
        });
    }
    vec![Phase::of(steps)]
}
