//! Rooted collectives as binomial trees of `ceil(lg p)` rounds, in ranks relative to the root
//! (`v = (rank - root) mod p`): reduce (partial results flow toward the root, reduced on the
//! way), gather (subtrees' blocks flow toward the root) and scatter (the reverse of gather).
//!
//! Blocks: reduce works on one block; gather and scatter on `p` blocks, block `i` being rank
//! `i`'s share. Ranks other than the root keep what they forward in `Scratch` (laid out like
//! the root's `p` blocks); only the root's `Output` (gather) or `Input` (scatter) holds all.

use super::{push_span, Buf, Phase, Span, Spans, Step};

/// The blocks of relative ranks `lo..hi` (absolute block `(v + root) mod p`) in `buf`, in
/// relative order (a wrap past `p - 1` makes two spans).
fn rel_span(buf: Buf, lo: usize, hi: usize, root: usize, p: usize) -> Spans {
    let mut v = Spans::new();
    for rel in lo..hi.min(p) {
        push_span(&mut v, Span::block(buf, (rel + root) % p));
    }
    v
}

/// Binomial-tree reduce of one block toward `root`; `average` divides the root's result by
/// `p` at the end.
pub fn reduce(rank: usize, p: usize, root: usize, average: bool) -> Vec<Phase> {
    let v = (rank + p - root) % p;
    let target = if rank == root {
        vec![Span::block(Buf::Output, 0)]
    } else {
        vec![Span::block(Buf::Scratch, 0)]
    };
    let mut acc = vec![Span::block(Buf::Input, 0)];
    let mut phases = Vec::new();
    let mut mask = 1;
    while mask < p {
        if v & mask != 0 {
            phases.push(Phase::of(vec![Step::Send {
                peer: (v - mask + root) % p,
                src: acc.clone(),
            }]));
            break;
        }
        if v + mask < p {
            phases.push(Phase::of(vec![Step::RecvReduce {
                peer: (v + mask + root) % p,
                dst: target.clone(),
                with: acc.clone(),
            }]));
            acc = target.clone();
        }
        mask <<= 1;
    }
    if rank == root {
        if p == 1 {
            phases.push(Phase::of(vec![Step::Copy {
                src: acc,
                dst: target.clone(),
            }]));
        }
        if average {
            phases.push(Phase::of(vec![Step::Average { dst: target }]));
        }
    }
    phases
}

/// Binomial-tree gather of every rank's one block into the root's `p` blocks, rank order.
pub fn gather(rank: usize, p: usize, root: usize) -> Vec<Phase> {
    let v = (rank + p - root) % p;
    let hold = if rank == root {
        Buf::Output
    } else {
        Buf::Scratch
    };
    let mut phases = Vec::new();
    // This rank's own block: the root copies it into place; the others send it from Input.
    let own = if rank == root {
        phases.push(Phase::of(vec![Step::Copy {
            src: vec![Span::block(Buf::Input, 0)],
            dst: vec![Span::block(Buf::Output, root)],
        }]));
        vec![Span::block(Buf::Output, root)]
    } else {
        vec![Span::block(Buf::Input, 0)]
    };
    // Children: v + mask for every mask below v's lowest set bit (all of them for the root).
    let mut recvs = Vec::new();
    let mut mask = 1;
    while mask < p && v & mask == 0 {
        if v + mask < p {
            recvs.push(Step::Recv {
                peer: (v + mask + root) % p,
                dst: rel_span(hold, v + mask, v + 2 * mask, root, p),
            });
        }
        mask <<= 1;
    }
    if !recvs.is_empty() {
        phases.push(Phase::of(recvs));
    }
    if v != 0 {
        // `mask` is v's lowest set bit: the subtree is v..v+mask.
        let mut src = own;
        for s in rel_span(hold, v + 1, v + mask, root, p) {
            push_span(&mut src, s);
        }
        phases.push(Phase::of(vec![Step::Send {
            peer: (v - mask + root) % p,
            src,
        }]));
    }
    phases
}

/// Binomial-tree scatter of the root's `p` blocks: rank `i` gets block `i` in its one-block
/// output.
pub fn scatter(rank: usize, p: usize, root: usize) -> Vec<Phase> {
    let v = (rank + p - root) % p;
    let hold = if rank == root {
        Buf::Input
    } else {
        Buf::Scratch
    };
    let mut phases = Vec::new();
    let mut top = 1;
    while top < p {
        top <<= 1;
    }
    // `low`: v's lowest set bit (the root: above every child distance).
    let low = if v == 0 { top } else { v & v.wrapping_neg() };
    if v != 0 {
        let mut dst = vec![Span::block(Buf::Output, 0)];
        for s in rel_span(hold, v + 1, v + low, root, p) {
            push_span(&mut dst, s);
        }
        phases.push(Phase::of(vec![Step::Recv {
            peer: (v - low + root) % p,
            dst,
        }]));
    }
    let mut steps = Vec::new();
    if rank == root {
        steps.push(Step::Copy {
            src: vec![Span::block(Buf::Input, root)],
            dst: vec![Span::block(Buf::Output, 0)],
        });
    }
    let mut mask = low >> 1;
    while mask > 0 {
        if v + mask < p {
            steps.push(Step::Send {
                peer: (v + mask + root) % p,
                src: rel_span(hold, v + mask, v + 2 * mask, root, p),
            });
        }
        mask >>= 1;
    }
    if !steps.is_empty() {
        phases.push(Phase::of(steps));
    }
    phases
}
