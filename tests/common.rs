//! Shared helpers of the collective tests: deterministic inputs and straightforward references.
#![allow(dead_code)]

use pccl::{Element, ReduceOp};

/// The value rank `rank` contributes at element `i` for `op`: small integers, so every
/// dtype (f16 and i8 included) represents every partial sum exactly and the reduction order
/// cannot change a bit of the result.
pub fn value<T: Element>(rank: usize, i: usize, op: ReduceOp) -> T {
    let v = match op {
        ReduceOp::Sum | ReduceOp::Avg => ((rank * 7 + i * 3) % 5) as i64,
        ReduceOp::Prod => {
            if (rank + i) % 5 == 0 {
                2
            } else {
                1
            }
        }
        ReduceOp::Min | ReduceOp::Max => {
            ((rank * 13 + i * 7) % 23) as i64 - 11 * i64::from(T::DTYPE.is_float())
        }
    };
    T::from_i64(v)
}

/// Rank `rank`'s input vector of `n` elements.
pub fn input<T: Element>(rank: usize, n: usize, op: ReduceOp) -> Vec<T> {
    (0..n).map(|i| value::<T>(rank, i, op)).collect()
}

/// The reduction over `p` ranks of element `i`, with the library's own element kernels
/// applied one element at a time, in rank order.
pub fn reduced<T: Element>(p: usize, i: usize, op: ReduceOp) -> T {
    let mut acc = [value::<T>(0, i, op)];
    for r in 1..p {
        T::reduce_into(op, &mut acc, &[value::<T>(r, i, op)]);
    }
    if op == ReduceOp::Avg {
        T::divide(&mut acc, p);
    }
    acc[0]
}

/// Compares bit for bit.
pub fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
}

/// All-gather (f32), reduce-scatter (f64 average) and all-reduce (i32 max) at each count,
/// bit for bit against the references; the first wrong or failed call as an error.
pub fn exact_on(comm: &pccl::Communicator, counts: &[usize]) -> Result<(), String> {
    let (r, p) = (comm.rank(), comm.size());
    for &count in counts {
        let mine = input::<f32>(r, count, ReduceOp::Sum);
        let mut out = vec![0f32; count * p];
        comm.all_gather(&mine, &mut out)
            .map_err(|e| e.to_string())?;
        let want: Vec<f32> = (0..p)
            .flat_map(|q| input::<f32>(q, count, ReduceOp::Sum))
            .collect();
        if !same_bits(&out, &want) {
            return Err(format!("all_gather count={count} wrong"));
        }
        let full = input::<f64>(r, count * p, ReduceOp::Avg);
        let mut o = vec![0f64; count];
        comm.reduce_scatter(&full, &mut o, ReduceOp::Avg)
            .map_err(|e| e.to_string())?;
        let want: Vec<f64> = (r * count..(r + 1) * count)
            .map(|i| reduced::<f64>(p, i, ReduceOp::Avg))
            .collect();
        if !same_bits(&o, &want) {
            return Err(format!("reduce_scatter count={count} wrong"));
        }
        let mut a = input::<i32>(r, count + 5, ReduceOp::Max);
        comm.all_reduce_in_place(&mut a, ReduceOp::Max)
            .map_err(|e| e.to_string())?;
        let want: Vec<i32> = (0..count + 5)
            .map(|i| reduced::<i32>(p, i, ReduceOp::Max))
            .collect();
        if a != want {
            return Err(format!("all_reduce count={count} wrong"));
        }
    }
    Ok(())
}

/// The overlapped hierarchy (`hier-INTER-INTRA-pipeK`) for the transport conformance loops:
/// every pair of level algorithms in turn, by `i`.
pub fn overlapped(i: usize, pieces: usize) -> pccl::plan::Algorithm {
    use pccl::plan::LevelAlgo::{Rd, Ring};
    let (inter, intra) = [(Rd, Ring), (Ring, Rd), (Rd, Rd), (Ring, Ring)][i % 4];
    pccl::plan::Algorithm::Overlap {
        inter,
        intra,
        pieces,
    }
}

/// [`exact_on`], then reduce-scatter with a sum (i64) and all-reduce with an average (f64,
/// not in place), bit for bit: every collective an overlapped plan cuts in pieces, both
/// averages and both sums.
pub fn exact_all_on(comm: &pccl::Communicator, counts: &[usize]) -> Result<(), String> {
    exact_on(comm, counts)?;
    let (r, p) = (comm.rank(), comm.size());
    for &count in counts {
        let full = input::<i64>(r, count * p, ReduceOp::Sum);
        let mut o = vec![0i64; count];
        comm.reduce_scatter(&full, &mut o, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        let want: Vec<i64> = (r * count..(r + 1) * count)
            .map(|i| reduced::<i64>(p, i, ReduceOp::Sum))
            .collect();
        if o != want {
            return Err(format!("reduce_scatter sum count={count} wrong"));
        }
        let n = count * 3 + 1;
        let mine = input::<f64>(r, n, ReduceOp::Avg);
        let mut o = vec![0f64; n];
        comm.all_reduce(&mine, &mut o, ReduceOp::Avg)
            .map_err(|e| e.to_string())?;
        let want: Vec<f64> = (0..n)
            .map(|i| reduced::<f64>(p, i, ReduceOp::Avg))
            .collect();
        if !same_bits(&o, &want) {
            return Err(format!("all_reduce avg count={n} wrong"));
        }
    }
    Ok(())
}

/// Runs `f` on `p` thread-ranks of this process joined by the TCP transport over loopback
/// (a fresh unique-id rendezvous; messages cut at `chunk` bytes; same-host shared-memory
/// rings when `shm`; connecting within `connect`), each with a communicator made with `cfg`;
/// returns every rank's result in rank order.
pub fn on_tcp_ranks<R: Send>(
    p: usize,
    chunk: usize,
    connect: std::time::Duration,
    shm: bool,
    cfg: &pccl::config::Config,
    f: impl Fn(pccl::Communicator) -> R + Sync,
) -> Vec<R> {
    use pccl::transport::tcp::{TcpTransport, UniqueId};
    let id = UniqueId::new(std::time::Duration::from_secs(30)).expect("rendezvous");
    let bytes = id.to_bytes();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let cfg = cfg.clone();
                let f = &f;
                s.spawn(move || {
                    let id = UniqueId::from_bytes(&bytes).expect("id parses");
                    let t = TcpTransport::connect_with(&id, p, r, chunk, connect, shm)
                        .expect("connect");
                    let comm = pccl::Communicator::with_config(std::sync::Arc::new(t), cfg)
                        .expect("communicator");
                    f(comm)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// The most [`load_stretch`] stretches a bound: a prompt failure stays far from the 30 s
/// timeouts that a hang or a missed report would cost.
pub const MAX_STRETCH: f64 = 4.0;

/// How much longer than on an idle machine this process's threads may take now to be
/// scheduled through a chain of hand-offs: the 1-minute load average per core, at least 1
/// and at most [`MAX_STRETCH`] (1 where `/proc/loadavg` is missing). On a CI machine of 2
/// cores running a test binary whose tests run side by side, each wake-up of a rank thread
/// waits behind the other runnable threads, and a failure that travels through several
/// ranks pays that several times: a bound of "within a second" on an idle machine is
/// "within a few seconds" there, and still far from any timeout.
pub fn load_stretch() -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    (load / cores).clamp(1.0, MAX_STRETCH)
}

/// `base` (the bound on an idle machine) stretched by [`load_stretch`].
pub fn prompt(base: std::time::Duration) -> std::time::Duration {
    base.mul_f64(load_stretch())
}

/// The bound for a call that must end at its collective's single deadline `timeout`: later
/// only by the timeout's diagnosis (a rank listens for the others' reports,
/// `pccl::transport::diagnose::grace`) and scheduling ([`prompt`] of half a second), and never
/// by a second deadline (the slack stays below `timeout`, so waiting two deadlines out always
/// fails).
pub fn one_deadline(timeout: std::time::Duration) -> std::time::Duration {
    let grace = pccl::transport::diagnose::grace(timeout);
    timeout + (grace + prompt(std::time::Duration::from_millis(500))).min(timeout.mul_f64(0.9))
}

/// A command running only test `name` of this test executable (ignored tests included,
/// output not captured, one thread): a child process of the test.
pub fn test_in_child(name: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("test executable"));
    cmd.args([
        "--exact",
        name,
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd
}

/// Runs test `name` of this test executable alone in a child process with `envs` set (and
/// `PCCL_FAULT` cleared), printing the child's `@@` lines prefixed with `name [label]`; panics
/// with the child's whole output if it fails. For settings a library reads once per process
/// (libfabric's `FI_PROVIDER`).
pub fn run_test_in_child(name: &str, label: &str, envs: &[(&str, &str)]) {
    let out = test_in_child(name)
        .envs(envs.iter().copied())
        .env_remove("PCCL_FAULT")
        .output()
        .expect("spawn the test");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    for l in text.lines().filter(|l| l.starts_with("@@")) {
        println!("{name} [{label}]: {l}");
    }
    assert!(out.status.success(), "{name} on {label} failed:\n{text}");
}

/// Runs collective `which` (0 all-gather, 1 reduce-scatter, 2 all-reduce, else broadcast from
/// the last rank), f32 sums, with `n` elements per block and checks the result when it
/// succeeds (a success with wrong data panics).
pub fn run_checked(comm: &pccl::Communicator, which: usize, n: usize) -> pccl::Result<()> {
    let (p, r) = (comm.size(), comm.rank());
    match which {
        0 => {
            let mine: Vec<f32> = input(r, n, ReduceOp::Sum);
            let mut out = vec![0f32; n * p];
            comm.all_gather(&mine, &mut out)?;
            for q in 0..p {
                let want: Vec<f32> = input(q, n, ReduceOp::Sum);
                assert!(
                    same_bits(&out[q * n..(q + 1) * n], &want),
                    "all-gather block {q}"
                );
            }
        }
        1 => {
            let inp: Vec<f32> = (0..n * p)
                .map(|i| value::<f32>(r, i, ReduceOp::Sum))
                .collect();
            let mut out = vec![0f32; n];
            comm.reduce_scatter(&inp, &mut out, ReduceOp::Sum)?;
            for (i, v) in out.iter().enumerate() {
                assert_eq!(
                    *v,
                    reduced::<f32>(p, r * n + i, ReduceOp::Sum),
                    "rs elem {i}"
                );
            }
        }
        2 => {
            let inp: Vec<f32> = input(r, n, ReduceOp::Sum);
            let mut out = vec![0f32; n];
            comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
            for (i, v) in out.iter().enumerate() {
                assert_eq!(*v, reduced::<f32>(p, i, ReduceOp::Sum), "ar elem {i}");
            }
        }
        _ => {
            let root = p - 1;
            let mut buf: Vec<f32> = if r == root {
                input(root, n, ReduceOp::Sum)
            } else {
                vec![0.0; n]
            };
            comm.broadcast(&mut buf, root)?;
            assert!(
                same_bits(&buf, &input::<f32>(root, n, ReduceOp::Sum)),
                "bcast"
            );
        }
    }
    Ok(())
}

/// The value after command-line flag `name` (`--calls 10`), parsed; `default` when absent or
/// unparsable (the examples' argument reading).
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
