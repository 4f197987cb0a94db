//! `pccl-bench --algo A,B,...`: several algorithms measured in one run, interleaved.
//!
//! Every algorithm gets its own communicator, split off the benchmark's over the same ranks
//! (same transport, same topology) with that algorithm fixed, and all of them run on the
//! same buffers. For each size the timed iterations are cut into rounds; each round times a
//! batch of every algorithm in turn (the orders a balanced Latin square, so no algorithm
//! keeps a place in the round or a predecessor: `order`; the ranks lined up by a barrier
//! right before each timed batch, after its untimed lead-in call where there is one), so a
//! burst of load from elsewhere falls on all of them alike. A row
//! per algorithm and size: the median over rounds of the per-iteration time (averaged over
//! ranks), the mean, and the fastest and slowest round. With `--passes N`
//! the whole sweep of sizes runs N times and each row is the median of its passes: a slow
//! spell of the host that outlasts a size's rounds (tens of seconds, seen on the 2-core VM)
//! falls on one pass instead of on every round of the sizes it covers.
//!
//! `mpi` in the list is MPI's own collective on the same buffers, interleaved like the others
//! (under mpiexec; refused elsewhere). `q8` and `q4` are the quantized all-gather and
//! reduce-scatter (`Communicator::all_gather_quantized`, `reduce_scatter_quantized` (sum),
//! INT8 / INT4 with a scale per 2048 elements; the all-gather on the tuner's plan for the
//! records, or ALGO's with `q8:ALGO`; float dtypes; lossy, so `--check` skips them): its
//! time against the plain all-gather's on the same data. `q8h` and `q4h` run the
//! reduce-scatter by recursive halving between nodes (`QuantScheme::Halving`) instead of the
//! two all-to-alls. With `--nic-rate` each row also shows its NIC floor. Each row of the
//! JSON also carries the share of the host's CPU time its hypervisor stole while that size
//! ran (`host_steal_pct`, from `/proc/stat`): on a shared VM a noisy neighbour slows every
//! entry of a size alike, and says so there.

mod order;

use super::{bounds, count_wrong, input_of, iters_for, lens, Args, Coll, Native, Row};
use pccl::{Communicator, DType, Element, Quant, QuantScheme, ReduceOp};
use std::time::Instant;

/// The algorithms of a comma-separated `--algo` list, in order; `None` when it names one.
pub fn parse_list(spec: &str) -> Option<Vec<String>> {
    spec.contains(',').then(|| {
        spec.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

/// Turns on the tuner's online trials in `cfg` (`auto-online`): `PCCL_TUNE_ONLINE`'s count,
/// else [`pccl::model::online::DEFAULT_TRIALS`].
pub fn online(cfg: &mut pccl::config::Config) {
    if cfg.tune_online == 0 {
        cfg.tune_online = pccl::model::online::DEFAULT_TRIALS;
    }
}

/// Runs `once` (a call of `coll` with `block_bytes` per block on `comm`) until `comm`'s online
/// trials for it have settled: the warm-up of a tuner that measures (nothing without them).
pub fn settle(
    comm: &Communicator,
    coll: pccl::plan::Collective,
    block_bytes: usize,
    mut once: impl FnMut() -> pccl::Result<()>,
) -> pccl::Result<()> {
    // The count falls by one per call; the bound only guards against a library bug.
    let mut left = comm.online_calls_left(coll, block_bytes)?;
    let bound = left;
    for _ in 0..=bound {
        if left == 0 {
            return Ok(());
        }
        once()?;
        left = comm.online_calls_left(coll, block_bytes)?;
    }
    Err(pccl::Error::internal(format!(
        "the online trials of {coll:?} at {block_bytes} B per block did not settle"
    )))
}

/// Communicators over `comm`'s ranks, one per algorithm of `algos` (`auto`: the tuner's;
/// `auto-pure`: the model's fastest, without the tuner's margins; `auto-online`: the
/// tuner's with its online trials); `None` for `mpi` (MPI's own).
pub fn split_per_algo(
    comm: &Communicator,
    algos: &[String],
) -> pccl::Result<Vec<Option<Communicator>>> {
    let mut out = Vec::new();
    for a in algos {
        if a == "mpi" {
            out.push(None);
            continue;
        }
        let mut cfg = comm.config().clone();
        // `q8:ALGO`: the quantized all-gather on ALGO; `q8`: on the tuner's choice.
        let a = match (quant_of(a), a.split_once(':')) {
            (Some(_), Some((_, algo))) => algo,
            (Some(_), None) => "auto",
            _ => a.as_str(),
        };
        cfg.algo = if a == "auto" {
            None
        } else if a == "auto-pure" {
            // The model's fastest as is: no near-tie margin (PCCL_TUNE_MARGIN=0, the
            // default) and no overlap margin (PCCL_TUNE_OVERLAP_MARGIN=0; default 0.05).
            cfg.tune_margin = 0.0;
            cfg.tune_overlap_margin = 0.0;
            None
        } else if a == "auto-online" {
            online(&mut cfg);
            None
        } else {
            Some(a.parse().map_err(|e: pccl::Error| {
                pccl::Error::usage(format!("--algo {a}: {}", e.message()))
            })?)
        };
        let sub = comm
            .split_with_config(Some(0), comm.rank() as i32, cfg)?
            .ok_or_else(|| pccl::Error::internal("a split with one colour left a rank out"))?;
        out.push(Some(sub));
    }
    Ok(out)
}

/// The quantization and reduce-scatter scheme of a `q8` / `q4` / `q8h` / `q4h` / `q8l` /
/// `q4l` entry of the list (`q8:ALGO`: with that algorithm; `l`: one hop per level).
fn quant_of(name: &str) -> Option<(Quant, QuantScheme)> {
    let int4 = Quant {
        bits: 4,
        ..Quant::INT8
    };
    match name.split_once(':').map_or(name, |(q, _)| q) {
        "q8" => Some((Quant::INT8, QuantScheme::TwoHop)),
        "q4" => Some((int4, QuantScheme::TwoHop)),
        "q8h" => Some((Quant::INT8, QuantScheme::Halving)),
        "q4h" => Some((int4, QuantScheme::Halving)),
        "q8l" => Some((Quant::INT8, QuantScheme::PerLevel)),
        "q4l" => Some((int4, QuantScheme::PerLevel)),
        _ => None,
    }
}

/// The quantized all-gather or reduce-scatter (sum) on `T`'s float type.
fn quantized<T: Element>(
    c: &Communicator,
    coll: Coll,
    input: &[T],
    out: &mut [T],
    q: (Quant, QuantScheme),
) -> pccl::Result<()> {
    use bytemuck::{cast_slice, cast_slice_mut};
    fn on<F: pccl::quant::QuantFloat>(
        c: &Communicator,
        coll: Coll,
        i: &[F],
        o: &mut [F],
        (q, scheme): (Quant, QuantScheme),
    ) -> pccl::Result<()> {
        match coll {
            Coll::ReduceScatter => c.reduce_scatter_quantized_with(i, o, q, false, scheme),
            _ => c.all_gather_quantized(i, o, q),
        }
    }
    match T::DTYPE {
        DType::F32 => on::<f32>(c, coll, cast_slice(input), cast_slice_mut(out), q),
        DType::F64 => on::<f64>(c, coll, cast_slice(input), cast_slice_mut(out), q),
        DType::F16 => on::<half::f16>(c, coll, cast_slice(input), cast_slice_mut(out), q),
        DType::BF16 => on::<half::bf16>(c, coll, cast_slice(input), cast_slice_mut(out), q),
        d => Err(pccl::Error::usage(format!(
            "--algo q8/q4: the quantized collectives take float dtypes, not {d}"
        ))),
    }
}

/// Median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One size of `coll`, every algorithm of `subs` interleaved; a row per algorithm.
#[allow(clippy::too_many_arguments)]
pub fn run_size<T: Element>(
    comm: &Communicator,
    native: &Native<'_>,
    subs: &[Option<Communicator>],
    names: &[String],
    coll: Coll,
    op: ReduceOp,
    bytes: usize,
    args: &Args,
) -> pccl::Result<Vec<Row>> {
    let (r, p) = (comm.rank(), comm.size());
    let es = std::mem::size_of::<T>();
    let count = (bytes / es).max(1);
    let (in_len, out_len) = lens(coll, count, p);
    let input: Vec<T> = input_of(r, in_len);
    let mut output: Vec<T> = vec![T::from_i64(0); out_len];
    let quants: Vec<Option<(Quant, QuantScheme)>> = names.iter().map(|n| quant_of(n)).collect();
    if quants.iter().any(Option::is_some) && coll == Coll::AllReduce {
        return Err(pccl::Error::usage(
            "--algo q8/q4 time the quantized all-gather and reduce-scatter, not all-reduce",
        ));
    }
    let run_once = |a: usize, out: &mut Vec<T>| -> pccl::Result<()> {
        let c = &subs[a];
        match (c, coll) {
            (Some(c), Coll::AllGather | Coll::ReduceScatter) if quants[a].is_some() => {
                quantized(c, coll, &input, out, quants[a].expect("checked"))
            }
            (Some(c), Coll::AllGather) => c.all_gather(&input, out),
            (Some(c), Coll::ReduceScatter) => c.reduce_scatter(&input, out, op),
            (Some(c), Coll::AllReduce) => c.all_reduce(&input, out, op),
            (None, _) => bounds::mpi_once(native, coll, op, &input, out, count, args)
                .unwrap_or_else(|| {
                    Err(pccl::Error::usage(format!(
                    "--algo mpi: MPI's own {} cannot be timed here (needs mpiexec, a dtype and \
                     op MPI has, and no --no-mpi-compare)",
                    coll.name()
                )))
                }),
        }
    };
    let total_bytes = out_len.max(in_len) * es;
    let iters = iters_for(args, total_bytes);
    let rounds = iters.clamp(1, 15);
    let batch = iters.div_ceil(rounds);
    let coll_key = coll.plan_key(op);
    let block_bytes = coll.block_bytes(count, p, es);
    let mut warm = 0.0f64;
    for (a, c) in subs.iter().enumerate() {
        if let (Some(sub), None) = (c, quants[a]) {
            settle(sub, coll_key, block_bytes, || run_once(a, &mut output))?;
        }
        let t0 = Instant::now();
        for _ in 0..args.warmup {
            run_once(a, &mut output)?;
        }
        warm = warm.max(t0.elapsed().as_secs_f64() / args.warmup.max(1) as f64);
    }
    let want = match args.batch_ms {
        Some(ms) if args.warmup > 0 => {
            // Every rank must run as many calls: the slowest rank's estimate decides.
            let mut slowest_call = [0f64];
            comm.all_reduce(&[warm], &mut slowest_call, ReduceOp::Max)?;
            let want = (ms * 1e-3 / slowest_call[0].max(1e-9)).ceil() as usize;
            Some(want.clamp(batch, batch.max(64)))
        }
        _ => None,
    };
    let k = subs.len();
    let order::Schedule {
        rounds: orders,
        batch,
        lead_in,
    } = order::schedule(k, rounds, batch, want);
    let rounds = orders.len();
    // samples[a * rounds + round]: this rank's seconds per iteration.
    let mut samples = vec![0f64; k * rounds];
    for (round, in_order) in orders.iter().enumerate() {
        for &a in in_order {
            comm.barrier()?;
            if lead_in {
                // The lead-in warms the entry's own links after the others' batches; the
                // barrier after it lines the ranks up again. Timed from the lead-in's end
                // instead, every rank started apart by the skew the call leaves behind (up to
                // a whole network step where a hierarchy ends on one: reduce-scatter), and in
                // batches of two or three calls that skew was 10-40% of the slowest rank's
                // time (docs/CLUSTER.md, "Batches that start together").
                run_once(a, &mut output)?;
                comm.barrier()?;
            }
            let t0 = Instant::now();
            for _ in 0..batch {
                run_once(a, &mut output)?;
            }
            samples[a * rounds + round] = t0.elapsed().as_secs_f64() / batch as f64;
        }
    }
    let mut wrong = vec![0f64; k];
    if args.check {
        for a in (0..subs.len()).filter(|&a| quants[a].is_none()) {
            output.iter_mut().for_each(|x| *x = T::from_i64(0));
            run_once(a, &mut output)?;
            wrong[a] = count_wrong(coll, op, p, r, count, &output) as f64;
        }
    }
    let mut sums = vec![0f64; k * rounds];
    comm.all_reduce(&samples, &mut sums, ReduceOp::Sum)?;
    // The slowest rank of each round: when the collective is done everywhere (ranks finish at
    // different times: in a ring, the last to receive finishes a step after the others).
    let mut slowest = vec![0f64; k * rounds];
    comm.all_reduce(&samples, &mut slowest, ReduceOp::Max)?;
    let mut wrong_all = vec![0f64; k];
    comm.all_reduce(&wrong, &mut wrong_all, ReduceOp::Sum)?;
    let factor = coll.busbw_factor(p);
    let mut rows = Vec::new();
    for (a, c) in subs.iter().enumerate() {
        let per_round: Vec<f64> = sums[a * rounds..(a + 1) * rounds]
            .iter()
            .map(|s| s / p as f64)
            .collect();
        let avg = per_round.iter().sum::<f64>() / rounds as f64;
        let med = median(per_round.clone());
        let algbw = total_bytes as f64 / avg / 1e9;
        let ran = match (c, quants[a]) {
            // The records' all-gather: its plan for the record's bytes.
            (Some(c), Some((q, scheme))) if coll == Coll::ReduceScatter => {
                let t = c.topology();
                let two = t.is_regular() && t.nodes().len() > 1 && t.nodes()[0].len() > 1;
                let how = match (scheme, two) {
                    (QuantScheme::TwoHop, true) => "a2a-2hop",
                    (QuantScheme::TwoHop, false) => "a2a",
                    (QuantScheme::Halving, true) => "rs+halving",
                    (QuantScheme::Halving, false) => "halving",
                    (QuantScheme::PerLevel, _) if t.has_groups() => "a2a-3hop",
                    (QuantScheme::PerLevel, true) => "a2a-2hop",
                    (QuantScheme::PerLevel, false) => "a2a",
                };
                format!("q{}:{how}", q.bits)
            }
            (Some(c), Some((q, _))) => format!(
                "q{}:{}",
                q.bits,
                c.algorithm_for(coll_key, q.record_bytes(count))?.name()
            ),
            (Some(c), None) => c.algorithm_for(coll_key, block_bytes)?.name(),
            (None, _) => "mpi".to_string(),
        };
        let (floor_us, model) = match (c, quants[a]) {
            (Some(_), None) => {
                let b = bounds::of_row(comm, coll, op, &ran, count, es, args)?;
                (b.floor_us, b.model_us)
            }
            _ => (None, None),
        };
        rows.push(Row {
            coll,
            bytes: count * es,
            count,
            avg_us: avg * 1e6,
            min_us: per_round.iter().copied().fold(f64::INFINITY, f64::min) * 1e6,
            max_us: per_round.iter().copied().fold(0.0, f64::max) * 1e6,
            iters: rounds * batch,
            algbw,
            busbw: algbw * factor,
            algo: ran,
            mpi_us: None,
            vendor_us: None,
            floor_us,
            slowest_us: Some(median(slowest[a * rounds..(a + 1) * rounds].to_vec()) * 1e6),
            model_us: model,
            scratch: None,
            wrong: wrong_all[a] as u64,
            requested: Some(names[a].clone()),
            median_us: Some(med * 1e6),
            steal_pct: None,
        });
    }
    Ok(rows)
}

/// The host's CPU time stolen by its hypervisor and its whole CPU time so far, in clock
/// ticks (`/proc/stat`'s `cpu` line: steal is its eighth value); `None` where unreadable.
fn host_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 8).then(|| (v[7], v.iter().sum()))
}

/// Every size of every collective with the algorithms of `names` interleaved.
#[allow(clippy::too_many_arguments)]
pub fn bench(
    comm: &Communicator,
    native: &Native<'_>,
    names: &[String],
    colls: &[Coll],
    dtype: DType,
    op: ReduceOp,
    szs: &[usize],
    args: &Args,
) -> pccl::Result<Vec<Row>> {
    if args.device != super::Device::Host || (args.floor && args.nic_rate.is_none()) {
        return Err(pccl::Error::usage(
            "--algo with a list measures host buffers, with no --floor but the NIC floor \
             (--nic-rate)",
        ));
    }
    let subs = split_per_algo(comm, names)?;
    let mut rows = Vec::new();
    for &coll in colls {
        if comm.rank() == 0 && !args.json {
            println!(
                "# {} of {} ranks over {} as {} nodes ({}), dtype {}, op {}: algorithms {} interleaved in one run",
                coll.name(),
                comm.size(),
                comm.transport_name(),
                comm.topology().nodes().len(),
                comm.topology().describe(),
                args.dtype,
                args.op,
                names.join(",")
            );
            let mut h = format!(
                "# {:<12} {:<12} {:<14} {:>12} {:>12} {:>12} {:>12} {:>10} {:>12}",
                "Size",
                "algo",
                "ran",
                "Median(us)",
                "Avg(us)",
                "Min(us)",
                "Max(us)",
                "Iterations",
                "busbw(GB/s)"
            );
            if args.nic_rate.is_some() {
                h.push_str(&format!(" {:>10} {:>7}", "nicfloor", "xfloor"));
            }
            if args.model {
                h.push_str(&format!(" {:>10} {:>7}", "model(us)", "xmodel"));
            }
            if args.check {
                h.push_str(&format!(" {:>7}", "#wrong"));
            }
            println!("{h}");
        }
        let passes = args.passes.max(1) as usize;
        let mut swept: Vec<Vec<Row>> = Vec::new();
        for _ in 0..passes {
            let mut pass = Vec::new();
            for &b in szs {
                macro_rules! go {
                    ($t:ty) => {
                        run_size::<$t>(comm, native, &subs, names, coll, op, b, args)?
                    };
                }
                let before = host_cpu();
                let mut got = by_dtype!(dtype, go);
                if let (Some(a), Some(b)) = (before, host_cpu()) {
                    let total = b.1.saturating_sub(a.1);
                    if total > 0 {
                        let pct = 100.0 * b.0.saturating_sub(a.0) as f64 / total as f64;
                        got.iter_mut().for_each(|r| r.steal_pct = Some(pct));
                    }
                }
                if passes == 1 && comm.rank() == 0 && !args.json {
                    got.iter().for_each(|r| print_row(r, args));
                }
                pass.extend(got);
            }
            swept.push(pass);
        }
        let got = of_passes(swept);
        if passes > 1 && comm.rank() == 0 && !args.json {
            got.iter().for_each(|r| print_row(r, args));
        }
        rows.extend(got);
    }
    Ok(rows)
}

/// One row per entry of several passes over the same sizes and algorithms (`--passes`): the
/// median of the passes' slowest-rank and median times, the mean of their means, the
/// fastest and slowest round of all, every pass's iterations and wrong elements.
fn of_passes(mut swept: Vec<Vec<Row>>) -> Vec<Row> {
    if swept.len() == 1 {
        return swept.pop().unwrap_or_default();
    }
    let n = swept.len() as f64;
    let mut out = swept[0].clone();
    for (i, row) in out.iter_mut().enumerate() {
        let all: Vec<&Row> = swept.iter().map(|pass| &pass[i]).collect();
        let of = |f: fn(&Row) -> Option<f64>| -> Option<f64> {
            all.iter()
                .map(|r| f(r))
                .collect::<Option<Vec<f64>>>()
                .map(median)
        };
        let avg = all.iter().map(|r| r.avg_us).sum::<f64>() / n;
        row.algbw *= row.avg_us / avg;
        row.busbw *= row.avg_us / avg;
        row.avg_us = avg;
        row.min_us = all.iter().map(|r| r.min_us).fold(f64::INFINITY, f64::min);
        row.max_us = all.iter().map(|r| r.max_us).fold(0.0, f64::max);
        row.iters = all.iter().map(|r| r.iters).sum();
        row.wrong = all.iter().map(|r| r.wrong).sum();
        row.median_us = of(|r| r.median_us);
        row.slowest_us = of(|r| r.slowest_us);
        row.steal_pct = all
            .iter()
            .map(|r| r.steal_pct)
            .collect::<Option<Vec<f64>>>()
            .map(|v| v.iter().sum::<f64>() / n);
        // `auto-online` may settle on another algorithm than its first pass: say so.
        let mut ran: Vec<&str> = Vec::new();
        for r in &all {
            if !ran.contains(&r.algo.as_str()) {
                ran.push(&r.algo);
            }
        }
        row.algo = ran.join("|");
    }
    out
}

/// Rank 0's table line for `r`.
fn print_row(r: &Row, args: &Args) {
    let mut s = format!(
        "{:<14} {:<12} {:<14} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>10} {:>12.3}",
        r.bytes,
        r.requested.as_deref().unwrap_or("-"),
        r.algo,
        r.median_us.unwrap_or(f64::NAN),
        r.avg_us,
        r.min_us,
        r.max_us,
        r.iters,
        r.busbw
    );
    match (args.nic_rate.is_some(), r.floor_us) {
        (true, Some(f)) => s.push_str(&format!(
            " {:>10.1} {:>7.2}",
            f,
            r.slowest_us.unwrap_or(r.avg_us) / f
        )),
        (true, None) => s.push_str(&format!(" {:>10} {:>7}", "-", "-")),
        _ => {}
    }
    match (args.model, r.model_us) {
        (true, Some(m)) => s.push_str(&format!(
            " {:>10.1} {:>7.2}",
            m,
            r.slowest_us.unwrap_or(r.avg_us) / m
        )),
        (true, None) => s.push_str(&format!(" {:>10} {:>7}", "-", "-")),
        _ => {}
    }
    if args.check {
        s.push_str(&format!(" {:>7}", r.wrong));
    }
    println!("{s}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(algo: &str, slowest: f64) -> Row {
        Row {
            coll: Coll::AllGather,
            bytes: 1024,
            count: 256,
            avg_us: slowest,
            min_us: slowest * 0.9,
            max_us: slowest * 1.1,
            iters: 5,
            algbw: 1.0,
            busbw: 2.0,
            algo: algo.into(),
            mpi_us: None,
            vendor_us: None,
            floor_us: Some(10.0),
            scratch: None,
            wrong: 0,
            requested: Some("auto".into()),
            median_us: Some(slowest),
            slowest_us: Some(slowest),
            model_us: None,
            steal_pct: Some(0.0),
        }
    }

    #[test]
    fn a_slow_pass_is_outvoted_by_the_others_and_every_round_is_counted() {
        let got = of_passes(vec![
            vec![row("ring", 100.0)],
            vec![row("ring", 250.0)],
            vec![row("rd", 110.0)],
        ]);
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_eq!(r.slowest_us, Some(110.0));
        assert_eq!(r.median_us, Some(110.0));
        assert!((r.avg_us - 460.0 / 3.0).abs() < 1e-9);
        assert!((r.busbw - 2.0 * 100.0 / r.avg_us).abs() < 1e-9);
        assert_eq!((r.min_us, r.max_us), (90.0, 275.0));
        assert_eq!(r.iters, 15);
        assert_eq!(r.algo, "ring|rd");
    }
}
