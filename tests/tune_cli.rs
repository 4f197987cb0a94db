//! `pccl-tune` on thread-ranks: a quick run writes a profile the communicator loads, with the
//! terms a thread world is calibrated by (only α free for its memcpy transfers), and bad
//! arguments fail with a message.

use pccl::model::profile::Profile;
use std::process::Command;

fn tune(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pccl-tune"))
        .args(args)
        .output()
        .expect("pccl-tune runs")
}

#[test]
fn a_quick_thread_run_writes_a_valid_profile_with_memcpy_transfers() {
    let dir = std::env::temp_dir().join(format!("pccl-tune-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tune.toml");
    let out = tune(&["--quick", "-v", "-o", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("memcpy sweep") && err.contains("2-rank exchange"),
        "{err}"
    );
    let p = Profile::load(&path).unwrap_or_else(|e| panic!("{e}\n{err}"));
    p.validate().unwrap();
    // Thread ranks' transfer is a memcpy: β is memory's copy rate, the whole cache gain.
    // (Equal up to rounding: β goes through bytes per second and back.)
    assert!(
        (p.intra.bandwidth_gbps / p.copy_gbps - 1.0).abs() < 1e-12,
        "{p:?}"
    );
    assert_eq!(p.cache.link_share, 1.0);
    assert!(p.intra.alpha_us >= 0.0 && p.intra.alpha_us < 1e4, "{p:?}");
    assert!(p.cache.sharpness >= 1.0);
    assert_eq!(
        (p.protocol.eager_bytes, p.protocol.small_bytes),
        (0, 0),
        "no protocol step for threads"
    );
    assert!(p.piece_overhead_us >= 0.0 && p.piece_overhead_us.is_finite());
    assert!(p.source.contains("per piece"), "{}", p.source);
    // Thread ranks copy strided blocks straight out of the sender's: no packing copy.
    assert_eq!(p.strided, pccl::model::profile::Strided::Gathered);
    // ... and reduce straight out of them too.
    assert_eq!(p.receive_reduce, pccl::model::profile::ReceiveReduce::Fused);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_arguments_exit_non_zero_with_a_message() {
    for args in [
        &["--ranks", "1"][..],
        &["--transport", "carrier-pigeon"][..],
    ] {
        let out = tune(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("pccl-tune:"), "{args:?}: {err}");
    }
}
