#!/usr/bin/env bash
# The Python side: the torch.distributed backend "pccl" (ffi/python) against gloo, and the
# FSDP2 harness with both backends. Installs the Python packages it needs with pip (torch,
# pytest, numpy; deepspeed optionally), builds libpccl.so (cargo build --release --features
# mpi,rocm, or PCCL_TEST_FEATURES), installs ffi/python in editable mode and runs pytest on the newest torch; then runs the
# subset that depends on torch's version (backend ops, Work lifetime, timeouts, FSDP2 /
# DeviceMesh / functional collectives, point-to-point and all-to-all, shrink; one world each)
# again on torch 2.11 (the Python-ProcessGroup code path),
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
# PCCL_TEST_FEATURES and PCCL_TEST_PREBUILT=1: its `cargo test` already built libpccl.so with
# those features, and `cargo build` would compile the crate again (about 2 minutes) only
# because the test build unifies the dev-dependencies' features into shared crates.
features="${PCCL_TEST_FEATURES:-mpi,rocm}"
export CARGO_TERM_COLOR=never
target_dir="${CARGO_TARGET_DIR:-$root/target}"
lib="$target_dir/release/libpccl.so"
# `cargo test` leaves the library it built in deps/ (cargo copies it up to release/ only for
# a `cargo build`); test_library_loads checks its features either way.
if [ "${PCCL_TEST_PREBUILT:-0}" = 1 ] && [ -f "$target_dir/release/deps/libpccl.so" ]; then
  lib="$target_dir/release/deps/libpccl.so"
  echo "== $lib from the cargo test build (features $features)"
else
  echo "== cargo build --release --features $features"
  cargo build --release --features "$features"
fi
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
    # One world per parametrized family (the newest-torch run above covers the others):
    # what differs on 2.11 is the Python ProcessGroup path, not the rank count.
    (cd ffi/python && "$py211" -m pytest -v -s -p no:cacheprovider \
      "tests/test_work.py::test_work_lifetime[4]" \
      tests/test_work.py::test_init_timeout_reaches_communicator \
      tests/test_work.py::test_set_timeout_reaches_every_call tests/test_work.py::test_peer_dies \
      "tests/test_work.py::test_fsdp2_device_mesh_functional[4]" \
      tests/test_work.py::test_timeout_env_restored "tests/test_p2p.py::test_p2p_alltoall_rooted[3]" \
      "tests/test_rocm.py::test_hip_tensors_route_to_the_hip_path[2]" \
      tests/test_rocm.py::test_async_op_leaves_the_stream_free_until_wait \
      tests/test_rocm.py::test_rooted_all_to_all_and_p2p_queue_on_device_memory \
      tests/test_rocm.py::test_cuda_tensors_are_not_sent_to_the_hip_path tests/test_shrink.py \
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
