"""The torch backend "pccl" on CUDA tensors: against torch's nccl at world size 1, and worlds
of 2 and 3 processes sharing one GPU. Skipped (saying why) where torch sees no CUDA device or
libpccl was built without CUDA."""

import os

import pytest
import torch

import _cuda_worker
from _spawn import failures, reports, run_ranks

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "300"))


def _skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    import pccl._lib as L
    import ctypes
    # A zero-count call with a stream is a no-op on a CUDA build and an error otherwise.
    comm = L.Communicator.init_rank(1, L.get_unique_id(), 0)
    try:
        code = L.lib().pcclAllReduce(None, None, 0, L.pcclFloat32, L.pcclSum, comm.handle,
                                     ctypes.c_void_p(1))
    finally:
        comm.destroy()
    if code != 0:
        return f"libpccl at {L.library_path()} was built without CUDA ({L.last_error()})"
    return None


def _run(world, mode, tmp_path):
    why = _skip_reason()
    if why:
        print(f"skipped: {why}")
        pytest.skip(why)
    init = f"file://{tmp_path}/rendezvous"
    err, took = run_ranks(_cuda_worker.main, world, (world, init, str(tmp_path), mode),
                          TIMEOUT_S, poll_s=5)
    reps = reports(tmp_path, world, name="cuda{r}.json")
    checks = sum(r["checks"] for r in reps)
    print(f"{mode} world {world}: {checks} checks in {took:.1f}s")
    fails = failures(reps)
    assert not fails and err is None, "\n".join(fails[:30]) + f"\n{err or ''}"
    assert checks > 0


def test_cuda_tensors_match_torch_nccl_world_1(tmp_path):
    _run(1, "vs_nccl", tmp_path)


@pytest.mark.parametrize("world,device_async", [(2, None), (3, "1")])
def test_cuda_tensors_world_sharing_one_gpu(world, device_async, tmp_path, monkeypatch):
    """Ranks sharing the GPU block by default (no stream gate: FSDP2's interleaved shapes
    hung there); world 3 queues on the gate anyway (PCCL_DEVICE_ASYNC=1), which this
    pattern survives, so the gate keeps a test across processes on a real GPU."""
    if device_async is not None:
        monkeypatch.setenv("PCCL_DEVICE_ASYNC", device_async)
    _run(world, "world", tmp_path)
