#!/usr/bin/env bash
# The Python side: the torch.distributed backend "pccl" (ffi/python) against gloo, and the
# FSDP2 harness with both backends. Installs the Python packages it needs with pip (torch,
# pytest, numpy; deepspeed optionally), builds libpccl.so (cargo build --release --features
# mpi), installs ffi/python in editable mode and runs pytest. Exits non-zero on any failure, including
# pytest finding no tests (exit 5).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
PYTHON="${PYTHON:-python3}"
if [ -x scripts/setup.sh ]; then scripts/setup.sh; fi

echo "== python packages"
pipi() { "$PYTHON" -m pip install -q --disable-pip-version-check "$@"; }
"$PYTHON" -c "import torch" 2>/dev/null || pipi torch
"$PYTHON" -c "import pytest" 2>/dev/null || pipi pytest
"$PYTHON" -c "import numpy" 2>/dev/null || pipi numpy
# Optional: DeepSpeed (its test is skipped when it cannot be installed).
"$PYTHON" -c "import deepspeed" 2>/dev/null || pipi deepspeed || echo "test-python: deepspeed not installed; its test will be skipped"
"$PYTHON" -c "import torch; print('torch', torch.__version__)"

echo "== cargo build --release --features mpi"
export CARGO_TERM_COLOR=never
cargo build --release --features mpi
target_dir="${CARGO_TARGET_DIR:-$root/target}"
lib="$target_dir/release/libpccl.so"
[ -f "$lib" ] || { echo "test-python: $lib was not built" >&2; exit 1; }
export PCCL_LIBRARY="$lib"
echo "PCCL_LIBRARY=$PCCL_LIBRARY"

echo "== pip install -e ffi/python"
pipi -e ffi/python --no-deps --no-build-isolation 2>/dev/null || pipi -e ffi/python --no-deps
"$PYTHON" -c "import pccl, pccl.torch, torch.distributed as d; print('pccl', pccl.version(), pccl.library_path(), d.Backend.PCCL)"

echo "== pytest ffi/python/tests"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
set +e
(cd ffi/python && "$PYTHON" -m pytest -v -s -p no:cacheprovider tests "$@")
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "test-python: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
