//! The order in which a list run (`--algo a,b,...`) times its algorithms.
//!
//! A round times a batch of every algorithm in turn. Where an algorithm stands in the round,
//! and which one ran just before it, can show in its time on a loaded host. On the emulated
//! cluster (8×2 ranks on 2 cores, reduce-scatter of 1 KiB, eight entries), with three rounds
//! each rotated by one, `auto-online` ran 1.08–1.18× the time of the very same plan under its
//! own name (`hier-rd`) in each of 4 launches; with eight rounds covering every position,
//! 0.89–1.00 (docs/CLUSTER.md, "Round order"). A rotation still gives every entry the same
//! predecessor, so the rounds follow a balanced Latin square (a Williams design): over the
//! whole design every entry runs once at every position and right after every other entry
//! equally often. A size whose batches are set by `--batch-ms` (small calls) runs at least
//! the whole design, its calls spread over more, shorter rounds: the calls timed per entry
//! stay what they were. Each such batch starts with one untimed call: a shorter batch spreads
//! over fewer calls what its start costs (the ranks leaving the barrier apart, the entry's
//! first call after the others' batches), and without it the 4×4 all-reduce at 1–16 KiB
//! measured 1.08–1.21× the model (median over the entries) where three long rounds gave
//! 0.97–1.07 and the design with the untimed call 0.97–1.05 (docs/CLUSTER.md, "Round
//! order"). The design removes a bias, not the noise: at 1 KiB the same plan under two names
//! still differs by up to 30% within one launch in any order (how the scheduler interleaves
//! 16 processes), which only more launches average out.

/// The rows of the Williams design for `k` entries: `k` rows for an even `k`, `2k` for an
/// odd one (the `k` rows and their reverses), each a permutation of `0..k`. Over all rows,
/// each entry stands at each position equally often and each ordered pair of distinct entries
/// is adjacent equally often (once for even `k`, twice for odd).
pub fn williams(k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return Vec::new();
    }
    // 0, 1, k-1, 2, k-2, ...: the differences of neighbours cover every non-zero residue once.
    let (mut low, mut high) = (1, k);
    let base: Vec<usize> = (0..k)
        .map(|j| match j {
            0 => 0,
            _ if j % 2 == 1 => {
                low += 1;
                low - 1
            }
            _ => {
                high -= 1;
                high
            }
        })
        .collect();
    let mut rows: Vec<Vec<usize>> = (0..k)
        .map(|i| base.iter().map(|&b| (b + i) % k).collect())
        .collect();
    if k % 2 == 1 {
        let reversed: Vec<Vec<usize>> = rows
            .iter()
            .map(|r| r.iter().rev().copied().collect())
            .collect();
        rows.extend(reversed);
    }
    rows
}

/// The timed rounds of one size: each round's order and the calls per batch.
#[derive(Debug, PartialEq)]
pub struct Schedule {
    /// The order of the algorithms in each round (indices into the list).
    pub rounds: Vec<Vec<usize>>,
    /// Calls per algorithm per round.
    pub batch: usize,
    /// Whether each batch starts with one untimed call (batches set by `--batch-ms`), the
    /// ranks lined up by a barrier after it.
    pub lead_in: bool,
}

/// The rounds of a size with `k` algorithms: `rounds` rounds of `batch` calls, or, where
/// `--batch-ms` asks for batches of `want` calls and that is more than `batch` (small calls),
/// the same number of calls per algorithm (`rounds × want`) over at least one whole design.
pub fn schedule(k: usize, rounds: usize, batch: usize, want: Option<usize>) -> Schedule {
    let design = williams(k);
    let lead_in = matches!(want, Some(w) if w > batch);
    let (rounds, batch) = match want {
        Some(w) if w > batch && design.len() > rounds => {
            let per_algo = rounds * w;
            (design.len(), per_algo.div_ceil(design.len()).max(1))
        }
        Some(w) => (rounds, w.max(batch)),
        None => (rounds, batch),
    };
    Schedule {
        rounds: (0..rounds)
            .map(|r| {
                design
                    .get(r % design.len().max(1))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect(),
        batch,
        lead_in,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_takes_every_position_and_follows_every_other_equally_often() {
        for k in 1..=11 {
            let rows = williams(k);
            assert_eq!(rows.len(), if k % 2 == 0 { k } else { 2 * k }, "k = {k}");
            let times = rows.len() / k;
            let mut at = vec![vec![0; k]; k];
            let mut after = vec![vec![0; k]; k];
            for r in &rows {
                let mut seen = r.clone();
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    (0..k).collect::<Vec<_>>(),
                    "k = {k}: {r:?} is not a permutation"
                );
                for (pos, &a) in r.iter().enumerate() {
                    at[a][pos] += 1;
                }
                for w in r.windows(2) {
                    after[w[1]][w[0]] += 1;
                }
            }
            for a in 0..k {
                for (pos, &n) in at[a].iter().enumerate() {
                    assert_eq!(n, times, "k = {k}: entry {a} at position {pos}");
                }
                for b in (0..k).filter(|&b| b != a) {
                    assert_eq!(after[a][b], times, "k = {k}: entry {a} right after {b}");
                }
            }
        }
    }

    #[test]
    fn small_calls_cover_the_whole_design_with_the_same_calls_per_algorithm() {
        // Eight algorithms, three rounds, batches of 40 calls to last --batch-ms.
        let s = schedule(8, 3, 1, Some(40));
        assert_eq!(s.rounds.len(), 8);
        assert_eq!(s.batch, 15);
        assert_eq!(s.rounds, williams(8));
        assert!(s.lead_in, "a short batch starts with an untimed call");
        // Nine (with MPI's own): the design's 18 rows, 120 calls in batches of 7.
        let s = schedule(9, 3, 1, Some(40));
        assert_eq!((s.rounds.len(), s.batch), (18, 7));
    }

    #[test]
    fn large_calls_keep_their_rounds_in_the_designs_first_orders() {
        // One call already lasts --batch-ms: three rounds of one call, as before.
        let s = schedule(8, 3, 1, Some(1));
        assert_eq!((s.rounds.len(), s.batch), (3, 1));
        assert_eq!(s.rounds[..], williams(8)[..3]);
        assert!(!s.lead_in, "a call that lasts the batch is not doubled");
        // No --batch-ms: the rounds cycle through the design.
        let s = schedule(2, 5, 4, None);
        assert_eq!(s.batch, 4);
        assert_eq!(
            s.rounds,
            vec![vec![0, 1], vec![1, 0], vec![0, 1], vec![1, 0], vec![0, 1]]
        );
        // Already a whole design or more: batches of `want` calls, as before.
        let s = schedule(2, 15, 1, Some(30));
        assert_eq!((s.rounds.len(), s.batch), (15, 30));
    }
}
