//! Failures on the TCP transport, with real processes: a rank killed, cut off, stalled or
//! sending damaged messages at collective k, over sockets only and over shared memory. The
//! survivors must fail that collective promptly (well before PCCL_TIMEOUT) with an error
//! naming the rank, then go on: a shrunk communicator after a death, the next collective
//! after a recoverable fault.
//!
//! Each test runs as the parent: it opens the rendezvous, then re-runs this test executable
//! once per rank (`--exact <test>`), with the rank, the unique id and the scenario in
//! [`CHILD`]; the child sees it and plays that rank.

use pccl::config::Config;
use pccl::fault::{Fault, FaultKind};
use pccl::plan::{Algorithm, LevelAlgo};
use pccl::transport::tcp::{TcpTransport, UniqueId};
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `<rank>:<unique id in hex>:<scenario>` in a child process.
const CHILD: &str = "PCCL_TCP_FAULTS_CHILD";
/// Elements per rank and collective (f64): several shared-memory slots and socket chunks.
const N: usize = 100_000;
/// How soon the survivors must see a death, a cut or a damaged message.
const PROMPT: Duration = Duration::from_millis(1500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    AllGather,
    ReduceScatter,
    AllReduce,
    /// An all-reduce of [`SMALL`] elements: messages that fit one shared-memory slot, which
    /// the sender publishes itself (no writer thread).
    SmallAllReduce,
}

/// Elements of [`Coll::SmallAllReduce`] (f64).
const SMALL: usize = 256;

/// What one run does: `p` ranks, rank `victim` misbehaves (`kind`) at collective `at`.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    p: usize,
    shm: bool,
    victim: usize,
    at: u32,
    kind: FaultKind,
    coll: Coll,
    /// PCCL_TIMEOUT.
    timeout_s: u64,
    /// Ranks per node of the topology (1 or p: flat or one node; 2 with `pieces`).
    m: usize,
    /// Pieces of the overlapped hierarchy `hier-rd-pipeK` it runs (0: the tuner's choice).
    pieces: usize,
    /// Runs flat recursive doubling (with `m = 1`: the TCP rendezvous for large messages).
    rd: bool,
}

impl Scenario {
    fn encode(&self) -> String {
        let kind = match self.kind {
            FaultKind::Kill => "kill",
            FaultKind::Stall => "stall",
            FaultKind::Slow => "slow",
            FaultKind::Drop => "drop",
            FaultKind::Corrupt => "corrupt",
            FaultKind::Isolate => "isolate",
        };
        let coll = match self.coll {
            Coll::AllGather => "ag",
            Coll::ReduceScatter => "rs",
            Coll::AllReduce => "ar",
            Coll::SmallAllReduce => "ar-small",
        };
        format!(
            "{},{},{},{},{kind},{coll},{},{},{},{}",
            self.p,
            self.shm as u8,
            self.victim,
            self.at,
            self.timeout_s,
            self.m,
            self.pieces,
            self.rd as u8
        )
    }

    fn decode(s: &str) -> Scenario {
        let f: Vec<&str> = s.split(',').collect();
        let kind = pccl::fault::parse(&format!("0:0:{}", f[4])).unwrap()[0].kind;
        Scenario {
            p: f[0].parse().unwrap(),
            shm: f[1] == "1",
            victim: f[2].parse().unwrap(),
            at: f[3].parse().unwrap(),
            kind,
            coll: match f[5] {
                "ag" => Coll::AllGather,
                "rs" => Coll::ReduceScatter,
                "ar-small" => Coll::SmallAllReduce,
                _ => Coll::AllReduce,
            },
            timeout_s: f[6].parse().unwrap(),
            m: f[7].parse().unwrap(),
            pieces: f[8].parse().unwrap(),
            rd: f[9] == "1",
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// Rank `r`'s element `i` in round `k` (small integers: sums are exact).
fn val(r: usize, i: usize, k: u32) -> f64 {
    ((r + 1) * (i % 7 + 1)) as f64 + f64::from(k % 5)
}

/// Runs `coll` as round `k` on `comm` and checks the result.
fn run(comm: &Communicator, coll: Coll, k: u32) -> pccl::Result<()> {
    let (r, p) = (comm.rank(), comm.size());
    let sum = |i: usize| (0..p).map(|q| val(q, i, k)).sum::<f64>();
    match coll {
        Coll::AllGather => {
            let n = N / p;
            let inp: Vec<f64> = (0..n).map(|i| val(r, i, k)).collect();
            let mut out = vec![0.0; n * p];
            comm.all_gather(&inp, &mut out)?;
            for (j, x) in out.iter().enumerate() {
                assert_eq!(
                    *x,
                    val(j / n, j % n, k),
                    "all-gather element {j} on rank {r}"
                );
            }
        }
        Coll::ReduceScatter => {
            let n = N / p;
            let inp: Vec<f64> = (0..n * p).map(|i| val(r, i, k)).collect();
            let mut out = vec![0.0; n];
            comm.reduce_scatter(&inp, &mut out, ReduceOp::Sum)?;
            for (j, x) in out.iter().enumerate() {
                assert_eq!(*x, sum(r * n + j), "reduce-scatter element {j} on rank {r}");
            }
        }
        Coll::AllReduce | Coll::SmallAllReduce => {
            let n = if coll == Coll::AllReduce { N } else { SMALL };
            let inp: Vec<f64> = (0..n).map(|i| val(r, i, k)).collect();
            let mut out = vec![0.0; n];
            comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
            for (j, x) in out.iter().enumerate() {
                assert_eq!(*x, sum(j), "all-reduce element {j} on rank {r}");
            }
        }
    }
    Ok(())
}

/// A child's part: rank `rank` of the scenario.
fn play(sc: Scenario, rank: usize, id: &UniqueId) {
    let cfg = Config {
        timeout: Duration::from_secs(sc.timeout_s),
        ranks_per_node: Some(sc.m),
        algo: if sc.rd {
            Some(Algorithm::Flat(LevelAlgo::Rd))
        } else {
            (sc.pieces > 0).then_some(Algorithm::Overlap {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
                pieces: sc.pieces,
            })
        },
        faults: vec![Fault {
            rank: sc.victim,
            seq: sc.at,
            kind: sc.kind,
        }],
        ..Config::default()
    };
    let t = TcpTransport::connect_with(id, sc.p, rank, 256 * 1024, cfg.timeout, sc.shm)
        .expect("connect");
    let comm = Communicator::with_config(Arc::new(t), cfg).expect("communicator");
    let v = sc.victim;
    // A death fails every collective still running: a survivor may still be finishing
    // collective at-1 when the victim dies at the start of collective at.
    let dies = matches!(sc.kind, FaultKind::Kill | FaultKind::Drop) && rank != v;
    let mut failed = None;
    for k in 0..=sc.at {
        let t0 = Instant::now();
        let r = run(&comm, sc.coll, k);
        let took = t0.elapsed();
        match r {
            Ok(()) if k < sc.at => {}
            // The faulty rank itself may finish its part before the others refuse theirs
            // (corrupt: its own receives were fine); there is no agreement step.
            Ok(()) if rank == v => {
                failed = Some((k, pccl::Error::remote("none: it succeeded here"), took));
                break;
            }
            Ok(()) => panic!("rank {rank}: the faulty collective #{k} succeeded"),
            Err(e) if k == sc.at || (dies && k + 1 == sc.at) => {
                failed = Some((k, e, took));
                break;
            }
            Err(e) => panic!("rank {rank}, round {k}: {e}"),
        }
    }
    let Some((k, e, took)) = failed else {
        unreachable!("the loop ends with a failure")
    };
    println!(
        "\n@@ rank {rank}: {:?} at #{} failed #{k} after {} ms: {:?}: {}",
        sc.kind,
        sc.at,
        took.as_millis(),
        e.kind(),
        e.message()
    );
    if rank != v {
        if sc.kind == FaultKind::Stall {
            let limit = Duration::from_secs(sc.timeout_s) + Duration::from_secs(1);
            assert!(took < limit, "rank {rank}: {took:?} for a stall: {e}");
            assert!(
                e.kind() == ErrorKind::Timeout || e.message().contains("deadline"),
                "rank {rank}: {e}"
            );
        } else {
            assert!(took < PROMPT, "rank {rank} took {took:?} to see it: {e}");
            assert_eq!(e.kind(), ErrorKind::Remote, "rank {rank}: {e}");
            assert!(
                e.message().contains(&format!("rank {v}")),
                "rank {rank}: the error does not name rank {v}: {e}"
            );
        }
    }
    match sc.kind {
        FaultKind::Kill | FaultKind::Drop => {
            if rank == v {
                return; // cut off: it leaves (a killed one never gets here)
            }
            let t0 = Instant::now();
            // A killed process is proven dead (its connections closed): the survivors find
            // it themselves. A dropped one lives on, so they name it.
            let small = if sc.kind == FaultKind::Kill {
                comm.shrink_to_survivors()
            } else {
                comm.shrink(&[v])
            }
            .unwrap_or_else(|e| panic!("rank {rank}: shrink: {e}"));
            assert_eq!(small.size(), sc.p - 1);
            for k in 0..2 {
                run(&small, Coll::AllReduce, k)
                    .unwrap_or_else(|e| panic!("rank {rank}: after shrink: {e}"));
            }
            println!(
                "@@ rank {rank}: shrunk to {} ranks and all-reduced in {} ms",
                small.size(),
                t0.elapsed().as_millis()
            );
        }
        FaultKind::Stall | FaultKind::Slow | FaultKind::Corrupt | FaultKind::Isolate => {
            if sc.kind == FaultKind::Stall && rank != v {
                // The stalled rank wakes after twice the timeout; meet it there.
                std::thread::sleep(Duration::from_secs(sc.timeout_s + 1));
            }
            run(&comm, sc.coll, sc.at + 1)
                .unwrap_or_else(|e| panic!("rank {rank}: the next collective failed: {e}"));
            println!("@@ rank {rank}: the next collective is correct");
        }
    }
}

/// The parent's part: runs the scenario's ranks as processes of this test (`name`), and
/// checks that they all ended as they should, in well under a minute.
fn launch(name: &str, sc: Scenario) {
    let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
    let exe = std::env::current_exe().expect("test executable");
    let dir = std::env::temp_dir();
    let logs: Vec<_> = (0..sc.p)
        .map(|r| {
            dir.join(format!(
                "pccl-tcp-faults-{}-{name}-{r}.log",
                std::process::id()
            ))
        })
        .collect();
    let mut kids: Vec<_> = (0..sc.p)
        .map(|r| {
            let log = std::fs::File::create(&logs[r]).expect("log file");
            let err = log.try_clone().expect("log file");
            Command::new(&exe)
                .args(["--exact", name, "--nocapture", "--test-threads=1"])
                .env(
                    CHILD,
                    format!("{r}:{}:{}", hex(&id.to_bytes()), sc.encode()),
                )
                .env_remove("PCCL_FAULT")
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(err))
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let give_up = Instant::now() + Duration::from_secs(40);
    let mut status = vec![None; sc.p];
    while status.iter().any(Option::is_none) && Instant::now() < give_up {
        for (k, s) in kids.iter_mut().zip(status.iter_mut()) {
            if s.is_none() {
                *s = k.try_wait().expect("wait for a rank");
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let hung: Vec<usize> = (0..sc.p).filter(|&r| status[r].is_none()).collect();
    for &r in &hung {
        let _ = kids[r].kill();
        let _ = kids[r].wait();
    }
    let out: Vec<String> = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    for l in &logs {
        let _ = std::fs::remove_file(l);
    }
    for o in &out {
        for line in o.lines().filter(|l| l.starts_with("@@")) {
            println!("{name}: {line}");
        }
    }
    let dump = || {
        out.iter()
            .enumerate()
            .map(|(r, o)| format!("---- rank {r}\n{o}"))
            .collect::<String>()
    };
    if std::env::var("PCCL_TEST_DUMP").is_ok() {
        println!("{}", dump());
    }
    assert!(hung.is_empty(), "{sc:?}: ranks {hung:?} hung\n{}", dump());
    for (r, s) in status.iter().enumerate() {
        let s = s.expect("finished");
        let killed = sc.kind == FaultKind::Kill && r == sc.victim;
        assert_eq!(
            s.success(),
            !killed,
            "{sc:?}: rank {r} ended with {s}\n{}",
            dump()
        );
    }
}

/// Plays a rank if this process is a child, else runs the scenario as the parent.
fn scenario(name: &str, sc: Scenario) {
    match std::env::var(CHILD) {
        Ok(v) => {
            let mut f = v.splitn(3, ':');
            let rank: usize = f.next().unwrap().parse().unwrap();
            let id = UniqueId::from_bytes(&unhex(f.next().unwrap())).unwrap();
            play(Scenario::decode(f.next().unwrap()), rank, &id);
        }
        Err(_) => launch(name, sc),
    }
}

fn sc(p: usize, shm: bool, victim: usize, at: u32, kind: FaultKind, coll: Coll) -> Scenario {
    Scenario {
        p,
        shm,
        victim,
        at,
        kind,
        coll,
        timeout_s: 30,
        m: p,
        pieces: 0,
        rd: false,
    }
}

/// [`sc`] running flat recursive doubling over sockets on pretend nodes of one rank: its
/// messages of 64 KiB and more wait for their receiver's "ready" (the TCP rendezvous).
fn sc_rendezvous(p: usize, victim: usize, at: u32, kind: FaultKind, coll: Coll) -> Scenario {
    Scenario {
        m: 1,
        rd: true,
        ..sc(p, false, victim, at, kind, coll)
    }
}

/// A rank killed, cut off or sending damaged stamps while the others hold messages for its
/// "ready" or wait for its held ones: every survivor fails promptly naming it, and goes on.
#[test]
fn kill_during_a_rendezvous_fails_fast_and_shrinks() {
    scenario(
        "kill_during_a_rendezvous_fails_fast_and_shrinks",
        sc_rendezvous(4, 2, 2, FaultKind::Kill, Coll::AllGather),
    );
}

#[test]
fn dropped_links_during_a_rendezvous_fail_fast() {
    scenario(
        "dropped_links_during_a_rendezvous_fail_fast",
        sc_rendezvous(4, 1, 1, FaultKind::Drop, Coll::ReduceScatter),
    );
}

#[test]
fn corrupt_messages_in_a_rendezvous_fail_fast_and_the_next_works() {
    scenario(
        "corrupt_messages_in_a_rendezvous_fail_fast_and_the_next_works",
        sc_rendezvous(4, 3, 1, FaultKind::Corrupt, Coll::AllReduce),
    );
}

#[test]
fn a_stalled_rank_in_a_rendezvous_times_out_at_the_deadline() {
    let mut s = sc_rendezvous(3, 0, 1, FaultKind::Stall, Coll::AllGather);
    s.timeout_s = 2;
    scenario(
        "a_stalled_rank_in_a_rendezvous_times_out_at_the_deadline",
        s,
    );
}

/// [`sc`] running `hier-rd-pipe{pieces}` on pretend nodes of 2 ranks.
fn sc_overlapped(p: usize, shm: bool, victim: usize, kind: FaultKind, pieces: usize) -> Scenario {
    Scenario {
        m: 2,
        pieces,
        ..sc(p, shm, victim, 2, kind, Coll::AllReduce)
    }
}

/// A rank killed while the others run an overlapped all-reduce (pieces of every stage in
/// flight): every survivor fails promptly naming it, shrinks, and all-reduces exactly.
#[test]
fn kill_during_an_overlapped_all_reduce_fails_fast_and_shrinks() {
    scenario(
        "kill_during_an_overlapped_all_reduce_fails_fast_and_shrinks",
        sc_overlapped(6, false, 3, FaultKind::Kill, 4),
    );
}

/// Damaged messages in an overlapped all-reduce over shared memory: every rank fails that
/// call naming the sender, and the next overlapped call is exact.
#[test]
fn corrupt_messages_in_an_overlapped_all_reduce_fail_fast_and_the_next_works() {
    scenario(
        "corrupt_messages_in_an_overlapped_all_reduce_fail_fast_and_the_next_works",
        sc_overlapped(4, true, 1, FaultKind::Corrupt, 7),
    );
}

#[test]
fn kill_over_sockets_fails_fast_and_shrinks() {
    scenario(
        "kill_over_sockets_fails_fast_and_shrinks",
        sc(4, false, 2, 2, FaultKind::Kill, Coll::AllReduce),
    );
}

#[test]
fn kill_over_shared_memory_fails_fast_and_shrinks() {
    scenario(
        "kill_over_shared_memory_fails_fast_and_shrinks",
        sc(4, true, 1, 2, FaultKind::Kill, Coll::ReduceScatter),
    );
}

#[test]
fn dropped_links_over_sockets_fail_fast() {
    scenario(
        "dropped_links_over_sockets_fail_fast",
        sc(3, false, 0, 1, FaultKind::Drop, Coll::AllGather),
    );
}

#[test]
fn dropped_links_over_shared_memory_fail_fast() {
    scenario(
        "dropped_links_over_shared_memory_fail_fast",
        sc(3, true, 2, 2, FaultKind::Drop, Coll::AllReduce),
    );
}

#[test]
fn corrupt_messages_fail_fast_and_the_next_collective_works() {
    scenario(
        "corrupt_messages_fail_fast_and_the_next_collective_works",
        sc(4, false, 3, 1, FaultKind::Corrupt, Coll::AllReduce),
    );
}

#[test]
fn corrupt_messages_over_shared_memory_fail_fast() {
    scenario(
        "corrupt_messages_over_shared_memory_fail_fast",
        sc(3, true, 1, 1, FaultKind::Corrupt, Coll::AllGather),
    );
}

#[test]
fn kill_during_small_messages_over_shared_memory_fails_fast() {
    scenario(
        "kill_during_small_messages_over_shared_memory_fails_fast",
        sc(4, true, 3, 3, FaultKind::Kill, Coll::SmallAllReduce),
    );
}

#[test]
fn a_stalled_rank_in_small_messages_over_shared_memory_times_out_at_the_deadline() {
    let mut s = sc(3, true, 0, 2, FaultKind::Stall, Coll::SmallAllReduce);
    s.timeout_s = 2;
    scenario(
        "a_stalled_rank_in_small_messages_over_shared_memory_times_out_at_the_deadline",
        s,
    );
}

#[test]
fn a_stalled_rank_times_out_at_the_deadline() {
    let mut s = sc(3, true, 1, 1, FaultKind::Stall, Coll::AllReduce);
    s.timeout_s = 2;
    scenario("a_stalled_rank_times_out_at_the_deadline", s);
}

/// Ten kills in a row at random ranks, collectives and moments, over both paths: every one
/// is detected promptly and the survivors shrink and go on; nothing hangs.
#[test]
fn random_kills_in_a_row_never_hang() {
    const NAME: &str = "random_kills_in_a_row_never_hang";
    if std::env::var(CHILD).is_ok() {
        return scenario(NAME, sc(3, false, 0, 1, FaultKind::Kill, Coll::AllReduce));
    }
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    println!("{NAME}: seed {seed}");
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..10 {
        let p = 3;
        let coll = [Coll::AllGather, Coll::ReduceScatter, Coll::AllReduce][next(3) as usize];
        let mut s = sc(
            p,
            next(2) == 0,
            next(p as u64) as usize,
            1 + next(3) as u32,
            FaultKind::Kill,
            coll,
        );
        s.m = if next(2) == 0 { 1 } else { p };
        println!("{NAME}: {s:?}");
        launch(NAME, s);
    }
}

/// A call one rank refuses (its output has the wrong length) fails on every rank with an
/// error naming that rank, and the next one works: ranks as threads, each with its own TCP
/// transport, over sockets and over shared memory.
#[test]
fn a_refused_call_fails_everywhere_and_the_next_works() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for shm in [false, true] {
        let p = 3;
        let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
        let cfg = Config {
            timeout: Duration::from_secs(30),
            ranks_per_node: Some(p),
            ..Config::default()
        };
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..p)
                .map(|r| {
                    let (cfg, id) = (cfg.clone(), id.clone());
                    s.spawn(move || {
                        let t = TcpTransport::connect_with(&id, p, r, 256 * 1024, cfg.timeout, shm)
                            .expect("connect");
                        let comm = Communicator::with_config(Arc::new(t), cfg).unwrap();
                        run(&comm, Coll::AllReduce, 0).unwrap();
                        let inp = vec![1.0f64; N];
                        let mut out = vec![0.0f64; if r == 0 { N - 1 } else { N }];
                        let t0 = Instant::now();
                        let e = comm
                            .all_reduce(&inp, &mut out, ReduceOp::Sum)
                            .expect_err("refused call");
                        let took = t0.elapsed();
                        if r == 0 {
                            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
                        } else {
                            assert_eq!(e.kind(), ErrorKind::Remote, "rank {r}: {e}");
                            assert!(e.message().contains("rank 0"), "rank {r}: {e}");
                            assert!(took < PROMPT, "rank {r}: {took:?}");
                        }
                        println!(
                            "shm={shm} rank {r}: refused in {} ms: {e}",
                            took.as_millis()
                        );
                        for k in 1..3 {
                            run(&comm, Coll::AllReduce, k).unwrap_or_else(|e| {
                                panic!("rank {r}: the next all-reduce failed: {e}")
                            });
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("rank thread");
            }
        });
    }
}
