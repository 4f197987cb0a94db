//! Host-staged device collectives cut their messages as the host path does: an explicit
//! `PCCL_CHUNK_SIZE` wins, else the tuner's piece for the call. Thread ranks on the fake ROCm
//! runtime (`tests/fake_rocm/fake_rocm.c`), each transport wrapped in a recorder of the
//! length of every message the device executor sent (one per piece). Runs in a child process
//! (see `tests/fake_rocm/harness.rs`); skipped where no C compiler is found.

#![cfg(feature = "rocm")]

#[path = "fake_rocm/harness.rs"]
mod harness;

use harness::{is_child, with_fake_runtime};
use pccl::config::{Config, NcclMode};
use pccl::device::hip::HipDevice;
use pccl::model::profile::Profile;
use pccl::transport::{Faults, Notice, SendOp, Tag, Transport};
use pccl::{Communicator, RawCollective, ReduceOp, Result, ThreadWorld};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The only piece the test profile lets the tuner choose.
const TUNED: usize = 16 * 1024;
/// f32 elements per all-reduce: blocks of 200 kB on 4 ranks, many tuned pieces each, and
/// whole messages under `PCCL_CHUNK_SIZE`'s 1 MiB default.
const COUNT: usize = 200_000;

/// A transport that records the length of every message sent, and forwards everything.
struct Recorder {
    inner: Arc<dyn Transport>,
    sends: Mutex<Vec<usize>>,
}

impl Transport for Recorder {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn node_key(&self) -> u64 {
        self.inner.node_key()
    }
    fn faults(&self) -> &Faults {
        self.inner.faults()
    }
    fn notify(&self, notice: &Notice) {
        self.inner.notify(notice)
    }
    unsafe fn isend(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
    ) -> Result<Box<dyn SendOp>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.isend_pieces(peer, tag, ptr, len, None) }
    }
    unsafe fn isend_pieces(
        &self,
        peer: usize,
        tag: Tag,
        ptr: *const u8,
        len: usize,
        piece: Option<usize>,
    ) -> Result<Box<dyn SendOp>> {
        self.sends.lock().unwrap().push(len);
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.isend_pieces(peer, tag, ptr, len, piece) }
    }
    fn recv(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.inner.recv(peer, tag, len, deadline, sink)
    }
    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        self.inner.recv_into(peer, tag, dst, deadline)
    }
    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        self.inner.subset(members, ctx)
    }
}

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
                    let rec = Arc::new(Recorder {
                        inner: t,
                        sends: Mutex::new(Vec::new()),
                    });
                    let c = Communicator::with_config(rec.clone(), cfg).unwrap();
                    let dev = HipDevice::open(r % 2).unwrap();
                    let x: Vec<f32> = (0..COUNT).map(|i| ((i * 7 + r) % 13) as f32).collect();
                    let mut want = vec![0f32; COUNT];
                    c.all_reduce(&x, &mut want, ReduceOp::Sum).unwrap();
                    let sb = dev.upload(&x).unwrap();
                    let o = dev.alloc_zeroed(COUNT * 4).unwrap();
                    rec.sends.lock().unwrap().clear();
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
                    let sent = std::mem::take(&mut *rec.sends.lock().unwrap());
                    sent
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
