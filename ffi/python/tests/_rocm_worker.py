"""Per-rank body of test_rocm.py: the backend on "HIP tensors" of the fake ROCm runtime.

torch's runtime detection is stubbed here only: ``torch.version.hip`` is set (as on torch's
ROCm build) or cleared, and the backend's device seams are pointed at the fake runtime: CPU
tensors count as device tensors (the fake's device memory is host memory), and the streams
and events of ``pccl._streams.STREAMS`` are the fake's (``FakeStreams``), the current stream
one made with ``hipStreamCreate``. With ``PCCL_DEVICE_RUNTIME=cuda`` in the
environment, a collective reaches the fake only if the backend told the library the stream is
a HIP stream; otherwise the library takes it for a CUDA stream and fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ffi/python, for `import pccl`

import pccl._streams as pccl_streams  # noqa: E402
import pccl.torch as pt  # noqa: E402  (registers "pccl")

N = 1000


class FakeEvent:
    def __init__(self, fake):
        self.fake = fake
        self.raw = ctypes.c_void_p()
        assert fake.hipEventCreate(ctypes.byref(self.raw)) == 0

    def record(self, stream):
        assert self.fake.hipEventRecord(self.raw, stream.raw) == 0

    def query(self):
        return self.fake.hipEventQuery(self.raw) == 0


class FakeStream:
    def __init__(self, fake, raw=None):
        self.fake = fake
        self.raw = raw if raw is not None else ctypes.c_void_p()
        if raw is None:
            assert fake.hipStreamCreate(ctypes.byref(self.raw)) == 0

    def wait_event(self, ev):
        assert self.fake.hipStreamWaitEvent(self.raw, ev.raw, 0) == 0

    def wait_stream(self, other):
        ev = FakeEvent(self.fake)
        ev.record(other)
        self.wait_event(ev)

    def synchronize(self):
        assert self.fake.hipStreamSynchronize(self.raw) == 0

    def copy(self, dst, src):
        """Queues a copy of tensor ``src`` into ``dst`` (CPU tensors: fake device memory)."""
        n = src.numel() * src.element_size()
        assert self.fake.hipMemcpyAsync(ctypes.c_void_p(dst.data_ptr()),
                                        ctypes.c_void_p(src.data_ptr()), ctypes.c_size_t(n),
                                        3, self.raw) == 0


class FakeStreams:
    """The seam of pccl._streams over the fake runtime: one current stream."""

    def __init__(self, fake):
        self.fake = fake
        self.cur = FakeStream(fake)
        self.kept = []  # tensors a queued call uses (CPU memory has no record_stream)

    def current(self, dev):
        return self.cur

    def new_stream(self, dev):
        return FakeStream(self.fake)

    def new_event(self):
        return FakeEvent(self.fake)

    @staticmethod
    def handle(stream):
        return stream.raw.value

    def keep_alive(self, tensor, stream):
        self.kept.append(tensor)

    def capturing(self, dev):
        status = ctypes.c_int(0)
        assert self.fake.hipStreamIsCapturing(self.cur.raw, ctypes.byref(status)) == 0
        return status.value != 0


def main(rank, world, init, outdir, mode):
    report = {"checks": 0, "failures": [], "errors": []}
    try:
        fake = ctypes.CDLL(os.environ["PCCL_HIP_LIBRARY"])
        fake.hipMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_void_p]
        assert fake.hipSetDevice(rank % 2) == 0
        streams = FakeStreams(fake)
        pccl_streams.STREAMS = streams
        torch.version.hip = "6.2.41133-fake" if mode != "cuda" else None
        pccl_streams.is_device = lambda dev: True
        pccl_streams.device_context = lambda dev: contextlib.nullcontext()
        dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world)
        if mode in ("async", "rooted"):
            try:
                checks = _async_checks if mode == "async" else _rooted_checks
                checks(rank, world, streams, report)
            except Exception as e:  # noqa: BLE001
                report["errors"].append(f"{type(e).__name__}: {e}")
            dist.destroy_process_group()
            _write(outdir, rank, report)
            return

        def synced():
            # The collective is ordered on the current stream: wait as torch.cuda would.
            streams.cur.synchronize()

        def check(what, got, want):
            report["checks"] += 1
            if not torch.equal(got, want):
                report["failures"].append(f"{what}: got {got[:4].tolist()}..., "
                                          f"want {want[:4].tolist()}...")

        total = sum(range(1, world + 1))
        for rep in range(2):  # twice: the first device call also decides the level
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
    _write(outdir, rank, report)


def _write(outdir, rank, report):
    with open(os.path.join(outdir, f"rocm{rank}.json"), "w") as f:
        json.dump(report, f)


def _async_checks(rank, world, streams, report):
    """torch's stream semantics on the fake runtime: ``async_op=True`` leaves the current
    stream free (a copy queued after the call runs while the collective waits for a late
    peer), ``work.wait()`` orders the current stream after it, ``is_completed`` /
    ``synchronize`` tell the host; each collective is a ``pccl:`` profiler event."""
    cur = streams.cur
    t = torch.full((N,), float(rank + 1))
    dist.all_reduce(t)  # the first device call decides the level with every rank
    cur.synchronize()
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)  # the peer joins late
    t = torch.full((N,), float(rank + 1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        work = dist.all_reduce(t, async_op=True)
    names = [e.name for e in prof.events()]
    report["checks"] += 1
    if not any(n.startswith("pccl:allreduce") for n in names):
        report["failures"].append(f"no pccl:allreduce profiler event in {names[:20]}")
    if rank == 0:
        src = torch.full((N,), 5.0)
        mine = torch.zeros(N)
        cur.copy(mine, src)
        ev = FakeEvent(cur.fake)
        ev.record(cur)
        t0 = time.monotonic()
        while not ev.query() and time.monotonic() - t0 < 0.6:
            time.sleep(0.001)
        report["checks"] += 1
        if not ev.query():
            report["failures"].append("the current stream was held by an async_op=True call")
        if work.is_completed():
            report["failures"].append("the collective ended before the late peer joined")
        if not torch.equal(mine, src):
            report["failures"].append("the copy queued after the call did not run")
    work.wait()
    back = torch.zeros(N)
    cur.copy(back, t)
    cur.synchronize()
    report["checks"] += 1
    want = torch.full((N,), float(sum(range(1, world + 1))))
    if not torch.equal(back, want):
        report["failures"].append(f"after wait(): {back[:4].tolist()}, want {want[:4].tolist()}")
    # The future completes once the device work ended (the host waits on it); is_completed()
    # then says so. (torch >= 2.12 forwards wait() and get_future() to the backend's Work,
    # not its deprecated synchronize().)
    t2 = torch.full((N,), 1.0)
    w2 = dist.all_reduce(t2, async_op=True)
    w2.get_future().wait()
    report["checks"] += 1
    if not w2.is_completed() or not torch.equal(t2, torch.full((N,), float(world))):
        report["failures"].append(f"get_future().wait(): {t2[:4].tolist()}")


def _rooted_checks(rank, world, streams, report):
    """reduce, gather, scatter and all_to_all_single on "device" tensors: queued on PCCL's
    stream through the C ABI's stream argument (no host copies), every result exact."""
    cur = streams.cur
    n = 6

    def check(what, got, want):
        report["checks"] += 1
        if not torch.equal(got, want):
            report["failures"].append(f"{what}: got {got.tolist()}, want {want.tolist()}")

    def val(r):
        return torch.arange(n, dtype=torch.float32) + 100 * r

    t = val(rank)
    dist.reduce(t, dst=world - 1)
    cur.synchronize()
    if rank == world - 1:
        check("reduce", t, sum(val(r) for r in range(world)))
    outs = [torch.zeros(n) for _ in range(world)] if rank == 0 else None
    # The list copy-out runs when the work finishes; the stand-in "device" tensors are CPU
    # tensors, whose copies run on the host at once, not on the stream: finish the work
    # after the device did (its future), as a host reader would.
    dist.gather(val(rank), outs, dst=0, async_op=True).get_future().wait()
    cur.synchronize()
    if rank == 0:
        for r in range(world):
            check(f"gather[{r}]", outs[r], val(r))
    got = torch.zeros(n)
    ins = [val(r) * 2 for r in range(world)] if rank == world - 1 else None
    dist.scatter(got, ins, src=world - 1)
    cur.synchronize()
    check("scatter", got, val(rank) * 2)
    inp = torch.arange(world * n, dtype=torch.float32) + 1000 * rank
    out = torch.zeros(world * n)
    work = dist.all_to_all_single(out, inp, async_op=True)
    work.wait()
    cur.synchronize()
    want = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32) + 1000 * r
                      for r in range(world)])
    check("all_to_all_single", out, want)
    _quantized_checks(rank, world, cur, check)
    _p2p_and_uneven_checks(rank, world, cur, check)


def _quantized_checks(rank, world, cur, check):
    """pccl.torch.all_gather_quantized / reduce_scatter_quantized on "device" tensors, through
    the C ABI's stream argument: queued on the current stream (synchronised before each
    check), encoded on pinned host memory. Integers in
    -127..127 with +-127 in every block of 32 encode exactly (scale 1), so the results are
    exact."""
    n = 64

    def ints(r, k):
        v = (torch.arange(k, dtype=torch.float32) * 37 + 11 * r) % 255 - 127
        v[::32] = 127.0
        return v

    out = torch.zeros(world * n)
    pt.all_gather_quantized(out, ints(rank, n), bits=8, block=32)
    cur.synchronize()
    check("all_gather_quantized", out, torch.cat([ints(r, n) for r in range(world)]))
    got = torch.zeros(n)
    pt.reduce_scatter_quantized(got, ints(rank, world * n), bits=8, block=32)
    cur.synchronize()
    want = sum(ints(r, world * n) for r in range(world))[rank * n:(rank + 1) * n]
    check("reduce_scatter_quantized", got, want)


def _p2p_and_uneven_checks(rank, world, cur, check):
    """Sends and receives (a batch, and blocking ones) and the uneven all-to-alls on
    "device" tensors: each one queued through ``_streams.issue`` (PCCL's stream; no host
    copies), every result exact."""
    issued = []
    real_issue = pccl_streams.issue

    def counting(comm, streams, dev, call, launch, label):
        issued.append(call)
        return real_issue(comm, streams, dev, call, launch, label)

    pccl_streams.issue = counting
    try:
        n = 5
        right, left = (rank + 1) % world, (rank - 1) % world
        mine = torch.arange(n, dtype=torch.float32) + 10 * rank
        got = torch.zeros(n)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
                                       dist.P2POp(dist.irecv, got, left)])
        for r in reqs:
            r.wait()
        cur.synchronize()
        check("batch_isend_irecv", got, torch.arange(n, dtype=torch.float32) + 10 * left)
        if rank == 0:
            dist.send(mine * 2, 1)
        elif rank == 1:
            got = torch.zeros(n)
            dist.recv(got, 0)
            cur.synchronize()
            check("send/recv", got, (torch.arange(n, dtype=torch.float32)) * 2)
        # Uneven all_to_all_single: rank r sends j + r + 1 rows of 2 to rank j.
        ins = [j + rank + 1 for j in range(world)]
        outs = [rank + i + 1 for i in range(world)]
        inp = torch.cat([torch.full((c, 2), float(100 * rank + j)) for j, c in enumerate(ins)])
        out = torch.zeros(sum(outs), 2)
        dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins)
        cur.synchronize()
        want = torch.cat([torch.full((c, 2), float(100 * i + rank)) for i, c in enumerate(outs)])
        check("all_to_all_single (uneven)", out, want)
        # all_to_all of tensor lists (uneven); the copy into the list runs when the work
        # finishes: after the device did (its future), as for gather above.
        in_list = [torch.full((j + rank + 1,), float(100 * rank + j)) for j in range(world)]
        out_list = [torch.zeros(rank + i + 1) for i in range(world)]
        dist.all_to_all(out_list, in_list, async_op=True).get_future().wait()
        cur.synchronize()
        for i in range(world):
            check(f"all_to_all[{i}]", out_list[i], torch.full((rank + i + 1,), float(100 * i + rank)))
        kinds = sorted(set(issued))
        check("queued on PCCL's stream", torch.tensor(len(issued)),
              torch.tensor(4 if rank in (0, 1) else 3))
        report_kinds = ",".join(kinds)
        if "alltoallv" not in report_kinds:
            raise AssertionError(f"no uneven all-to-all was queued: {issued}")
    finally:
        pccl_streams.issue = real_issue
