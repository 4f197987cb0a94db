//! Running a test's checks in a child process on the fake ROCm runtime (or the real one):
//! shared by `tests/rocm_fake.rs` and `tests/rocm_fake_async.rs`.

#![allow(dead_code)]

use std::process::Command;

const CHILD_ENV: &str = "PCCL_ROCM_FAKE_CHILD";

/// Builds the fake runtime into `dir`; `None` (and the directory removed) when there is no
/// C compiler.
pub fn build_fake(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let so = dir.join("libfakerocm.so");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_rocm/fake_rocm.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(src)
        .args(["-lm", "-lpthread"])
        .status();
    if !matches!(built, Ok(s) if s.success()) {
        println!("skipped: no C compiler to build the fake ROCm runtime ({built:?})");
        let _ = std::fs::remove_dir_all(dir);
        return None;
    }
    Some(so)
}

/// `PCCL_ROCM_REAL=1` (scripts/gpu-check.sh --rocm on an AMD machine): the children run on
/// the real HIP, hipRTC and RCCL; `FAKE_HIP_DEVICES=N` becomes `HIP_VISIBLE_DEVICES=0..N-1`,
/// and the checks that need the fake's fault injection are skipped.
pub fn real_runtime() -> bool {
    std::env::var("PCCL_ROCM_REAL").is_ok_and(|v| v == "1")
}

/// Builds the fake runtime and runs `child` in a child process with it (or on the real one,
/// see [`real_runtime`]); returns false when skipped.
pub fn with_fake_runtime(child: &str, extra: &[(&str, &str)]) -> bool {
    let real = real_runtime();
    if real
        && extra
            .iter()
            .any(|(k, _)| k.starts_with("FAKE_") && *k != "FAKE_HIP_DEVICES")
    {
        println!("skipped on the real ROCm runtime: needs the fake's fault injection");
        return false;
    }
    let dir = std::env::temp_dir().join(format!("pccl-rocm-fake-{}-{child}", std::process::id()));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", child, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1");
    if real {
        for (k, v) in extra {
            if *k == "FAKE_HIP_DEVICES" {
                let n: usize = v.parse().unwrap();
                let list: Vec<String> = (0..n).map(|d| d.to_string()).collect();
                cmd.env("HIP_VISIBLE_DEVICES", list.join(","));
            } else {
                // PCCL_* settings of the check apply on the real runtime too.
                cmd.env(k, v);
            }
        }
    } else {
        let Some(so) = build_fake(&dir) else {
            return false;
        };
        cmd.env("PCCL_HIP_LIBRARY", &so)
            .env("PCCL_HIPRTC_LIBRARY", &so)
            .env("PCCL_RCCL_LIBRARY", &so)
            .env_remove("PCCL_HIP_ARCH");
        for (k, v) in extra {
            cmd.env(k, v);
        }
    }
    let out = output_within(cmd, CHILD_LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    let Some(out) = out else {
        panic!("child {child} did not finish within {CHILD_LIMIT:?} (killed): a hang");
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("child-checked"),
        "child did not run:\n{stdout}\n{stderr}"
    );
    true
}

/// How long a child may run: every check finishes in seconds; a hung one (a rank that
/// panicked while its peers wait at a barrier, a stream held forever) fails instead of
/// holding the suite until CI's limit.
const CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(240);

/// Runs `cmd` to completion and returns its output, or kills it after `limit` (None).
fn output_within(mut cmd: Command, limit: std::time::Duration) -> Option<std::process::Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the child test process");
    // Drain both pipes on threads of their own (a full pipe would stall the child).
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if status.is_none() {
        eprintln!(
            "child output before it was killed:\n{}\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    }
    status.map(|status| std::process::Output {
        status,
        stdout,
        stderr,
    })
}

pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Calls a test hook of the fake runtime (a `void f(...)` exported by fake_rocm.c).
pub fn fake_hook(name: &str, arg: Option<i32>) {
    let path = std::env::var("PCCL_HIP_LIBRARY").expect("the child runs on the fake runtime");
    // SAFETY: the fake runtime is already loaded by PCCL (this only takes another reference);
    // the hooks have the C signatures of the two arms below.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        match arg {
            None => lib.get::<unsafe extern "C" fn()>(name.as_bytes()).unwrap()(),
            Some(a) => lib
                .get::<unsafe extern "C" fn(i32)>(name.as_bytes())
                .unwrap()(a),
        }
        std::mem::forget(lib);
    }
}

/// The fake runtime's counter `name` (a `long name(void)` hook), every thread's so far.
fn fake_counter(name: &[u8]) -> i64 {
    let path = std::env::var("PCCL_HIP_LIBRARY").expect("the child runs on the fake runtime");
    // SAFETY: as in `fake_hook`; the counters are `long name(void)`.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        let n = lib
            .get::<unsafe extern "C" fn() -> std::ffi::c_long>(name)
            .unwrap()();
        std::mem::forget(lib);
        n as i64
    }
}

/// Batched decodes (`pccl_dequantize_many_*`, `pccl_dequantize_sum_*`) the fake runtime has
/// launched so far (every thread's).
pub fn fake_batch_launches() -> i64 {
    fake_counter(b"fake_hip_batch_launches")
}

/// Events the fake runtime has made so far (every thread's).
pub fn fake_events_created() -> i64 {
    fake_counter(b"fake_hip_events_created")
}
