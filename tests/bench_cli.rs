//! The benchmark binary on thread-ranks: checked results, JSON output, and a non-zero exit
//! status for bad arguments.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pccl-bench"))
        .args(args)
        .output()
        .expect("pccl-bench runs")
}

/// The rows of a successful `--json` run's output.
fn json_rows(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    v["results"].as_array().expect("a results array").clone()
}

/// A list run's row: its median within its fastest and slowest round, no wrong element.
fn check_list_row(r: &serde_json::Value) {
    let (med, lo, hi) = (
        r["median_us"].as_f64().unwrap(),
        r["min_us"].as_f64().unwrap(),
        r["max_us"].as_f64().unwrap(),
    );
    assert!(lo > 0.0 && lo <= med && med <= hi, "{r}");
    assert_eq!(r["wrong"], 0, "{r}");
}

#[test]
fn thread_ranks_2x4_check_every_collective() {
    let out = bench(&[
        "--ranks",
        "8",
        "--ranks-per-node",
        "4",
        "--coll",
        "all",
        "-m",
        "1K:256K",
        "-i",
        "3",
        "--check",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("# OSU MPI Allgather Latency Test"));
    assert!(
        text.contains("Avg Latency(us)") && text.contains("busbw(GB/s)") && text.contains("#wrong")
    );
    // 9 sizes x 3 collectives, each with 0 wrong elements.
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 27, "{text}");
    assert!(rows.iter().all(|l| l.trim_end().ends_with(" 0")), "{text}");
}

#[test]
fn json_output_parses_and_names_every_size() {
    let out = bench(&[
        "--ranks",
        "3",
        "--coll",
        "reducescatter",
        "-m",
        "4K:16K",
        "-i",
        "2",
        "--json",
        "--check",
        "--algo",
        "rd",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["bytes"], 4096);
    assert!(rows.iter().all(|r| r["wrong"] == 0 && r["algo"] == "rd"));
}

#[test]
fn an_algorithm_list_gives_a_checked_row_per_algorithm_and_size_with_its_median() {
    let out = bench(&[
        "--ranks",
        "4",
        "--ranks-per-node",
        "2",
        "--coll",
        "allgather",
        "-m",
        "4K:8K",
        "-i",
        "6",
        "--json",
        "--check",
        "--algo",
        "auto,ring,rd,hier-rd",
    ]);
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 2 * 4, "{rows:?}");
    for (i, want) in ["auto", "ring", "rd", "hier-rd"].iter().enumerate() {
        let r = &rows[i];
        assert_eq!(r["bytes"], 4096);
        assert_eq!(r["requested"], *want);
        if *want != "auto" {
            assert_eq!(r["algo"], *want, "{r}");
        }
        check_list_row(r);
    }
    // The single-algorithm output has no list fields.
    let out = bench(&[
        "--ranks", "2", "-m", "1K", "-i", "2", "--json", "--algo", "rd",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert!(v["results"][0].get("requested").is_none(), "{v}");
}

#[test]
fn passes_sweep_the_sizes_again_and_give_one_checked_row_per_algorithm_and_size() {
    let out = bench(&[
        "--ranks",
        "4",
        "--ranks-per-node",
        "2",
        "--coll",
        "allreduce",
        "-m",
        "1K:2K",
        "-i",
        "4",
        "--json",
        "--check",
        "--passes",
        "3",
        "--algo",
        "ring,hier-rd",
    ]);
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 2 * 2, "{rows:?}");
    for (r, (bytes, algo)) in rows.iter().zip([
        (1024, "ring"),
        (1024, "hier-rd"),
        (2048, "ring"),
        (2048, "hier-rd"),
    ]) {
        assert_eq!(
            (r["bytes"].as_u64(), r["algo"].as_str()),
            (Some(bytes), Some(algo))
        );
        // Four rounds of one call per pass, three passes.
        assert_eq!(r["iters"], 12, "{r}");
        check_list_row(r);
    }
}

#[test]
fn bad_arguments_exit_non_zero_with_a_message() {
    for args in [
        &["--algo", "fastest"][..],
        &["-m", "8:4"],
        &["--dtype", "f128"],
        &["--dtype", "i32", "--op", "avg"],
        &["--algo", "ring,fastest"],
        &["--algo", "ring,rd", "--floor"],
        &["--algo", "ring", "--passes", "2"],
        &["--algo", "ring,rd", "--passes", "0"],
    ] {
        let out = bench(&[&["--ranks", "2", "-i", "1"], args].concat());
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(!out.stderr.is_empty(), "{args:?} should explain");
    }
}

/// Whether `-d cuda` can run here: `Err(reason)` without the `cuda` feature, a driver or a
/// device.
fn cuda_devices() -> Result<usize, String> {
    #[cfg(feature = "cuda")]
    {
        match pccl::device::cuda::CudaDevice::count() {
            Ok(0) => Err("the driver reports no CUDA device".to_string()),
            Ok(n) => Ok(n),
            Err(e) => Err(e.message().to_string()),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("built without the cuda feature".to_string())
    }
}

#[test]
fn cuda_device_checks_every_collective_or_says_why_not() {
    let out = bench(&[
        "-d", "cuda", "--ranks", "2", "--check", "--coll", "all", "-m", "1K:1M",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    let reason = match cuda_devices() {
        Ok(n) => {
            println!("{n} CUDA device(s)");
            None
        }
        Err(reason) => Some(reason),
    };
    if let Some(reason) = reason {
        assert!(!out.status.success(), "-d cuda should fail here: {text}");
        assert!(!err.contains("panicked"), "{err}");
        if cfg!(feature = "cuda") {
            assert!(
                err.contains("pccl-bench: no CUDA device: "),
                "unclear error: {err}"
            );
            if std::env::var("PCCL_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("PCCL_REQUIRE_CUDA=1 but CUDA is not usable: {reason}");
            }
        } else {
            assert!(err.contains("--features cuda"), "unclear error: {err}");
        }
        println!("skipped: no CUDA device ({reason})");
        return;
    }
    assert!(out.status.success(), "{text}\n{err}");
    assert!(text.contains("# device cuda: rank 0 on GPU 0"), "{text}");
    assert!(text.contains("#wrong") && err.contains("# check: all results correct"));
    // 11 sizes x 3 collectives, each with 0 wrong elements.
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 33, "{text}");
    assert!(rows.iter().all(|l| l.trim_end().ends_with(" 0")), "{text}");
}

#[test]
fn unknown_device_exits_non_zero_with_a_message() {
    let out = bench(&["--ranks", "2", "-i", "1", "-d", "tpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host") && err.contains("cuda"), "{err}");
}

#[test]
fn pccl_group_size_makes_three_levels_run_and_a_bad_one_is_refused() {
    let run = |group: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pccl-bench"))
            .args(args)
            .env("PCCL_GROUP_SIZE", group)
            .output()
            .expect("pccl-bench runs")
    };
    let out = run(
        "2",
        &[
            "--ranks",
            "8",
            "--ranks-per-node",
            "4",
            "--coll",
            "reducescatter",
            "-m",
            "4K:4K",
            "-i",
            "3",
            "--json",
            "--check",
            "--algo",
            "hier3-rd,hier3-rd-pipe2",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["comm"]["shape"], "2x4 (groups of 2)", "{v}");
    let rows = v["results"].as_array().unwrap();
    for (r, want) in rows.iter().zip(["hier3-rd", "hier3-rd-pipe2"]) {
        // Each algorithm's own communicator (a split) kept the groups: it ran as asked.
        assert_eq!(r["algo"], want, "{r}");
        assert_eq!(r["wrong"], 0);
    }
    for bad in ["0", "x"] {
        let out = run(bad, &["--ranks", "2"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("PCCL_GROUP_SIZE"), "{bad}: {err}");
    }
}

/// `scripts/cluster_merge.py` (cluster-bench.sh `--launches`) on `docs`, written to a fresh
/// folder: its exit status and the merged document.
fn merge_launches(docs: &[String]) -> (std::process::ExitStatus, String) {
    let dir = std::env::temp_dir().join(format!("pccl-merge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut args = vec![
        concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster_merge.py").to_string(),
        dir.join("merged.json").display().to_string(),
    ];
    for (i, d) in docs.iter().enumerate() {
        let p = dir.join(format!("launch{i}.json"));
        std::fs::write(&p, d).unwrap();
        args.push(p.display().to_string());
    }
    let status = Command::new("python3")
        .args(&args)
        .status()
        .expect("python3 runs");
    let merged = std::fs::read_to_string(dir.join("merged.json")).unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();
    (status, merged)
}

#[test]
fn launches_merge_into_the_median_per_point_and_keep_every_wrong_element() {
    // Three launches of one point: the median time, every round and wrong element counted,
    // every plan named, and a non-zero status for the one wrong element.
    let launch = |slowest: f64, wrong: u64, algo: &str| {
        serde_json::json!({
            "comm": {"ranks": 4},
            "results": [{
                "coll": "allreduce", "bytes": 1024, "requested": "auto", "algo": algo,
                "avg_us": slowest, "slowest_us": slowest, "median_us": slowest,
                "min_us": slowest / 2.0, "max_us": slowest * 2.0, "iters": 10, "wrong": wrong,
                "algbw_gbs": 1024.0 / slowest / 1e3, "busbw_gbs": 1.0, "floor_us": 5.0,
                "x_floor": slowest / 5.0, "host_steal_pct": 0.0,
            }]
        })
        .to_string()
    };
    let (status, merged) = merge_launches(&[
        launch(10.0, 0, "rd"),
        launch(30.0, 1, "ring"),
        launch(20.0, 0, "rd"),
    ]);
    assert!(!status.success(), "a wrong element must fail the merge");
    let v: serde_json::Value =
        serde_json::from_str(merged.split("\n# check").next().expect("a JSON document"))
            .expect("valid JSON");
    let r = &v["results"][0];
    assert_eq!(r["slowest_us"], 20.0, "{r}");
    assert_eq!(r["avg_us"], 20.0, "{r}");
    assert_eq!(
        (r["min_us"].as_f64(), r["max_us"].as_f64()),
        (Some(5.0), Some(60.0))
    );
    assert_eq!(
        (r["iters"].as_u64(), r["wrong"].as_u64()),
        (Some(30), Some(1))
    );
    assert_eq!(r["algo"], "rd|ring");
    assert_eq!(r["x_floor"], 4.0, "{r}");
    assert_eq!(v["comm"]["launches"], 3);
    assert!(merged.contains("# check: 1 wrong elements"), "{merged}");

    // Two real list runs merge into one checked row per algorithm and size.
    let run = || {
        let out = bench(&[
            "--ranks",
            "4",
            "--ranks-per-node",
            "2",
            "--coll",
            "allgather",
            "-m",
            "1K:2K",
            "-i",
            "2",
            "--json",
            "--check",
            "--algo",
            "ring,rd",
        ]);
        json_rows(&out);
        String::from_utf8(out.stdout).unwrap()
    };
    let (status, merged) = merge_launches(&[run(), run()]);
    assert!(status.success(), "{merged}");
    let v: serde_json::Value =
        serde_json::from_str(merged.split("\n# check").next().unwrap()).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    rows.iter().for_each(check_list_row);

    // A launch that crashed before its JSON fails the merge instead of vanishing into it.
    let (status, _) = merge_launches(&[run(), "pccl-bench: rank 3 died".into()]);
    assert!(!status.success());
}
