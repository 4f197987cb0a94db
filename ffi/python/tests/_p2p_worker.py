"""Per-rank body of test_p2p.py: send/recv, isend/irecv, batch_isend_irecv rings,
all_to_all_single (even and uneven), all_to_all (lists), reduce, gather, scatter on the pccl
backend, compared with gloo over the same ranks."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ffi/python, for `import pccl`

import pccl.torch  # noqa: E402,F401  (registers "pccl")

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16, torch.uint8]
SIZES = [1, 7, 3000]


def val(rank, n, dtype, salt):
    g = torch.Generator().manual_seed(97 * salt + 13 * rank + n)
    return torch.randint(0, 5, (n,), generator=g).to(dtype)


def main(rank, world, init, outdir):
    torch.set_num_threads(1)
    fails, checks, vs_gloo = [], 0, 0

    def eq(what, got, want):
        nonlocal checks
        checks += 1
        if got.shape != want.shape or not torch.equal(got.to(torch.float64),
                                                      want.to(torch.float64)):
            fails.append(f"{what}: got {got.flatten()[:6].tolist()} want "
                         f"{want.flatten()[:6].tolist()}")

    try:
        dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world)
        gloo = dist.new_group(list(range(world)), backend="gloo")
        right, left = (rank + 1) % world, (rank - 1) % world
        salt = 0
        for dtype in DTYPES:
            for n in SIZES:
                salt += 1
                # send/recv along a ring, ordered so it cannot deadlock (even ranks send first)
                x = val(rank, n, dtype, salt)
                r = torch.zeros(n, dtype=dtype)
                if rank % 2 == 0:
                    dist.send(x, right)
                    dist.recv(r, left)
                else:
                    dist.recv(r, left)
                    dist.send(x, right)
                eq(f"send/recv {dtype} n={n}", r, val(left, n, dtype, salt))
                # batch_isend_irecv ring: both directions at once
                r1, r2 = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
                ops = [dist.P2POp(dist.isend, x, right), dist.P2POp(dist.irecv, r1, left),
                       dist.P2POp(dist.irecv, r2, right), dist.P2POp(dist.isend, x, left)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                eq(f"batch ring left {dtype} n={n}", r1, val(left, n, dtype, salt))
                eq(f"batch ring right {dtype} n={n}", r2, val(right, n, dtype, salt))
                # all_to_all_single, equal blocks, vs gloo
                inp = val(rank, n * world, dtype, salt + 500)
                out = torch.full((n * world,), 9).to(dtype)
                dist.all_to_all_single(out, inp)
                if dtype != torch.bfloat16 and dtype != torch.uint8:
                    g = torch.empty_like(out)
                    dist.all_to_all_single(g, inp, group=gloo)
                    eq(f"all_to_all_single vs gloo {dtype} n={n}", out, g)
                    vs_gloo += 1
                want = torch.cat([val(s, n * world, dtype, salt + 500).narrow(0, rank * n, n)
                                  for s in range(world)])
                eq(f"all_to_all_single {dtype} n={n}", out, want)
                # reduce / gather / scatter to a rotating root
                root = salt % world
                t = val(rank, n, dtype, salt + 900)
                dist.reduce(t, root, op=dist.ReduceOp.SUM)
                if rank == root:
                    want = sum(val(s, n, dtype, salt + 900).to(torch.float64)
                               for s in range(world))
                    eq(f"reduce {dtype} n={n}", t, want.to(dtype))
                gl = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root \
                    else None
                dist.gather(val(rank, n, dtype, salt), gl, dst=root)
                if rank == root:
                    eq(f"gather {dtype} n={n}", torch.cat(gl),
                       torch.cat([val(s, n, dtype, salt) for s in range(world)]))
                so = torch.zeros(n, dtype=dtype)
                sl = [val(s, n, dtype, salt + 77) for s in range(world)] if rank == root \
                    else None
                dist.scatter(so, sl, src=root)
                eq(f"scatter {dtype} n={n}", so, val(rank, n, dtype, salt + 77))
        # uneven all_to_all_single (2-D rows), vs gloo: rank s sends (s + d) % 3 rows to d
        cols = 5
        for dtype in (torch.float32, torch.int64):
            ins = [(rank + d) % 3 for d in range(world)]
            outs = [(s + rank) % 3 for s in range(world)]
            inp = (torch.arange(sum(ins) * cols) + 1000 * rank).reshape(-1, cols).to(dtype)
            out = torch.full((sum(outs), cols), -1).to(dtype)
            w = dist.all_to_all_single(out, inp, outs, ins, async_op=True)
            w.wait()
            g = torch.empty_like(out)
            dist.all_to_all_single(g, inp, outs, ins, group=gloo)
            eq(f"uneven all_to_all_single vs gloo {dtype}", out, g)
            vs_gloo += 1
            # list form, uneven
            il = [torch.full((rank + d + 1,), float(10 * rank + d)).to(dtype)
                  for d in range(world)]
            ol = [torch.zeros(s + rank + 1, dtype=dtype) for s in range(world)]
            dist.all_to_all(ol, il)
            eq(f"all_to_all lists {dtype}", torch.cat(ol),
               torch.cat([torch.full((s + rank + 1,), float(10 * s + rank)).to(dtype)
                          for s in range(world)]))
        # isend/irecv Works (pairs 0<->1), then a collective right after
        if world >= 2 and rank < 2:
            peer = 1 - rank
            a = torch.arange(10, dtype=torch.float32) + rank
            b = torch.zeros(10)
            ws = [dist.isend(a, peer), dist.irecv(b, peer)]
            for w in ws:
                w.wait()
            eq("isend/irecv pair", b, torch.arange(10, dtype=torch.float32) + peer)
        # A lone isend goes out without a wait (torch >= 2.12, where sends are posted at
        # once): rank 0 blocks in a gloo barrier before waiting, rank 1 in its receive. When
        # sends only go out at a wait, this deadlocks.
        pg = dist.group.WORLD
        be = pg if isinstance(pg, pccl.torch.PcclBackend) else pg._get_backend(
            torch.device("cpu"))
        if be._async_p2p:
            big = torch.arange(4 << 20, dtype=torch.float32)  # 16 MiB
            if rank == 0:
                w = dist.isend(big, 1)
                dist.barrier(group=gloo)
                w.wait()
            elif rank == 1:
                got = torch.zeros(4 << 20)
                dist.recv(got, 0)
                dist.barrier(group=gloo)
                eq("lone isend (16 MiB) before a gloo barrier", got, big)
            else:
                dist.barrier(group=gloo)
        # A ring of separate isend/irecv outside any batch, in either order (even ranks send
        # first, odd ranks receive first), 4 B to 16 MiB (more than any buffering): separate
        # requests progress together. is_completed(), get_future() and result() through
        # what torch hands out (its C++ wrapper on torch >= 2.12).
        if be._async_p2p:
            for n in (1, 1000, 4 << 20):
                x = torch.arange(n, dtype=torch.float32) + 1000 * rank
                r = torch.zeros(n)
                if rank % 2 == 0:
                    ws = [dist.isend(x, right), dist.irecv(r, left)]
                else:
                    ws = [dist.irecv(r, left), dist.isend(x, right)]
                deadline = time.monotonic() + 60
                while not all(w.is_completed() for w in ws):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"isend/irecv ring n={n}: is_completed never True")
                    time.sleep(0.001)
                for w in ws:
                    w.wait()
                    if not w.get_future().done():
                        fails.append(f"isend/irecv ring n={n}: future not done after wait")
                eq(f"separate isend/irecv ring n={n}", r,
                   torch.arange(n, dtype=torch.float32) + 1000 * left)
        # Async collective Works through torch's wrapper: is_completed() turns True by
        # itself, result() gives the outputs.
        t = torch.ones(5)
        w = dist.all_reduce(t, async_op=True)
        deadline = time.monotonic() + 60
        while not w.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError("all_reduce: is_completed() never True")
            time.sleep(0.001)
        eq("async all_reduce result()", w.result()[0], torch.full((5,), float(world)))
        t = torch.ones(3)
        dist.all_reduce(t)
        eq("all_reduce after p2p", t, torch.full((3,), float(world)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        fails.append("exception: " + traceback.format_exc())
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"checks": checks, "vs_gloo": vs_gloo, "failures": fails[:50]}, f)
    if fails:
        raise SystemExit(1)
