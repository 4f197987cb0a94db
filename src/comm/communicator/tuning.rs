//! The tuner's side of the communicator: which algorithm and piece size a call runs, cached
//! per collective and size bucket, and the online trials (`PCCL_TUNE_ONLINE`) that time the
//! model's close candidates on the first calls and agree on the fastest.
//!
//! Every rank must run the same algorithm at the same call. The model's choice depends only
//! on the topology, the profile and the size; the trials advance by the calls every rank
//! makes in the same order; their times are made common by an all-reduce (maximum), so the
//! decision is the same everywhere.

use super::{lock, Call, Inner};
use crate::config::DebugLevel;
use crate::dtype::ReduceOp;
use crate::error::{Error, Result};
use crate::exec::BlockLayout;
use crate::model::online::{self, Step, Trial, Tuned};
use crate::model::tuner;
use crate::plan::{self, Algorithm, Collective, Plan};
use std::sync::Arc;
use std::time::Duration;

/// Where a collective and size bucket stands with the tuner.
pub(super) enum Tuning {
    /// Settled: the model's choice, or the trials' winner.
    Fixed(Tuned),
    /// Online trials in progress.
    Trying(Trial),
}

impl Tuning {
    /// What runs now where a call is not a trial.
    fn current(&self) -> Tuned {
        match self {
            Tuning::Fixed(t) => *t,
            Tuning::Trying(tr) => tr.model_choice(),
        }
    }
}

/// A plan to run, with its piece size and, for a trial call, its number (to time it).
pub(super) struct Planned {
    pub plan: Arc<Plan>,
    pub piece: Option<usize>,
    pub trial: Option<usize>,
}

/// The size bucket of a call: calls in one bucket share the tuner's choice.
fn bucket(block_bytes: usize) -> u32 {
    usize::BITS - block_bytes.leading_zeros()
}

impl Inner {
    /// The algorithm a call of `coll` with `block_bytes` per block runs now (the model's
    /// choice while online trials are in progress), without advancing the trials.
    pub(super) fn algorithm_for(&self, coll: Collective, block_bytes: usize) -> Result<Algorithm> {
        if let Some(a) = self.forced(coll) {
            return Ok(a);
        }
        self.ensure_tuned(coll, block_bytes)?;
        Ok(lock(&self.choices)
            .get(&(coll, bucket(block_bytes)))
            .map_or(Algorithm::Flat(plan::LevelAlgo::Ring), |t| t.current().0))
    }

    /// Calls of `coll` with `block_bytes` per block still to make before the online trials
    /// settle its bucket's choice (0: settled, nothing to try, or the trials time another
    /// size of the bucket).
    pub(super) fn online_calls_left(&self, coll: Collective, block_bytes: usize) -> Result<usize> {
        if self.forced(coll).is_some() {
            return Ok(0);
        }
        self.ensure_tuned(coll, block_bytes)?;
        Ok(
            match lock(&self.choices).get(&(coll, bucket(block_bytes))) {
                Some(Tuning::Trying(tr)) => tr.calls_left(block_bytes),
                _ => 0,
            },
        )
    }

    /// The algorithm of a collective that is not the tuner's to choose: one with a single
    /// algorithm, or one `PCCL_ALGO` sets.
    fn forced(&self, coll: Collective) -> Option<Algorithm> {
        if coll.fixed_algorithm() {
            // One algorithm each (binomial trees, pairwise exchange): nothing to tune.
            return Some(Algorithm::Flat(plan::LevelAlgo::Ring));
        }
        self.cfg
            .algo_by_coll
            .get_or(coll, self.cfg.algo)
            .map(|a| plan::effective_algorithm(a, &self.topo))
    }

    /// Makes the tuner's entry for `coll`'s bucket of `block_bytes` if there is none: the
    /// model's choice, or the trials of its close candidates under `PCCL_TUNE_ONLINE`.
    fn ensure_tuned(&self, coll: Collective, block_bytes: usize) -> Result<()> {
        let key = (coll, bucket(block_bytes));
        if lock(&self.choices).contains_key(&key) {
            return Ok(());
        }
        let prof = &self.cfg.profile;
        let (choice, scored) = tuner::choose_with_margins(
            coll,
            &self.topo,
            block_bytes,
            prof,
            self.cfg.tune_margin,
            self.cfg.tune_overlap_margin,
        )?;
        // Raw tuned pieces: `plan` applies an explicit PCCL_CHUNK_SIZE over them.
        let best: Tuned = (choice.algo, Some(choice.piece_bytes));
        let mut cands = vec![best];
        if self.cfg.tune_online > 0 {
            for a in online::shortlist(&scored) {
                if a != choice.algo {
                    let t = scored.iter().find(|s| s.0 == a).map_or(0.0, |s| s.1);
                    let pb = tuner::best_piece(coll, a, &self.topo, block_bytes, prof, t)?;
                    cands.push((a, Some(pb)));
                }
            }
        }
        let rank = self.transport.rank();
        if self.cfg.debug >= DebugLevel::Info && rank == 0 {
            let table: Vec<String> = scored
                .iter()
                .map(|(a, t)| format!("{a} {:.1}us", t * 1e6))
                .collect();
            let fastest = scored.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
            let margin = if fastest < choice.seconds {
                format!(
                    "; an overlapped hierarchy is taken only {:.0}% ahead of the plain candidates",
                    self.cfg.tune_overlap_margin * 100.0
                )
            } else {
                String::new()
            };
            let online = if cands.len() > 1 {
                let names: Vec<String> = cands.iter().map(|c| c.0.to_string()).collect();
                format!(
                    "; PCCL_TUNE_ONLINE tries {} on the first calls",
                    names.join(", ")
                )
            } else {
                String::new()
            };
            eprintln!(
                "PCCL INFO {:?} {} B/block on {} ({}): {} (pieces of {} B applied{}){margin}{online} [profile {}: {}]",
                coll,
                block_bytes,
                self.topo.describe(),
                self.transport.name(),
                best.0,
                self.piece_for(best.1).unwrap_or(self.cfg.chunk_bytes),
                if self.cfg.chunk_explicit {
                    format!(
                        ": PCCL_CHUNK_SIZE wins over the model's {} B",
                        choice.piece_bytes
                    )
                } else {
                    ", the model's choice".to_string()
                },
                prof.name,
                table.join(", ")
            );
        }
        let entry = if cands.len() > 1 {
            Tuning::Trying(Trial::new(cands, self.cfg.tune_online))
        } else {
            Tuning::Fixed(best)
        };
        lock(&self.choices).entry(key).or_insert(entry);
        Ok(())
    }

    /// The piece size a call runs with: an explicit `PCCL_CHUNK_SIZE` wins over the tuner's
    /// `tuned` piece; `None` (nothing tuned, nothing set) keeps the transport's own.
    pub(super) fn piece_for(&self, tuned: Option<usize>) -> Option<usize> {
        if self.cfg.chunk_explicit {
            Some(self.cfg.chunk_bytes)
        } else {
            tuned
        }
    }

    /// The piece size of an untimed call of `coll` with blocks of `block_bytes` (after
    /// [`Inner::plan`] tuned it).
    pub(super) fn piece_of(&self, coll: Collective, block_bytes: usize) -> Option<usize> {
        let tuned = lock(&self.choices)
            .get(&(coll, bucket(block_bytes)))
            .and_then(|t| t.current().1);
        self.piece_for(tuned)
    }

    /// The plan of the next call of `coll` with `block_bytes` per block. `trials`: the call
    /// may be one of the online trials (host calls; device calls run the current choice).
    /// The call after the last trial first agrees with every rank on the winner, an
    /// all-reduce that waits for the queued calls and takes a collective number.
    pub(super) fn plan(
        &self,
        coll: Collective,
        block_bytes: usize,
        trials: bool,
        out_of_place: bool,
    ) -> Result<Planned> {
        let (tuned, trial) = match self.forced(coll) {
            Some(a) => ((a, None), None),
            None => {
                self.ensure_tuned(coll, block_bytes)?;
                let key = (coll, bucket(block_bytes));
                let step = match lock(&self.choices).get_mut(&key) {
                    Some(Tuning::Trying(tr)) if trials => tr.next(block_bytes),
                    Some(t) => Step::Untimed(t.current()),
                    None => return Err(Error::internal("the tuner's entry vanished")),
                };
                match step {
                    Step::Try(i, t) => (t, Some(i)),
                    Step::Untimed(t) => (t, None),
                    Step::Decide => (self.settle(key)?, None),
                }
            }
        };
        let (algo, piece) = (tuned.0, self.piece_for(tuned.1));
        Ok(Planned {
            plan: self.plan_for(coll, algo, out_of_place)?,
            piece,
            trial,
        })
    }

    /// The cached plan of `coll` with `algo` on this rank.
    fn plan_for(&self, coll: Collective, algo: Algorithm, out_of_place: bool) -> Result<Arc<Plan>> {
        // Only the reduce-scatter's plans differ out of place (see plan::build_for).
        let oop = out_of_place && matches!(coll, Collective::ReduceScatter { .. });
        if let Some(p) = lock(&self.plans).get(&(coll, algo, oop)) {
            return Ok(p.clone());
        }
        let p = Arc::new(plan::build_for(
            coll,
            algo,
            &self.topo,
            self.transport.rank(),
            oop,
        )?);
        if p.algorithm != algo && self.cfg.debug >= DebugLevel::Info {
            eprintln!(
                "PCCL INFO rank {}: {algo} needs nodes of equal size ({}); running {} instead",
                self.transport.rank(),
                self.topo.describe(),
                p.algorithm
            );
        }
        lock(&self.plans).insert((coll, algo, oop), p.clone());
        Ok(p)
    }

    /// Records this rank's time of trial call `trial` of `coll` with `block_bytes`.
    pub(super) fn record_trial(
        &self,
        coll: Collective,
        block_bytes: usize,
        trial: usize,
        took: Duration,
    ) {
        if let Some(Tuning::Trying(tr)) = lock(&self.choices).get_mut(&(coll, bucket(block_bytes)))
        {
            tr.record(trial, took.as_secs_f64());
        }
    }

    /// Ends the trials of `key`: waits for the queued calls (their times), all-reduces every
    /// candidate's median by maximum, and keeps the fastest for the bucket's later calls.
    fn settle(&self, key: (Collective, u32)) -> Result<Tuned> {
        self.quiesce();
        let (cands, mine) = match lock(&self.choices).get(&key) {
            Some(Tuning::Trying(tr)) => (tr.candidates().to_vec(), tr.local_medians()),
            Some(Tuning::Fixed(t)) => return Ok(*t),
            None => return Err(Error::internal("the tuner's entry vanished")),
        };
        let slowest = self.agree_max(&mine)?;
        let won = cands[online::decide(&slowest)];
        if self.cfg.debug >= DebugLevel::Info && self.transport.rank() == 0 {
            let times: Vec<String> = cands
                .iter()
                .zip(&slowest)
                .map(|(c, t)| format!("{} {:.1}us", c.0, t * 1e6))
                .collect();
            eprintln!(
                "PCCL INFO {:?} size bucket {}: PCCL_TUNE_ONLINE keeps {} (slowest rank's median: {})",
                key.0,
                key.1,
                won.0,
                times.join(", ")
            );
        }
        lock(&self.choices).insert(key, Tuning::Fixed(won));
        Ok(won)
    }

    /// Every rank's `mine` reduced by maximum, as one collective of this communicator
    /// (whole-vector recursive doubling: a few values).
    fn agree_max(&self, mine: &[f64]) -> Result<Vec<f64>> {
        let mut out = vec![0f64; mine.len()];
        let coll = Collective::AllReduce { average: false };
        let plan = self.plan_for(coll, Algorithm::VectorRd, false)?;
        let p = self.transport.size();
        let lay = BlockLayout::Balanced {
            total: mine.len(),
            parts: p,
        };
        let call = Call {
            coll,
            op: ReduceOp::Max,
            block_bytes: mine.len().div_ceil(p) * 8,
            input: (mine.as_ptr(), mine.len(), lay),
            output: (out.as_mut_ptr(), out.len(), lay),
            scratch: lay,
        };
        let seq = self.next_seq();
        self.execute(&plan, call, seq, None)?;
        Ok(out)
    }
}
