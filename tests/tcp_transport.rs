//! The TCP transport on loopback: ranks as threads of this process, each with its own
//! sockets, bootstrapped from a unique id.

mod common;

use common::{exact_all_on, exact_on, overlapped};
use pccl::config::Config;
use pccl::plan::{Algorithm, LevelAlgo};
use pccl::transport::tcp::UniqueId;
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::time::Duration;

fn on_tcp<R: Send>(p: usize, cfg: Config, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    on_tcp_with(p, cfg, true, f)
}

fn on_tcp_with<R: Send>(
    p: usize,
    cfg: Config,
    shm: bool,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    common::on_tcp_ranks(p, 256 * 1024, cfg.timeout, shm, &cfg, f)
}

fn cfg(m: usize, algo: Algorithm) -> Config {
    Config {
        ranks_per_node: Some(m),
        algo: Some(algo),
        timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

#[test]
fn unique_id_round_trips_through_bytes() {
    let id = UniqueId::new(Duration::from_millis(200)).unwrap();
    assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
    assert_eq!(
        UniqueId::from_bytes(&[0u8; 128]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn hierarchical_collectives_are_exact_over_tcp_and_shared_memory() {
    for (p, m, algo, shm) in [
        (
            4,
            2,
            Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            },
            true,
        ),
        (
            4,
            2,
            Algorithm::Hier {
                inter: LevelAlgo::Rd,
                intra: LevelAlgo::Ring,
            },
            false,
        ),
        (
            6,
            3,
            Algorithm::Hier {
                inter: LevelAlgo::Ring,
                intra: LevelAlgo::Rd,
            },
            true,
        ),
        (5, 1, Algorithm::Flat(LevelAlgo::Rd), false),
        (5, 1, Algorithm::Flat(LevelAlgo::Ring), true),
    ] {
        let res = on_tcp_with(p, cfg(m, algo), shm, |comm| -> Result<(), String> {
            exact_on(&comm, &[0, 1, 7, 300_001])
        });
        for r in res {
            r.unwrap_or_else(|e| panic!("P={p} M={m} {algo} shm={shm}: {e}"));
        }
    }
}

/// The overlapped hierarchy on 2…8 ranks with pretend nodes, K in {2, 4, 7}, every level
/// pair, over sockets and shared memory, at counts that are no multiple of P·K.
#[test]
fn overlapped_plans_are_exact_over_tcp_and_shared_memory() {
    for (i, (p, m, k, shm)) in [
        (2, 1, 2, true),
        (3, 3, 4, false),
        (4, 2, 7, true),
        (5, 1, 4, false),
        (6, 2, 2, false),
        (6, 3, 7, true),
        (8, 2, 4, true),
        (8, 4, 7, false),
    ]
    .into_iter()
    .enumerate()
    {
        let algo = overlapped(i, k);
        let res = on_tcp_with(p, cfg(m, algo), shm, |comm| -> Result<(), String> {
            exact_all_on(&comm, &[0, 1, 13, 30_001])
        });
        for r in res {
            r.unwrap_or_else(|e| panic!("P={p} M={m} {algo} shm={shm}: {e}"));
        }
    }
}

/// Three levels (2 nodes of 2 pairs, 2 nodes of 3 pairs overlapped) over sockets and shared
/// memory: strided units at every level, exact at counts that are no multiple of P.
#[test]
fn three_level_plans_are_exact_over_tcp_and_shared_memory() {
    for (p, m, name, shm) in [
        (8, 4, "hier3-rd", true),
        (8, 4, "hier3-ring-rd-rd", false),
        (12, 6, "hier3-rd-pipe3", true),
    ] {
        let algo: Algorithm = name.parse().unwrap();
        let c = Config {
            group_size: Some(2),
            ..cfg(m, algo)
        };
        let res = on_tcp_with(p, c, shm, |comm| -> Result<(), String> {
            if !comm.topology().has_groups() {
                return Err(format!("no groups: {}", comm.topology().describe()));
            }
            exact_on(&comm, &[0, 1, 7, 100_003])
        });
        for r in res {
            r.unwrap_or_else(|e| panic!("P={p} M={m} {algo} shm={shm}: {e}"));
        }
    }
}

#[test]
fn split_builds_a_working_sub_mesh() {
    let res = on_tcp(
        4,
        cfg(2, Algorithm::Flat(LevelAlgo::Ring)),
        |comm| -> Result<(), String> {
            let r = comm.rank();
            let sub = comm
                .split(Some((r / 2) as u32), 0)
                .map_err(|e| e.to_string())?
                .ok_or("no sub")?;
            let mut v = vec![r as u64 + 1; 10];
            sub.all_reduce_in_place(&mut v, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            let want = if r < 2 { 3 } else { 7 };
            if v.iter().any(|&x| x != want) {
                return Err(format!("rank {r}: {v:?}"));
            }
            comm.barrier().map_err(|e| e.to_string())
        },
    );
    res.into_iter().for_each(|r| r.unwrap());
}

#[test]
fn a_peer_that_leaves_gives_an_error_not_a_hang() {
    let mut c = cfg(1, Algorithm::Flat(LevelAlgo::Ring));
    c.timeout = Duration::from_secs(2);
    let res = on_tcp(3, c, |comm| {
        if comm.rank() == 1 {
            return Ok(()); // leaves: its sockets close when the communicator drops
        }
        let mut out = vec![0f32; 30];
        comm.all_gather(&[1.0; 10], &mut out)
    });
    assert!(res[0].is_err() && res[2].is_err(), "{res:?}");
}

/// Small messages over shared memory go straight into the peer's ring and the receiver
/// sleeps on it: a peer that joins 200 ms late is waited for (and its data is right), and
/// the others' waits end when it arrives, not at some poll step far after.
#[test]
fn small_collectives_wait_for_a_slow_peer_over_shared_memory() {
    let mut c = cfg(4, Algorithm::Flat(LevelAlgo::Rd));
    c.timeout = Duration::from_secs(10);
    let slow = Duration::from_millis(200);
    let res = on_tcp(4, c, |comm| {
        let r = comm.rank();
        let mut out = vec![0f32; 256];
        comm.all_reduce(&[1.0; 256], &mut out, ReduceOp::Sum)?;
        if r == 2 {
            std::thread::sleep(slow);
        }
        let t0 = std::time::Instant::now();
        let inp: Vec<f32> = (0..256).map(|i| (i * (r + 1)) as f32).collect();
        comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
        let took = t0.elapsed();
        for (i, x) in out.iter().enumerate() {
            assert_eq!(*x, (i * 10) as f32, "element {i} on rank {r}");
        }
        Ok::<_, pccl::Error>(took)
    });
    for (r, took) in res.into_iter().enumerate() {
        let took = took.unwrap();
        if r != 2 {
            assert!(
                took >= slow - Duration::from_millis(20),
                "rank {r}: {took:?}"
            );
            assert!(
                took < slow + Duration::from_millis(300),
                "rank {r}: {took:?}"
            );
        }
    }
}

/// A peer that never joins a small collective over shared memory: the others' sleeping
/// waits still end with a timeout error at the deadline (within a second after it).
#[test]
fn small_collectives_time_out_on_a_silent_peer_over_shared_memory() {
    let mut c = cfg(3, Algorithm::Flat(LevelAlgo::Rd));
    c.timeout = Duration::from_secs(1);
    let res = on_tcp(3, c.clone(), |comm| {
        if comm.rank() == 1 {
            // Silent past everyone's deadline, then gone.
            std::thread::sleep(c.timeout + Duration::from_millis(1500));
            return Ok(Duration::ZERO);
        }
        let t0 = std::time::Instant::now();
        let mut out = vec![0f32; 64];
        match comm.all_reduce(&[1.0; 64], &mut out, ReduceOp::Sum) {
            Ok(()) => Err(pccl::Error::internal("succeeded without rank 1")),
            Err(e) => {
                assert!(
                    e.kind() == ErrorKind::Timeout || e.message().contains("deadline"),
                    "{e}"
                );
                Ok(t0.elapsed())
            }
        }
    });
    for (r, took) in res.into_iter().enumerate() {
        let took = took.unwrap();
        if r != 1 {
            assert!(
                took >= c.timeout - Duration::from_millis(50),
                "rank {r}: {took:?}"
            );
            assert!(
                took < c.timeout + Duration::from_secs(1),
                "rank {r}: {took:?}"
            );
        }
    }
}

/// Plans that exchange with several peers across nodes in turn (recursive doubling or
/// halving over three pretend nodes or more) hold their messages of 64 KiB and more until the
/// receiver is ready for them (the TCP rendezvous, `wire::RENDEZVOUS`): exact over sockets
/// at counts on both sides of the threshold, with a different rank late to every call.
#[test]
fn rendezvous_plans_are_exact_over_sockets_with_a_late_rank() {
    let hier = Algorithm::Hier {
        inter: LevelAlgo::Rd,
        intra: LevelAlgo::Ring,
    };
    for (p, m, algo) in [
        (4, 1, Algorithm::Flat(LevelAlgo::Rd)),
        (3, 1, Algorithm::Flat(LevelAlgo::Rd)),
        (6, 2, hier),
        (4, 1, Algorithm::VectorRd),
    ] {
        let res = on_tcp_with(p, cfg(m, algo), false, |comm| -> Result<(), String> {
            for (i, n) in [7usize, 20_000, 70_001, 300_001].into_iter().enumerate() {
                if comm.rank() == i % p {
                    std::thread::sleep(Duration::from_millis(30));
                }
                exact_all_on(&comm, &[n])?;
            }
            Ok(())
        });
        for (r, x) in res.into_iter().enumerate() {
            x.unwrap_or_else(|e| panic!("P={p} M={m} {algo}, rank {r}: {e}"));
        }
    }
}

/// A rank that disagrees on a rendezvous plan's message (its count differs, so its stamps
/// and lengths do): every rank fails that call promptly, whether the disagreeing messages
/// are held too (both large) or not (one side small: its receive says what it waits for,
/// and the peer lets its held message go to fail there), and the next call is exact.
#[test]
fn ranks_that_disagree_in_a_rendezvous_fail_fast_and_the_next_call_works() {
    for other in [100_008usize, 1_000] {
        let res = on_tcp_with(
            4,
            cfg(1, Algorithm::Flat(LevelAlgo::Rd)),
            false,
            |comm| -> Result<Duration, String> {
                let n = if comm.rank() == 3 { other } else { 100_000 };
                let mut out = vec![0f32; n * 4];
                let t0 = std::time::Instant::now();
                let e = comm.all_gather(&vec![1f32; n], &mut out);
                let took = t0.elapsed();
                if e.is_ok() {
                    return Err(format!("the disagreeing all-gather ({n}) succeeded"));
                }
                exact_all_on(&comm, &[70_001])?;
                Ok(took)
            },
        );
        for (r, x) in res.into_iter().enumerate() {
            let took = x.unwrap_or_else(|e| panic!("rank 3 at {other}, rank {r}: {e}"));
            assert!(
                took < Duration::from_secs(3),
                "rank 3 at {other}, rank {r}: {took:?} to fail (timeout 30 s)"
            );
        }
    }
}

/// Ranks whose `PCCL_TCP_RENDEZVOUS` differ (16 KiB, 64 KiB, off, 32 KiB) agree on each
/// link's threshold (the larger of its two ends'), so every message is held on both sides
/// or on neither: recursive doubling and halving are exact at counts on both sides of each
/// threshold, with a different rank late to every call.
#[test]
fn ranks_with_different_rendezvous_settings_agree_per_link_and_stay_exact() {
    use pccl::transport::tcp::TcpTransport;
    let mine = [16 << 10, 64 << 10, usize::MAX, 32 << 10];
    let p = mine.len();
    let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
    let bytes = id.to_bytes();
    let res: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let bytes = &bytes;
                s.spawn(move || {
                    let id = UniqueId::from_bytes(bytes).expect("id parses");
                    let t = TcpTransport::connect_with_rendezvous(
                        &id,
                        p,
                        r,
                        256 << 10,
                        Duration::from_secs(30),
                        false,
                        mine[r],
                    )
                    .map_err(|e| e.to_string())?;
                    for q in 0..p {
                        let want = (q != r).then(|| mine[r].max(mine[q]));
                        if t.rendezvous_with(q) != want {
                            return Err(format!(
                                "link to rank {q}: threshold {:?}, want {want:?}",
                                t.rendezvous_with(q)
                            ));
                        }
                    }
                    let comm = Communicator::with_config(
                        std::sync::Arc::new(t),
                        cfg(1, Algorithm::Flat(LevelAlgo::Rd)),
                    )
                    .map_err(|e| e.to_string())?;
                    for (i, n) in [3_000usize, 6_000, 12_000, 20_000, 70_001]
                        .into_iter()
                        .enumerate()
                    {
                        if comm.rank() == i % p {
                            std::thread::sleep(Duration::from_millis(30));
                        }
                        exact_all_on(&comm, &[n])?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    for (r, x) in res.into_iter().enumerate() {
        x.unwrap_or_else(|e| panic!("rank {r} (rendezvous from {}): {e}", mine[r]));
    }
}
