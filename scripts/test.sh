#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests (thread-ranks, symbolic
# plan checks, MPI processes under mpiexec, the benchmark CLI, the C ABI). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TERM_COLOR=never
features="mpi,cuda,rocm,hwloc,ofi"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (features: $features)"
cargo clippy --release --all-targets --features "$features" -- -D warnings
echo "== cargo test (features: $features)"
cargo test --release --features "$features" 2>&1
echo "== python: torch.distributed backend, FSDP2 harness"
# The same features as the cargo test build above: libpccl.so is already built, not rebuilt.
PCCL_TEST_FEATURES="$features" scripts/test-python.sh
