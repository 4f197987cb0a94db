"""pccl vs gloo for all_to_all_single on CPU tensors (one host): median time per call.

    torchrun --nproc-per-node 4 ffi/python/examples/bench_alltoall.py [--sizes 1024,16777216]

Sizes are bytes per rank (each rank's whole input, float32, split evenly among the ranks).
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pccl.torch  # noqa: E402,F401


def timed(fn, iters, warmup, group):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    # the slowest rank's time per iteration
    t = torch.tensor(ts, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(t.tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,16777216", help="bytes per rank")
    ap.add_argument("--iters", type=int, default=0, help="0: 200 small / 10 large")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world, me = dist.get_world_size(), dist.get_rank()
    pg = dist.new_group(list(range(world)), backend="pccl")
    gl = dist.new_group(list(range(world)), backend="gloo")
    torch.set_num_threads(1)
    for nbytes in (int(s) for s in args.sizes.split(",")):
        n = nbytes // 4 // world * world
        inp = torch.randn(n)
        out = torch.empty(n)
        iters = args.iters or (200 if nbytes < (1 << 20) else 10)
        res = {}
        for name, grp in (("gloo", gl), ("pccl", pg)):
            res[name] = timed(lambda: dist.all_to_all_single(out, inp, group=grp), iters,
                              max(2, iters // 10), grp)
        if me == 0:
            print(f"all_to_all_single {world} ranks {nbytes} B/rank: "
                  f"gloo {res['gloo'] * 1e6:.1f} us, pccl {res['pccl'] * 1e6:.1f} us "
                  f"(gloo/pccl {res['gloo'] / res['pccl']:.2f}x)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
