//! `pccl-tune` on thread-ranks: a quick run writes a profile the communicator loads, with the
//! terms a thread world is calibrated by (only α free for its memcpy transfers) and the raw
//! timings they come from; `--merge` derives one profile from several runs' medians (with
//! `--rings-of`, the oversubscribed rings of another); bad arguments fail with a message.

use pccl::model::profile::Profile;
use std::process::Command;

fn tune(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pccl-tune"))
        .args(args)
        .output()
        .expect("pccl-tune runs")
}

/// A fresh directory for one test's profiles.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pccl-tune-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The path of file `n` in `dir`, as an argument for pccl-tune.
fn path_in(dir: &std::path::Path, n: &str) -> String {
    dir.join(n).to_str().unwrap().to_string()
}

/// `n` quick thread calibrations written to `run0.toml` … in `dir`, loaded.
fn quick_runs(dir: &std::path::Path, n: usize) -> Vec<Profile> {
    (0..n)
        .map(|i| {
            let f = path_in(dir, &format!("run{i}.toml"));
            let out = tune(&["--quick", "-o", &f]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Profile::load(std::path::Path::new(&f)).unwrap()
        })
        .collect()
}

#[test]
fn a_quick_thread_run_writes_a_valid_profile_with_memcpy_transfers() {
    let dir = scratch_dir("cli");
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
    // The raw timings are kept, and derive the same profile again.
    let m = p.measured.clone().expect("[measured] kept");
    assert_eq!(m.transport, "threads");
    assert_eq!(m.exchange_bytes.len(), m.exchange_us.len());
    assert_eq!(pccl::model::calibrate::derive(&m).unwrap(), p);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn merged_runs_give_one_profile_from_the_median_of_each_size() {
    let dir = scratch_dir("merge");
    let file = |n: &str| path_in(&dir, n);
    let mut runs = quick_runs(&dir, 3);
    // One run's 16 KiB … 2 MiB made 4× slower, as a badly placed process times them: the
    // merge outvotes it.
    let mut slow = runs[2].measured.clone().unwrap();
    for (t, &s) in slow.exchange_us.iter_mut().zip(&slow.exchange_bytes) {
        if (16 << 10..=2 << 20).contains(&s) {
            *t *= 4.0;
        }
    }
    runs[2].measured = Some(slow);
    std::fs::write(file("run2.toml"), runs[2].to_toml()).unwrap();
    let out = tune(&[
        "--merge",
        &file("run0.toml"),
        &file("run1.toml"),
        &file("run2.toml"),
        "-v",
        "-o",
        &file("merged.toml"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("2-rank exchange, measured vs fitted"), "{err}");
    assert!(
        err.contains("differ up to") && err.contains("state changed between the runs"),
        "the slowed run is reported: {err}"
    );
    let merged = Profile::load(std::path::Path::new(&file("merged.toml"))).unwrap();
    assert!(merged.source.contains("median of 3"), "{}", merged.source);
    let m = merged.measured.as_ref().unwrap();
    for (k, &t) in m.exchange_us.iter().enumerate() {
        let mut v: Vec<f64> = runs
            .iter()
            .map(|r| r.measured.as_ref().unwrap().exchange_us[k])
            .collect();
        v.sort_by(f64::total_cmp);
        assert_eq!(t, v[1], "size {}: the median of {v:?}", m.exchange_bytes[k]);
    }
    // A profile without timings (a preset) or a missing file is refused with its name.
    std::fs::write(file("preset.toml"), Profile::default().to_toml()).unwrap();
    for bad in [file("preset.toml"), file("missing.toml")] {
        let out = tune(&["--merge", &file("run0.toml"), &bad, "-o", &file("x.toml")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}");
        assert!(err.contains("pccl-tune:") && err.contains(&bad), "{err}");
    }
    assert!(
        !dir.join("x.toml").exists(),
        "nothing written on a refused merge"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn rings_of_pairs_merged_exchanges_with_another_profiles_oversubscribed_rings() {
    let dir = scratch_dir("rings");
    let file = |n: &str| path_in(&dir, n);
    quick_runs(&dir, 2);
    let load = |n: &str| Profile::load(std::path::Path::new(&file(n))).unwrap();
    // The rings of another calibration, at 2 × and 4 × the host's cores.
    let mut rings = load("run0.toml");
    let mut m = rings.measured.clone().unwrap();
    let (p1, p2) = (2 * m.cores, 4 * m.cores);
    (m.oversub_ranks, m.oversub_us, m.oversub_ring_us) = (vec![], vec![], 0.0);
    m.add_oversub_point(p2, 4000.0, 0.0);
    m.add_oversub_point(p1, 900.0, 7000.0);
    rings.measured = Some(m);
    std::fs::write(file("rings.toml"), rings.to_toml()).unwrap();
    let args = |r: &str| {
        tune(&[
            "--merge",
            &file("run0.toml"),
            &file("run1.toml"),
            "--rings-of",
            r,
            "-o",
            &file("merged.toml"),
        ])
    };
    let out = args(&file("rings.toml"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged = load("merged.toml");
    let mm = merged.measured.as_ref().unwrap();
    assert_eq!(
        (
            mm.oversub_ranks.clone(),
            mm.oversub_us.clone(),
            mm.oversub_ring_us
        ),
        (vec![p1, p2], vec![900.0, 4000.0], 7000.0),
        "the rings come from --rings-of"
    );
    let (a, b) = (load("run0.toml"), load("run1.toml"));
    for (k, &t) in mm.exchange_us.iter().enumerate() {
        let (x, y) = (
            a.measured.as_ref().unwrap().exchange_us[k],
            b.measured.as_ref().unwrap().exchange_us[k],
        );
        assert_eq!(t, (x + y) / 2.0, "the exchange from the merged runs");
    }
    let points = format!("{p1}, {p2} ranks on");
    assert!(merged.source.contains(&points), "{}", merged.source);
    // Rings of another transport are refused by name, and nothing is written.
    std::fs::remove_file(file("merged.toml")).unwrap();
    let mut other = load("rings.toml");
    other.measured.as_mut().unwrap().transport = "mpi".into();
    std::fs::write(file("other.toml"), other.to_toml()).unwrap();
    let out = args(&file("other.toml"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("other.toml"), "{err}");
    assert!(!dir.join("merged.toml").exists());
    // Without --merge it is a usage error.
    let out = tune(&["--rings-of", &file("rings.toml"), "-o", &file("x.toml")]);
    assert!(!out.status.success());
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

/// `--refit` fits a network profile's timings again without measuring: from a profile written
/// before profiles kept them (read back from its `source`), with or without a NIC burst; the
/// result keeps the timings as a table and refits to the same terms. A profile with no network
/// timings (a threads run) is refused, naming what is missing.
#[test]
fn refit_fits_a_network_profiles_timings_again_and_refuses_one_without_them() {
    let dir = scratch_dir("refit");
    let old = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/cluster/cpu64/profile-tuned-allgather-8x2-k1-200mbit.toml"
    );
    let first = path_in(&dir, "refit.toml");
    let out = tune(&["--refit", old, "--nic-burst", "32K", "-o", &first]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = Profile::load(std::path::Path::new(&first)).unwrap();
    let m = p
        .measured_network
        .as_ref()
        .expect("the timings kept as a table");
    assert_eq!((m.nodes, m.ranks_per_node, m.world.len()), (8, 2, 6));
    assert_eq!(p.inter.burst_bytes, 32768.0);
    assert!(p.oversub.inter_cpu_us > 0.0, "{:?}", p.oversub);
    // Refitting the refitted profile reads its table and lands on the same terms.
    let again = path_in(&dir, "again.toml");
    let out = tune(&["--refit", &first, "-o", &again]);
    assert!(out.status.success());
    let q = Profile::load(std::path::Path::new(&again)).unwrap();
    assert_eq!(q.measured_network, p.measured_network);
    assert!((q.oversub.inter_cpu_us / p.oversub.inter_cpu_us - 1.0).abs() < 1e-9);
    // A threads profile has no network timings.
    let threads = path_in(&dir, "threads.toml");
    assert!(tune(&["--quick", "-o", &threads]).status.success());
    let out = tune(&["--refit", &threads, "-o", &path_in(&dir, "no.toml")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no network timings"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
