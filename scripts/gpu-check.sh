#!/usr/bin/env bash
# Every GPU check of PCCL in one script: the CUDA kernel tests (tests/cuda_kernels.rs, every
# dtype x op against the host reference, transposes of many shapes), the device collectives
# (tests/cuda_collectives.rs), the GPU benchmark (src/bin/pccl-gpu-bench.rs: D2D copy ceiling,
# reductions, transpose, in GB/s and % of copy) and the host-staged device reduce-scatter
# benchmark (src/bin/pccl-device-bench.rs; its arguments from $DEVICE_BENCH_ARGS).
# Run it from the repository root on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh [-- BENCH_ARGS]   build with cargo (when it is installed), then run them all
#   scripts/gpu-check.sh --build-only      build the binaries into out/gpu-check/ (release), to
#                                          carry to a GPU machine that has no Rust toolchain
#   scripts/gpu-check.sh --no-build [-- BENCH_ARGS]
#                                          run the binaries already in out/gpu-check/
# BENCH_ARGS go to pccl-gpu-bench (e.g. -- --sweep). With neither flag, the script builds when
# cargo is on PATH and otherwise runs what is in out/gpu-check/.
#
# Then pccl-bench -d cuda --check (host-staged, then with the NCCL level) and the torch backend on
# CUDA tensors (ffi/python/tests/test_cuda.py, with out/gpu-check/libpccl.so).
# Logs (tests.log, collectives.log, bench.log, device-bench.log, pccl-bench-cuda.log,
# torch-cuda.log, env.log) go to $OUT when it is set, else to out/gpu-check/logs/.
# NCCL is found through PCCL_NCCL_LIBRARY, else python's nvidia.nccl wheel, else ldconfig.
# With a GPU visible (nvidia-smi lists one), PCCL_REQUIRE_CUDA=1 makes the tests fail instead of
# skipping when CUDA cannot be used. The exit status is non-zero if any check failed.
set -uo pipefail

cd "$(dirname "$0")/.."
BIN_DIR=out/gpu-check
mode=auto
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build-only) mode=build; shift ;;
        --no-build) mode=run; shift ;;
        --) shift; bench_args=("$@"); break ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

build() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
    mkdir -p "$BIN_DIR"
    cargo build --release --features cuda --lib --bin pccl-gpu-bench --bin pccl-device-bench \
        --bin pccl-bench || return 1
    local test_exe t
    for t in cuda_kernels cuda_collectives; do
        test_exe=$(cargo test --release --features cuda --test "$t" --no-run --message-format=json 2>/dev/null \
            | grep -o "\"executable\":\"[^\"]*$t[^\"]*\"" | tail -1 | sed 's/"executable":"//; s/"$//')
        if [ -z "$test_exe" ] || [ ! -x "$test_exe" ]; then
            cargo test --release --features cuda --test "$t" --no-run   # show the errors
            echo "gpu-check: could not build the $t test" >&2
            return 1
        fi
        cp "$test_exe" "$BIN_DIR/$t"
    done
    cp "$CARGO_TARGET_DIR/release/pccl-gpu-bench" "$BIN_DIR/pccl-gpu-bench"
    cp "$CARGO_TARGET_DIR/release/pccl-device-bench" "$BIN_DIR/pccl-device-bench"
    cp "$CARGO_TARGET_DIR/release/pccl-bench" "$BIN_DIR/pccl-bench"
    cp "$CARGO_TARGET_DIR/release/libpccl.so" "$BIN_DIR/libpccl.so"
    if command -v strip >/dev/null; then
        strip "$BIN_DIR/cuda_kernels" "$BIN_DIR/cuda_collectives" "$BIN_DIR/pccl-gpu-bench" \
            "$BIN_DIR/pccl-device-bench" "$BIN_DIR/pccl-bench" "$BIN_DIR/libpccl.so"
    fi
    ls -l "$BIN_DIR"
}

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
for b in cuda_kernels cuda_collectives pccl-gpu-bench pccl-device-bench pccl-bench libpccl.so; do
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
echo "## bench: $BIN_DIR/pccl-gpu-bench ${bench_args[*]:-}"
"$BIN_DIR/pccl-gpu-bench" "${bench_args[@]}" 2>&1 | tee "$LOG_DIR/bench.log" || status=1
echo "## device bench: $BIN_DIR/pccl-device-bench ${DEVICE_BENCH_ARGS:-}"
# shellcheck disable=SC2086
"$BIN_DIR/pccl-device-bench" ${DEVICE_BENCH_ARGS:-} 2>&1 | tee "$LOG_DIR/device-bench.log" || status=1
echo "## pccl-bench -d cuda (CUDA events; NCCL level off, then on with one rank per node)"
{
    PCCL_NCCL=0 "$BIN_DIR/pccl-bench" -d cuda --ranks 2 --check --coll all -m 1K:64M &&
    PCCL_RANKS_PER_NODE=1 "$BIN_DIR/pccl-bench" -d cuda --ranks 2 --check --coll all -m 1K:64M
} 2>&1 | tee "$LOG_DIR/pccl-bench-cuda.log" || status=1
echo "## torch backend on CUDA tensors (ffi/python/tests/test_cuda.py)"
if python3 -c 'import torch, pytest; assert torch.cuda.is_available()' 2>/dev/null; then
    PCCL_LIBRARY="$PWD/$BIN_DIR/libpccl.so" PYTHONUNBUFFERED=1 \
        python3 -m pytest -q -s ffi/python/tests/test_cuda.py -p no:cacheprovider 2>&1 \
        | tee "$LOG_DIR/torch-cuda.log" || status=1
else
    echo "skipped: python3 has no torch with CUDA (or no pytest)" | tee "$LOG_DIR/torch-cuda.log"
fi
echo "## gpu-check: $([ $status = 0 ] && echo all checks passed || echo SOME CHECKS FAILED)"
exit $status
