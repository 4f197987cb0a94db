"""Per-rank body of the distributed tests (spawned by test_backend.py).

Every rank builds a pccl group and a gloo group over the same ranks (the default group and a
sub-group of each) and runs every operation x dtype x op x size on both, comparing the
results. Inputs are small integers, so sums, products, minima and maxima are exact in every
dtype; AVG and PREMUL_SUM results are compared with a tolerance. Where gloo cannot run a case
(AVG, PREMUL_SUM, uint32/uint64/bool) the reference is computed locally from every rank's
input (each rank can rebuild every other rank's input from its rank number).
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

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
EXTRA = [t for t in (getattr(torch, "uint32", None), getattr(torch, "uint64", None)) if t]


def make_input(rank: int, n: int, dtype, op, salt: int) -> torch.Tensor:
    """Deterministic small-integer input of rank `rank` (same on every process)."""
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    if op == "prod":
        v = torch.randint(1, 3, (n,), generator=g)  # 1 or 2: 2^4 fits int8
    elif dtype in (torch.uint8, torch.bool) or dtype in EXTRA:
        v = torch.randint(0, 4, (n,), generator=g)
    else:
        v = torch.randint(-3, 4, (n,), generator=g)
    if dtype == torch.bool:
        return v > 1
    return v.to(torch.int64).to(dtype)


def reference(inputs, op, dtype):
    """Elementwise reduction of the ranks' inputs, in float64/int64."""
    wide = torch.float64 if dtype in FLOATS else torch.int64
    st = torch.stack([x.to(wide) for x in inputs])
    if op in ("sum", "premul"):
        r = st.sum(0)
    elif op == "avg":
        r = st.sum(0) / len(inputs)
    elif op == "prod":
        r = st.prod(0)
    elif op == "max":
        r = st.max(0).values
    elif op == "min":
        r = st.min(0).values
    else:
        raise ValueError(op)
    return r


TORCH_OP = {"sum": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN, "avg": R.AVG}
PREMUL = 0.5


def torch_op(op):
    if op == "premul":
        return dist._make_nccl_premul_sum(PREMUL)
    return TORCH_OP[op]


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.checks = 0
        self.vs_gloo = 0
        self.failures = []
        self.async_count = 0

    def close(self, what, got, want, exact):
        self.checks += 1
        got = got.detach()
        if got.shape != want.shape:
            self.failures.append(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        if got.numel() == 0:
            return
        if exact:
            ok = torch.equal(got.to(torch.float64), want.to(torch.float64))
        else:
            g64, w64 = got.to(torch.float64), want.to(torch.float64)
            tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(got.dtype, 1e-6)
            ok = torch.allclose(g64, w64, rtol=tol, atol=tol)
        if not ok:
            self.failures.append(f"{what}: got {got.flatten()[:8].tolist()} want "
                                 f"{want.flatten()[:8].tolist()}")


def run_async(ck: Checker, fn, *args, **kw):
    """Alternates sync and async calls; async ones are waited through wait() or the future."""
    ck.async_count += 1
    mode = ck.async_count % 3
    if mode == 0:
        return fn(*args, **kw)
    work = fn(*args, async_op=True, **kw)
    if work is None:
        return None
    if mode == 1:
        work.wait()
    else:
        work.get_future().wait()
    return None


# torch <= 2.11 keeps a PREMUL_SUM factor out of Python's reach (the backend raises).
HAS_PREMUL = hasattr(dist._make_nccl_premul_sum(PREMUL), "factor")


def ops_for(dtype):
    ops = ["sum", "prod", "max", "min"]
    if dtype in FLOATS:
        ops += ["avg"] + (["premul"] if HAS_PREMUL else [])
    return ops


def gloo_supports(dtype, op):
    return op not in ("avg", "premul") and dtype not in EXTRA and dtype != torch.bool


def suite(ck: Checker, pg, gloo, ranks, tag, sizes):
    """All checks on one pair of groups (pg: pccl, gloo: gloo) over global `ranks`."""
    me = dist.get_rank(pg)
    n_ranks = len(ranks)
    salt = 0
    for dtype in FLOATS + INTS + EXTRA + [torch.bool]:
        for n in sizes:
            salt += 1
            # --- all_gather_into_tensor / all_gather (lists) / broadcast: no reduction.
            inputs = [make_input(r, n, dtype, "sum", salt) for r in range(n_ranks)]
            want = torch.cat(inputs)
            out = torch.full((n * n_ranks,), 7).to(dtype) if dtype != torch.bool else \
                torch.zeros(n * n_ranks, dtype=dtype)
            run_async(ck, dist.all_gather_into_tensor, out, inputs[me].clone(), group=pg)
            ck.close(f"{tag} all_gather_into_tensor {dtype} n={n}", out, want, True)
            if gloo_supports(dtype, "sum"):
                gout = torch.empty_like(out)
                dist.all_gather_into_tensor(gout, inputs[me].clone(), group=gloo)
                ck.close(f"{tag} all_gather_into_tensor vs gloo {dtype} n={n}", out, gout, True)
                ck.vs_gloo += 1
            # in place: the input is this rank's block of the output
            out2 = torch.zeros(n * n_ranks, dtype=dtype)
            out2.narrow(0, me * n, n).copy_(inputs[me])
            dist.all_gather_into_tensor(out2, out2.narrow(0, me * n, n), group=pg)
            ck.close(f"{tag} all_gather_into_tensor in-place {dtype} n={n}", out2, want, True)
            # lists, 2-D tensors
            shp = (n, 1)
            outs = [torch.zeros(shp, dtype=dtype) for _ in range(n_ranks)]
            run_async(ck, dist.all_gather, outs, inputs[me].clone().view(shp), group=pg)
            ck.close(f"{tag} all_gather {dtype} n={n}", torch.cat(outs).view(-1), want, True)
            # broadcast from the last rank of the group
            root_local = n_ranks - 1
            b = inputs[me].clone()
            run_async(ck, dist.broadcast, b, src=ranks[root_local], group=pg)
            ck.close(f"{tag} broadcast {dtype} n={n}", b, inputs[root_local], True)

            for op in ops_for(dtype):
                if dtype == torch.bool and op not in ("max", "min"):
                    continue
                salt += 1
                ins = [make_input(r, n, dtype, op, salt) for r in range(n_ranks)]
                exact = op not in ("avg", "premul")
                ref_all = reference(ins, op, dtype)
                if op == "premul":
                    ref_all = ref_all * PREMUL
                # all_reduce
                t = ins[me].clone()
                run_async(ck, dist.all_reduce, t, op=torch_op(op), group=pg)
                ck.close(f"{tag} all_reduce {op} {dtype} n={n}", t, ref_all, exact)
                if gloo_supports(dtype, op):
                    gt = ins[me].clone()
                    dist.all_reduce(gt, op=TORCH_OP[op], group=gloo)
                    ck.close(f"{tag} all_reduce vs gloo {op} {dtype} n={n}", t, gt, exact)
                    ck.vs_gloo += 1
                elif op in ("avg", "premul") and dtype in (torch.float32, torch.float64):
                    gt = ins[me].clone().to(torch.float64)
                    dist.all_reduce(gt, op=R.SUM, group=gloo)
                    gt = gt / n_ranks if op == "avg" else gt * PREMUL
                    ck.close(f"{tag} all_reduce vs gloo-sum {op} {dtype} n={n}", t, gt, False)
                    ck.vs_gloo += 1
                # reduce_scatter_tensor: every rank gives n_ranks blocks of n
                if dtype == torch.bool:
                    continue
                bins = [make_input(r, n * n_ranks, dtype, op, salt + 5000)
                        for r in range(n_ranks)]
                rs_ref = reference(bins, op, dtype)
                if op == "premul":
                    rs_ref = rs_ref * PREMUL
                mine = rs_ref.narrow(0, me * n, n)
                o = torch.full((n,), 3).to(dtype)
                src = bins[me].clone()
                run_async(ck, dist.reduce_scatter_tensor, o, src, op=torch_op(op), group=pg)
                ck.close(f"{tag} reduce_scatter_tensor {op} {dtype} n={n}", o, mine, exact)
                ck.close(f"{tag} reduce_scatter_tensor input untouched {dtype}", src, bins[me],
                         True)
                if gloo_supports(dtype, op):
                    go = torch.empty_like(o)
                    dist.reduce_scatter_tensor(go, bins[me].clone(), op=TORCH_OP[op],
                                               group=gloo)
                    ck.close(f"{tag} reduce_scatter_tensor vs gloo {op} {dtype} n={n}", o, go,
                             exact)
                    ck.vs_gloo += 1
                # reduce_scatter (lists)
                o2 = torch.zeros((n,), dtype=dtype)
                run_async(ck, dist.reduce_scatter, o2, list(bins[me].clone().chunk(n_ranks))
                          if n else [torch.zeros(0, dtype=dtype)] * n_ranks,
                          op=torch_op(op), group=pg)
                ck.close(f"{tag} reduce_scatter {op} {dtype} n={n}", o2, mine, exact)


def misc(ck: Checker, pg, gloo, ranks, tag):
    me = dist.get_rank(pg)
    n_ranks = len(ranks)
    # Non-contiguous tensors: made contiguous, results copied back.
    base = torch.arange(24, dtype=torch.float32).view(4, 6) + me
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    dist.all_reduce(view, group=pg)
    want = sum(torch.arange(24, dtype=torch.float32).view(4, 6) + r for r in range(n_ranks))
    ck.close(f"{tag} all_reduce non-contiguous", base, want, True)
    strided = torch.zeros(10, dtype=torch.int64)
    if me == n_ranks - 1:
        strided[::2] = torch.arange(5)
    dist.broadcast(strided[::2], src=ranks[-1], group=pg)
    ck.close(f"{tag} broadcast strided", strided[::2], torch.arange(5), True)
    ck.close(f"{tag} broadcast strided (gaps untouched)", strided[1::2], torch.zeros(5,
             dtype=torch.int64), True)
    out = torch.zeros(3, 2 * n_ranks, dtype=torch.float64)  # column blocks: non-contiguous rows
    outs = [out[:, 2 * i:2 * i + 2] for i in range(n_ranks)]
    dist.all_gather(outs, torch.full((3, 2), float(me), dtype=torch.float64), group=pg)
    want = torch.cat([torch.full((3, 2), float(r), dtype=torch.float64)
                      for r in range(n_ranks)], 1)
    ck.close(f"{tag} all_gather into non-contiguous views", out, want, True)
    # all_reduce_coalesced: flatten, one all-reduce, unflatten
    ts = [torch.full((3,), float(me + 1)), torch.full((2, 2), 2.0 * (me + 1))]
    dist.all_reduce_coalesced(ts, group=pg)
    s = sum(range(1, n_ranks + 1))
    ck.close(f"{tag} all_reduce_coalesced[0]", ts[0], torch.full((3,), float(s)), True)
    ck.close(f"{tag} all_reduce_coalesced[1]", ts[1], torch.full((2, 2), 2.0 * s), True)
    gts = [torch.full((3,), float(me + 1)), torch.full((2, 2), 2.0 * (me + 1))]
    dist.all_reduce_coalesced(gts, group=gloo)
    ck.close(f"{tag} all_reduce_coalesced vs gloo", ts[1], gts[1], True)
    ck.vs_gloo += 1
    # torch's coalescing manager -> all_gather_single_coalesced / reduce_scatter_single_coalesced
    ins = [torch.full((3,), float(me)), torch.full((2,), float(me + 10))]
    outs = [torch.empty(3 * n_ranks), torch.empty(2 * n_ranks)]
    with dist._coalescing_manager(group=pg, async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i, group=pg)
    cm.wait()
    ck.close(f"{tag} coalesced all_gather[0]", outs[0],
             torch.cat([torch.full((3,), float(r)) for r in range(n_ranks)]), True)
    ck.close(f"{tag} coalesced all_gather[1]", outs[1],
             torch.cat([torch.full((2,), float(r + 10)) for r in range(n_ranks)]), True)
    rs = [torch.empty(2), torch.empty(1)]
    with dist._coalescing_manager(group=pg, async_ops=True) as cm:
        dist.reduce_scatter_tensor(rs[0], torch.arange(2.0 * n_ranks) + me, group=pg)
        dist.reduce_scatter_tensor(rs[1], torch.arange(1.0 * n_ranks) * (me + 1), group=pg)
    cm.wait()
    s1 = sum(range(1, n_ranks + 1))
    ck.close(f"{tag} coalesced reduce_scatter[0]", rs[0],
             (torch.arange(2.0 * n_ranks) * n_ranks + sum(range(n_ranks)))[2 * me:2 * me + 2],
             True)
    ck.close(f"{tag} coalesced reduce_scatter[1]", rs[1], torch.tensor([float(me * s1)]), True)
    # barrier, sync and async
    dist.barrier(group=pg)
    w = dist.barrier(group=pg, async_op=True)
    w.wait()
    # A larger all-reduce, count not divisible by the group size; async with the future.
    n = 100_003
    x = torch.arange(n, dtype=torch.float32) % 97 + me
    fut = dist.all_reduce(x, group=pg, async_op=True).get_future()
    res = fut.wait()
    gx = torch.arange(n, dtype=torch.float32) % 97 + me
    dist.all_reduce(gx, group=gloo)
    ck.close(f"{tag} all_reduce 100003 floats vs gloo", x, gx, True)
    ck.close(f"{tag} future value", res[0], gx, True)
    ck.vs_gloo += 1
    # Many outstanding requests at once, completed in issue order.
    works, bufs = [], []
    for i in range(8):
        b = torch.full((1000 + i,), float(i + me))
        bufs.append(b)
        works.append(dist.all_reduce(b, group=pg, async_op=True))
    for w in reversed(works):
        w.wait()
    for i, b in enumerate(bufs):
        ck.close(f"{tag} outstanding all_reduce {i}", b,
                 torch.full((1000 + i,), float(sum(i + r for r in range(n_ranks)))), True)
    # Errors: clear Python exceptions naming the call.
    for name, fn in [
        ("all_reduce with ReduceOp.AVG needs a floating dtype",
         lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=R.AVG, group=pg)),
        ("does not support dtype",
         lambda: dist.broadcast(torch.ones(2).to(torch.float8_e5m2), src=ranks[0], group=pg)),
    ]:
        ck.checks += 1
        try:
            fn()
            ck.failures.append(f"{tag} expected an error for {name}")
        except Exception as e:  # noqa: BLE001
            if name not in str(e):
                ck.failures.append(f"{tag} error for {name} lacks the call: {e}")


def c_error(ck: Checker):
    """A C error (unknown dtype code) comes back as PcclError with pcclGetLastError's text."""
    from pccl import _lib
    pg = dist.group.WORLD
    # torch <= 2.11: the group is the backend (a Python ProcessGroup)
    be = pg if isinstance(pg, pccl.torch.PcclBackend) else pg._get_backend(torch.device("cpu"))
    ck.checks += 1
    if not isinstance(be, pccl.torch.PcclBackend):
        ck.failures.append(f"default group backend is {type(be)}, not PcclBackend")
        return
    buf = torch.zeros(4)
    try:
        be._comm.iallreduce(buf.data_ptr(), buf.data_ptr(), 4, 99, _lib.pcclSum).wait()
        ck.failures.append("dtype 99 did not fail")
    except _lib.PcclError as e:
        if e.code == 0 or not e.detail or "pcclIallReduce" not in str(e):
            ck.failures.append(f"PcclError without message: {e!r}")
    # PcclWork.is_completed on the backend's own Work (torch's wrapper does not forward it).
    ck.checks += 1
    w = be.allreduce([buf], _AsyncAllreduceOpts())
    w.wait()
    if not w.is_completed():
        ck.failures.append("PcclWork.is_completed() false after wait()")
    # Polling is_completed() alone finishes a Work, copy-back included (list all-gather).
    ck.checks += 1
    me, n = dist.get_rank(), dist.get_world_size()
    outs = [torch.zeros(5) for _ in range(n)]
    w = be.allgather([outs], [torch.full((5,), float(me))], _AsyncAllreduceOpts())
    import time
    deadline = time.time() + 60
    while not w.is_completed():
        if time.time() > deadline:
            ck.failures.append("PcclWork.is_completed() never true")
            w.wait()
            break
        time.sleep(0.001)
    ck.close("all_gather completed by polling", torch.cat(outs),
             torch.cat([torch.full((5,), float(r)) for r in range(n)]), True)


def fast_path(ck: Checker):
    """Synchronous calls on contiguous CPU tensors take the backend's fast path (one C call,
    no registry): their Works are complete and numbered like the others, and a call the
    ranks disagree on fails on every rank with the C function's name and message, after
    which the group still works."""
    from pccl import _lib
    pg = dist.group.WORLD
    be = pg if isinstance(pg, pccl.torch.PcclBackend) else pg._get_backend(torch.device("cpu"))
    me, n = dist.get_rank(), dist.get_world_size()
    opts = dist.AllreduceOptions()
    if not hasattr(opts, "asyncOp"):
        return  # torch <= 2.11 does not tell a backend whether a call is synchronous
    opts.asyncOp = False
    ck.checks += 1
    buf = torch.full((3,), float(me + 1))
    inflight = pccl.torch.inflight()
    seq = be._get_sequence_number_for_group()
    w = be.allreduce([buf], opts)
    if not w.is_completed() or w.result() != [buf] or pccl.torch.inflight() != inflight:
        ck.failures.append("fast-path all_reduce: Work not complete, wrong result, or "
                           "left in flight")
    if w._get_sequence_number() != seq + 1 or be._get_sequence_number_for_group() != seq + 1:
        ck.failures.append(f"fast-path all_reduce: sequence number {w._get_sequence_number()}"
                           f", expected {seq + 1}")
    ck.close("fast-path all_reduce", buf, torch.full((3,), float(n * (n + 1) // 2)), True)
    if n == 1:
        return
    ck.checks += 1
    bad = torch.ones(4 if me == 0 else 5)
    try:
        be.allreduce([bad], opts)
        ck.failures.append("fast-path all_reduce with counts that disagree did not fail")
    except _lib.PcclError as e:
        if "pcclAllReduce" not in str(e) or not e.detail:
            ck.failures.append(f"fast-path error without the call or message: {e!r}")
    after = torch.full((2,), float(me))
    dist.all_reduce(after)
    ck.close("all_reduce after a failed fast-path call", after,
             torch.full((2,), float(n * (n - 1) // 2)), True)


def quantized(ck: Checker):
    """``pccl.torch.all_gather_quantized``: every element within half its block's step for
    each float dtype and bit width (against the inputs, rebuilt here for every rank); a NaN on
    one rank raises on every rank, after which the group still works."""
    from pccl import _lib
    me, n = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for bits, block in ((8, 64), (4, 32)):
            ck.checks += 1
            shards = [torch.linspace(-1.0, 1.0, 100, dtype=torch.float32) * (r + 1) for r in
                      range(n)]
            for s in shards:
                s[::9] = 0.0
            out = torch.empty(100 * n, dtype=dtype)
            pccl.torch.all_gather_quantized(out, shards[me].to(dtype), bits=bits, block=block)
            want = torch.cat([s.to(dtype).to(torch.float32) for s in shards])
            got = out.to(torch.float32)
            qmax = 127.0 if bits == 8 else 7.0
            steps = torch.cat([
                torch.stack([c.abs().max() / qmax for c in s.to(dtype).float().split(block)])
                .repeat_interleave(block)[: s.numel()] for s in shards])
            err = (got - want).abs() - (steps / 2 * 1.0001 + got.abs() * 4e-3)
            zeros_ok = bool((got[want == 0] == 0).all())
            if err.max() > 0 or not zeros_ok:
                ck.failures.append(f"all_gather_quantized {dtype} {bits}-bit: worst excess "
                                   f"{err.max().item()}, zeros exact {zeros_ok}")
    # The reduce-scatter: one contribution per element (±1 from its owner), so the quantized
    # sums are exact and show each contribution counted exactly once.
    for bits in (8, 4):
        ck.checks += 1
        m = 40
        idx = torch.arange(n * m)
        owner = (idx // m * 5 + idx % m * 3) % n
        sign = 1.0 - 2.0 * (owner % 2).float()
        inp = torch.where(owner == me, sign, torch.zeros(()))
        out = torch.empty(m)
        pccl.torch.reduce_scatter_quantized(out, inp, bits=bits, block=32)
        ck.close(f"reduce_scatter_quantized {bits}-bit", out, sign[me * m:(me + 1) * m], True)
        pccl.torch.reduce_scatter_quantized(out, inp, bits=bits, block=32, average=True)
        ck.close(f"reduce_scatter_quantized {bits}-bit average", out,
                 sign[me * m:(me + 1) * m] / n, False)
        pccl.torch.reduce_scatter_quantized(out, inp, bits=bits, block=32, scheme="halving")
        ck.close(f"reduce_scatter_quantized {bits}-bit halving", out, sign[me * m:(me + 1) * m],
                 True)
        pccl.torch.reduce_scatter_quantized(out, inp, bits=bits, block=32, scheme="per-level")
        ck.close(f"reduce_scatter_quantized {bits}-bit per-level", out,
                 sign[me * m:(me + 1) * m], True)
    if n == 1:
        return
    ck.checks += 1
    x = torch.ones(64)
    if me == n - 1:
        x[5] = float("nan")
    try:
        pccl.torch.all_gather_quantized(torch.empty(64 * n), x)
        ck.failures.append("all_gather_quantized with a NaN on one rank did not raise")
    except _lib.PcclError as e:
        if f"rank(s) {n - 1} holds NaN" not in str(e) + (e.detail or ""):
            ck.failures.append(f"all_gather_quantized NaN error does not name the rank: {e!r}")
    after = torch.full((2,), float(me))
    dist.all_reduce(after)
    ck.close("all_reduce after a refused quantized all-gather", after,
             torch.full((2,), float(n * (n - 1) // 2)), True)
    # A wrong output size on rank 0: a ValueError there, an error naming it everywhere else
    # (no rank waits for the others).
    ck.checks += 1
    out = torch.empty(64 * n - (1 if me == 0 else 0))
    try:
        pccl.torch.all_gather_quantized(out, torch.ones(64))
        ck.failures.append("all_gather_quantized with a short output on rank 0 did not raise")
    except ValueError as e:
        if me != 0 or "expected" not in str(e):
            ck.failures.append(f"rank {me}: unexpected ValueError {e!r}")
    except _lib.PcclError as e:
        if me == 0 or "rank(s) 0 passed unsound" not in str(e) + (e.detail or ""):
            ck.failures.append(f"rank {me}: the error does not name rank 0: {e!r}")
    dist.all_reduce(after)
    ck.close("all_reduce after a refused size", after,
             torch.full((2,), float(n * n * (n - 1) // 2)), True)


class _AsyncAllreduceOpts:
    def __init__(self):
        self.reduceOp = R.SUM
        self.asyncOp = True


def _world(ck, rank, world, init, quick):
    """One whole run on a fresh default group: the checks of every family."""
    dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world)
    ranks = list(range(world))
    gloo = dist.new_group(ranks, backend="gloo")
    sizes = [0, 1, 7, 1000] if not quick else [0, 5]
    suite(ck, dist.group.WORLD, gloo, ranks, "world", sizes)
    misc(ck, dist.group.WORLD, gloo, ranks, "world")
    c_error(ck)
    fast_path(ck)
    quantized(ck)
    # A sub-group: every rank but 0 (or just rank 0 when alone); pccl and gloo.
    sub = ranks[1:] if world > 1 else ranks
    spg = dist.new_group(sub, backend="pccl")
    sgl = dist.new_group(sub, backend="gloo")
    if rank in sub:
        suite(ck, spg, sgl, sub, "sub", [0, 3, 1000] if not quick else [3])
        misc(ck, spg, sgl, sub, "sub")
    # Overlapping sub-groups (rank 1 is in both), created in the same order everywhere.
    if world >= 3:
        ga = dist.new_group([0, 1], backend="pccl")
        gb = dist.new_group([1, 2], backend="pccl")
        for grp, members in ((ga, [0, 1]), (gb, [1, 2])):
            if rank in members:
                t = torch.tensor([rank + 1], dtype=torch.int64)
                dist.all_reduce(t, group=grp)
                ck.close(f"overlapping group {members}", t,
                         torch.tensor([sum(m + 1 for m in members)]), True)
    dist.barrier()
    dist.destroy_process_group()


def main(rank, world, init, outdir, quick, phases=None):
    """Runs the checks once (report ``rank{r}.json``), or once per phase of ``phases``
    (``[(name, {variable: value or None})]``, report ``{name}-rank{r}.json``) one after
    another in this process: each phase sets its variables (None removes one) and builds a
    new default group, so several configurations share one start of the ranks (a start of
    torch costs more than a configuration's checks). A failed phase does not stop the next."""
    torch.set_num_threads(1)
    failed = False
    for name, env in phases or [(None, {})]:
        ck = Checker(rank)
        try:
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            _world(ck, rank, world, f"{init}-{name}" if name else init, quick)
        except BaseException:  # noqa: BLE001
            ck.failures.append("exception: " + traceback.format_exc())
            if dist.is_initialized():
                # A phase that failed half-way leaves its group: the next phase needs a new one.
                try:
                    dist.destroy_process_group()
                except BaseException:  # noqa: BLE001
                    pass
        report = f"{name}-rank{rank}.json" if name else f"rank{rank}.json"
        with open(os.path.join(outdir, report), "w") as f:
            json.dump({"checks": ck.checks, "vs_gloo": ck.vs_gloo, "failures": ck.failures[:50],
                       "n_failures": len(ck.failures)}, f)
        failed = failed or bool(ck.failures)
    if failed:
        raise SystemExit(1)


def bad_env_main(rank, world, init, outdir, only=None):
    """Joins a pccl default group with an invalid ``PCCL_RANKS_PER_NODE`` (set by the test;
    on rank ``only`` alone when given): reports how long ``init_process_group`` took to fail
    and its message."""
    import time

    if only is not None and rank != only:
        os.environ.pop("PCCL_RANKS_PER_NODE", None)
    t0 = time.time()
    err = None
    try:
        dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world)
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        err = str(e)
    with open(os.path.join(outdir, f"bad-env-rank{rank}.json"), "w") as f:
        json.dump({"error": err, "after_s": time.time() - t0}, f)
