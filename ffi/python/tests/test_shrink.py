"""Going on after ranks die, from torch: pccl.torch.shrink_to_survivors (the survivors agree,
no list needed) and pccl.torch.shrink_group (the survivors name the dead), each followed by
checked collectives on the new default group."""

import os

import _shrink_worker
from _spawn import failures, reports, run_ranks

TIMEOUT_S = int(os.environ.get("PCCL_TEST_TIMEOUT", "120"))


def test_survivors_shrink_and_go_on_after_ranks_crash(tmp_path):
    world = 4
    init = f"file://{tmp_path}/rendezvous"
    err, _ = run_ranks(_shrink_worker.main, world, (world, init, str(tmp_path)), TIMEOUT_S)
    reps = reports(tmp_path, world)
    for i, r in enumerate(reps):
        for line in r["log"]:
            print(f"rank {i}: {line}")
    assert not failures(reps) and err is None, "\n".join(failures(reps)[:30]) + f"\n{err}"
    # Ranks 0 and 1 went through both shrinks; rank 2 through the agreement.
    assert reps[0]["checks"] >= 7 and reps[2]["checks"] >= 5, reps
