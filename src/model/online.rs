//! Online refinement of the tuner's choice (`PCCL_TUNE_ONLINE=T`): the model shortlists the
//! algorithms it predicts within [`MARGIN`] of its best, the first calls of a collective and
//! size run each of them in turn for `T + 1` calls in a row (the first warms up), and the
//! ranks then agree on the fastest by the slowest rank's median.
//!
//! In a row, not interleaved: on a host with more ranks than cores, how the scheduler places
//! the ranks follows the pattern that runs, and a call between calls of other algorithms
//! measures another placement than the same call repeated. On 4 thread-ranks on 2 cores,
//! interleaved trials with `T = 8` kept an algorithm 1.13–1.31× slower than the fastest at 3
//! of 5 sizes; trials in a row with `T = 8` kept one within 10% at every size
//! (`docs/BENCHMARKS.md`, "Online trials").
//!
//! This is the part of the tuner the model cannot do: where two algorithms are predicted
//! close, which one wins on this machine can depend on where the scheduler put the ranks of
//! this very process (`docs/SCALING.md`). The state here is plain data, advanced identically
//! on every rank by the calls they all make in the same order; only the times differ between
//! ranks, and the agreement (an all-reduce of the per-candidate times by maximum, run by the
//! communicator) makes the choice the same everywhere.

use crate::plan::Algorithm;

/// Candidates predicted at most this factor above the model's best are tried (the model's
/// accuracy target on a calibrated machine, issue 12).
pub const MARGIN: f64 = 1.5;

/// At most this many candidates are tried (the model's best first).
pub const MAX_CANDIDATES: usize = 3;

/// The largest accepted `PCCL_TUNE_ONLINE` (timed calls per candidate).
pub const MAX_TRIALS: usize = 32;

/// Timed calls per candidate for `PCCL_TUNE_ONLINE=on` (4 were too few on 4 thread-ranks
/// on 2 cores: 2 of 5 sizes picked 1.3× slower).
pub const DEFAULT_TRIALS: usize = 8;

/// An algorithm with the piece size its calls run with (`None`: the transport's own).
pub type Tuned = (Algorithm, Option<usize>);

/// The candidates worth trying, fastest predicted first: those within [`MARGIN`] of the best,
/// at most [`MAX_CANDIDATES`]. `scored` is the tuner's list; ties keep its order.
pub fn shortlist(scored: &[(Algorithm, f64)]) -> Vec<Algorithm> {
    let mut v: Vec<(Algorithm, f64)> = scored.to_vec();
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    let Some(&(_, best)) = v.first() else {
        return Vec::new();
    };
    v.into_iter()
        .filter(|&(_, t)| t <= best * MARGIN)
        .take(MAX_CANDIDATES)
        .map(|(a, _)| a)
        .collect()
}

/// What the next call of a collective and size bucket runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// Timed call number `.0` of the trials, with candidate `.1`.
    Try(usize, Tuned),
    /// Every trial has been issued: the ranks must agree ([`Trial::local_medians`],
    /// [`decide`]) before this call runs.
    Decide,
    /// A call of another size of the bucket: it runs the model's choice, untimed.
    Untimed(Tuned),
}

/// The trials of one collective and size bucket.
#[derive(Clone, Debug)]
pub struct Trial {
    /// The candidates, the model's best first.
    cands: Vec<Tuned>,
    /// Calls per candidate: the timed ones and one warm-up.
    per: usize,
    /// The block size the trials time: the first one that came to run (every rank sees the
    /// same calls, so the same one).
    ref_bytes: Option<usize>,
    /// Trial calls issued so far.
    issued: usize,
    /// Seconds of each issued trial call on this rank (`None` until it finished).
    secs: Vec<Option<f64>>,
}

impl Trial {
    /// Trials of `cands` (the model's best first), each timed `trials` times after a
    /// warm-up call.
    pub fn new(cands: Vec<Tuned>, trials: usize) -> Self {
        let per = trials.clamp(1, MAX_TRIALS) + 1;
        Trial {
            secs: vec![None; cands.len() * per],
            cands,
            per,
            ref_bytes: None,
            issued: 0,
        }
    }

    /// The model's choice (what runs until the trials end, where a call is not one of them).
    pub fn model_choice(&self) -> Tuned {
        self.cands[0]
    }

    /// The candidates, the model's best first.
    pub fn candidates(&self) -> &[Tuned] {
        &self.cands
    }

    /// Calls with blocks of `block_bytes` still to issue before the choice is made (the
    /// deciding call included); 0 where the trials time another size of the bucket (calls of
    /// this one run the model's choice until they settle).
    pub fn calls_left(&self, block_bytes: usize) -> usize {
        match self.ref_bytes {
            Some(r) if r != block_bytes => 0,
            _ => self.secs.len() - self.issued + 1,
        }
    }

    /// The candidate of trial call `i`: each runs its calls in a row, the model's best first.
    fn candidate_of(&self, i: usize) -> usize {
        i / self.per
    }

    /// Advances by one call with blocks of `block_bytes`.
    pub fn next(&mut self, block_bytes: usize) -> Step {
        let r = *self.ref_bytes.get_or_insert(block_bytes);
        if r != block_bytes {
            return Step::Untimed(self.model_choice());
        }
        if self.issued == self.secs.len() {
            return Step::Decide;
        }
        let i = self.issued;
        self.issued += 1;
        Step::Try(i, self.cands[self.candidate_of(i)])
    }

    /// Records this rank's seconds of trial call `i`.
    pub fn record(&mut self, i: usize, seconds: f64) {
        if let Some(s) = self.secs.get_mut(i) {
            *s = Some(seconds);
        }
    }

    /// This rank's median seconds per candidate over its timed calls (the warm-up call, the
    /// switch from the previous candidate, left out); infinite for a candidate with a trial
    /// that did not finish.
    pub fn local_medians(&self) -> Vec<f64> {
        self.secs
            .chunks(self.per)
            .map(|c| {
                let mut t: Vec<f64> = c[1..].iter().map(|s| s.unwrap_or(f64::INFINITY)).collect();
                median(&mut t)
            })
            .collect()
    }
}

/// The median of `v`, the mean of the middle two for an even count (infinite when empty).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::INFINITY,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The candidate the ranks agree on from `slowest`, every rank's medians reduced by maximum:
/// the fastest; ties (and a list with no finite time) go to the earlier one, the model's
/// order. A NaN counts as infinitely slow.
pub fn decide(slowest: &[f64]) -> usize {
    let key = |t: f64| if t.is_nan() { f64::INFINITY } else { t };
    let mut best = 0;
    for (i, &t) in slowest.iter().enumerate() {
        if key(t) < key(slowest[best]) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::LevelAlgo;

    const RING: Algorithm = Algorithm::Flat(LevelAlgo::Ring);
    const RD: Algorithm = Algorithm::Flat(LevelAlgo::Rd);

    #[test]
    fn the_shortlist_keeps_what_the_model_puts_within_its_margin_best_first() {
        let hier = Algorithm::Hier {
            inter: LevelAlgo::Rd,
            intra: LevelAlgo::Ring,
        };
        let s = shortlist(&[(RING, 2.0), (RD, 1.0), (hier, 1.4), (RING, 1.6)]);
        assert_eq!(s, vec![RD, hier]);
        assert_eq!(shortlist(&[(RING, 1.0), (RD, 1.0)]), vec![RING, RD]);
        assert!(shortlist(&[]).is_empty());
        let many: Vec<(Algorithm, f64)> = (0..6).map(|i| (RING, 1.0 + i as f64 * 0.01)).collect();
        assert_eq!(shortlist(&many).len(), MAX_CANDIDATES);
    }

    #[test]
    fn each_candidate_runs_its_calls_in_a_row_then_the_ranks_decide() {
        let mut t = Trial::new(vec![(RING, None), (RD, Some(4096))], 2);
        let mut order = Vec::new();
        for i in 0..6 {
            match t.next(1024) {
                Step::Try(j, c) => {
                    assert_eq!(j, i);
                    order.push(c.0);
                }
                s => panic!("call {i}: {s:?}"),
            }
        }
        assert_eq!(order, vec![RING, RING, RING, RD, RD, RD]);
        assert_eq!(t.calls_left(1024), 1);
        assert_eq!(t.calls_left(2000), 0);
        assert_eq!(t.next(1024), Step::Decide);
        assert_eq!(t.next(1024), Step::Decide);
    }

    #[test]
    fn calls_of_another_size_in_the_bucket_run_the_models_choice_untimed() {
        let mut t = Trial::new(vec![(RD, None), (RING, None)], 1);
        assert!(matches!(t.next(1000), Step::Try(0, _)));
        assert_eq!(t.next(1500), Step::Untimed((RD, None)));
        assert!(matches!(t.next(1000), Step::Try(1, _)));
    }

    #[test]
    fn the_warm_up_calls_are_left_out_and_an_unfinished_trial_counts_as_infinitely_slow() {
        let mut t = Trial::new(vec![(RING, None), (RD, None)], 3);
        let mut i = 0;
        while let Step::Try(j, c) = t.next(64) {
            // Each warm-up call is slow; later RING 2 s, RD 1 s, one RD trial 9 s.
            let s = match (j % 4 == 0, c.0 == RING, j) {
                (true, _, _) => 100.0,
                (false, true, _) => 2.0,
                (false, false, 6) => 9.0,
                _ => 1.0,
            };
            t.record(j, s);
            i += 1;
        }
        assert_eq!(i, 8);
        assert_eq!(t.local_medians(), vec![2.0, 1.0]);
        let mut u = Trial::new(vec![(RING, None), (RD, None)], 1);
        while let Step::Try(j, _) = u.next(64) {
            if j != 3 {
                u.record(j, 1.0);
            }
        }
        assert_eq!(u.local_medians()[0], 1.0);
        assert!(u.local_medians()[1].is_infinite());
    }

    #[test]
    fn the_decision_takes_the_fastest_and_breaks_ties_by_the_models_order() {
        assert_eq!(decide(&[2.0, 1.0, 3.0]), 1);
        assert_eq!(decide(&[1.0, 1.0]), 0);
        assert_eq!(decide(&[f64::INFINITY, f64::INFINITY]), 0);
        assert_eq!(decide(&[f64::INFINITY, 5.0]), 1);
        assert_eq!(decide(&[f64::NAN, 5.0]), 1);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [2.0, 9.0, 1.0]), 2.0);
        assert!(median(&mut []).is_infinite());
    }
}
