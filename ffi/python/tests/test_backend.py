"""torch.distributed backend "pccl" against gloo: worlds of 1..4 processes."""

import os

import pytest
import torch

import _dist_worker
from _spawn import failures, reports, run_ranks, run_world

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "240"))


def _run_world(world, tmp_path, quick=False):
    init = f"file://{tmp_path}/rendezvous"
    reports = run_world(_dist_worker.main, world, (world, init, str(tmp_path), quick),
                        TIMEOUT_S, tmp_path, poll_s=5)
    checks = sum(r["checks"] for r in reports)
    vs_gloo = sum(r["vs_gloo"] for r in reports)
    print(f"world {world}: {vs_gloo} checks against gloo")
    assert checks > 0 and (world == 1 or vs_gloo > 0)


# Worlds of 3 and 4 run each configuration one after another in one start of the ranks
# (_dist_worker's phases): the plain world; pretend nodes of 2 ranks (the hierarchical
# algorithms; 3 ranks = unequal nodes 2 + 1); and with 4, PCCL_TUNE_ONLINE's trials (the
# first calls of each size try the model's close candidates, and the agreement waits for
# torch's queued work) — every result still matches gloo.
PHASES = {
    3: [("plain", {"PCCL_RANKS_PER_NODE": None, "PCCL_TUNE_ONLINE": None}),
        ("two_nodes", {"PCCL_RANKS_PER_NODE": "2"})],
    4: [("plain", {"PCCL_RANKS_PER_NODE": None, "PCCL_TUNE_ONLINE": None}),
        ("two_nodes", {"PCCL_RANKS_PER_NODE": "2"}),
        ("online", {"PCCL_RANKS_PER_NODE": "2", "PCCL_TUNE_ONLINE": "2"})],
}


@pytest.fixture(scope="module")
def shared_world(tmp_path_factory):
    """``get(world)``: that world's phases, run once for the module: (error, seconds, folder)."""
    done = {}

    def get(world):
        if world not in done:
            tmp = tmp_path_factory.mktemp(f"world{world}")
            phases = PHASES[world]
            done[world] = run_ranks(_dist_worker.main, world,
                                    (world, f"file://{tmp}/rendezvous", str(tmp), False,
                                     phases), TIMEOUT_S * len(phases), poll_s=5) + (tmp,)
        return done[world]

    return get


def _phase(shared_world, world, name):
    err, took, tmp = shared_world(world)
    reps = reports(tmp, world, name=f"{name}-rank{{r}}.json")
    vs_gloo = sum(r["vs_gloo"] for r in reps)
    print(f"world {world} {name}: {vs_gloo} checks against gloo (the world's phases "
          f"{took:.1f}s)")
    fails = failures(reps)
    assert not fails and err is None, "\n".join(fails[:40]) + f"\n{err}"
    assert vs_gloo > 0


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collectives_match_gloo(world, tmp_path, shared_world):
    if world in PHASES:
        _phase(shared_world, world, "plain")
    else:
        _run_world(world, tmp_path)


@pytest.mark.parametrize("world", [3, 4])
def test_collectives_match_gloo_two_nodes(world, shared_world):
    _phase(shared_world, world, "two_nodes")


def test_collectives_match_gloo_with_online_trials(shared_world):
    _phase(shared_world, 4, "online")


@pytest.mark.parametrize("only", [None, 2], ids=["on_every_rank", "on_rank_2_only"])
def test_an_invalid_variable_fails_every_rank_at_once(tmp_path, monkeypatch, only):
    """An invalid PCCL_RANKS_PER_NODE ends the group's creation on every rank within seconds,
    instead of a wait of the store's or the group's timeout (30 minutes). On every rank: rank
    0 cannot create the unique id, raises, and the ranks waiting for the id in the store raise
    with its reason. On rank 2 only: its pcclCommInitRank fails and withdraws from the
    rendezvous, and ranks 0 and 1 raise naming rank 2 and its reason."""
    monkeypatch.setenv("PCCL_RANKS_PER_NODE", "abc")
    err, took = run_ranks(_dist_worker.bad_env_main, 3,
                          (3, f"file://{tmp_path}/rendezvous", str(tmp_path), only), 120)
    reps = reports(tmp_path, 3, name="bad-env-rank{r}.json", missing=False)
    print(f"\nbad variable: {[(r['after_s'], (r['error'] or '')[:160]) for r in reps]}")
    assert err is None and len(reps) == 3, (err, reps)
    for r, rep in enumerate(reps):
        assert rep["error"] and "PCCL_RANKS_PER_NODE=abc" in rep["error"], (r, rep)
        assert rep["after_s"] < 30, (r, rep)
        if only is None and r > 0:
            assert "rank 0 of the group" in rep["error"], (r, rep)
        if only is not None and r != only:
            assert f"rank {only} cannot join" in rep["error"], (r, rep)


def test_import_registers_backend():
    import torch.distributed as dist

    import pccl.torch  # noqa: F401

    assert dist.Backend.PCCL == "pccl"
    assert "pccl" in dist.Backend.backend_list


def test_library_loads():
    import pccl

    assert pccl.version() >= 100
    assert os.path.exists(pccl.library_path())
    # The library says what it was built with; the suite builds it with PCCL_TEST_FEATURES.
    feats = pccl.features()
    assert set(feats) <= {"mpi", "cuda", "rocm", "hwloc", "ofi"}, feats
    want = os.environ.get("PCCL_TEST_FEATURES")
    if want:
        assert set(feats) == {f for f in want.split(",") if f}, (feats, want)


def test_tensors_on_several_or_unknown_devices_rejected():
    import pccl.torch as pt

    class Fake:
        def __init__(self, kind):
            self.device = torch.device(kind, 0) if kind != "cpu" else torch.device("cpu")
            self.is_sparse = False

    with pytest.raises(RuntimeError, match="all_reduce.*several devices"):
        pt._device_of([Fake("cpu"), Fake("cuda")], "all_reduce")
    with pytest.raises(RuntimeError, match="all_reduce.*CPU and CUDA"):
        pt._device_of([Fake("meta")], "all_reduce")
    assert pt._device_of([Fake("cuda")], "x") == torch.device("cuda", 0)


def test_library_path_order(tmp_path, monkeypatch):
    """PCCL_LIBRARY overrides, then the library packaged next to the module, then target/."""
    import pccl
    from pccl import _lib

    fake = tmp_path / "libpccl.so"
    fake.write_bytes(b"")
    monkeypatch.setattr(_lib, "_lib_path", None)
    monkeypatch.setenv("PCCL_LIBRARY", str(fake))
    assert pccl.library_path() == str(fake)
    monkeypatch.delenv("PCCL_LIBRARY")
    cands = [str(c) for c in _lib._candidates()]
    pkg = os.path.join(os.path.dirname(os.path.abspath(_lib.__file__)), "libpccl.so")
    assert cands[0] == pkg
    assert any(c.endswith(os.path.join("target", "release", "libpccl.so")) for c in cands[1:])
