//! The tuner's piece size reaches the transports per call: ranks as threads over TCP on
//! loopback, each transport wrapped in a recorder of the piece size every send and receive
//! was given and of the pieces each receive handed over.

mod common;

use common::exact_on;
use pccl::config::Config;
use pccl::model::profile::Profile;
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::transport::{Faults, Notice, SendOp, Tag, Transport};
use pccl::{Communicator, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The transports' creation-time piece size in these tests (their `PCCL_CHUNK_SIZE`).
const CREATED: usize = 256 * 1024;
/// The only piece the test profile lets the tuner choose.
const TUNED: usize = 16 * 1024;
/// Elements per block: f64 blocks of 400 kB, 25 tuned pieces, 2 creation-time ones.
const COUNT: usize = 50_000;

/// One receive as the recorder saw it.
#[derive(Clone, Copy, Debug)]
struct Recv {
    len: usize,
    piece: Option<usize>,
    /// Pieces the transport handed to the sink (`None`: received straight into memory).
    handed: Option<usize>,
}

/// A transport that records what the executor asked of it, and forwards everything.
struct Recorder {
    inner: Arc<dyn Transport>,
    sends: Mutex<Vec<Option<usize>>>,
    recvs: Mutex<Vec<Recv>>,
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
        self.sends.lock().unwrap().push(piece);
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
        self.recv_pieces(peer, tag, len, None, deadline, sink)
    }
    fn recv_pieces(
        &self,
        peer: usize,
        tag: Tag,
        len: usize,
        piece: Option<usize>,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let mut handed = 0;
        let r = self
            .inner
            .recv_pieces(peer, tag, len, piece, deadline, &mut |off, b| {
                handed += 1;
                sink(off, b)
            });
        self.recvs.lock().unwrap().push(Recv {
            len,
            piece,
            handed: Some(handed),
        });
        r
    }
    fn recv_into(&self, peer: usize, tag: Tag, dst: &mut [u8], deadline: Instant) -> Result<()> {
        self.recv_into_pieces(peer, tag, dst, None, deadline)
    }
    fn recv_into_pieces(
        &self,
        peer: usize,
        tag: Tag,
        dst: &mut [u8],
        piece: Option<usize>,
        deadline: Instant,
    ) -> Result<()> {
        let len = dst.len();
        let r = self.inner.recv_into_pieces(peer, tag, dst, piece, deadline);
        self.recvs.lock().unwrap().push(Recv {
            len,
            piece,
            handed: None,
        });
        r
    }
    fn subset(&self, members: &[usize], ctx: u64) -> Result<Arc<dyn Transport>> {
        self.inner.subset(members, ctx)
    }
}

/// What one rank recorded.
struct Seen {
    sends: Vec<Option<usize>>,
    recvs: Vec<Recv>,
}

/// Runs `exact_on` at [`COUNT`] on `p` TCP ranks, rank `r` configured by `cfg(r)`.
fn run(p: usize, cfg: impl Fn(usize) -> Config + Sync) -> Vec<Seen> {
    let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
    let bytes = id.to_bytes();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let cfg = &cfg;
                s.spawn(move || {
                    let cfg = cfg(r);
                    let id = UniqueId::from_bytes(&bytes).expect("id parses");
                    let t = TcpTransport::connect_with(&id, p, r, CREATED, cfg.timeout, false)
                        .expect("connect");
                    let rec = Arc::new(Recorder {
                        inner: Arc::new(t),
                        sends: Mutex::new(Vec::new()),
                        recvs: Mutex::new(Vec::new()),
                    });
                    let comm = Communicator::with_config(rec.clone(), cfg).expect("communicator");
                    exact_on(&comm, &[COUNT]).unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    drop(comm);
                    let sends = std::mem::take(&mut *rec.sends.lock().unwrap());
                    let recvs = std::mem::take(&mut *rec.recvs.lock().unwrap());
                    Seen { sends, recvs }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// A profile (as a tune file would hold it) whose only piece candidate is [`TUNED`].
fn small_piece_profile() -> Profile {
    Profile::from_toml(&format!(
        "name = \"small pieces\"\npiece_bytes = {TUNED}\npiece_candidates = [{TUNED}]\n"
    ))
    .expect("profile parses")
}

fn tuned_cfg() -> Config {
    Config {
        ranks_per_node: Some(2),
        profile: small_piece_profile(),
        timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

/// Every receive was told `piece`, and every one of at least 4 kB handed to a sink (the
/// reductions) handed over exactly `len / piece` pieces (rounded up).
fn assert_cut(rank: usize, recvs: &[Recv], piece: usize) {
    let mut cut = 0;
    for r in recvs {
        assert_eq!(r.piece, Some(piece), "rank {rank}: {r:?}");
        if let (Some(h), true) = (r.handed, r.len >= 4096) {
            assert_eq!(h, r.len.div_ceil(piece), "rank {rank}: {r:?}");
            cut += usize::from(h > 1);
        }
    }
    assert!(
        cut > 0,
        "rank {rank}: no receive was cut in pieces: {recvs:?}"
    );
}

#[test]
fn the_tuners_piece_cuts_every_message_of_the_call() {
    let seen = run(4, |_| tuned_cfg());
    for (rank, s) in seen.iter().enumerate() {
        assert!(!s.sends.is_empty());
        assert!(
            s.sends.iter().all(|&p| p == Some(TUNED)),
            "rank {rank}: {:?}",
            s.sends
        );
        assert_cut(rank, &s.recvs, TUNED);
    }
}

#[test]
fn an_explicit_chunk_size_wins_over_the_tuner() {
    let explicit = 8192;
    let seen = run(4, |_| Config {
        chunk_bytes: explicit,
        chunk_explicit: true,
        ..tuned_cfg()
    });
    for (rank, s) in seen.iter().enumerate() {
        assert!(
            s.sends.iter().all(|&p| p == Some(explicit)),
            "rank {rank}: {:?}",
            s.sends
        );
        assert_cut(rank, &s.recvs, explicit);
    }
}

/// On TCP a message is one self-describing frame: a rank cutting at another size (an older
/// configuration) still gets and gives exact results.
#[test]
fn tcp_ranks_with_different_piece_sizes_interoperate() {
    let seen = run(4, |r| {
        if r == 1 {
            Config {
                chunk_bytes: 64 * 1024,
                chunk_explicit: true,
                ..tuned_cfg()
            }
        } else {
            tuned_cfg()
        }
    });
    assert_cut(1, &seen[1].recvs, 64 * 1024);
    assert_cut(0, &seen[0].recvs, TUNED);
}

#[test]
fn a_profile_with_a_piece_candidate_below_4_kib_is_refused() {
    let e = Profile::from_toml("piece_candidates = [1024]").unwrap_err();
    assert!(e.message().contains("piece_candidates"), "{e}");
}
