"""pccl's point-to-point, all-to-all and rooted ops against gloo (worlds of 2..4)."""

import os

import pytest

import _p2p_worker
from _spawn import run_world

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "120"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_p2p_alltoall_rooted(world, tmp_path):
    init = f"file://{tmp_path}/rendezvous"
    reports = run_world(_p2p_worker.main, world, (world, init, str(tmp_path)), TIMEOUT_S,
                        tmp_path)
    checks = sum(r["checks"] for r in reports)
    assert checks > 0 and sum(r["vs_gloo"] for r in reports) > 0
