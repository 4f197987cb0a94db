//! Host-staged device collectives cut their messages as the host path does: an explicit
//! `PCCL_CHUNK_SIZE` wins, else the tuner's piece for the call. Thread ranks on the fake ROCm
//! runtime (`tests/fake_rocm/fake_rocm.c`), each transport wrapped in a recorder of the
//! length of every message the device executor sent (one per piece). Runs in a child process
//! (see `tests/fake_rocm/harness.rs`); skipped where no C compiler is found.

#![cfg(feature = "rocm")]

#[path = "fake_rocm/harness.rs"]
mod harness;
mod recorder;

use harness::{is_child, with_fake_runtime};
use pccl::config::{Config, NcclMode};
use pccl::device::hip::HipDevice;
use pccl::model::profile::Profile;
use pccl::{Communicator, RawCollective, ReduceOp, ThreadWorld};
use recorder::Recorder;
use std::time::Duration;

/// The only piece the test profile lets the tuner choose.
const TUNED: usize = 16 * 1024;
/// f32 elements per all-reduce: blocks of 200 kB on 4 ranks, many tuned pieces each, and
/// whole messages under `PCCL_CHUNK_SIZE`'s 1 MiB default.
const COUNT: usize = 200_000;

/// Runs one device all-reduce of [`COUNT`] f32 on 4 thread ranks (2 nodes of 2) with `cfg`,
/// checks it against the host's, and returns the lengths every rank's device collective sent.
fn device_sends(cfg: Config) -> Vec<Vec<usize>> {
    let p = 4;
    let world = ThreadWorld::new(p);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let t = world.transport(r).unwrap();
                let cfg = cfg.clone();
                s.spawn(move || {
                    let rec = Recorder::new(t);
                    let c = Communicator::with_config(rec.clone(), cfg).unwrap();
                    let dev = HipDevice::open(r % 2).unwrap();
                    let x: Vec<f32> = (0..COUNT).map(|i| ((i * 7 + r) % 13) as f32).collect();
                    let mut want = vec![0f32; COUNT];
                    c.all_reduce(&x, &mut want, ReduceOp::Sum).unwrap();
                    let sb = dev.upload(&x).unwrap();
                    let o = dev.alloc_zeroed(COUNT * 4).unwrap();
                    rec.take_sends();
                    // SAFETY: both buffers hold COUNT f32 and live until the call returns.
                    unsafe {
                        c.collective_on::<f32, HipDevice>(
                            &dev,
                            RawCollective::AllReduce(ReduceOp::Sum),
                            sb.device_ptr(),
                            o.device_ptr(),
                            COUNT,
                        )
                    }
                    .unwrap();
                    assert_eq!(dev.download::<f32>(&o).unwrap(), want, "rank {r}");
                    rec.take_sends().iter().map(|s| s.len).collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn tuned_cfg() -> Config {
    Config {
        nccl: NcclMode::Off,
        ranks_per_node: Some(2),
        profile: Profile::from_toml(&format!(
            "name = \"small pieces\"\npiece_bytes = {TUNED}\npiece_candidates = [{TUNED}]\n"
        ))
        .expect("profile parses"),
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// Every message is at most `piece` bytes and some are exactly `piece` (the cut happened).
fn assert_cut_at(sends: &[Vec<usize>], piece: usize) {
    for (r, s) in sends.iter().enumerate() {
        assert!(!s.is_empty(), "rank {r} sent nothing");
        assert!(s.iter().all(|&n| n <= piece), "rank {r}: {s:?}");
        assert!(s.contains(&piece), "rank {r}: {s:?}");
    }
}

#[test]
fn device_collectives_cut_messages_at_the_tuners_piece() {
    with_fake_runtime("child_tuned_piece", &[]);
}

#[test]
fn child_tuned_piece() {
    if !is_child() {
        return;
    }
    assert_cut_at(&device_sends(tuned_cfg()), TUNED);
    // An explicit PCCL_CHUNK_SIZE wins over the tuner.
    let explicit = 8192;
    assert_cut_at(
        &device_sends(Config {
            chunk_bytes: explicit,
            chunk_explicit: true,
            ..tuned_cfg()
        }),
        explicit,
    );
    // A forced algorithm has no tuned piece: PCCL_CHUNK_SIZE's default (1 MiB) cuts nothing
    // here, so some message is longer than the tuned piece.
    let forced = device_sends(Config {
        algo: Some("ring".parse().unwrap()),
        ..tuned_cfg()
    });
    assert!(forced.iter().flatten().any(|&n| n > TUNED), "{forced:?}");
    println!("child-checked");
}
