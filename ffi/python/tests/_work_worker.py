"""Per-rank bodies of test_work.py: Work lifetime, timeouts, a dying peer, FSDP2/DeviceMesh."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ffi/python, for `import pccl`

import pccl.torch as pt  # noqa: E402


def _init(rank, world, init, timeout_s=60):
    dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def _backend(pg=None):
    pg = pg or dist.group.WORLD
    return pg if isinstance(pg, pt.PcclBackend) else pg._get_backend(torch.device("cpu"))


def work_lifetime(rank, world, init, out):
    """Hundreds of dropped async Works, wait(timeout), is_completed, sequence numbers."""
    _init(rank, world, init)
    be = _backend()
    seq0 = be._get_sequence_number_for_group()
    n = 400
    for i in range(n):  # dropped at once: the registry keeps the buffers alive
        dist.all_reduce(torch.full((257 + i % 7,), float(i)), async_op=True)
        if i % 50 == 0:
            dist.all_gather_into_tensor(torch.empty(16 * world), torch.ones(16), async_op=True)
    x = torch.full((1000,), float(rank + 1))
    w = dist.all_reduce(x, async_op=True)
    assert w.wait(timeout=timedelta(seconds=30)) is not False
    want = float(sum(range(1, world + 1)))
    assert torch.equal(x, torch.full((1000,), want)), x[:4]
    # Requests run in issue order: every dropped one has completed; the registry drains.
    deadline = time.time() + 30
    while pt.reap() and time.time() < deadline:
        time.sleep(0.01)
    out["left_in_flight"] = pt.inflight()
    assert pt.inflight() == 0, f"{pt.inflight()} operations never reaped"
    seq = be._get_sequence_number_for_group()
    out["seq"] = [seq0, seq]
    assert seq - seq0 == n + n // 50 + 1, (seq0, seq)
    assert dist.group.WORLD._get_sequence_number_for_group() == seq
    # The backend's own Work: is_completed, result, sequence number (torch <= 2.11 hands it to
    # the caller as it is; newer torch wraps it, and its wrapper answers wait/get_future).
    opts = type("O", (), {"reduceOp": dist.ReduceOp.SUM, "asyncOp": True})()
    y = torch.ones(5)
    bw = be.allreduce([y], opts)
    deadline = time.time() + 30
    while not bw.is_completed():
        assert time.time() < deadline, "is_completed never true"
        time.sleep(0.001)
    assert bw.is_success() and bw.exception() is None
    assert bw.result()[0] is y and torch.equal(y, torch.full((5,), float(world)))
    assert bw._get_sequence_number() == seq + 1
    tw = dist.all_reduce(torch.ones(3), async_op=True)
    tw.wait()
    # What the caller holds (torch's C++ wrapper on torch >= 2.12, whose own is_completed
    # flag only C++ sets; pccl.torch extends it with the forwarded future) answers too.
    out["wrapper_is_completed"] = bool(tw.is_completed())
    assert tw.is_completed() and torch.equal(tw.result()[0], torch.full((3,), float(world)))
    assert tw.get_future().done()
    # wait(timeout) honoured: rank 0 waits on an all-reduce that the others join 2 s late.
    if world > 1:
        z = torch.ones(10)
        if rank == 0:
            wz = dist.all_reduce(z, async_op=True)
            assert not wz.is_completed(), "completed before the peers joined"
            t0 = time.time()
            try:
                wz.wait(timeout=timedelta(seconds=0.5))
                raise AssertionError("wait(timeout) returned before the peers joined")
            except pt.PcclTimeoutError:
                out["timeout_raised_after_s"] = round(time.time() - t0, 3)
                assert 0.4 < time.time() - t0 < 1.5
            del wz  # dropped while still running: finished later by the registry
        else:
            time.sleep(2.0)
            dist.all_reduce(z)
        dist.barrier()
        assert torch.equal(z, torch.full((10,), float(world))), z
    dist.destroy_process_group()
    assert pt.reap() == 0


def init_timeout(rank, world, init, out):
    """init_process_group(timeout=2 s) reaches the communicator: a rank that stalls for 8 s
    makes the others' collective fail with a timeout (PCCL's default would be 300 s)."""
    _init(rank, world, init, timeout_s=2)
    be = _backend()
    out["comm_timeout_s"] = be._comm.timeout_s
    assert be._comm.timeout_s == 2.0
    dist.barrier()
    t = torch.ones(100)
    if rank == world - 1:
        time.sleep(8)
        os._exit(0)  # stalled past the others' timeout; no report
    t0 = time.time()
    try:
        dist.all_reduce(t)
        raise AssertionError("all_reduce succeeded with a stalled peer")
    except RuntimeError as e:
        out["error"] = str(e)[:300]
        out["error_after_s"] = round(time.time() - t0, 3)
    assert time.time() - t0 < 2 + 1, out
    _backend().abort()


def set_timeout(rank, world, init, out):
    """dist.set_timeout (torch >= 2.12) / group.set_timeout (torch 2.11) after init reaches
    the communicator: calls that never go through wait() (a blocking all-to-all, a receive)
    fail after the new timeout (1.5 s), not the group's first one (60 s)."""
    _init(rank, world, init, timeout_s=60)
    dist.barrier()
    new = timedelta(seconds=1.5)
    if hasattr(dist, "set_timeout"):
        dist.set_timeout(new)
    else:
        dist.group.WORLD.set_timeout(new)
    be = _backend()
    out["comm_timeout_s"] = be._comm.get_timeout()
    assert be._comm.get_timeout() == 1.5, out
    if rank == world - 1:
        time.sleep(8)
        os._exit(0)  # silent past the others' timeout; no report
    out["errors_after_s"] = []
    for what in ("all_to_all_single", "recv"):
        t0 = time.time()
        try:
            if what == "recv":
                dist.recv(torch.empty(4), world - 1)
            else:
                dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world))
            raise AssertionError(f"{what} succeeded with a silent peer")
        except RuntimeError as e:
            out[f"error_{what}"] = str(e)[:300]
            out["errors_after_s"].append(round(time.time() - t0, 3))
        assert time.time() - t0 < 1.5 + 1, out
    _backend().abort()


def peer_dies(rank, world, init, out):
    """A rank dies (SIGKILL-like os._exit) mid-job: the others get an exception from
    wait()/the call within the group's timeout + 1 s; abort then ends the group."""
    timeout_s = 3
    _init(rank, world, init, timeout_s=timeout_s)
    dist.barrier()
    if rank == world - 1:
        time.sleep(0.5)
        os._exit(0)  # dies abruptly: no teardown, sockets closed by the kernel
    t0 = time.time()
    try:
        w = dist.all_reduce(torch.ones(1 << 16), async_op=True)
        w.wait()
        dist.all_reduce(torch.ones(8))
        raise AssertionError("collectives succeeded after a peer died")
    except RuntimeError as e:
        out["error"] = str(e)[:300]
        out["error_after_s"] = round(time.time() - t0, 3)
    assert time.time() - t0 < timeout_s + 1, out
    t1 = time.time()
    _backend().abort()  # pcclCommAbort
    out["abort_s"] = round(time.time() - t1, 3)
    assert pt.reap() == 0


def fsdp_mesh(rank, world, init, out):
    """FSDP2 fully_shard with its default mesh, init_device_mesh 1-D and 2-D (HSDP), DTensor
    and functional collectives, all on pccl; gradients checked against a local reference."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Shard, distribute_tensor

    _init(rank, world, init)
    assert dist.group.WORLD.group_name  # torch 2.11: "ProcessGroup name not set" before
    out["group_name"] = dist.group.WORLD.group_name

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                   torch.nn.Linear(16, 4))

    xs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(100 + r))
          for r in range(world)]
    ref = model()
    sum(ref(x).square().mean() for x in xs).div(world).backward()
    ref_grads = [p.grad.clone() for p in ref.parameters()]

    def check(m, tag):
        m(xs[rank]).square().mean().backward()
        for p, g in zip(m.parameters(), ref_grads):
            full = p.grad.full_tensor()
            assert torch.allclose(full, g, atol=1e-5), f"{tag}: {(full - g).abs().max()}"

    m = model()  # default mesh: init_device_mesh over the default group
    for layer in (m[0], m[2]):
        fully_shard(layer)
    fully_shard(m)
    check(m, "fully_shard (default mesh)")
    mesh1 = init_device_mesh("cpu", (world,))
    m = model()
    fully_shard(m, mesh=mesh1)
    check(m, "fully_shard 1-D mesh")
    shape = (2, world // 2) if world % 2 == 0 and world > 2 else (1, world)
    mesh2 = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    m = model()
    fully_shard(m, mesh=mesh2)  # HSDP
    check(m, f"fully_shard 2-D mesh {shape}")
    # DTensor
    full = torch.arange(4.0 * world * 2).view(4 * world, 2)
    dt = distribute_tensor(full, mesh1, [Shard(0)])
    assert torch.equal(dt.full_tensor(), full)
    assert torch.equal((dt * 2).sum().full_tensor(), full.sum() * 2)
    # functional collectives on a group, a mesh and a mesh dimension
    v = torch.full((5,), float(rank + 1))
    s = sum(range(1, world + 1))
    assert torch.equal(funcol.all_reduce(v, "sum", dist.group.WORLD), torch.full((5,), float(s)))
    g = funcol.all_gather_tensor(v, 0, mesh1)
    assert torch.equal(g, torch.cat([torch.full((5,), float(r + 1)) for r in range(world)]))
    rs = funcol.reduce_scatter_tensor(torch.ones(2 * world), "sum", 0, mesh1)
    assert torch.equal(rs, torch.full((2,), float(world)))
    sub = funcol.all_reduce(v, "sum", (mesh2, 1))
    assert sub.numel() == 5
    out["mesh2"] = list(shape)
    dist.destroy_process_group()


SCENARIOS = {f.__name__: f for f in (work_lifetime, init_timeout, set_timeout, peer_dies,
                                       fsdp_mesh)}


def main(rank, world, init, outdir, scenario):
    torch.set_num_threads(1)
    out = {"failures": []}
    path = os.path.join(outdir, f"{scenario}-rank{rank}.json")

    def report():
        with open(path, "w") as f:
            json.dump(out, f)

    try:
        SCENARIOS[scenario](rank, world, init, out)
    except BaseException:  # noqa: BLE001
        out["failures"].append(traceback.format_exc()[-3000:])
    report()
    if scenario in ("init_timeout", "set_timeout", "peer_dies"):
        os._exit(0)  # the group is broken on purpose: leave without torch's teardown
    if out["failures"]:
        raise SystemExit(1)
