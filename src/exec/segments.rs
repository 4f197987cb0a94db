//! Segments: the contiguous element runs a list of block spans covers, and how two such
//! lists (a message's source and target, or a reduction's target and operand) line up. Shared
//! by the host and device executors.

use crate::plan::{Buf, Span};
use std::ops::Range;

/// A contiguous run of elements in one buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) buf: Buf,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

/// The element runs of `spans`, merged where adjacent; `elems` maps a span to its elements.
pub(crate) fn segments(spans: &[Span], elems: impl Fn(Span) -> Range<usize>) -> Vec<Seg> {
    let mut v: Vec<Seg> = Vec::with_capacity(spans.len());
    for s in spans {
        let r = elems(*s);
        if r.is_empty() {
            continue;
        }
        if let Some(last) = v.last_mut() {
            if last.buf == s.buf && last.off + last.len == r.start {
                last.len += r.len();
                continue;
            }
        }
        v.push(Seg {
            buf: s.buf,
            off: r.start,
            len: r.len(),
        });
    }
    v
}

/// Elements in all.
pub(crate) fn total(segs: &[Seg]) -> usize {
    segs.iter().map(|s| s.len).sum()
}

/// The parts of `segs` (laid end to end as a message) overlapping message elements
/// `lo..hi`: `(message offset, segment part)`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn parts(segs: &[Seg], lo: usize, hi: usize) -> Vec<(usize, Seg)> {
    let mut out = Vec::new();
    let mut pos = 0;
    for s in segs {
        let (a, b) = (pos.max(lo), (pos + s.len).min(hi));
        if a < b {
            out.push((
                a,
                Seg {
                    buf: s.buf,
                    off: s.off + (a - pos),
                    len: b - a,
                },
            ));
        }
        pos += s.len;
        if pos >= hi {
            break;
        }
    }
    out
}

/// Pairs of equally long pieces of two segment lists: `(message offset, a, b)`.
pub(crate) fn zip_segments(a: &[Seg], b: &[Seg]) -> Vec<(usize, Seg, Seg)> {
    let mut out = Vec::new();
    let (mut i, mut j, mut ai, mut bj, mut pos) = (0, 0, 0, 0, 0);
    while i < a.len() && j < b.len() {
        let n = (a[i].len - ai).min(b[j].len - bj);
        out.push((
            pos,
            Seg {
                buf: a[i].buf,
                off: a[i].off + ai,
                len: n,
            },
            Seg {
                buf: b[j].buf,
                off: b[j].off + bj,
                len: n,
            },
        ));
        pos += n;
        ai += n;
        bj += n;
        if ai == a[i].len {
            i += 1;
            ai = 0;
        }
        if bj == b[j].len {
            j += 1;
            bj = 0;
        }
    }
    out
}
