"""Per-rank body of test_split.py: dist.split_group and new_group (from an eager default
group) on pccl go through pcclCommSplit, never a fresh bootstrap, and their collectives
match gloo's on the same ranks."""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ffi/python, for `import pccl`

import pccl.torch as pt  # noqa: E402
from pccl import _lib  # noqa: E402

BOOTSTRAPS = []
_get_unique_id = _lib.get_unique_id


def _counted_unique_id(*a, **k):
    BOOTSTRAPS.append(1)  # a new communicator made by a rendezvous, not a split
    return _get_unique_id(*a, **k)


_lib.get_unique_id = _counted_unique_id


def _backend(pg):
    return pg if isinstance(pg, pt.PcclBackend) else pg._get_backend(torch.device("cpu"))


def main(rank, world, init, outdir):
    torch.set_num_threads(1)
    out = {"failures": [], "checks": 0}

    def eq(what, got, want):
        out["checks"] += 1
        if not torch.equal(got, want):
            out["failures"].append(f"{what}: got {got.flatten()[:6].tolist()} want "
                                   f"{want.flatten()[:6].tolist()}")

    def compare(tag, group, gloo, members):
        """all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
        broadcast and a send/recv ring on `group` vs gloo on the same ranks."""
        n = len(members)
        me = dist.get_rank(group)
        assert me == members.index(rank), (tag, me, members)
        assert group.size() == n
        x = torch.arange(6, dtype=torch.float32) * (rank + 1)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, group=group)
        dist.all_reduce(b, group=gloo)
        eq(f"{tag} all_reduce", a, b)
        a, b = torch.empty(6 * n), torch.empty(6 * n)
        dist.all_gather_into_tensor(a, x, group=group)
        dist.all_gather_into_tensor(b, x, group=gloo)
        eq(f"{tag} all_gather", a, b)
        a, b = torch.empty(2), torch.empty(2)
        y = torch.arange(2.0 * n) + rank
        dist.reduce_scatter_tensor(a, y, group=group)
        dist.reduce_scatter_tensor(b, y, group=gloo)
        eq(f"{tag} reduce_scatter", a, b)
        a, b = torch.empty(3 * n), torch.empty(3 * n)
        z = torch.arange(3.0 * n) + 100 * rank
        dist.all_to_all_single(a, z, group=group)
        dist.all_to_all_single(b, z, group=gloo)
        eq(f"{tag} all_to_all_single", a, b)
        root = members[-1]
        a = x.clone() if rank == root else torch.zeros(6)
        dist.broadcast(a, root, group=group)
        eq(f"{tag} broadcast", a, torch.arange(6, dtype=torch.float32) * (root + 1))
        if n > 1:
            nxt, prv = members[(me + 1) % n], members[(me - 1) % n]
            r = torch.zeros(4)
            ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), nxt, group=group),
                   dist.P2POp(dist.irecv, r, prv, group=group)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            eq(f"{tag} send/recv ring", r, torch.full((4,), float(prv)))

    try:
        # An eager default group (device_id): torch's new_group may split it.
        dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world,
                                device_id=torch.device("cpu:0"))
        boots0 = len(BOOTSTRAPS)
        gloo_world = dist.new_group(list(range(world)), backend="gloo")
        del gloo_world
        # 1. split_group into two disjoint halves (order kept: the second half reversed)
        half = world // 2
        lo, hi = list(range(half)), list(range(world - 1, half - 1, -1))
        boots = len(BOOTSTRAPS)
        g = dist.split_group(split_ranks=[lo, hi], timeout=timedelta(seconds=45))
        out["split_bootstraps"] = len(BOOTSTRAPS) - boots
        mine = lo if rank in lo else hi
        gloos = [dist.new_group(lo, backend="gloo"),
                 dist.new_group(hi, backend="gloo", sort_ranks=False)]  # same order
        gl = gloos[0] if rank in lo else gloos[1]
        be = _backend(g)
        assert isinstance(be, pt.PcclBackend), type(be)
        out["split_timeout_s"] = be._comm.get_timeout()
        assert be._comm.get_timeout() == 45.0, be._comm.get_timeout()
        compare("split_group halves", g, gl, mine)
        # 2. a split that leaves ranks out: they get NON_GROUP_MEMBER
        pair = [0, world - 1]
        g2 = dist.split_group(split_ranks=[pair])
        if rank in pair:
            compare("split_group pair", g2, dist.new_group(pair, backend="gloo"), pair)
        else:
            dist.new_group(pair, backend="gloo")
            assert g2 is dist.GroupMember.NON_GROUP_MEMBER or g2 is None, g2
        # 3. a split of a split (the halves' first ranks split again)
        g3 = dist.split_group(g, split_ranks=[[0]]) if len(mine) > 0 else None
        if dist.get_rank(g) == 0:
            t = torch.ones(3) * rank
            dist.all_reduce(t, group=g3)
            eq("split of a split", t, torch.ones(3) * rank)
        # 4. new_group from the eager default group: pcclCommSplit too
        boots = len(BOOTSTRAPS)
        sub = list(range(1, world))
        g4 = dist.new_group(sub)
        g4_gloo = dist.new_group(sub, backend="gloo")
        out["new_group_bootstraps"] = len(BOOTSTRAPS) - boots
        if rank in sub:
            compare("new_group (split)", g4, g4_gloo, sub)
        out["bootstraps_after_init"] = len(BOOTSTRAPS) - boots0
        assert out["split_bootstraps"] == 0 and out["new_group_bootstraps"] == 0, out
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        out["failures"].append(traceback.format_exc()[-3000:])
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if out["failures"]:
        raise SystemExit(1)
