"""The torch backend on ROCm: torch's ROCm build calls HIP tensors "cuda" and sets
``torch.version.hip``; the backend must then hand the library HIP streams (not load libcuda).
Without AMD hardware: the fake ROCm runtime (tests/fake_rocm/fake_rocm.c, built here with cc)
stands in for libamdhip64/RCCL through the library's usual dlopen path, and each rank's worker
stubs torch's runtime detection (see _rocm_worker.py). ``PCCL_DEVICE_RUNTIME=cuda`` makes the
library take streams for CUDA streams unless the backend says otherwise, so a backend that did
not route to HIP fails. Skipped (saying why) without a C compiler or with a libpccl built
without ``--features rocm``."""

import os
import shutil
import subprocess

import pytest

import _rocm_worker
from _spawn import failures, reports, run_ranks

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "120"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _fake_runtime(tmp_path):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the fake ROCm runtime")
    so = os.path.join(tmp_path, "libfakerocm.so")
    src = os.path.join(REPO, "tests", "fake_rocm", "fake_rocm.c")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", so, src, "-lm", "-lpthread"],
                   check=True)
    return so


def _skip_without_rocm():
    import pccl._lib as L
    comm = L.Communicator.init_rank(1, L.get_unique_id(), 0)
    try:
        comm.set_device_runtime(L.pcclRuntimeHip)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"libpccl at {L.library_path()} cannot take HIP streams: {e}")
    finally:
        comm.destroy()


def _run(world, mode, tmp_path, monkeypatch):
    so = _fake_runtime(tmp_path)
    _skip_without_rocm()
    for k in ("PCCL_HIP_LIBRARY", "PCCL_HIPRTC_LIBRARY", "PCCL_RCCL_LIBRARY"):
        monkeypatch.setenv(k, so)
    monkeypatch.setenv("PCCL_DEVICE_RUNTIME", "cuda")
    monkeypatch.setenv("PCCL_TIMEOUT", "60")
    # The fake's RCCL joins thread ranks of one process only: host-staged between processes.
    monkeypatch.setenv("PCCL_NCCL", "0")
    monkeypatch.delenv("PCCL_HIP_ARCH", raising=False)
    init = f"file://{tmp_path}/rendezvous"
    err, took = run_ranks(_rocm_worker.main, world, (world, init, str(tmp_path), mode),
                          TIMEOUT_S)
    reps = reports(tmp_path, world, name="rocm{r}.json", missing=False)
    assert len(reps) == world, f"{world - len(reps)} rank(s) wrote no report ({err})"
    print(f"{mode} world {world}: {sum(r['checks'] for r in reps)} checks, errors "
          f"{[r['errors'] for r in reps]} in {took:.1f}s")
    assert err is None, err
    fails = failures(reps)
    assert not fails, "\n".join(fails)
    return reps


@pytest.mark.parametrize("world", [1, 2])
def test_hip_tensors_route_to_the_hip_path(world, tmp_path, monkeypatch):
    reports = _run(world, "hip", tmp_path, monkeypatch)
    for r, rep in enumerate(reports):
        assert not rep["errors"], f"rank {r}: {rep['errors']}"
        assert rep["checks"] == 8, f"rank {r}: {rep['checks']} checks"


def test_async_op_leaves_the_stream_free_until_wait(tmp_path, monkeypatch):
    # torch's stream semantics (ProcessGroupNCCL's) on the fake runtime's streams.
    reports = _run(2, "async", tmp_path, monkeypatch)
    for r, rep in enumerate(reports):
        assert not rep["errors"], f"rank {r}: {rep['errors']}"
        assert rep["checks"] >= 3, f"rank {r}: {rep['checks']} checks"


def test_rooted_all_to_all_and_p2p_queue_on_device_memory(tmp_path, monkeypatch):
    # reduce, gather, scatter, all-to-all (even, uneven, lists), a send/recv batch and
    # blocking send/recv, each queued on PCCL's stream (no host copies); the quantized
    # all-gather and reduce-scatter on device memory.
    reports = _run(2, "rooted", tmp_path, monkeypatch)
    for r, rep in enumerate(reports):
        assert not rep["errors"], f"rank {r}: {rep['errors']}"
        assert rep["checks"] == 11, f"rank {r}: {rep['checks']} checks"


def test_cuda_tensors_are_not_sent_to_the_hip_path(tmp_path, monkeypatch):
    # The same stubs with torch.version.hip unset: the backend says CUDA, and the library
    # (no libcuda here, or built without CUDA) refuses the stream.
    reports = _run(1, "cuda", tmp_path, monkeypatch)
    err = reports[0]["errors"]
    assert err and reports[0]["checks"] == 0, reports[0]
    assert "CUDA" in err[0] or "libcuda" in err[0], err[0]
