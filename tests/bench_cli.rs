//! The benchmark binary on thread-ranks: checked results, JSON output, and a non-zero exit
//! status for bad arguments.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pccl-bench"))
        .args(args)
        .output()
        .expect("pccl-bench runs")
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
fn bad_arguments_exit_non_zero_with_a_message() {
    for args in [
        &["--algo", "fastest"][..],
        &["-m", "8:4"],
        &["--dtype", "f128"],
        &["--dtype", "i32", "--op", "avg"],
    ] {
        let out = bench(&[&["--ranks", "2", "-i", "1"], args].concat());
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(!out.stderr.is_empty(), "{args:?} should explain");
    }
}
