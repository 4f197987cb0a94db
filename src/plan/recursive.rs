//! Logarithmic algorithms for any member count.
//!
//! Powers of two use the classic pairwise exchanges (recursive doubling for all-gather,
//! recursive halving for reduce-scatter, partner `i XOR d`). Other counts use the
//! dissemination (Bruck) pattern: `ceil(lg k)` steps at distances `1, 2, 4, ...`, each member
//! talking to `i ± 2^j`, the last step carrying only the `k - 2^j` units still missing. Blocks
//! keep their absolute positions, so no final rotation is needed and the output is in rank
//! order. The reduce-scatter is the dissemination all-gather run backwards; both move the
//! minimum `k-1` units per member.

use super::{concat, Level, Partials, Phase, Spans, Step};

fn units_at<'a>(units: &'a [Spans], idx: impl Iterator<Item = usize>) -> Spans {
    let list: Vec<&'a Spans> = idx.map(|u| &units[u]).collect();
    concat(list)
}

/// Recursive-doubling / Bruck all-gather.
pub fn allgather(lvl: Level<'_>, units: &[Spans]) -> Vec<Phase> {
    let k = lvl.size();
    let i = lvl.me;
    let mut phases = Vec::new();
    if k.is_power_of_two() {
        let mut d = 1;
        while d < k {
            let partner = i ^ d;
            let mine = i & !(d - 1);
            let theirs = partner & !(d - 1);
            phases.push(Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(partner),
                    src: units_at(units, mine..mine + d),
                },
                Step::Recv {
                    peer: lvl.peer(partner),
                    dst: units_at(units, theirs..theirs + d),
                },
            ]));
            d <<= 1;
        }
    } else {
        let mut dist = 1;
        while dist < k {
            let c = dist.min(k - dist);
            phases.push(Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(i + k - dist),
                    src: units_at(units, (0..c).map(|x| (i + x) % k)),
                },
                Step::Recv {
                    peer: lvl.peer(i + dist),
                    dst: units_at(units, (0..c).map(|x| (i + dist + x) % k)),
                },
            ]));
            dist <<= 1;
        }
    }
    phases
}

/// Recursive-halving / reverse-dissemination reduce-scatter (`k >= 2`).
pub fn reduce_scatter(lvl: Level<'_>, src: &[Spans], work: &[Spans], out: &Spans) -> Vec<Phase> {
    let k = lvl.size();
    let i = lvl.me;
    let mut parts = Partials::new(src, work);
    let mut phases = Vec::new();
    if k.is_power_of_two() {
        let (mut lo, mut hi) = (0, k);
        let mut d = k / 2;
        while d >= 1 {
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if i & d == 0 {
                (lo..mid, mid..hi)
            } else {
                (mid..hi, lo..mid)
            };
            let send = concat(give.clone().map(|u| parts.current(u)).collect::<Vec<_>>());
            let with = concat(keep.clone().map(|u| parts.current(u)).collect::<Vec<_>>());
            let dst = if d == 1 {
                out.clone()
            } else {
                let mut v = Vec::new();
                for u in keep.clone() {
                    v.push(parts.next(u));
                }
                concat(v)
            };
            phases.push(Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(i ^ d),
                    src: send,
                },
                Step::RecvReduce {
                    peer: lvl.peer(i ^ d),
                    dst,
                    with,
                },
            ]));
            lo = keep.start;
            hi = keep.end;
            d /= 2;
        }
    } else {
        let steps = usize::BITS - (k - 1).leading_zeros();
        for j in (0..steps).rev() {
            let dist = 1usize << j;
            let c = dist.min(k - dist);
            let send = concat(
                (0..c)
                    .map(|x| parts.current((i + dist + x) % k))
                    .collect::<Vec<_>>(),
            );
            let mine: Vec<usize> = (0..c).map(|x| (i + x) % k).collect();
            let with = concat(mine.iter().map(|&u| parts.current(u)).collect::<Vec<_>>());
            let dst = if j == 0 {
                out.clone()
            } else {
                let mut v = Vec::new();
                for &u in &mine {
                    v.push(parts.next(u));
                }
                concat(v)
            };
            phases.push(Phase::of(vec![
                Step::Send {
                    peer: lvl.peer(i + dist),
                    src: send,
                },
                Step::RecvReduce {
                    peer: lvl.peer(i + k - dist),
                    dst,
                    with,
                },
            ]));
        }
    }
    phases
}
