//! Single-copy messages between processes of one host (`PCCL_SHM_SINGLE_COPY`): a large
//! message goes through the shared-memory ring as an offer, and the receiver reads it from
//! the sender's memory (`process_vm_readv`). Exact across processes, and never wrong data
//! when a peer misbehaves: a receiver that exits before reading, a sender that exits with
//! its offer out, a receiver too slow for the sender's timeout, ranks that disagree on the
//! length.
//!
//! Each test re-runs this executable as its ranks (`PCCL_SC_TEST_RANK`, `PCCL_SC_TEST_ID`);
//! a rank prints one `SC ...` line the parent checks. Needs a host where a user's processes
//! may read each other's memory (Linux's default without Yama, or root): the transport probes
//! it, and the first test fails where it cannot.

mod common;

use common::{exact_all_on, test_in_child};
use pccl::config::Config;
use pccl::plan::{Algorithm, LevelAlgo};
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::Communicator;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ENV_RANK: &str = "PCCL_SC_TEST_RANK";
const ENV_ID: &str = "PCCL_SC_TEST_ID";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// This process's role, when the parent started it as a rank: (rank, unique id).
fn as_rank() -> Option<(usize, UniqueId)> {
    let rank = std::env::var(ENV_RANK).ok()?.parse().expect("rank");
    let id = UniqueId::from_bytes(&unhex(&std::env::var(ENV_ID).ok()?)).expect("id");
    Some((rank, id))
}

/// One rank's transport and communicator (flat ring, each rank its own node in the plan,
/// every peer on this host in fact).
fn join(
    id: &UniqueId,
    p: usize,
    rank: usize,
    timeout: Duration,
) -> (Vec<Option<usize>>, Communicator) {
    let t = TcpTransport::connect_with(id, p, rank, 256 << 10, timeout, true)
        .unwrap_or_else(|e| panic!("rank {rank}: connect: {e}"));
    let single: Vec<_> = (0..p).map(|q| t.single_copy_with(q)).collect();
    let cfg = Config {
        ranks_per_node: Some(1),
        algo: Some(Algorithm::Flat(LevelAlgo::Ring)),
        timeout,
        ..Config::default()
    };
    let comm = Communicator::with_config(Arc::new(t), cfg).expect("communicator");
    (single, comm)
}

/// Starts `p` ranks of test `name`, rank r with `envs(r)`.
fn spawn(
    name: &str,
    p: usize,
    envs: impl Fn(usize) -> Vec<(&'static str, &'static str)>,
) -> Vec<Child> {
    let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
    (0..p)
        .map(|r| {
            test_in_child(name)
                .env(ENV_RANK, r.to_string())
                .env(ENV_ID, hex(&id.to_bytes()))
                .env_remove("PCCL_SHM_DISABLE")
                .env_remove("PCCL_SHM_SINGLE_COPY")
                .env_remove("PCCL_FAULT")
                .envs(envs(r))
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect()
}

/// Each rank's `SC ...` line (without `SC `), waiting until `until` at most (then the rank is
/// killed and its whole output is the error).
fn reports(children: Vec<Child>, until: Instant) -> Vec<Result<String, String>> {
    children
        .into_iter()
        .enumerate()
        .map(|(r, mut c)| {
            while c.try_wait().expect("wait").is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let out = c.wait_with_output().expect("rank output");
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = out
                .lines()
                .find_map(|l| l.find("SC ").map(|at| l[at + 3..].to_string()))
                .ok_or(out);
            eprintln!("rank {r}: {line:?}");
            line
        })
        .collect()
}

/// Every 4-byte word of a p2p message from `from`, numbered `i`.
fn word(from: usize, i: usize) -> u32 {
    (from as u32) << 24 ^ (i as u32).wrapping_mul(2_654_435_761)
}

/// Three processes, the third with `PCCL_SHM_SINGLE_COPY=off`: the first two offer their
/// messages from 256 KiB on to every peer (the third still reads theirs), the third copies
/// through the ring; ring collectives whose messages lie on both sides of the threshold and
/// point-to-point messages of exactly 256 KiB and one word less are exact, bit for bit.
#[test]
fn processes_on_one_host_read_large_messages_from_each_other_exactly() {
    const NAME: &str = "processes_on_one_host_read_large_messages_from_each_other_exactly";
    if let Some((r, id)) = as_rank() {
        let (single, comm) = join(&id, 3, r, Duration::from_secs(30));
        let run = || -> Result<(), String> {
            exact_all_on(&comm, &[20_000, 70_001, 300_000])?;
            for n in [65_536usize, 65_535, 300_001] {
                let (next, prev) = ((r + 1) % 3, (r + 2) % 3);
                let mine: Vec<u32> = (0..n).map(|i| word(r, i)).collect();
                let mut got = vec![0u32; n];
                let mut g = comm.group_start();
                g.send(&mine, next).recv(&mut got, prev);
                g.end().map_err(|e| e.to_string())?;
                if let Some(i) = (0..n).find(|&i| got[i] != word(prev, i)) {
                    return Err(format!("p2p {n} words from rank {prev}: word {i} wrong"));
                }
            }
            Ok(())
        };
        match run() {
            Ok(()) => println!("SC ok {single:?}"),
            Err(e) => println!("SC err {e}"),
        }
        return;
    }
    let children = spawn(NAME, 3, |r| {
        if r == 2 {
            vec![("PCCL_SHM_SINGLE_COPY", "off")]
        } else {
            vec![]
        }
    });
    let got = reports(children, Instant::now() + Duration::from_secs(120));
    let on = Some(pccl::transport::shm::SINGLE_COPY);
    let want = [
        format!("ok {:?}", [None, on, on]),
        format!("ok {:?}", [on, None, on]),
        format!("ok {:?}", [None::<usize>, None, None]),
    ];
    for (r, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g
            .as_ref()
            .unwrap_or_else(|out| panic!("rank {r} did not report: {out}"));
        assert_eq!(
            g, w,
            "rank {r}: single-copy thresholds per peer and result (None everywhere: this host \
             refuses process_vm_readv between processes)"
        );
    }
}

/// A receiver that exits before it takes an offer: the sender's send fails within seconds
/// (its timeout is 60 s), naming it; nothing waits for a read that cannot come.
#[test]
fn a_receiver_that_exits_before_taking_an_offer_fails_the_sender_at_once() {
    const NAME: &str = "a_receiver_that_exits_before_taking_an_offer_fails_the_sender_at_once";
    if let Some((r, id)) = as_rank() {
        let (_, comm) = join(&id, 2, r, Duration::from_secs(60));
        comm.barrier().expect("barrier");
        if r == 0 {
            println!("SC gone");
            std::process::exit(0);
        }
        let t0 = Instant::now();
        let e = comm.send(&vec![7u32; 1 << 20], 0);
        println!(
            "SC {:?} after {} ms",
            e.map_err(|e| e.to_string()),
            t0.elapsed().as_millis()
        );
        return;
    }
    let start = Instant::now();
    let got = reports(spawn(NAME, 2, |_| vec![]), start + Duration::from_secs(30));
    assert_eq!(got[0].as_deref(), Ok("gone"), "rank 0");
    let line = got[1]
        .as_ref()
        .unwrap_or_else(|out| panic!("rank 1: {out}"));
    assert!(
        line.starts_with("Err(") && line.contains("rank 0"),
        "rank 1: {line}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}

/// A sender that exits with its offer out (its send posted, never waited for): the receiver
/// that comes to it later gets an error naming it, never the bytes of a dead process.
#[test]
fn a_sender_that_exits_with_its_offer_out_fails_the_receiver() {
    const NAME: &str = "a_sender_that_exits_with_its_offer_out_fails_the_receiver";
    if let Some((r, id)) = as_rank() {
        let (_, comm) = join(&id, 2, r, Duration::from_secs(60));
        comm.barrier().expect("barrier");
        if r == 1 {
            let req = comm.send_async(vec![7u32; 1 << 20], 0).expect("post");
            std::thread::sleep(Duration::from_millis(300));
            println!("SC gone");
            std::mem::forget(req);
            std::process::exit(0);
        }
        std::thread::sleep(Duration::from_millis(1500));
        let mut got = vec![0u32; 1 << 20];
        let e = comm.recv(&mut got, 1);
        println!("SC {:?}", e.map_err(|e| e.to_string()));
        return;
    }
    let start = Instant::now();
    let got = reports(spawn(NAME, 2, |_| vec![]), start + Duration::from_secs(30));
    assert_eq!(got[1].as_deref(), Ok("gone"), "rank 1");
    let line = got[0]
        .as_ref()
        .unwrap_or_else(|out| panic!("rank 0: {out}"));
    assert!(
        line.starts_with("Err(") && line.contains("rank 1"),
        "rank 0: {line}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}

/// A receiver slower than the sender's timeout (2 s): the sender's send times out naming it
/// and withdraws the offer, then overwrites its buffer; the receiver that comes later gets an
/// error, never the overwritten bytes.
#[test]
fn a_receiver_slower_than_the_senders_timeout_gets_an_error_not_reused_memory() {
    const NAME: &str = "a_receiver_slower_than_the_senders_timeout_gets_an_error_not_reused_memory";
    if let Some((r, id)) = as_rank() {
        let timeout = Duration::from_secs(if r == 1 { 2 } else { 30 });
        let (_, comm) = join(&id, 2, r, timeout);
        comm.barrier().expect("barrier");
        let n = 1 << 20;
        if r == 1 {
            let mut buf = vec![7u32; n];
            let t0 = Instant::now();
            let e = comm.send(&buf, 0);
            buf.iter_mut().for_each(|w| *w = 0xdead_beef);
            println!(
                "SC {:?} after {} ms",
                e.map_err(|e| e.to_string()),
                t0.elapsed().as_millis()
            );
            std::hint::black_box(&buf);
            // Stay alive while the receiver looks.
            std::thread::sleep(Duration::from_secs(6));
            return;
        }
        std::thread::sleep(Duration::from_secs(4));
        let mut got = vec![0u32; n];
        match comm.recv(&mut got, 1) {
            Ok(()) => println!("SC Ok, first word {:#x}", got[0]),
            Err(e) => println!("SC Err({e})"),
        }
        return;
    }
    let got = reports(
        spawn(NAME, 2, |_| vec![]),
        Instant::now() + Duration::from_secs(40),
    );
    let sender = got[1]
        .as_ref()
        .unwrap_or_else(|out| panic!("rank 1: {out}"));
    assert!(
        sender.starts_with("Err(") && sender.contains("rank 0"),
        "rank 1: {sender}"
    );
    let ms: u64 = sender
        .rsplit("after ")
        .next()
        .and_then(|t| t.trim_end_matches(" ms").parse().ok())
        .expect("time");
    assert!(ms < 8000, "rank 1 took {ms} ms to time out (timeout 2 s)");
    let receiver = got[0]
        .as_ref()
        .unwrap_or_else(|out| panic!("rank 0: {out}"));
    assert!(
        receiver.starts_with("Err(") && receiver.contains("rank 1"),
        "rank 0: {receiver}"
    );
}
