//! The tuner's piece size reaches the transports per call: ranks as threads over TCP on
//! loopback, each transport wrapped in a recorder of the piece size every send and receive
//! was given and of the pieces each receive handed over.

mod common;
mod recorder;

use common::exact_on;
use pccl::config::Config;
use pccl::model::profile::Profile;
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::Communicator;
use recorder::{Recorder, Recv};
use std::sync::Arc;
use std::time::Duration;

/// The transports' creation-time piece size in these tests (their `PCCL_CHUNK_SIZE`).
const CREATED: usize = 256 * 1024;
/// The only piece the test profile lets the tuner choose.
const TUNED: usize = 16 * 1024;
/// Elements per block: f64 blocks of 400 kB, 25 tuned pieces, 2 creation-time ones.
const COUNT: usize = 50_000;

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
                    let rec = Recorder::new(Arc::new(t));
                    let comm = Communicator::with_config(rec.clone(), cfg).expect("communicator");
                    exact_on(&comm, &[COUNT]).unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    drop(comm);
                    let sends = rec.take_sends().iter().map(|s| s.piece).collect();
                    let recvs = rec.take_recvs();
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
