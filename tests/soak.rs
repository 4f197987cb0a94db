//! The soak: 10 000 seeded mixed collectives (every collective, sizes 0..256 KiB, four
//! dtypes, four ops, sync and async, one communicator per algorithm and a half-world
//! sub-communicator) on 4 real processes over TCP, every result checked, all-reduce results
//! bit-identical on every rank, resident memory reported (`examples/soak.rs`).

use std::path::PathBuf;
use std::process::Command;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf()
}

#[test]
fn ten_thousand_mixed_collectives_on_four_processes_have_no_mismatch() {
    let prog = target_dir().join("examples").join("soak");
    assert!(prog.exists(), "{} is built by `cargo test`", prog.display());
    let out = Command::new(&prog)
        .args(["--ranks", "4", "--calls", "10000"])
        .output()
        .expect("run the soak");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "soak failed:\n{text}");
    let reports: Vec<&str> = text.lines().filter(|l| l.contains("calls in")).collect();
    assert_eq!(reports.len(), 4, "one report per rank:\n{text}");
    for r in reports {
        assert!(r.contains(" 0 mismatches"), "{r}");
        assert!(r.contains("bit-identical on every rank: true"), "{r}");
    }
}
