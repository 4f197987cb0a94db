#!/usr/bin/env bash
# The Python side: the torch.distributed backend "pccl" (ffi/python) against gloo, and the
# FSDP2 harness with both backends. Installs the Python packages it needs with pip (torch,
# pytest, numpy; deepspeed optionally), builds libpccl.so (cargo build --release --features
# mpi,rocm, or PCCL_TEST_FEATURES), installs ffi/python in editable mode and runs pytest on the newest torch; then runs the
# subset that depends on torch's version (backend ops, Work lifetime, timeouts, FSDP2 /
# DeviceMesh / functional collectives, point-to-point and all-to-all, shrink) again on torch 2.11 (the Python-ProcessGroup code path),
# in a virtual environment kept at $PCCL_TORCH211_VENV (default ~/.cache/pccl/venv-torch2.11).
# PCCL_SKIP_TORCH211=1 skips that run; PCCL_TEST_WHEEL=1 also builds the wheel
# (pip wheel ./ffi/python, the features scripts/features.sh finds) and checks libpccl.so is inside. Exits
# non-zero on any failure, including pytest finding no tests (exit 5).
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

# rocm: test_rocm.py (fake runtime, no GPU). scripts/test.sh passes its own feature set in
# PCCL_TEST_FEATURES, so the library its cargo test built is reused instead of rebuilt.
features="${PCCL_TEST_FEATURES:-mpi,rocm}"
echo "== cargo build --release --features $features"
export CARGO_TERM_COLOR=never
cargo build --release --features "$features"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
lib="$target_dir/release/libpccl.so"
[ -f "$lib" ] || { echo "test-python: $lib was not built" >&2; exit 1; }
export PCCL_LIBRARY="$lib"
echo "PCCL_LIBRARY=$PCCL_LIBRARY"

echo "== pip install -e ffi/python"
pipi -e ffi/python --no-deps --no-build-isolation 2>/dev/null || pipi -e ffi/python --no-deps
"$PYTHON" -c "import pccl, pccl.torch, torch.distributed as d; print('pccl', pccl.version(), pccl.library_path(), d.Backend.PCCL)"

echo "== pytest ffi/python/tests (torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
t0=$SECONDS
set +e
(cd ffi/python && "$PYTHON" -m pytest -v -s -p no:cacheprovider tests "$@")
rc=$?
set -e
echo "test-python: newest torch: pytest exit $rc in $((SECONDS - t0)) s"
if [ "$rc" = 5 ]; then
  echo "test-python: pytest collected no tests" >&2
  exit 1
fi

rc211=0
if [ "${PCCL_SKIP_TORCH211:-0}" != 1 ]; then
  echo "== torch 2.11 (Python ProcessGroup path)"
  venv="${PCCL_TORCH211_VENV:-$HOME/.cache/pccl/venv-torch2.11}"
  py211="$venv/bin/python"
  if ! "$py211" -c "import torch, pytest, numpy; assert torch.__version__.startswith('2.11')" 2>/dev/null; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$PYTHON" -m venv "$venv" && "$py211" -m pip install -q --disable-pip-version-check \
      "torch==2.11.*" pytest numpy || true
  fi
  if "$py211" -c "import torch, pytest, numpy; assert torch.__version__.startswith('2.11')" 2>/dev/null; then
    t0=$SECONDS
    set +e
    (cd ffi/python && "$py211" -m pytest -v -s -p no:cacheprovider \
      tests/test_work.py tests/test_p2p.py tests/test_rocm.py tests/test_shrink.py \
      "tests/test_backend.py::test_collectives_match_gloo[3]" \
      tests/test_backend.py::test_import_registers_backend tests/test_backend.py::test_library_loads)
    rc211=$?
    set -e
    echo "test-python: torch 2.11: pytest exit $rc211 in $((SECONDS - t0)) s"
  else
    echo "########################################################################" >&2
    echo "test-python: COULD NOT INSTALL torch==2.11.* in $venv: the torch 2.11 run" >&2
    echo "test-python: (Python ProcessGroup code path) was NOT TESTED" >&2
    echo "########################################################################" >&2
  fi
fi

if [ "${PCCL_TEST_WHEEL:-0}" = 1 ]; then
  echo "== pip wheel ./ffi/python (cargo build with the features scripts/features.sh finds)"
  whl="$(mktemp -d)"
  "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps -w "$whl" ./ffi/python
  "$PYTHON" -m zipfile -l "$whl"/pccl-*.whl | grep -q "pccl/libpccl.so" \
    || { echo "test-python: libpccl.so is not in the wheel" >&2; exit 1; }
  echo "test-python: wheel $(ls "$whl") holds pccl/libpccl.so"
  rm -rf "$whl"
fi
[ "$rc" = 0 ] || exit "$rc"
exit "$rc211"
