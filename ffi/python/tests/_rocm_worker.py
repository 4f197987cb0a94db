"""Per-rank body of test_rocm.py: the backend on "HIP tensors" of the fake ROCm runtime.

torch's runtime detection is stubbed here only: ``torch.version.hip`` is set (as on torch's
ROCm build) or cleared, and the backend's device seams are pointed at the fake runtime: CPU
tensors count as device tensors (the fake's device memory is host memory) and the current
stream is a stream of the fake (``hipStreamCreate``). With ``PCCL_DEVICE_RUNTIME=cuda`` in the
environment, a collective reaches the fake only if the backend told the library the stream is
a HIP stream; otherwise the library takes it for a CUDA stream and fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ffi/python, for `import pccl`

import pccl.torch as pt  # noqa: E402  (registers "pccl")

N = 1000


def main(rank, world, init, outdir, mode):
    report = {"checks": 0, "failures": [], "errors": []}
    try:
        fake = ctypes.CDLL(os.environ["PCCL_HIP_LIBRARY"])
        assert fake.hipSetDevice(rank % 2) == 0
        stream = ctypes.c_void_p()
        assert fake.hipStreamCreate(ctypes.byref(stream)) == 0
        torch.version.hip = "6.2.41133-fake" if mode == "hip" else None
        pt._is_device = lambda dev: True
        pt._device_context = lambda dev: contextlib.nullcontext()
        pt._stream_of = lambda dev: stream.value
        dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world)

        def synced():
            # The collective is queued on the stream: wait for it as torch.cuda would.
            assert fake.hipStreamSynchronize(stream) == 0

        def check(what, got, want):
            report["checks"] += 1
            if not torch.equal(got, want):
                report["failures"].append(f"{what}: got {got[:4].tolist()}..., "
                                          f"want {want[:4].tolist()}...")

        total = sum(range(1, world + 1))
        for rep in range(2):  # the first call of a shape blocks, the second is queued
            try:
                t = torch.full((N,), float(rank + 1))
                dist.all_reduce(t)
                synced()
                check(f"all_reduce #{rep}", t, torch.full((N,), float(total)))
                inp = torch.arange(N, dtype=torch.int32) + rank * N
                out = torch.zeros(N * world, dtype=torch.int32)
                dist.all_gather_into_tensor(out, inp)
                synced()
                check(f"all_gather #{rep}", out, torch.arange(N * world, dtype=torch.int32))
                big = torch.ones(N * world, dtype=torch.float64) * (rank + 1)
                part = torch.zeros(N, dtype=torch.float64)
                dist.reduce_scatter_tensor(part, big)
                synced()
                check(f"reduce_scatter #{rep}", part,
                      torch.full((N,), float(total), dtype=torch.float64))
                b = torch.full((N,), float(rank)) if rank == world - 1 else torch.zeros(N)
                dist.broadcast(b, src=world - 1)
                synced()
                check(f"broadcast #{rep}", b, torch.full((N,), float(world - 1)))
            except Exception as e:  # noqa: BLE001
                report["errors"].append(f"{type(e).__name__}: {e}")
                break
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        report["failures"].append(traceback.format_exc())
    with open(os.path.join(outdir, f"rocm{rank}.json"), "w") as f:
        json.dump(report, f)
