"""all_gather_into_tensor / reduce_scatter_tensor through torch.distributed: pccl vs gloo.

    torchrun --nproc-per-node 4 ffi/python/examples/bench_torch.py
    PCCL_RANKS_PER_NODE=2 torchrun --nproc-per-node 4 ffi/python/examples/bench_torch.py

Both backends run in the same job on the same buffers: the default group is gloo and a pccl
group spans the same ranks. Sizes are bytes per rank (the all-gather input, the
reduce-scatter output), float32, doubling over ``--min-mib``..``--max-mib`` MiB. The time of one
call is the slowest rank's mean over ``--iters`` calls after ``--warmup``; algbw is the
whole buffer (size x ranks) over that time and busbw = algbw (n-1)/n, as nccl-tests define
them. Every size is checked once: the pccl result must equal gloo's (integer-valued data).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ffi/python, for `pccl`
import pccl.torch  # noqa: E402,F401


def timed(fn, iters, warmup, group):
    for _ in range(warmup):
        fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
    return dt.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-mib", type=float, default=4, help="MiB per rank")
    ap.add_argument("--max-mib", type=float, default=64, help="MiB per rank")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--op", default="sum", choices=["sum", "avg"])
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.group.WORLD
    pg = dist.new_group(list(range(world)), backend="pccl")
    op = dist.ReduceOp.SUM if args.op == "sum" else dist.ReduceOp.AVG

    sizes = []
    s = args.min_mib
    while s <= args.max_mib + 1e-9:
        sizes.append(s)
        s *= 2
    rows = []
    if rank == 0:
        print(f"# torch.distributed all_gather_into_tensor / reduce_scatter_tensor, {world} ranks,"
              f" PCCL_RANKS_PER_NODE={os.environ.get('PCCL_RANKS_PER_NODE', 'unset')}, float32",
              flush=True)
        print(f"# {'coll':<14} {'MiB/rank':>8} {'gloo ms':>9} {'pccl ms':>9} {'gloo busbw':>10} "
              f"{'pccl busbw':>10} {'speedup':>8} check", flush=True)
    for mib in sizes:
        n = int(mib * (1 << 20)) // 4
        inp = (torch.arange(n, dtype=torch.int64) % 251 + rank).to(torch.float32)
        out_p = torch.empty(n * world)
        out_g = torch.empty(n * world)
        big = (torch.arange(n * world, dtype=torch.int64) % 127 + rank).to(torch.float32)
        rs_p = torch.empty(n)
        rs_g = torch.empty(n)
        # correctness once
        dist.all_gather_into_tensor(out_p, inp, group=pg)
        dist.all_gather_into_tensor(out_g, inp, group=gloo)
        ok_ag = torch.equal(out_p, out_g)
        dist.reduce_scatter_tensor(rs_p, big, op=dist.ReduceOp.SUM, group=pg)
        dist.reduce_scatter_tensor(rs_g, big, op=dist.ReduceOp.SUM, group=gloo)
        ok_rs = torch.equal(rs_p, rs_g)
        iters = args.iters if mib < 32 else max(2, args.iters // 2)
        for coll, ok, fp, fg in [
            ("all_gather", ok_ag,
             lambda: dist.all_gather_into_tensor(out_p, inp, group=pg),
             lambda: dist.all_gather_into_tensor(out_g, inp, group=gloo)),
            ("reduce_scatter", ok_rs,
             lambda: dist.reduce_scatter_tensor(rs_p, big, op=op, group=pg),
             # gloo has no AVG: SUM is the same traffic
             lambda: dist.reduce_scatter_tensor(rs_g, big, op=dist.ReduceOp.SUM, group=gloo)),
        ]:
            tg = timed(fg, iters, args.warmup, gloo)
            tp = timed(fp, iters, args.warmup, gloo)
            whole = n * 4 * world
            bus = (world - 1) / world
            row = {"coll": coll, "mib_per_rank": mib, "gloo_ms": tg * 1e3, "pccl_ms": tp * 1e3,
                   "gloo_busbw_GBs": whole / tg * bus / 1e9, "pccl_busbw_GBs": whole / tp * bus / 1e9,
                   "speedup": tg / tp, "check": bool(ok)}
            rows.append(row)
            if rank == 0:
                print(f"  {coll:<14} {mib:>8g} {tg * 1e3:>9.2f} {tp * 1e3:>9.2f} "
                      f"{row['gloo_busbw_GBs']:>10.2f} {row['pccl_busbw_GBs']:>10.2f} "
                      f"{row['speedup']:>7.2f}x {'ok' if ok else 'WRONG'}", flush=True)
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world": world, "ranks_per_node": os.environ.get("PCCL_RANKS_PER_NODE"),
                       "rows": rows}, f, indent=1)
    bad = [r for r in rows if not r["check"]]
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
