"""dist.split_group and new_group through pcclCommSplit (no new bootstrap), vs gloo."""

import json
import os
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import _split_worker

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "120"))


@pytest.mark.skipif(not hasattr(dist.ProcessGroup, "split_group")
                    or "split" not in dir(__import__("torch")._C._distributed_c10d.Backend),
                    reason="torch <= 2.11: split_group needs a CUDA backend; new_group bootstraps")
@pytest.mark.parametrize("world", [3, 4])
def test_split_group_and_new_group(world, tmp_path):
    init = f"file://{tmp_path}/rendezvous"
    t0 = time.time()
    ctx = mp.start_processes(_split_worker.main, args=(world, init, str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn")
    err = None
    try:
        while not ctx.join(timeout=2):
            if time.time() - t0 > TIMEOUT_S:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                err = TimeoutError(f"world {world} did not finish in {TIMEOUT_S}s (hang?)")
                break
    except Exception as e:  # noqa: BLE001
        err = e
    reports = []
    for r in range(world):
        p = os.path.join(tmp_path, f"rank{r}.json")
        reports.append(json.load(open(p)) if os.path.exists(p)
                       else {"checks": 0, "failures": ["no report"]})
    checks = sum(r["checks"] for r in reports)
    print(f"world {world}: {checks} checks in {time.time() - t0:.1f}s")
    fails = [f"rank {i}: {m}" for i, r in enumerate(reports) for m in r["failures"]]
    assert not fails and err is None, "\n".join(fails[:30]) + f"\n{err}"
    assert checks > 0
    for r in reports:
        assert r["split_bootstraps"] == 0 and r["new_group_bootstraps"] == 0, r
