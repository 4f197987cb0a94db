"""The FSDP2 harness: 30 steps on 4 ranks (2 nodes x 2) with pccl and with gloo, same seed."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS = 30


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(backend, tmp_path):
    out = tmp_path / f"{backend}.json"
    env = dict(os.environ, PCCL_RANKS_PER_NODE="2", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           str(EXAMPLES / "train_fsdp.py"), "--backend", backend, "--steps", str(STEPS),
           "--seed", "1234", "--json-out", str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, f"{backend} harness failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    return {b: _train(b, tmp) for b in ("pccl", "gloo")}


def test_losses_agree_with_gloo(runs):
    lp, lg = runs["pccl"]["losses"], runs["gloo"]["losses"]
    assert len(lp) == len(lg) == STEPS
    worst = max(abs(a - b) / abs(b) for a, b in zip(lp, lg))
    print(f"\nharness: pccl first/last loss {lp[0]:.6f} / {lp[-1]:.6f}; "
          f"gloo {lg[0]:.6f} / {lg[-1]:.6f}; worst relative difference {worst:.2e}; "
          f"step time pccl {runs['pccl']['mean_step_s'] * 1e3:.0f} ms, "
          f"gloo {runs['gloo']['mean_step_s'] * 1e3:.0f} ms")
    for i, (a, b) in enumerate(zip(lp, lg)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {i}: pccl {a} gloo {b}"


def test_loss_falls(runs):
    lp = runs["pccl"]["losses"]
    assert lp[0] > 5.0  # ~ln(256) at initialisation
    assert lp[-1] < lp[0] - 2.0, f"loss did not fall clearly: {lp[0]} -> {lp[-1]}"
