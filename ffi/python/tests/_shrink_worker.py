"""Per-rank body of test_shrink.py: going on after ranks die. Rank 3 exits abruptly (no
goodbye); ranks 0–2 agree on the survivors (``pccl.torch.shrink_to_survivors``), which makes
the new default group; rank 2 then exits; ranks 0–1 shrink it out by name
(``pccl.torch.shrink_group``); every collective after each shrink is checked."""

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

import pccl.torch as pt  # noqa: E402, F401 (registers the backend)


def main(rank, world, init, outdir):
    torch.set_num_threads(1)
    out = {"failures": [], "checks": 0, "log": []}

    def check(what, ok):
        out["checks"] += 1
        if not ok:
            out["failures"].append(what)

    def summed(members):
        x = torch.full((1000,), float(rank + 1))
        dist.all_reduce(x)
        want = float(sum(m + 1 for m in members))
        check(f"all_reduce over {members}: {x[0].item()} != {want}",
              bool(torch.all(x == want)))

    def report():
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)

    try:
        os.environ["PCCL_TIMEOUT"] = "5"
        dist.init_process_group("pccl", init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=5))
        summed(list(range(world)))
        dist.barrier()
        time.sleep(0.3)
        if rank == world - 1:
            report()
            os._exit(0)  # a crash: no destroy, no goodbye
        try:
            summed(list(range(world)))
            # A call may finish before the lost rank's connections close; the next fails.
            summed(list(range(world)))
            check("a call with a rank gone failed", False)
        except Exception as e:  # noqa: BLE001
            out["log"].append(f"failed as it should: {e}"[:300])
        t0 = time.time()
        pt.shrink_to_survivors()
        out["log"].append(f"survivors agreed in {time.time() - t0:.2f}s")
        members = list(range(world - 1))
        check(f"world size {dist.get_world_size()} after the agreement",
              dist.get_world_size() == world - 1)
        check(f"rank {dist.get_rank()} after the agreement", dist.get_rank() == rank)
        summed(members)
        x = torch.arange(4, dtype=torch.float32) + 10 * rank
        g = torch.empty(4 * len(members))
        dist.all_gather_into_tensor(g, x)
        want = torch.cat([torch.arange(4, dtype=torch.float32) + 10 * m for m in members])
        check("all_gather after the agreement", torch.equal(g, want))
        dist.barrier()
        time.sleep(0.3)
        if rank == world - 2:
            report()
            os._exit(0)
        try:
            summed(members)
            summed(members)
            check("a call with the second rank gone failed", False)
        except Exception as e:  # noqa: BLE001
            out["log"].append(f"failed as it should: {e}"[:300])
        pt.shrink_group([world - 2])
        members = members[:-1]
        check("world size after shrink_group", dist.get_world_size() == len(members))
        summed(members)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        out["failures"].append(traceback.format_exc()[-2000:])
    report()
