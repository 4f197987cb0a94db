"""Per-rank body of the CUDA tests (spawned by test_cuda.py).

``mode == "vs_nccl"`` (world size 1): a pccl group and torch's own nccl group over the one
rank run the same collectives on the same CUDA tensors; the results must agree (inputs are
small integers, so every op is exact in every dtype except AVG, compared with a tolerance).
``mode == "world"``: every rank of a pccl world sharing the one GPU runs the collectives and
checks them against the reference each rank can rebuild from every rank's input.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ffi/python, for `import pccl`

import pccl.torch  # noqa: E402,F401  (registers "pccl")

R = dist.ReduceOp
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
          torch.int64, torch.int8, torch.uint8]
OPS = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}
SIZES = [1, 1000, 65537]


def make(rank, n, dtype, op, salt):
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    lo, hi = (1, 3) if op == "prod" else (0, 5)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def reference(inputs, op):
    acc = inputs[0].to(torch.float64)
    for t in inputs[1:]:
        t = t.to(torch.float64)
        acc = {"sum": acc + t, "avg": acc + t, "prod": acc * t,
               "min": torch.minimum(acc, t), "max": torch.maximum(acc, t)}[op]
    if op == "avg":
        acc = acc / len(inputs)
    return acc


def close(a, b, op, dtype):
    a, b = a.double().cpu(), b.double().cpu()
    if op == "exact":
        return torch.equal(a, b)
    if op == "avg" or dtype in (torch.float16, torch.bfloat16):
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        return torch.allclose(a, b, rtol=tol, atol=tol)
    return torch.equal(a, b)


def main(rank, world, init, outdir, mode):
    report = {"checks": 0, "failures": []}
    try:
        os.environ.setdefault("PCCL_TIMEOUT", "120")
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        if mode == "vs_nccl":
            # No device_id: on torch <= 2.11 (pccl as a Python ProcessGroup) new_group would
            # then ask the pccl group for a splitting backend it cannot have.
            dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
            ref_group = dist.group.WORLD
            group = dist.new_group(list(range(world)), backend="pccl")
        else:
            dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world)
            ref_group = None
            group = dist.group.WORLD
        p = world

        def check(what, got, want, op, dtype):
            report["checks"] += 1
            if not close(got, want, op, dtype):
                diff = (got.double().cpu() - want.double().cpu()).abs()
                report["failures"].append(
                    f"{what}: max abs diff {diff.max().item()} at {diff.argmax().item()}")

        salt = 0
        for dtype in DTYPES:
            for n in SIZES:
                for opname, op in OPS.items():
                    if opname == "avg" and not dtype.is_floating_point:
                        continue
                    if opname == "prod" and dtype in (torch.int8, torch.uint8) and p > 4:
                        continue
                    salt += 1
                    what = f"{dtype} n={n} {opname}"
                    ins = [make(r, n * p, dtype, opname, salt) for r in range(p)]
                    mine = ins[rank].to(dev)
                    # all_reduce
                    t = mine.clone()
                    dist.all_reduce(t, op=op, group=group)
                    if ref_group is not None:
                        w = mine.clone()
                        dist.all_reduce(w, op=op, group=ref_group)
                    else:
                        w = reference(ins, opname)
                    check(f"all_reduce {what}", t, w, opname, dtype)
                    # reduce_scatter_tensor
                    out = torch.full((n,), 77, dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(out, mine, op=op, group=group)
                    if ref_group is not None:
                        w = torch.empty_like(out)
                        dist.reduce_scatter_tensor(w, mine, op=op, group=ref_group)
                    else:
                        w = reference(ins, opname)[rank * n:(rank + 1) * n]
                    check(f"reduce_scatter {what}", out, w, opname, dtype)
                salt += 1
                part = make(rank, n, dtype, "sum", salt).to(dev)
                out = torch.full((n * p,), 77, dtype=dtype, device=dev)
                dist.all_gather_into_tensor(out, part, group=group)
                if ref_group is not None:
                    w = torch.empty_like(out)
                    dist.all_gather_into_tensor(w, part, group=ref_group)
                else:
                    w = torch.cat([make(r, n, dtype, "sum", salt) for r in range(p)])
                check(f"all_gather {dtype} n={n}", out, w, "sum", dtype)
                b = part.clone() if rank == p - 1 else torch.full_like(part, 77)
                dist.broadcast(b, src=p - 1, group=group)
                w = make(p - 1, n, dtype, "sum", salt)
                check(f"broadcast {dtype} n={n}", b, w, "sum", dtype)
        # the same shapes again and again (FSDP's pattern): after the first of each shape the
        # collectives are queued on the stream without blocking the host; read at the end
        length = 61440  # divisible by every world size up to 6
        t = torch.full((length,), 1.0, device=dev)
        shard = torch.empty(length // p, device=dev)
        for _ in range(6):
            dist.all_reduce(t, group=group)
            dist.reduce_scatter_tensor(shard, t, group=group)
        torch.cuda.synchronize()
        check("repeated all_reduce", t, torch.full((length,), float(p ** 6)), "sum",
              torch.float32)
        check("repeated reduce_scatter", shard, torch.full((length // p,), float(p ** 7)),
              "sum", torch.float32)
        # work on a side stream is ordered on that stream
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = torch.full((1 << 20,), float(rank + 1), device=dev)
            dist.all_reduce(t, group=group)
            t2 = t * 2
        s.synchronize()
        check("all_reduce on a side stream", t2, torch.full((1 << 20,),
              float(p * (p + 1)), dtype=torch.float32), "sum", torch.float32)
        # the quantized calls on CUDA tensors (csrc/quant.cu) equal the CPU ones bit for bit
        if mode != "vs_nccl":
            import pccl.torch as pt
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                for bits, block in ((8, 2048), (4, 64)):
                    x = (torch.randn(3000 * p, generator=torch.Generator().manual_seed(rank))
                         * (1 + rank)).to(dtype)
                    cpu_out = torch.zeros(3000 * p, dtype=dtype)
                    gpu_out = torch.zeros(3000 * p, dtype=dtype, device=dev)
                    pt.all_gather_quantized(cpu_out, x[:3000], bits=bits, block=block)
                    pt.all_gather_quantized(gpu_out, x[:3000].to(dev), bits=bits, block=block)
                    check(f"all_gather_quantized {dtype} {bits}", gpu_out.cpu(), cpu_out,
                          "exact", dtype)
                    cpu_rs = torch.zeros(3000, dtype=dtype)
                    gpu_rs = torch.zeros(3000, dtype=dtype, device=dev)
                    pt.reduce_scatter_quantized(cpu_rs, x, bits=bits, block=block, average=True)
                    pt.reduce_scatter_quantized(gpu_rs, x.to(dev), bits=bits, block=block,
                                                average=True)
                    check(f"reduce_scatter_quantized {dtype} {bits}", gpu_rs.cpu(), cpu_rs,
                          "exact", dtype)
        dist.barrier(group=group)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        report["failures"].append(traceback.format_exc())
    with open(os.path.join(outdir, f"cuda{rank}.json"), "w") as f:
        json.dump(report, f)
