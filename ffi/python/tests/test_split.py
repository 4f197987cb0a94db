"""dist.split_group and new_group through pcclCommSplit (no new bootstrap), vs gloo."""

import os

import pytest
import torch.distributed as dist

import _split_worker
from _spawn import run_world

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "120"))


@pytest.mark.skipif(not hasattr(dist.ProcessGroup, "split_group")
                    or "split" not in dir(__import__("torch")._C._distributed_c10d.Backend),
                    reason="torch <= 2.11: split_group needs a CUDA backend; new_group bootstraps")
@pytest.mark.parametrize("world", [3, 4])
def test_split_group_and_new_group(world, tmp_path):
    init = f"file://{tmp_path}/rendezvous"
    reports = run_world(_split_worker.main, world, (world, init, str(tmp_path)), TIMEOUT_S,
                        tmp_path)
    checks = sum(r["checks"] for r in reports)
    assert checks > 0
    for r in reports:
        assert r["split_bootstraps"] == 0 and r["new_group_bootstraps"] == 0, r
