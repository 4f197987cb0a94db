"""Going on after ranks die, from torch: pccl.torch.shrink_to_survivors (the survivors agree,
no list needed) and pccl.torch.shrink_group (the survivors name the dead), each followed by
checked collectives on the new default group."""

import json
import os
import time

import torch.multiprocessing as mp

import _shrink_worker

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "120"))


def test_survivors_shrink_and_go_on_after_ranks_crash(tmp_path):
    world = 4
    init = f"file://{tmp_path}/rendezvous"
    t0 = time.time()
    ctx = mp.start_processes(_shrink_worker.main, args=(world, init, str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn")
    err = None
    try:
        while not ctx.join(timeout=2):
            if time.time() - t0 > TIMEOUT_S:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                err = TimeoutError(f"did not finish in {TIMEOUT_S}s (hang?)")
                break
    except Exception as e:  # noqa: BLE001
        err = e
    reports = []
    for r in range(world):
        p = os.path.join(tmp_path, f"rank{r}.json")
        reports.append(json.load(open(p)) if os.path.exists(p)
                       else {"checks": 0, "failures": ["no report"], "log": []})
    for i, r in enumerate(reports):
        for line in r["log"]:
            print(f"rank {i}: {line}")
    fails = [f"rank {i}: {m}" for i, r in enumerate(reports) for m in r["failures"]]
    assert not fails and err is None, "\n".join(fails[:30]) + f"\n{err}"
    # Ranks 0 and 1 went through both shrinks; rank 2 through the agreement.
    assert reports[0]["checks"] >= 7 and reports[2]["checks"] >= 5, reports
