"""The torch backend's costs, pccl vs gloo in one job: per-call overhead and four collectives.

    torchrun --nproc-per-node 4 ffi/python/examples/bench_backend.py
    torchrun --nproc-per-node 4 ffi/python/examples/bench_backend.py --sizes 1K,64K,16M --json-out r.json

1. Per-call overhead: an all_reduce of one float32 element through ``dist.all_reduce`` on a
   pccl group, through the C ABI directly (``pcclAllReduce`` via ctypes on the same
   communicator, blocking, no torch), and through ``dist.all_reduce`` on gloo. The difference
   between the first two is what the Python backend adds per call.
2. all_gather_into_tensor, reduce_scatter_tensor, all_reduce and all_to_all_single at each
   size (bytes of the per-rank tensor: the all-gather input, the reduce-scatter output, the
   all-reduce buffer, the all-to-all input), float32, pccl and gloo alternating.

Timing: ``--reps`` batches of calls (each batch as many calls as fill about 20 ms, at least
one), a barrier before each batch; a batch's time per call is its mean; a rank's figure is the
median over its batches; the printed figure is the slowest rank's median. ``ratio`` is
gloo / pccl (above 1: pccl is faster). Every collective is checked once against gloo
(integer-valued data).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ffi/python, for `pccl`
import pccl.torch as pt  # noqa: E402
from pccl import _lib  # noqa: E402


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def median_time(fn, reps, sync_group):
    """The slowest rank's median per-call time (s) of ``fn``, over ``reps`` batches."""
    fn()  # warm-up (plans, buffers)
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    b = torch.tensor([max(1, min(1000, int(0.02 / one)))], dtype=torch.int64)
    dist.all_reduce(b, op=dist.ReduceOp.MIN, group=sync_group)  # every rank: the same calls
    batch = int(b.item())
    per_call = []
    for _ in range(reps):
        dist.barrier(group=sync_group)
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter() - t0) / batch)
    med = torch.tensor([statistics.median(per_call)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=sync_group)
    return med.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1K,16M", help="per-rank tensor bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=15, help="batches per figure")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    gloo = dist.group.WORLD
    pg = dist.new_group(list(range(p)), backend="pccl")
    be = pg if isinstance(pg, pt.PcclBackend) else pg._get_backend(torch.device("cpu"))
    rows = []

    def out(row):
        rows.append(row)
        if rank == 0:
            print(f"  {row['what']:<24} {row['size']:>8} {row['gloo_us']:>10.1f} "
                  f"{row['pccl_us']:>10.1f} {row['ratio']:>7.2f}x {row.get('check', '')}",
                  flush=True)

    # 1. per-call overhead
    x = torch.ones(1)
    lib, handle = _lib.lib(), be._comm.handle
    ptr = x.data_ptr()

    def c_call():
        code = lib.pcclAllReduce(ptr, ptr, 1, _lib.pcclFloat32, _lib.pcclSum, handle, None)
        if code:
            _lib.check("pcclAllReduce", code, handle)

    t_c = median_time(c_call, args.reps, gloo)
    t_t = median_time(lambda: dist.all_reduce(x, group=pg), args.reps, gloo)
    t_g = median_time(lambda: dist.all_reduce(x, group=gloo), args.reps, gloo)
    if rank == 0:
        print(f"# pccl torch backend, {p} ranks, torch {torch.__version__}, libpccl "
              f"{_lib.library_path()}")
        print(f"# per-call: all_reduce of 1 float32 (median us, slowest rank)")
        print(f"  C ABI pcclAllReduce (ctypes) {t_c * 1e6:9.1f}")
        print(f"  dist.all_reduce on pccl      {t_t * 1e6:9.1f}   (+{(t_t - t_c) * 1e6:.1f} us "
              "Python backend and torch dispatch)")
        print(f"  dist.all_reduce on gloo      {t_g * 1e6:9.1f}")
        print(f"# {'collective':<24} {'bytes':>8} {'gloo us':>10} {'pccl us':>10} "
              f"{'gloo/pccl':>8}")
    rows.append({"what": "overhead", "c_us": t_c * 1e6, "torch_pccl_us": t_t * 1e6,
                 "gloo_us": t_g * 1e6})

    # 2. collectives
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        n = max(p, size // 4 // p * p)  # elements, a multiple of p
        label = args.sizes.split(",")[[parse_size(s) for s in args.sizes.split(",")].index(size)]
        inp = (torch.arange(n, dtype=torch.int64) % 251 + rank).to(torch.float32)
        big = (torch.arange(n * p, dtype=torch.int64) % 127 + rank).to(torch.float32)
        cases = {
            "all_gather_into_tensor": (
                lambda o, g: dist.all_gather_into_tensor(o, inp, group=g),
                lambda: torch.empty(n * p)),
            "reduce_scatter_tensor": (
                lambda o, g: dist.reduce_scatter_tensor(o, big, group=g),
                lambda: torch.empty(n)),
            "all_reduce": (
                lambda o, g: (o.copy_(inp), dist.all_reduce(o, group=g)),
                lambda: torch.empty(n)),
            "all_to_all_single": (
                lambda o, g: dist.all_to_all_single(o, inp, group=g),
                lambda: torch.empty(n)),
        }
        for what, (call, alloc) in cases.items():
            op_, og = alloc(), alloc()
            call(op_, pg)
            call(og, gloo)
            ok = torch.equal(op_, og)
            tg = median_time(lambda: call(og, gloo), args.reps, gloo)
            tp = median_time(lambda: call(op_, pg), args.reps, gloo)
            out({"what": what, "size": label, "bytes": n * 4, "gloo_us": tg * 1e6,
                 "pccl_us": tp * 1e6, "ratio": tg / tp, "check": "ok" if ok else "WRONG"})
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": p, "torch": torch.__version__, "rows": rows}, f, indent=1)
    bad = [r for r in rows if r.get("check") == "WRONG"]
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
