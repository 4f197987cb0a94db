//! The C ABI from C and C++: the committed header matches the code, and C programs
//! (`tests/c/`) built with the system `cc` against `libpccl.so` / `libpccl.a` run every
//! collective, the non-blocking calls and a table of bad inputs on thread-ranks, for 1..=6
//! ranks and several `PCCL_RANKS_PER_NODE` shapes; one runs under valgrind memcheck, and
//! the thread-rank, bad-input and unique-id programs run once more built with
//! AddressSanitizer (LeakSanitizer included).
//!
//! Refresh `include/pccl.h` after changing `src/capi/` with
//! `PCCL_BLESS=1 cargo test --test capi header`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put the `libpccl.so` and `libpccl.a` this test was built with: next to the
/// test executable (`target/<profile>/deps/`). Cargo builds every crate type of the library
/// for the integration tests, but copies them up to `target/<profile>/` only for
/// `cargo build`, so the copies there may be stale or absent.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let dir = exe
        .parent()
        .expect("test executable has a directory")
        .to_path_buf();
    for lib in ["libpccl.so", "libpccl.a"] {
        assert!(
            dir.join(lib).exists(),
            "{} is missing: cargo should build it with the library (crate-type cdylib, staticlib)",
            dir.join(lib).display()
        );
    }
    dir
}

/// Scratch directory for the C binaries of this test run.
fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi");
    std::fs::create_dir_all(&d).expect("create the scratch directory");
    d
}

/// Runs `cmd`, killing it after `limit`; returns (success, stdout + stderr).
fn run(cmd: &mut Command, limit: Duration) -> (bool, String) {
    let log = out_dir().join(format!(
        "run-{}-{:?}.log",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = File::create(&log).expect("create a log file");
    // `cargo test` puts target/<profile> on LD_LIBRARY_PATH, which outranks the programs'
    // RUNPATH, and the libpccl.so there is whatever `cargo build` last copied up (other
    // features, other sources): make the one this test was built with win.
    let mut paths = vec![lib_dir()];
    paths.extend(
        std::env::var_os("LD_LIBRARY_PATH")
            .iter()
            .flat_map(std::env::split_paths),
    );
    let ld_path = std::env::join_paths(paths).expect("library paths without separators");
    let mut child = cmd
        .env("LD_LIBRARY_PATH", ld_path)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("dup log file"))
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(s) => {
            if !s.success() {
                out.push_str(&format!("\n[exit status: {s}]"));
            }
            (s.success(), out)
        }
        None => {
            out.push_str(&format!("\n[killed after {limit:?}]"));
            (false, out)
        }
    }
}

fn tool_exists(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Compiles `src` (C or C++ by `compiler`) into `name`, linked against the shared library
/// (or, with `static_lib`, the static one); each binary is built once per test run.
fn build(compiler: &str, src: &str, name: &str, static_lib: bool) -> PathBuf {
    build_with(compiler, src, name, static_lib, &[])
}

/// [`build`] with extra compiler (and linker) flags.
fn build_with(compiler: &str, src: &str, name: &str, static_lib: bool, flags: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let exe = out_dir().join(name);
    if built.iter().any(|b| b == name) {
        return exe;
    }
    let lib = lib_dir();
    let mut cmd = Command::new(compiler);
    let cxx = compiler.contains("++");
    cmd.arg(if cxx { "-std=c++17" } else { "-std=c11" })
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1"])
        .args(flags)
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join(src))
        .arg("-o")
        .arg(&exe);
    if static_lib {
        cmd.arg(lib.join("libpccl.a"))
            .args(["-lpthread", "-ldl", "-lm"]);
        // The system libraries that optional features link (what `libpccl.so` records itself).
        if cfg!(feature = "hwloc") {
            cmd.arg("-lhwloc");
        }
        if cfg!(feature = "ofi") {
            cmd.arg("-lfabric");
        }
    } else {
        cmd.arg("-L")
            .arg(&lib)
            .arg("-lpccl")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lpthread");
    }
    let (ok, out) = run(&mut cmd, Duration::from_secs(120));
    assert!(ok, "compiling {src} failed:\n{out}");
    built.push(name.to_string());
    exe
}

/// What a collective given a stream but host buffers must answer (`code:message part`), for
/// `tests/c/bad_input.c`: a host-only library refuses streams; a CUDA build says CUDA is
/// missing, or, with a driver, that the buffers are not device memory.
fn stream_expectation() -> &'static str {
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    return "5:built without CUDA";
    // A ROCm-only build takes the stream for a HIP stream: HIP is not installed here.
    #[cfg(all(feature = "rocm", not(feature = "cuda")))]
    return "2:libamdhip64";
    #[cfg(feature = "cuda")]
    match pccl::device::cuda::ensure_available() {
        Err(_) => "2:CUDA is not available",
        Ok(()) => "4:not CUDA device memory",
    }
}

/// Runs a built test program with `env` set; asserts it succeeded and returns its output.
fn run_ok(exe: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env_remove("PCCL_RANKS_PER_NODE")
        .env_remove("PCCL_ALGO")
        .env_remove("PCCL_CHUNK_SIZE")
        .env_remove("PCCL_DEBUG")
        .env("PCCL_TIMEOUT", "60")
        .env("PCCL_TEST_STREAM_EXPECT", stream_expectation())
        .envs(env.iter().copied());
    let (ok, out) = run(&mut cmd, limit);
    assert!(ok, "{} {args:?} with {env:?} failed:\n{out}", exe.display());
    out
}

/// The "N checks, 0 failed" summary a C test program prints last, as the number of checks.
fn checks_of(out: &str) -> usize {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains(" checks, "))
        .unwrap_or_else(|| panic!("no summary in:\n{out}"));
    assert!(line.ends_with(" 0 failed"), "{line}");
    let n = line
        .rsplit(": ")
        .next()
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok());
    n.unwrap_or_else(|| panic!("cannot read the check count of: {line}"))
}

fn generated_header() -> String {
    let config =
        cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("read cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root().join("src/capi/mod.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn header_matches_the_code() {
    let path = root().join("include/pccl.h");
    let fresh = generated_header();
    if std::env::var_os("PCCL_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write include/pccl.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/pccl.h is out of date with src/capi/: run `PCCL_BLESS=1 cargo test --test capi header` \
         and commit the result"
    );
}

/// Every collective, dtype, op, count and form, on 1..=6 ranks in several node shapes.
#[test]
fn collectives_from_c_on_thread_ranks() {
    let exe = build("cc", "tests/c/collectives.c", "collectives", false);
    let mut total = 0;
    let mut runs = 0;
    for p in 1..=6usize {
        // Unset (one host), one rank per node, and nodes of 2 and 4 (unequal where p is odd
        // or not a multiple of 4).
        let mut shapes: Vec<Option<usize>> = vec![None, Some(1)];
        shapes.extend([2, 4].into_iter().filter(|&m| m < p).map(Some));
        for m in shapes {
            let m_s = m.map(|m| m.to_string());
            let mut env = vec![];
            if let Some(m) = &m_s {
                env.push(("PCCL_RANKS_PER_NODE", m.as_str()));
            }
            if p == 4 && m == Some(2) {
                env.push(("PCCL_CHUNK_SIZE", "4096"));
            }
            let out = run_ok(&exe, &[&p.to_string()], &env, Duration::from_secs(120));
            total += checks_of(&out);
            runs += 1;
        }
    }
    eprintln!("collectives from C: {runs} runs, {total} checks passed");
}

/// Each row of the bad-input table returns its code and message; nothing crashes or hangs.
#[test]
fn bad_inputs_from_c_return_codes_and_messages() {
    let exe = build("cc", "tests/c/bad_input.c", "bad_input", false);
    let args: &[&str] = if cfg!(feature = "mpi") { &["mpi"] } else { &[] };
    let out = run_ok(&exe, args, &[], Duration::from_secs(120));
    eprintln!("bad inputs from C: {} checks passed", checks_of(&out));
}

/// The same collective table as `collectives_from_c_on_thread_ranks`, as real MPI processes
/// (communicator from `pcclCommInitMPI`) under `mpiexec -n 1..6` in several node shapes.
#[test]
#[cfg(feature = "mpi")]
fn collectives_from_c_under_mpiexec() {
    let exe = build(
        "mpicc",
        "tests/c/collectives_mpi.c",
        "collectives_mpi",
        false,
    );
    let mut total = 0;
    for p in 1..=6usize {
        for m in [1usize, 2, 3].into_iter().filter(|m| p % m == 0) {
            let mut cmd = Command::new("mpiexec");
            cmd.args(["-n", &p.to_string()]).arg(&exe);
            // Oversubscribed processes are slow on 2 cores: the full table at small sizes,
            // the quick one above 4 processes.
            if p > 4 {
                cmd.arg("quick");
            }
            cmd.env("PCCL_TIMEOUT", "120")
                .env("PCCL_RANKS_PER_NODE", m.to_string());
            let (ok, out) = run(&mut cmd, Duration::from_secs(300));
            assert!(
                ok,
                "mpiexec -n {p} (PCCL_RANKS_PER_NODE={m}) collectives_mpi failed:\n{out}"
            );
            total += checks_of(&out);
        }
    }
    eprintln!("collectives from C under mpiexec: {total} checks passed");
}

/// NCCL-style bootstrap: `pcclGetUniqueId` on one rank, `pcclCommInitRank` on all, then
/// collectives over TCP / shared memory.
#[test]
fn unique_id_bootstrap_from_c() {
    let exe = build("cc", "tests/c/unique_id.c", "unique_id", false);
    let out = run_ok(&exe, &[], &[], Duration::from_secs(120));
    eprintln!("unique id from C: {} checks passed", checks_of(&out));
}

/// The static library links into a C program on its own.
#[test]
fn static_library_links_and_runs() {
    // With MPI inside, the static library also needs libmpi, which mpicc adds.
    let cc = if cfg!(feature = "mpi") { "mpicc" } else { "cc" };
    let exe = build(cc, "tests/c/collectives.c", "collectives_static", true);
    let out = run_ok(
        &exe,
        &["3", "quick"],
        &[("PCCL_RANKS_PER_NODE", "2")],
        Duration::from_secs(120),
    );
    checks_of(&out);
}

/// The C++ example compiles against the header with `c++` and runs.
#[test]
fn cpp_example_builds_and_runs() {
    if !tool_exists("c++") {
        eprintln!("SKIPPED: no c++ compiler found");
        return;
    }
    let exe = build("c++", "ffi/cpp/example.cpp", "cpp_example", false);
    let out = run_ok(
        &exe,
        &["4"],
        &[("PCCL_RANKS_PER_NODE", "2")],
        Duration::from_secs(60),
    );
    assert!(out.contains("ok"), "{out}");
}

/// valgrind memcheck finds no error in a C program that runs collectives and the bad-input
/// table (errors and definite leaks fail it).
#[test]
fn valgrind_memcheck_is_clean() {
    if !tool_exists("valgrind") {
        eprintln!("SKIPPED: valgrind not found; install it to run the memcheck test");
        return;
    }
    let vg = |exe: &Path, args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new("valgrind");
        cmd.args([
            "--tool=memcheck",
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--fair-sched=yes",
            "-q",
        ])
        .arg(exe)
        .args(args)
        .env_remove("PCCL_RANKS_PER_NODE")
        .env("PCCL_TIMEOUT", "60")
        .env("PCCL_TEST_STREAM_EXPECT", stream_expectation())
        .envs(env.iter().copied());
        let (ok, out) = run(&mut cmd, Duration::from_secs(300));
        assert!(
            ok,
            "valgrind reports errors in {} {args:?}:\n{out}",
            exe.display()
        );
        out
    };
    let coll = build("cc", "tests/c/collectives.c", "collectives", false);
    let out = vg(&coll, &["3", "quick"], &[("PCCL_RANKS_PER_NODE", "2")]);
    let n = checks_of(&out);
    let bad = build("cc", "tests/c/bad_input.c", "bad_input", false);
    let args: &[&str] = if cfg!(feature = "mpi") { &["mpi"] } else { &[] };
    let out = vg(&bad, args, &[]);
    eprintln!(
        "valgrind memcheck: clean over {} checks",
        n + checks_of(&out)
    );
}

/// The C test programs built with AddressSanitizer (`-fsanitize=address`, LeakSanitizer on)
/// run the bad-input table, the thread-rank collective tables in several shapes and the
/// unique-id bootstrap with no report: no out-of-bounds access, use after free or leak in
/// what the programs and libpccl allocate (libpccl itself is not instrumented, but every
/// allocation it makes goes through ASan's malloc, so its frees and leaks are checked).
/// No leak is suppressed: the library frees everything a program released by exit.
#[test]
fn address_sanitizer_is_clean() {
    const ASAN: &[&str] = &["-fsanitize=address", "-fno-omit-frame-pointer"];
    // A compiler without the ASan runtime: skip, as for valgrind.
    let probe = out_dir().join("asan_probe.c");
    std::fs::write(&probe, "int main(void) { return 0; }\n").expect("write the probe");
    let (ok, _) = run(
        Command::new("cc")
            .args(ASAN)
            .arg(&probe)
            .arg("-o")
            .arg(out_dir().join("asan_probe")),
        Duration::from_secs(60),
    );
    if !ok {
        eprintln!("SKIPPED: cc cannot build with -fsanitize=address (no libasan)");
        return;
    }
    let asan = |exe: &Path, args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env_remove("PCCL_RANKS_PER_NODE")
            .env_remove("PCCL_ALGO")
            .env_remove("PCCL_CHUNK_SIZE")
            .env("PCCL_TIMEOUT", "60")
            .env("PCCL_TEST_STREAM_EXPECT", stream_expectation())
            // Leak checking at exit, stack use after return, and a distinctive exit code;
            // LSAN_OPTIONS cleared so no outside suppression file applies.
            .env(
                "ASAN_OPTIONS",
                "detect_leaks=1:halt_on_error=1:exitcode=86:detect_stack_use_after_return=1:\
                 check_initialization_order=1:strict_init_order=1",
            )
            .env_remove("LSAN_OPTIONS")
            .envs(env.iter().copied());
        let (ok, out) = run(&mut cmd, Duration::from_secs(300));
        let report = ["AddressSanitizer", "LeakSanitizer"]
            .iter()
            .any(|t| out.contains(t));
        assert!(
            ok && !report,
            "AddressSanitizer reports in {} {args:?} with {env:?}:\n{out}",
            exe.display()
        );
        checks_of(&out)
    };
    let mut checks = 0;
    let bad = build_with("cc", "tests/c/bad_input.c", "bad_input_asan", false, ASAN);
    let args: &[&str] = if cfg!(feature = "mpi") { &["mpi"] } else { &[] };
    checks += asan(&bad, args, &[]);
    let coll = build_with(
        "cc",
        "tests/c/collectives.c",
        "collectives_asan",
        false,
        ASAN,
    );
    checks += asan(&coll, &["1"], &[]);
    checks += asan(&coll, &["2"], &[("PCCL_RANKS_PER_NODE", "1")]);
    checks += asan(&coll, &["3"], &[("PCCL_RANKS_PER_NODE", "2")]);
    checks += asan(
        &coll,
        &["4"],
        &[("PCCL_RANKS_PER_NODE", "2"), ("PCCL_CHUNK_SIZE", "4096")],
    );
    checks += asan(&coll, &["6", "quick"], &[]);
    let uid = build_with("cc", "tests/c/unique_id.c", "unique_id_asan", false, ASAN);
    checks += asan(&uid, &[], &[]);
    eprintln!("AddressSanitizer + LeakSanitizer: clean over {checks} checks");
}

/// `pcclCommInitMPI` from a C MPI program under `mpiexec` (libpccl built with `--features mpi`).
#[cfg(feature = "mpi")]
#[test]
fn mpi_init_from_c_under_mpiexec() {
    if !tool_exists("mpicc") || !tool_exists("mpiexec") {
        eprintln!("SKIPPED: mpicc or mpiexec not found");
        return;
    }
    let exe = build("mpicc", "tests/c/mpi_init.c", "mpi_init", false);
    for p in [1, 3] {
        let mut cmd = Command::new("mpiexec");
        cmd.args(["-n", &p.to_string()])
            .arg(&exe)
            .env("PCCL_TIMEOUT", "60");
        let (ok, out) = run(&mut cmd, Duration::from_secs(120));
        assert!(ok, "mpiexec -n {p} mpi_init failed:\n{out}");
        checks_of(&out);
    }
}

/// A device call routed to CUDA where libcuda cannot be loaded returns `pcclSystemError`
/// naming the driver (cudarc would panic inside the library); an unknown runtime is an
/// invalid argument, a runtime not built in an invalid usage.
#[test]
fn a_device_call_without_libcuda_is_an_error_through_the_c_abi() {
    use pccl::capi::*;
    let mut world: pcclThreadWorld_t = std::ptr::null_mut();
    // SAFETY: `world` is a writable handle.
    assert_eq!(unsafe { pcclThreadWorldCreate(1, &mut world) }, pcclSuccess);
    let mut comm: pcclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a writable handle; the world lives until the end.
    assert_eq!(
        unsafe { pcclCommInitThreads(&mut comm, world, 0) },
        pcclSuccess
    );
    let msg = || {
        // SAFETY: a NUL-terminated string owned by PCCL.
        unsafe { std::ffi::CStr::from_ptr(pcclGetLastError(comm)) }
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(pcclCommSetDeviceRuntime(comm, 7), pcclInvalidArgument);
    assert!(msg().contains("pcclDeviceRuntime_t"), "{}", msg());
    let hip = pcclCommSetDeviceRuntime(comm, pcclRuntimeHip);
    assert_eq!(
        hip,
        if cfg!(feature = "rocm") {
            pcclSuccess
        } else {
            pcclInvalidUsage
        },
        "{}",
        msg()
    );
    #[cfg(feature = "cuda")]
    if pccl::device::cuda::ensure_available().is_err() {
        assert_eq!(pcclCommSetDeviceRuntime(comm, pcclRuntimeCuda), pcclSuccess);
        // SAFETY: refused before the (made-up) device addresses are used.
        let rc = unsafe {
            pcclAllReduce(
                0x10000 as *const _,
                0x20000 as *mut _,
                4,
                pcclFloat32,
                pcclSum,
                comm,
                0x5000 as *mut std::ffi::c_void,
            )
        };
        assert_eq!(rc, pcclSystemError, "{}", msg());
        assert!(msg().contains("libcuda"), "{}", msg());
    } else {
        println!("skipped the libcuda check: a CUDA driver is present");
    }
    pcclCommDestroy(comm);
    pcclThreadWorldDestroy(world);
}
