"""Runs a test's per-rank worker in spawned processes and collects the JSON report each rank
writes: one place for the start, the bounded wait (a hang kills the ranks and fails the test
instead of stalling the suite) and the reading of reports."""

from __future__ import annotations

import json
import os
import time

import torch.multiprocessing as mp


def run_ranks(main, world, args, timeout_s, poll_s=2.0):
    """Starts ``main(rank, *args)`` in ``world`` spawned processes and waits for them. Returns
    the error (None when all ended cleanly; a string naming the hang when they ran past
    ``timeout_s`` and were killed) and the seconds taken."""
    t0 = time.time()
    ctx = mp.start_processes(main, args=tuple(args), nprocs=world, join=False,
                             start_method="spawn")
    err = None
    try:
        while not ctx.join(timeout=poll_s):
            if time.time() - t0 > timeout_s:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                err = f"world {world}: no end in {timeout_s}s (hang?)"
                break
    except Exception as e:  # noqa: BLE001 (a rank's exception or exit code)
        err = str(e)
    return err, time.time() - t0


def reports(folder, world, name="rank{r}.json", missing=None):
    """Each rank's report (``folder/name`` with ``{r}`` its rank), in rank order; a rank
    without one gets ``missing`` (default: a report of one failure, "no report"), or is left
    out when ``missing`` is False."""
    out = []
    for r in range(world):
        p = os.path.join(str(folder), name.format(r=r))
        if os.path.exists(p):
            with open(p) as f:
                out.append(json.load(f))
        elif missing is not False:
            out.append(dict(missing) if missing else
                        {"checks": 0, "vs_gloo": 0, "failures": ["no report"], "log": []})
    return out


def failures(reps):
    """Every failure of every report, named by its rank."""
    return [f"rank {i}: {m}" for i, r in enumerate(reps) for m in r["failures"]]


def run_world(main, world, args, timeout_s, folder, poll_s=2.0):
    """``run_ranks``, then every rank's report from ``folder``: fails the test when a rank
    failed a check, wrote no report, raised or hung; prints the checks and the time. Returns
    the reports."""
    err, took = run_ranks(main, world, args, timeout_s, poll_s)
    reps = reports(folder, world)
    print(f"world {world}: {sum(r['checks'] for r in reps)} checks in {took:.1f}s")
    fails = failures(reps)
    assert not fails and err is None, "\n".join(fails[:40]) + f"\n{err}"
    return reps
