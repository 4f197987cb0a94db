//! The TCP bootstrap trusts nobody: strangers on the rendezvous or a mesh listener (idle,
//! garbage, forged hellos, floods) neither break nor delay a real job; the unique id carries a
//! random secret and refuses to parse when mangled; sizes are checked before anything is
//! allocated; shared-memory ring files are private and reveal nothing of the secret.
//!
//! The two-process test re-runs this test executable as each rank (`PCCL_BOOT_TEST_RANK`,
//! `PCCL_BOOT_TEST_ID`) while the parent attacks.

use pccl::config::Config;
use pccl::plan::{Algorithm, LevelAlgo};
use pccl::transport::tcp::{TcpTransport, UniqueId, SECRET_BYTES, UNIQUE_ID_BYTES};
use pccl::transport::{fnv1a, hostname};
use pccl::{Communicator, ErrorKind, ReduceOp};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the documented id layout keeps the secret.
const SECRET_AT: usize = 6;
/// Frame kinds and body sizes of the bootstrap (see `transport::rendezvous` and `mesh`).
const RDV_KIND: &[u8; 8] = b"PCCLRDV2";
const MESH_KIND: &[u8; 8] = b"PCCLMSH1";
const TEXT_MAX: usize = 160;

const ENV_RANK: &str = "PCCL_BOOT_TEST_RANK";
const ENV_ID: &str = "PCCL_BOOT_TEST_ID";
const JOB_TEST: &str = "strangers_do_not_break_or_delay_a_two_process_job";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id"))
        .collect()
}

fn secret_of(id: &UniqueId) -> Vec<u8> {
    id.to_bytes()[SECRET_AT..SECRET_AT + SECRET_BYTES].to_vec()
}

fn addr_of(id: &UniqueId) -> SocketAddr {
    let b = id.to_bytes();
    let n = b[5] as usize;
    let at = SECRET_AT + SECRET_BYTES;
    std::str::from_utf8(&b[at..at + n])
        .unwrap()
        .parse()
        .unwrap()
}

/// A rendezvous hello: `secret ++ kind ++ rank ++ nranks ++ node ++ what ++ len ++ text[160]`
/// (what 0: a report whose text is the rank's address; 1: a withdrawal and its reason).
fn rdv_frame(secret: &[u8], rank: u64, nranks: u64, node: u64, what: u8, text: &str) -> Vec<u8> {
    let mut f = secret.to_vec();
    f.extend_from_slice(RDV_KIND);
    f.extend_from_slice(&rank.to_le_bytes());
    f.extend_from_slice(&nranks.to_le_bytes());
    f.extend_from_slice(&node.to_le_bytes());
    f.push(what);
    f.push(text.len() as u8);
    let mut a = [0u8; TEXT_MAX];
    a[..text.len()].copy_from_slice(text.as_bytes());
    f.extend_from_slice(&a);
    f
}

/// A rank's report: it listens at `addr`.
fn rdv_hello(secret: &[u8], rank: u64, nranks: u64, node: u64, addr: &str) -> Vec<u8> {
    rdv_frame(secret, rank, nranks, node, 0, addr)
}

fn dial(addr: SocketAddr) -> Option<TcpStream> {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()
}

/// Opens connections to `addr` that misbehave in every way a stranger can; returns them so
/// they stay open for the whole job.
fn attack(addr: SocketAddr, kind: &[u8; 8], flood: usize) -> Vec<TcpStream> {
    let mut keep = Vec::new();
    // (a) an idle connection that never writes.
    keep.extend(dial(addr));
    // (b) garbage bytes, and a connection that sends a few bytes then stalls.
    if let Some(mut s) = dial(addr) {
        let _ = s.write_all(&[0xAB; 4096]);
        keep.push(s);
    }
    if let Some(mut s) = dial(addr) {
        let _ = s.write_all(b"GET / HTTP/1.0\r\n");
        keep.push(s);
    }
    // (c) forged hellos with a wrong secret, claiming absurd sizes.
    let wrong = [0x5Au8; SECRET_BYTES];
    for nranks in [0u64, 1, 2, 1 << 40] {
        if let Some(mut s) = dial(addr) {
            let mut f = rdv_hello(&wrong, 0, nranks, 7, "127.0.0.1:1");
            f[SECRET_BYTES..SECRET_BYTES + 8].copy_from_slice(kind);
            let _ = s.write_all(&f);
            keep.push(s);
        }
    }
    // (d) a flood: idle connections and half-sent prefixes.
    for i in 0..flood {
        if let Some(mut s) = dial(addr) {
            if i % 2 == 1 {
                let _ = s.write_all(&wrong[..10]);
            }
            keep.push(s);
        }
    }
    keep
}

/// The address of the one listening TCP socket of process `pid`, once it has one.
fn listening_addr(pid: u32, within: Duration) -> Option<SocketAddr> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().to_string();
                l.strip_prefix("socket:[")
                    .and_then(|r| r.strip_suffix(']'))
                    .map(str::to_string)
            })
            .collect();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(t) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in t.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                    let (ip, port) = f[1].split_once(':')?;
                    let port = u16::from_str_radix(port, 16).ok()?;
                    // IPv4 is one little-endian word; anything else: dial loopback.
                    let ip = match u32::from_str_radix(ip, 16) {
                        Ok(w) if ip.len() == 8 && w != 0 => {
                            std::net::Ipv4Addr::from(w.to_le_bytes())
                        }
                        _ => std::net::Ipv4Addr::LOCALHOST,
                    };
                    return Some(SocketAddr::from((ip, port)));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn job_config() -> Config {
    Config {
        ranks_per_node: Some(1),
        algo: Some(Algorithm::Flat(LevelAlgo::Ring)),
        timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// One rank of the two-process job: all-reduce and all-gather with checked results.
fn run_rank(rank: usize, id_hex: &str) {
    let id = UniqueId::from_bytes(&unhex(id_hex)).expect("id from the parent");
    let cfg = job_config();
    let t = TcpTransport::connect_with(&id, 2, rank, 256 * 1024, cfg.timeout, true)
        .unwrap_or_else(|e| panic!("rank {rank}: connect: {e}"));
    let comm = Communicator::with_config(Arc::new(t), cfg).expect("communicator");
    let n = 100_003;
    let mine: Vec<f64> = (0..n).map(|i| (i * (rank + 1)) as f64).collect();
    let mut sum = vec![0f64; n];
    comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("rank {rank}: all_reduce: {e}"));
    assert!(
        sum.iter().enumerate().all(|(i, &v)| v == (3 * i) as f64),
        "rank {rank}: all_reduce result wrong"
    );
    let part: Vec<u32> = (0..1000).map(|i| (rank * 1000 + i) as u32).collect();
    let mut all = vec![0u32; 2000];
    comm.all_gather(&part, &mut all)
        .unwrap_or_else(|e| panic!("rank {rank}: all_gather: {e}"));
    assert!(
        all.iter().enumerate().all(|(i, &v)| v == i as u32),
        "rank {rank}: all_gather result wrong"
    );
}

fn spawn_rank(rank: usize, id: &UniqueId) -> Child {
    Command::new(std::env::current_exe().expect("test executable"))
        .args(["--exact", JOB_TEST, "--nocapture", "--test-threads=1"])
        .env(ENV_RANK, rank.to_string())
        .env(ENV_ID, hex(&id.to_bytes()))
        .env_remove("PCCL_SHM_DISABLE")
        .spawn()
        .expect("spawn a rank")
}

fn wait_ok(mut c: Child, rank: usize, until: Instant) {
    loop {
        match c.try_wait().expect("wait for a rank") {
            Some(st) => {
                assert!(st.success(), "rank {rank} failed: {st}");
                return;
            }
            None if Instant::now() >= until => {
                let _ = c.kill();
                let _ = c.wait();
                panic!("rank {rank} did not finish in time");
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[test]
fn strangers_do_not_break_or_delay_a_two_process_job() {
    if let (Ok(rank), Ok(id)) = (std::env::var(ENV_RANK), std::env::var(ENV_ID)) {
        run_rank(rank.parse().expect("rank"), &id);
        return;
    }
    let id = UniqueId::new(Duration::from_secs(60)).expect("rendezvous");
    let rdv = addr_of(&id);
    let start = Instant::now();
    let mut strangers = attack(rdv, RDV_KIND, 200);
    // Members' reports that are malformed are refused, answered at once, and change nothing.
    let secret = secret_of(&id);
    for (rank, nranks) in [(0u64, 0u64), (0, 1 << 40), (5, 2), (0, (1 << 22) + 1)] {
        let mut s = dial(rdv).expect("reach the rendezvous");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&rdv_hello(&secret, rank, nranks, 7, "127.0.0.1:1"))
            .unwrap();
        let mut ans = [0u8; 16];
        s.read_exact(&mut ans).expect("a refusal, at once");
        assert_ne!(u64::from_le_bytes(ans[..8].try_into().unwrap()), 1);
    }
    // Rank 1 first: it waits for rank 0 with its mesh listener open, which we attack too.
    let r1 = spawn_rank(1, &id);
    match listening_addr(r1.id(), Duration::from_secs(5)) {
        Some(mesh) => {
            strangers.extend(attack(mesh, MESH_KIND, 100));
            eprintln!("attacked rank 1's mesh listener at {mesh}");
        }
        None => eprintln!("rank 1's mesh listener not found: skipping that attack"),
    }
    let r0 = spawn_rank(0, &id);
    let until = start + Duration::from_secs(30);
    wait_ok(r0, 0, until);
    wait_ok(r1, 1, until);
    let took = start.elapsed();
    drop(strangers);
    eprintln!("two-process job under attack finished in {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "the job took {took:?}: someone waited a timeout out"
    );
}

#[test]
fn unique_ids_carry_a_random_secret_and_refuse_mangling() {
    let a = UniqueId::new(Duration::from_millis(200)).unwrap();
    let b = UniqueId::new(Duration::from_millis(200)).unwrap();
    assert_ne!(a, b);
    assert_ne!(a.to_bytes(), b.to_bytes());
    assert_eq!(UNIQUE_ID_BYTES, 128);
    const { assert!(SECRET_BYTES * 8 >= 128) };
    // Independent random secrets differ in about half their bits.
    let (sa, sb) = (secret_of(&a), secret_of(&b));
    let bits: u32 = sa.iter().zip(&sb).map(|(x, y)| (x ^ y).count_ones()).sum();
    let total = (SECRET_BYTES * 8) as u32;
    assert!(
        bits > total / 4 && bits < 3 * total / 4,
        "secrets differ in {bits} of {total} bits"
    );
    assert!(!format!("{a:?}").contains(&hex(&sa)));
    assert_eq!(UniqueId::from_bytes(&a.to_bytes()).unwrap(), a);
    let good = a.to_bytes();
    for i in [
        0,
        4,
        5,
        SECRET_AT,
        SECRET_AT + 17,
        SECRET_AT + SECRET_BYTES,
        100,
        127,
    ] {
        let mut m = good;
        m[i] ^= 0x10;
        assert_eq!(
            UniqueId::from_bytes(&m).unwrap_err().kind(),
            ErrorKind::InvalidArgument,
            "byte {i} changed"
        );
    }
    for bad in [&[0u8; 128][..], &good[..100], &[0xFF; 128][..]] {
        assert_eq!(
            UniqueId::from_bytes(bad).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
}

#[test]
fn absurd_rank_counts_are_invalid_arguments_not_aborts() {
    let id = UniqueId::new(Duration::from_millis(500)).unwrap();
    let t = Instant::now();
    for (nranks, rank) in [(1usize << 30, 0usize), (usize::MAX, 0), (0, 0), (2, 2)] {
        let e = TcpTransport::connect(&id, nranks, rank, 1 << 20, Duration::from_secs(30))
            .err()
            .expect("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    // SAFETY: `uid` and `comm` are valid, writable locals.
    unsafe {
        let mut uid = pccl::capi::pcclUniqueId { internal: [0; 128] };
        assert_eq!(
            pccl::capi::pcclGetUniqueId(&mut uid),
            pccl::capi::pcclSuccess
        );
        let mut comm: pccl::capi::pcclComm_t = std::ptr::null_mut();
        assert_eq!(
            pccl::capi::pcclCommInitRank(&mut comm, 1 << 30, uid, 0),
            pccl::capi::pcclInvalidArgument
        );
        assert!(comm.is_null());
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn a_rank_count_that_disagrees_fails_that_rank_only() {
    let id = UniqueId::new(Duration::from_secs(30)).unwrap();
    let timeout = Duration::from_secs(30);
    std::thread::scope(|s| {
        let r0 = s.spawn(|| TcpTransport::connect_with(&id, 2, 0, 1 << 20, timeout, false));
        // Let rank 0 fix the job's size first.
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let e = TcpTransport::connect_with(&id, 3, 2, 1 << 20, timeout, false)
            .err()
            .expect("a rank of another size is refused");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("has 2"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
        let r1 = s.spawn(|| TcpTransport::connect_with(&id, 2, 1, 1 << 20, timeout, false));
        let (a, b) = (r0.join().unwrap(), r1.join().unwrap());
        a.expect("rank 0 carries on");
        b.expect("rank 1 carries on");
    });
}

fn shm_dir() -> PathBuf {
    let d = PathBuf::from("/dev/shm");
    if d.is_dir() {
        d
    } else {
        std::env::temp_dir()
    }
}

/// Ring files of the current format (`pccl-` and 32 hex digits) in the shared-memory directory,
/// with their permission bits.
fn ring_files() -> Vec<(String, u32)> {
    std::fs::read_dir(shm_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let h = name.strip_prefix("pccl-")?;
            if h.len() != 32 || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            let mode = e.metadata().ok()?.permissions().mode() & 0o777;
            Some((name, mode))
        })
        .collect()
}

/// Whether `name` shows `secret` (or any 8 bytes of it) in hex or decimal.
fn reveals(name: &str, secret: &[u8]) -> bool {
    let name = name.to_ascii_lowercase();
    if name.contains(&hex(secret)) {
        return true;
    }
    secret.windows(8).any(|w| {
        let le = u64::from_le_bytes(w.try_into().unwrap());
        let be = u64::from_be_bytes(w.try_into().unwrap());
        [le, be]
            .iter()
            .any(|v| name.contains(&format!("{v:016x}")) || name.contains(&v.to_string()))
    })
}

fn check_private(files: &[(String, u32)], secret: &[u8]) {
    for (name, mode) in files {
        assert_eq!(*mode, 0o600, "{name} has mode {mode:o}");
        assert!(!reveals(name, secret), "{name} reveals the secret");
    }
}

#[test]
fn ring_files_are_private_and_do_not_reveal_the_secret() {
    // A real same-host job of two thread-ranks; a watcher records every ring file that
    // appears while it is built and used.
    let id = UniqueId::new(Duration::from_secs(30)).unwrap();
    let secret = secret_of(&id);
    let seen = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let before: HashSet<String> = ring_files().into_iter().map(|f| f.0).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let mut v = seen.lock().unwrap();
                for f in ring_files() {
                    if !before.contains(&f.0) && !v.contains(&f) {
                        v.push(f);
                    }
                }
                drop(v);
                std::thread::yield_now();
            }
        });
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let id = &id;
                s.spawn(move || {
                    let t = TcpTransport::connect_with(
                        id,
                        2,
                        r,
                        1 << 20,
                        Duration::from_secs(30),
                        true,
                    )
                    .expect("connect");
                    let comm = Communicator::with_config(Arc::new(t), job_config()).unwrap();
                    let mut v = vec![r as u64 + 1; 1000];
                    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert!(v.iter().all(|&x| x == 3));
                    comm
                })
            })
            .collect();
        let comms: Vec<Communicator> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        // The job is alive: whatever ring file exists now or existed is private.
        stop.store(true, Ordering::Relaxed);
        check_private(&ring_files(), &secret);
        check_private(&seen.lock().unwrap(), &secret);
        assert_eq!(comms.len(), 2);
    });

    // Deterministically: a hand-made rank 0 reports to the rendezvous and never dials, so the
    // real rank 1 sits in its mesh phase with its inbound ring file created.
    let id = UniqueId::new(Duration::from_secs(30)).unwrap();
    let secret = secret_of(&id);
    let before: HashSet<String> = ring_files().into_iter().map(|f| f.0).collect();
    let fake_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake_listener.local_addr().unwrap().to_string();
    let mut fake = dial(addr_of(&id)).expect("rendezvous");
    fake.write_all(&rdv_hello(
        &secret,
        0,
        2,
        fnv1a(hostname().as_bytes()),
        &fake_addr,
    ))
    .unwrap();
    std::thread::scope(|s| {
        let r1 = s
            .spawn(|| TcpTransport::connect_with(&id, 2, 1, 1 << 20, Duration::from_secs(2), true));
        let until = Instant::now() + Duration::from_secs(2);
        let mut fresh = Vec::new();
        while fresh.is_empty() && Instant::now() < until {
            fresh = ring_files()
                .into_iter()
                .filter(|f| !before.contains(&f.0))
                .collect();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(!fresh.is_empty(), "rank 1 created no ring file");
        check_private(&fresh, &secret);
        let e = r1.join().unwrap().err().expect("rank 0 never dialed");
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(
            e.message().contains("rank 1") && e.message().contains('0'),
            "{e}"
        );
        for (name, _) in &fresh {
            assert!(
                !shm_dir().join(name).exists(),
                "{name} left behind after the failed build"
            );
        }
    });
    drop(fake);
}

/// The line a child rank printed from `marker` on (libtest prints the test's name on the same
/// line first), once it ended or `until` passed (then it is killed); its whole output if it
/// printed none.
fn report_line(mut c: Child, until: Instant, marker: &str) -> Result<String, String> {
    while c.try_wait().expect("wait").is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let out = c.wait_with_output().expect("rank output");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = out
        .lines()
        .find_map(|l| l.find(marker).map(|at| l[at..].to_string()));
    line.ok_or(out)
}

const ENV_INIT_RANK: &str = "PCCL_BOOT_TEST_INIT_RANK";
const INIT_TEST: &str = "a_rank_that_cannot_join_fails_every_rank_at_once_naming_it";

/// One rank of the 4-process job through the C ABI: prints `rc=<code> <message>` of
/// `pcclCommInitRank`.
fn init_rank_child(rank: i32, id_hex: &str) {
    let bytes = unhex(id_hex);
    let mut uid = pccl::capi::pcclUniqueId { internal: [0; 128] };
    for (o, b) in uid.internal.iter_mut().zip(bytes) {
        *o = b as std::os::raw::c_char;
    }
    let mut comm: pccl::capi::pcclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid, writable local; the id was made by pcclGetUniqueId.
    let rc = unsafe { pccl::capi::pcclCommInitRank(&mut comm, 4, uid, rank) };
    // SAFETY: NULL asks for this thread's last error; the string is copied at once.
    let msg =
        unsafe { std::ffi::CStr::from_ptr(pccl::capi::pcclGetLastError(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned();
    println!("INIT rc={rc} {msg}");
    if !comm.is_null() {
        pccl::capi::pcclCommDestroy(comm);
    }
}

/// NCCL waits forever (torch: 30 minutes) when one rank cannot join. Here rank 2's
/// `PCCL_RANKS_PER_NODE` is not a number: its `pcclCommInitRank` fails, withdraws from the
/// rendezvous, and the three others' `pcclCommInitRank` return a remote error naming rank 2
/// and its reason within seconds, whatever their own `PCCL_TIMEOUT` (60 s here).
#[test]
fn a_rank_that_cannot_join_fails_every_rank_at_once_naming_it() {
    if let (Ok(rank), Ok(id)) = (std::env::var(ENV_INIT_RANK), std::env::var(ENV_ID)) {
        init_rank_child(rank.parse().expect("rank"), &id);
        return;
    }
    let id = UniqueId::new(Duration::from_secs(60)).expect("rendezvous");
    let start = Instant::now();
    let children: Vec<(usize, std::process::Child)> = (0..4)
        .map(|r| {
            let mut c = Command::new(std::env::current_exe().expect("test executable"));
            c.args(["--exact", INIT_TEST, "--nocapture", "--test-threads=1"])
                .env(ENV_INIT_RANK, r.to_string())
                .env(ENV_ID, hex(&id.to_bytes()))
                .env("PCCL_TIMEOUT", "60")
                .env("PCCL_SHM_DISABLE", "1")
                .env_remove("PCCL_RANKS_PER_NODE")
                .stdout(std::process::Stdio::piped());
            if r == 2 {
                c.env("PCCL_RANKS_PER_NODE", "abc");
            }
            (r, c.spawn().expect("spawn a rank"))
        })
        .collect();
    for (r, c) in children {
        // A hang would be a wait of 60 s: kill at 20 and report it.
        let line = report_line(c, start + Duration::from_secs(20), "INIT rc=")
            .unwrap_or_else(|out| panic!("rank {r} did not finish within 20 s: {out}"));
        eprintln!("rank {r}: {line}");
        if r == 2 {
            assert!(
                line.starts_with(&format!("INIT rc={} ", pccl::capi::pcclInvalidArgument))
                    && line.contains("PCCL_RANKS_PER_NODE"),
                "rank 2 fails on its own variable: {line}"
            );
        } else {
            assert!(
                line.starts_with(&format!("INIT rc={} ", pccl::capi::pcclRemoteError))
                    && line.contains("rank 2 cannot join")
                    && line.contains("PCCL_RANKS_PER_NODE"),
                "rank {r} names rank 2 and its reason: {line}"
            );
        }
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: someone waited"
    );
}

/// A rank that reported to the rendezvous and then died (here a hand-made rank 2 whose
/// listener is closed) is found by the others' mesh, not waited out: rank 1 is refused when it
/// dials it, the failure spreads as the ranks that gave up close their listeners, and rank 3
/// finds its lower ranks gone by probing, all within seconds of a 60 s timeout.
#[test]
fn a_rank_that_dies_after_the_rendezvous_is_found_not_waited_out() {
    let id = UniqueId::new(Duration::from_secs(60)).unwrap();
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let mut fake = dial(addr_of(&id)).expect("rendezvous");
    fake.write_all(&rdv_hello(&secret_of(&id), 2, 4, 7, &dead_addr))
        .unwrap();
    let start = Instant::now();
    let timeout = Duration::from_secs(60);
    let errs: Vec<_> = std::thread::scope(|s| {
        let h: Vec<_> = [0usize, 1, 3]
            .into_iter()
            .map(|r| {
                let id = &id;
                s.spawn(move || TcpTransport::connect_with(id, 4, r, 1 << 20, timeout, false))
            })
            .collect();
        h.into_iter()
            .map(|h| {
                h.join()
                    .unwrap()
                    .err()
                    .expect("rank 2 is dead: no rank may join")
            })
            .collect()
    });
    let took = start.elapsed();
    // Rank 1 dials rank 2 first and is refused; rank 0 may find rank 2 or, if rank 1 gave
    // up first, rank 1 gone; rank 3 finds a lower rank gone by probing.
    for (r, e) in [0, 1, 3].into_iter().zip(&errs) {
        eprintln!("rank {r}: {e}");
        assert_eq!(e.kind(), ErrorKind::Remote, "rank {r}: {e}");
        let m = e.message();
        assert!(m.contains("gave up joining"), "rank {r}: {m}");
        if r == 1 {
            assert!(m.contains("rank 2 refused"), "rank {r}: {m}");
        }
    }
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: someone waited"
    );
    drop(fake);
}

const ENV_CC_RANK: &str = "PCCL_BOOT_TEST_CC_RANK";
const CC_TEST: &str = "a_congestion_control_setting_applies_or_fails_every_rank_naming_it";

/// One rank of a two-process job over sockets only: prints `CC ok` after a checked
/// all-reduce, or `CC err <message>`.
fn cc_rank_child(rank: usize, id_hex: &str) {
    let id = UniqueId::from_bytes(&unhex(id_hex)).expect("id from the parent");
    let run = || -> Result<(), String> {
        let t =
            TcpTransport::connect_with(&id, 2, rank, 256 * 1024, Duration::from_secs(30), false)
                .map_err(|e| e.to_string())?;
        let comm =
            Communicator::with_config(Arc::new(t), job_config()).map_err(|e| e.to_string())?;
        let mut sum = vec![0f32; 70_001];
        comm.all_reduce(&vec![1f32; 70_001], &mut sum, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        match sum.iter().all(|&v| v == 2.0) {
            true => Ok(()),
            false => Err("wrong all-reduce result".into()),
        }
    };
    match run() {
        Ok(()) => println!("CC ok"),
        Err(e) => println!("CC err {e}"),
    }
}

/// `PCCL_TCP_CONGESTION` reaches every socket: `reno` (which every Linux allows) runs a
/// checked all-reduce; a name the kernel does not have fails both ranks' creation with an
/// error naming the variable, within seconds (never a hang at a timeout of 30 s).
#[test]
fn a_congestion_control_setting_applies_or_fails_every_rank_naming_it() {
    if let (Ok(rank), Ok(id)) = (std::env::var(ENV_CC_RANK), std::env::var(ENV_ID)) {
        cc_rank_child(rank.parse().expect("rank"), &id);
        return;
    }
    for (cc, ok) in [("reno", true), ("nosuchcc", false)] {
        let id = UniqueId::new(Duration::from_secs(30)).expect("rendezvous");
        let start = Instant::now();
        let children: Vec<Child> = (0..2)
            .map(|r| {
                Command::new(std::env::current_exe().expect("test executable"))
                    .args(["--exact", CC_TEST, "--nocapture", "--test-threads=1"])
                    .env(ENV_CC_RANK, r.to_string())
                    .env(ENV_ID, hex(&id.to_bytes()))
                    .env("PCCL_TCP_CONGESTION", cc)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn a rank")
            })
            .collect();
        for (r, c) in children.into_iter().enumerate() {
            let line = report_line(c, start + Duration::from_secs(20), "CC ")
                .unwrap_or_else(|out| panic!("{cc}: rank {r} did not finish within 20 s: {out}"));
            eprintln!("{cc}: rank {r}: {line}");
            if ok {
                assert_eq!(line, "CC ok", "{cc}: rank {r}");
            } else {
                assert!(
                    line.starts_with("CC err") && line.contains("PCCL_TCP_CONGESTION=nosuchcc"),
                    "{cc}: rank {r} names the variable: {line}"
                );
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{cc}: {:?}",
            start.elapsed()
        );
    }
}
