#!/usr/bin/env bash
# Every GPU check of PCCL in one script: the CUDA kernel tests (tests/cuda_kernels.rs, every
# dtype x op against the host reference, transposes of many shapes), the device collectives
# (tests/cuda_collectives.rs), the CUDA unit tests of the library (device::, comm::), the GPU
# benchmark (src/bin/pccl-gpu-bench/: `kernels`: D2D copy ceiling, reductions, transpose, in GB/s
# and % of copy; `staged`: the host-staged device reduce-scatter, its arguments from
# $DEVICE_BENCH_ARGS), pccl-bench -d cuda with NCCL's own collective timed beside PCCL's.
# Run it from the repository root on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh --rocm [--build-only]   the same on an AMD GPU (MI250X, MI300): see below
#
#   scripts/gpu-check.sh [-- BENCH_ARGS]   build with cargo (when it is installed), then run them all
#   scripts/gpu-check.sh --build-only      build the binaries into out/gpu-check/ (release), to
#                                          carry to a GPU machine that has no Rust toolchain
#   scripts/gpu-check.sh --no-build [-- BENCH_ARGS]
#                                          run the binaries already in out/gpu-check/
# BENCH_ARGS go to pccl-gpu-bench (e.g. -- --sweep). With neither flag, the script builds when
# cargo is on PATH and otherwise runs what is in out/gpu-check/.
#
# Then pccl-bench -d cuda --check (host-staged, with the NCCL level, and one rank per GPU with
# the NCCL column), the torch backend on CUDA tensors (ffi/python/tests/test_cuda.py, with
# out/gpu-check/libpccl.so) and the FSDP2 harness (ffi/python/examples/train_fsdp.py --device
# cuda --compare, under torchrun, one rank per GPU).
# Logs (tests.log, collectives.log, lib.log, bench.log, device-bench.log, pccl-bench-cuda.log,
# torch-cuda.log, fsdp-cuda.log, env.log) go to $OUT when it is set, else to out/gpu-check/logs/.
#
# --rocm: builds with --features rocm into out/gpu-check-rocm/ and runs the ROCm suite on the
# real runtime (HIP, hipRTC and RCCL from /opt/rocm, or PCCL_HIP_LIBRARY / PCCL_HIPRTC_LIBRARY /
# PCCL_RCCL_LIBRARY): tests/rocm_fake.rs with PCCL_ROCM_REAL=1 (every dtype x op through the
# staged, direct and RCCL-level executors on thread ranks, one per GCD), tests/hip_loading.rs,
# and pccl-bench -d rocm --check with RCCL's own collective timed beside PCCL's. Logs go to
# rocm-*.log.
# NCCL is found through PCCL_NCCL_LIBRARY, else python's nvidia.nccl wheel, else ldconfig.
# With a GPU visible (nvidia-smi lists one), PCCL_REQUIRE_CUDA=1 makes the tests fail instead of
# skipping when CUDA cannot be used. The exit status is non-zero if any check failed.
set -uo pipefail

cd "$(dirname "$0")/.."
BIN_DIR=out/gpu-check
mode=auto
rocm=0
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build-only) mode=build; shift ;;
        --rocm) rocm=1; shift ;;
        --no-build) mode=run; shift ;;
        --) shift; bench_args=("$@"); break ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

# The test executable cargo builds for `cargo test --release --features $1 $2` (e.g. `--test
# cuda_kernels` or `--lib`), named $4-<hash> in deps/, copied to $BIN_DIR/$3.
copy_test() {
    local feature=$1 target=$2 name=$3 stem=$4 test_exe
    # shellcheck disable=SC2086
    test_exe=$(cargo test --release --features "$feature" $target --no-run --message-format=json 2>/dev/null \
        | grep -o "\"executable\":\"[^\"]*/deps/$stem-[^\"]*\"" | tail -1 | sed 's/"executable":"//; s/"$//')
    if [ -z "$test_exe" ] || [ ! -x "$test_exe" ]; then
        # shellcheck disable=SC2086
        cargo test --release --features "$feature" $target --no-run   # show the errors
        echo "gpu-check: could not build the $target tests" >&2
        return 1
    fi
    cp "$test_exe" "$BIN_DIR/$name"
}

build() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
    mkdir -p "$BIN_DIR"
    cargo build --release --features cuda --lib --bin pccl-gpu-bench --bin pccl-bench || return 1
    copy_test cuda "--test cuda_kernels" cuda_kernels cuda_kernels || return 1
    copy_test cuda "--test cuda_collectives" cuda_collectives cuda_collectives || return 1
    copy_test cuda "--lib" lib_cuda pccl || return 1
    cp "$CARGO_TARGET_DIR/release/pccl-gpu-bench" "$BIN_DIR/pccl-gpu-bench"
    cp "$CARGO_TARGET_DIR/release/pccl-bench" "$BIN_DIR/pccl-bench"
    cp "$CARGO_TARGET_DIR/release/libpccl.so" "$BIN_DIR/libpccl.so"
    if command -v strip >/dev/null; then
        strip "$BIN_DIR/cuda_kernels" "$BIN_DIR/cuda_collectives" "$BIN_DIR/lib_cuda" \
            "$BIN_DIR/pccl-gpu-bench" "$BIN_DIR/pccl-bench" "$BIN_DIR/libpccl.so"
    fi
    ls -l "$BIN_DIR"
}

# --rocm: build with the rocm feature, then the ROCm checks on the real runtime.
rocm_check() {
    BIN_DIR=out/gpu-check-rocm
    if [ "$mode" != run ]; then
        if ! command -v cargo >/dev/null; then
            [ "$mode" = build ] && { echo "gpu-check: --build-only needs cargo" >&2; return 1; }
        else
            export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
            mkdir -p "$BIN_DIR"
            cargo build --release --features rocm --lib --bin pccl-bench || return 1
            copy_test rocm "--test rocm_fake" rocm_suite rocm_fake || return 1
            copy_test rocm "--test hip_loading" hip_loading hip_loading || return 1
            copy_test rocm "--test rocm_fake_async" rocm_async rocm_fake_async || return 1
            cp "$CARGO_TARGET_DIR/release/pccl-bench" "$BIN_DIR/pccl-bench"
            cp "$CARGO_TARGET_DIR/release/libpccl.so" "$BIN_DIR/libpccl.so"
            ls -l "$BIN_DIR"
        fi
        [ "$mode" = build ] && return 0
    fi
    local b
    for b in rocm_suite rocm_async hip_loading pccl-bench; do
        if [ ! -x "$BIN_DIR/$b" ]; then
            echo "gpu-check: $BIN_DIR/$b is missing: run scripts/gpu-check.sh --rocm --build-only where cargo is" >&2
            return 1
        fi
    done
    local log="${OUT:-$BIN_DIR/logs}" rocm_lib="${ROCM_PATH:-/opt/rocm}/lib" st=0 ngpu
    mkdir -p "$log"
    # The real libraries: the environment's, else ROCm's own folder.
    [ -z "${PCCL_HIP_LIBRARY:-}" ] && [ -e "$rocm_lib/libamdhip64.so" ] && export PCCL_HIP_LIBRARY="$rocm_lib/libamdhip64.so"
    [ -z "${PCCL_HIPRTC_LIBRARY:-}" ] && [ -e "$rocm_lib/libhiprtc.so" ] && export PCCL_HIPRTC_LIBRARY="$rocm_lib/libhiprtc.so"
    [ -z "${PCCL_RCCL_LIBRARY:-}" ] && [ -e "$rocm_lib/librccl.so" ] && export PCCL_RCCL_LIBRARY="$rocm_lib/librccl.so"
    ngpu=$(rocm-smi --showid 2>/dev/null | grep -c 'GPU\[' || true)
    [ "${ngpu:-0}" -gt 0 ] || ngpu=1
    {
        echo "## gpu-check --rocm $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
        echo "## git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
        rocm-smi --showproductname 2>&1 || echo "rocm-smi: not available"
        echo "HIP=${PCCL_HIP_LIBRARY:-search} HIPRTC=${PCCL_HIPRTC_LIBRARY:-search} RCCL=${PCCL_RCCL_LIBRARY:-search} GPUs=$ngpu"
    } 2>&1 | tee "$log/rocm-env.log"
    echo "## rocm: every collective on the real runtime ($BIN_DIR/rocm_suite, PCCL_ROCM_REAL=1)"
    PCCL_ROCM_REAL=1 "$BIN_DIR/rocm_suite" --nocapture --test-threads=1 2>&1 | tee "$log/rocm-tests.log" || st=1
    # Collectives queued on a caller's HIP stream (hipStreamWaitValue32 gate), not blocking.
    PCCL_ROCM_REAL=1 "$BIN_DIR/rocm_async" --nocapture --test-threads=1 2>&1 | tee -a "$log/rocm-tests.log" || st=1
    "$BIN_DIR/hip_loading" --nocapture 2>&1 | tee -a "$log/rocm-tests.log" || st=1
    echo "## rocm: pccl-bench -d rocm (host-staged; RCCL level; one rank per GCD with the RCCL column)"
    {
        PCCL_NCCL=0 "$BIN_DIR/pccl-bench" -d rocm --ranks 2 --check --coll all -m 1K:64M &&
        PCCL_NCCL=1 "$BIN_DIR/pccl-bench" -d rocm --ranks "$ngpu" --check --coll all -m 1K:256M &&
        PCCL_RANKS_PER_NODE=1 "$BIN_DIR/pccl-bench" -d gpu --ranks 2 --check --coll all -m 1K:64M
    } 2>&1 | tee "$log/rocm-bench.log" || st=1
    echo "## gpu-check --rocm: $([ $st = 0 ] && echo all checks passed || echo SOME CHECKS FAILED)"
    return $st
}

if [ "$rocm" = 1 ]; then
    rocm_check
    exit $?
fi

if [ "$mode" = build ]; then
    build
    exit $?
fi
if [ "$mode" = auto ]; then
    if command -v cargo >/dev/null; then mode=build_and_run; else mode=run; fi
fi
if [ "$mode" = build_and_run ]; then
    build || exit 1
fi
for b in cuda_kernels cuda_collectives lib_cuda pccl-gpu-bench pccl-bench libpccl.so; do
    if [ ! -x "$BIN_DIR/$b" ]; then
        echo "gpu-check: $BIN_DIR/$b is missing: run scripts/gpu-check.sh --build-only where cargo is" >&2
        exit 1
    fi
done

LOG_DIR="${OUT:-$BIN_DIR/logs}"
mkdir -p "$LOG_DIR"

# NVRTC: cudarc looks for libnvrtc.so or libnvrtc.so.12 on the loader path. Add the folders
# that hold a libnvrtc, and where only another major version is installed (libnvrtc.so.13),
# an unversioned link to it in a folder of our own.
nvrtc_dirs=()
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' -not -name '*builtins*' -not -name '*alt*' \
             -not -path '*/stubs/*' -printf '%h\n' 2>/dev/null | sort -u); do
    # Never the toolkit's stubs folder: its libcuda.so is a stub that cannot run anything.
    case "$d" in */stubs|*/stubs/*) continue ;; esac
    case " ${nvrtc_dirs[*]:-} " in *" $d "*) continue ;; esac
    if [ -d "$d" ] && ls "$d"/libnvrtc.so* >/dev/null 2>&1; then nvrtc_dirs+=("$d"); fi
done
link_dir="${TMPDIR:-/tmp}/pccl-nvrtc-link"
if [ ${#nvrtc_dirs[@]} -gt 0 ]; then
    first="${nvrtc_dirs[0]}"
    if [ ! -e "$first/libnvrtc.so" ] && [ ! -e "$first/libnvrtc.so.12" ]; then
        real=$(ls "$first"/libnvrtc.so.* 2>/dev/null | grep -v builtins | head -1)
        if [ -n "$real" ]; then
            mkdir -p "$link_dir" && ln -sf "$real" "$link_dir/libnvrtc.so"
            nvrtc_dirs=("$link_dir" "${nvrtc_dirs[@]}")
        fi
    fi
fi
extra=$(IFS=:; echo "${nvrtc_dirs[*]:-}")
export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    export PCCL_REQUIRE_CUDA=1
fi
# NCCL: its soname is libnccl.so.2; PyTorch's pip wheels keep it in site-packages/nvidia/nccl.
if [ -z "${PCCL_NCCL_LIBRARY:-}" ]; then
    nccl=$(python3 -c 'import nvidia.nccl, os, glob; d = list(nvidia.nccl.__path__)[0]; print((glob.glob(os.path.join(d, "lib", "libnccl.so*")) or [""])[0])' 2>/dev/null)
    [ -z "$nccl" ] && nccl=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libnccl.so.2' | head -1)
    [ -n "$nccl" ] && export PCCL_NCCL_LIBRARY="$nccl"
fi
[ -n "${PCCL_NCCL_LIBRARY:-}" ] && [ -n "${PCCL_REQUIRE_CUDA:-}" ] && export PCCL_REQUIRE_NCCL=1

{
    echo "## gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "## git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
    uname -srm
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || echo "nvidia-smi: not available"
    echo "libcuda: $(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libcuda.so[^ ]*' | head -2 | tr '\n' ' ')"
    echo "libnvrtc dirs: ${extra:-none}"
    for d in "${nvrtc_dirs[@]:-}"; do [ -n "$d" ] && ls -l "$d"/libnvrtc.so* 2>/dev/null; done
    echo "PCCL_REQUIRE_CUDA=${PCCL_REQUIRE_CUDA:-0} PCCL_NCCL_LIBRARY=${PCCL_NCCL_LIBRARY:-none}"
} 2>&1 | tee "$LOG_DIR/env.log"

status=0
echo "## tests: $BIN_DIR/cuda_kernels --nocapture"
"$BIN_DIR/cuda_kernels" --nocapture 2>&1 | tee "$LOG_DIR/tests.log" || status=1
echo "## tests: $BIN_DIR/cuda_collectives --nocapture"
"$BIN_DIR/cuda_collectives" --nocapture 2>&1 | tee "$LOG_DIR/collectives.log" || status=1
echo "## tests: $BIN_DIR/lib_cuda device:: comm:: (the library's unit tests with the cuda feature)"
"$BIN_DIR/lib_cuda" device:: comm:: 2>&1 | tee "$LOG_DIR/lib.log" || status=1
echo "## bench: $BIN_DIR/pccl-gpu-bench ${bench_args[*]:-}"
"$BIN_DIR/pccl-gpu-bench" "${bench_args[@]}" 2>&1 | tee "$LOG_DIR/bench.log" || status=1
echo "## device bench: $BIN_DIR/pccl-gpu-bench staged ${DEVICE_BENCH_ARGS:-}"
# shellcheck disable=SC2086
"$BIN_DIR/pccl-gpu-bench" staged ${DEVICE_BENCH_ARGS:-} 2>&1 | tee "$LOG_DIR/device-bench.log" || status=1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "${ngpu:-0}" -gt 0 ] || ngpu=1
echo "## pccl-bench -d cuda (NCCL level off; on with one rank per node; one rank per GPU, NCCL column)"
{
    PCCL_NCCL=0 "$BIN_DIR/pccl-bench" -d cuda --ranks 2 --check --coll all -m 1K:64M &&
    PCCL_RANKS_PER_NODE=1 "$BIN_DIR/pccl-bench" -d cuda --ranks 2 --check --coll all -m 1K:64M &&
    "$BIN_DIR/pccl-bench" -d cuda --ranks "$ngpu" --check --coll all -m 1K:256M
} 2>&1 | tee "$LOG_DIR/pccl-bench-cuda.log" || status=1
echo "## torch backend on CUDA tensors (ffi/python/tests/test_cuda.py)"
if python3 -c 'import torch, pytest; assert torch.cuda.is_available()' 2>/dev/null; then
    PCCL_LIBRARY="$PWD/$BIN_DIR/libpccl.so" PYTHONUNBUFFERED=1 \
        python3 -m pytest -q -s ffi/python/tests/test_cuda.py -p no:cacheprovider 2>&1 \
        | tee "$LOG_DIR/torch-cuda.log" || status=1
else
    echo "skipped: python3 has no torch with CUDA (or no pytest)" | tee "$LOG_DIR/torch-cuda.log"
fi
echo "## FSDP2 harness on CUDA tensors (train_fsdp.py --device cuda --compare, $ngpu rank(s))"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    PCCL_LIBRARY="$PWD/$BIN_DIR/libpccl.so" PYTHONUNBUFFERED=1 \
        python3 -m torch.distributed.run --nproc-per-node "$ngpu" \
        ffi/python/examples/train_fsdp.py --device cuda --compare --steps 10 2>&1 \
        | tee "$LOG_DIR/fsdp-cuda.log" || status=1
else
    echo "skipped: python3 has no torch with CUDA" | tee "$LOG_DIR/fsdp-cuda.log"
fi
echo "## gpu-check: $([ $status = 0 ] && echo all checks passed || echo SOME CHECKS FAILED)"
exit $status
