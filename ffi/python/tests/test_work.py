"""Work lifetime (dropped Works, wait(timeout), is_completed, sequence numbers), timeouts
reaching the communicator, a peer that dies, and FSDP2 / DeviceMesh / DTensor / functional
collectives on the pccl backend. Run on the newest torch and on torch 2.11 (test-python.sh)."""

import os

import pytest
import torch

import _work_worker
from _spawn import reports as read_reports
from _spawn import run_ranks

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "180"))


def _run(scenario, world, tmp_path, silent_ranks=()):
    init = f"file://{tmp_path}/rendezvous-{scenario}"
    err, took = run_ranks(_work_worker.main, world, (world, init, str(tmp_path), scenario),
                          TIMEOUT_S)
    reports, failures = [], []
    for r in range(world):
        rep = read_reports(tmp_path, 1, name=f"{scenario}-rank{r}.json", missing=False)
        if rep:
            reports.append(rep[0])
            failures += [f"rank {r}: {m}" for m in rep[0]["failures"]]
        elif r not in silent_ranks:
            failures.append(f"rank {r}: no report")
    print(f"\n{scenario} world {world} ({took:.1f}s): "
          f"{[{k: v for k, v in rep.items() if k != 'failures'} for rep in reports]}")
    assert not failures, "\n".join(failures)
    if err and not silent_ranks:
        raise AssertionError(err)
    return reports


@pytest.mark.parametrize("world", [1, 4])
def test_work_lifetime(world, tmp_path):
    _run("work_lifetime", world, tmp_path)


@pytest.mark.parametrize("world", [2])
def test_init_timeout_reaches_communicator(world, tmp_path):
    reps = _run("init_timeout", world, tmp_path, silent_ranks=(world - 1,))
    assert len(reps) == world - 1
    for rep in reps:
        assert rep["comm_timeout_s"] == 2.0 and rep["error_after_s"] < 3.0


@pytest.mark.parametrize("world", [3])
def test_set_timeout_reaches_every_call(world, tmp_path):
    reps = _run("set_timeout", world, tmp_path, silent_ranks=(world - 1,))
    assert len(reps) == world - 1
    for rep in reps:
        assert rep["comm_timeout_s"] == 1.5
        assert len(rep["errors_after_s"]) == 2
        assert all(1.0 < t < 1.5 + 1 for t in rep["errors_after_s"]), rep


@pytest.mark.parametrize("world", [3])
def test_peer_dies(world, tmp_path):
    reps = _run("peer_dies", world, tmp_path, silent_ranks=(world - 1,))
    assert len(reps) == world - 1
    for rep in reps:
        assert rep["error_after_s"] < 3 + 1


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fsdp2_device_mesh_functional(world, tmp_path):
    _run("fsdp_mesh", world, tmp_path)


def test_timeout_env_restored(monkeypatch):
    from pccl import _lib

    monkeypatch.setenv("PCCL_TIMEOUT", "77")
    with _lib.timeout_env(5):
        assert os.environ["PCCL_TIMEOUT"] == "5.0"
    assert os.environ["PCCL_TIMEOUT"] == "77"
    monkeypatch.delenv("PCCL_TIMEOUT")
    with _lib.timeout_env(5):
        pass
    assert "PCCL_TIMEOUT" not in os.environ


def test_reap_counts_an_ended_operation_another_thread_is_finishing_as_done():
    """The flake of 2026-11-29 (newest torch, world 4): torch's wrapper had asked a dropped
    Work for its future, whose thread held the operation while it freed the ended request;
    reap() then skipped it and counted it as still in flight. Now reap() waits for that
    thread (its requests have ended, so it is only finishing)."""
    import threading
    import time

    from pccl import _work

    class SlowlyFreed:  # a request that has ended but takes a while to free
        def test(self):
            return True

        def wait(self):
            time.sleep(0.3)

    op = _work._Op([SlowlyFreed()], keep=[], post=None, result=None, call="x", seq=1)
    _work._register(op)
    finisher = threading.Thread(target=op.finish)
    finisher.start()
    while not op.lock.locked():
        time.sleep(0.001)
    try:
        assert _work.reap() == 0 and op.finished
    finally:
        finisher.join()
        _work._unregister(op)
