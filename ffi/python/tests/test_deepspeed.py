"""DeepSpeed ZeRO-3 (CPU accelerator) over pccl and gloo: same losses. Skipped without deepspeed."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS = 6


def _run(backend, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / f"ds-{backend}.json"
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PCCL_RANKS_PER_NODE="2")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                        "--master-addr", "127.0.0.1", "--master-port", str(port),
                        str(EXAMPLES / "train_deepspeed.py"), "--backend", backend,
                        "--steps", str(STEPS), "--json-out", str(out)],
                       env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, f"{backend}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_deepspeed_zero3_pccl_matches_gloo(tmp_path):
    lp = _run("pccl", tmp_path)["losses"]
    lg = _run("gloo", tmp_path)["losses"]
    print(f"\ndeepspeed zero-3: pccl {lp[0]:.6f} -> {lp[-1]:.6f}, gloo {lg[0]:.6f} -> {lg[-1]:.6f}")
    assert len(lp) == len(lg) == STEPS
    for i, (a, b) in enumerate(zip(lp, lg)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {i}: pccl {a} gloo {b}"
    assert lp[-1] < lp[0] - 1.0
