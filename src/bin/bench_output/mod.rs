//! What `pccl-bench` prints: the osu-style header and rows, or the JSON of every row, and
//! the check's verdict.

use super::{Args, Coll, Row};
use pccl::Communicator;

pub(super) fn print_header(
    comm: &Communicator,
    coll: Coll,
    args: &Args,
    mpi: bool,
    vendor: Option<&str>,
    notes: &[String],
) {
    println!(
        "# OSU MPI {} Latency Test (PCCL {})",
        coll.osu_title(),
        env!("CARGO_PKG_VERSION")
    );
    println!(
        "# {} ranks over {} as {} nodes ({}), algo {}, dtype {}, op {}",
        comm.size(),
        comm.transport_name(),
        comm.topology().nodes().len(),
        comm.topology().describe(),
        args.algo,
        args.dtype,
        args.op
    );
    for n in notes {
        println!("{n}");
    }
    let mut h = format!(
        "# {:<12} {:>15} {:>15} {:>15} {:>10} {:>13} {:>12} {:>12}  {:<10}",
        "Size",
        "Avg Latency(us)",
        "Min Latency(us)",
        "Max Latency(us)",
        "Iterations",
        "count",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "algo"
    );
    if mpi && !args.no_mpi_compare {
        h.push_str(&format!(" {:>12} {:>10}", "MPI Avg(us)", "PCCL/MPI"));
    }
    if let Some(v) = vendor {
        h.push_str(&format!(
            " {:>12} {:>10}",
            format!("{v} Avg(us)"),
            format!("PCCL/{v}")
        ));
    }
    if args.nic_rate.is_some() {
        h.push_str(&format!(" {:>10} {:>7}", "nicfloor", "xfloor"));
    } else if args.floor && coll == Coll::AllGather {
        h.push_str(&format!(" {:>10} {:>7}", "floor(us)", "xfloor"));
    }
    if args.model {
        h.push_str(&format!(" {:>10} {:>7}", "model(us)", "xmodel"));
    }
    if args.memory {
        h.push_str(&format!(" {:>12}", "scratch(B)"));
    }
    if args.check {
        h.push_str(&format!(" {:>7}", "#wrong"));
    }
    println!("{h}");
}

pub(super) fn print_row(r: &Row, check: bool, nic: bool) {
    let mut s = format!(
        "{:<14} {:>15.2} {:>15.2} {:>15.2} {:>10} {:>13} {:>12.3} {:>12.3}  {:<10}",
        r.bytes, r.avg_us, r.min_us, r.max_us, r.iters, r.count, r.algbw, r.busbw, r.algo
    );
    if let Some(m) = r.mpi_us {
        s.push_str(&format!(" {:>12.2} {:>10.3}", m, r.avg_us / m));
    }
    if let Some(v) = r.vendor_us {
        s.push_str(&format!(" {:>12.2} {:>10.3}", v, r.avg_us / v));
    }
    if let Some(f) = r.floor_us {
        // A NIC floor bounds the collective's completion (the slowest rank); the memory floor
        // each rank's own time.
        let t = if nic {
            r.slowest_us.unwrap_or(r.avg_us)
        } else {
            r.avg_us
        };
        s.push_str(&format!(" {:>10.1} {:>7.2}", f, t / f));
    }
    if let Some(m) = r.model_us {
        s.push_str(&format!(
            " {:>10.1} {:>7.2}",
            m,
            r.slowest_us.unwrap_or(r.avg_us) / m
        ));
    }
    if let Some(b) = r.scratch {
        s.push_str(&format!(" {b:>12}"));
    }
    if check {
        s.push_str(&format!(" {:>7}", r.wrong));
    }
    println!("{s}");
}

fn json(rows: &[Row], comm_desc: &serde_json::Value, nic: bool) -> String {
    let v: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut v = serde_json::json!({
                "coll": r.coll.name(), "bytes": r.bytes, "count": r.count,
                "avg_us": r.avg_us, "min_us": r.min_us, "max_us": r.max_us, "iters": r.iters,
                "algbw_gbs": r.algbw, "busbw_gbs": r.busbw, "algo": r.algo,
                "mpi_avg_us": r.mpi_us, "ratio_vs_mpi": r.mpi_us.map(|m| r.avg_us / m),
                "vendor_avg_us": r.vendor_us, "ratio_vs_vendor": r.vendor_us.map(|v| r.avg_us / v),
                "floor_us": r.floor_us,
                "x_floor": r.floor_us.map(|f| if nic { r.slowest_us.unwrap_or(r.avg_us) } else { r.avg_us } / f), "wrong": r.wrong,
                "scratch_bytes": r.scratch, "slowest_us": r.slowest_us, "model_us": r.model_us,
                "host_steal_pct": r.steal_pct,
            });
            if let (Some(req), Some(med)) = (&r.requested, r.median_us) {
                v["requested"] = req.as_str().into();
                v["median_us"] = med.into();
            }
            v
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({ "comm": comm_desc, "results": v }))
        .unwrap_or_default()
}

pub(super) fn report(comm: &Communicator, rows: &[Row], args: &Args) -> u64 {
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if comm.rank() == 0 && args.json {
        let desc = serde_json::json!({
            "ranks": comm.size(), "transport": comm.transport_name(),
            "nodes": comm.topology().nodes().len(), "shape": comm.topology().describe(),
            "dtype": args.dtype, "op": args.op, "algo": args.algo, "device": args.device.name(),
        });
        println!("{}", json(rows, &desc, args.nic_rate.is_some()));
    }
    if comm.rank() == 0 && args.memory && !args.json {
        match peak_rss_kib() {
            Some(k) => println!("# peak resident memory of this process (VmHWM): {k} KiB"),
            None => println!("# peak resident memory: /proc/self/status not readable"),
        }
    }
    if comm.rank() == 0 && args.check {
        if wrong == 0 {
            eprintln!("# check: all results correct");
        } else {
            eprintln!("# check: {wrong} wrong elements");
        }
    }
    wrong
}

/// The process's peak resident set size (`VmHWM` of /proc/self/status), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
