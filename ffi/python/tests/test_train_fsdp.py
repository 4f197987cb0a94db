"""The FSDP2 harness: 30 steps on 4 ranks (2 nodes x 2) with pccl and with gloo, same seed;
hpZ on the same shape; INT8 weights and INT4 gradients against the unquantized run.

A small model (2 layers, 64-token sequences): what is checked is agreement and the loss
falling, and a launch of 4 ranks costs more than the steps, so the pccl, hpZ and gloo runs
share one launch (``--compare-hpz node``: pccl trains the same seed again with hpZ;
``--compare``: gloo trains it again on a group of its own)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS = 30
SMALL = ("--seq", "64", "--layers", "2")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(backend, tmp_path, extra=()):
    out = tmp_path / f"{backend}{'-'.join(extra)}.json"
    env = dict(os.environ, PCCL_RANKS_PER_NODE="2", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           str(EXAMPLES / "train_fsdp.py"), "--backend", backend, "--steps", str(STEPS),
           "--seed", "1234", "--json-out", str(out), *SMALL, *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    if p.returncode != 0 and "SUMMARY" in p.stdout and \
            "terminate called without an active exception" in p.stdout + p.stderr:
        # A gloo run finished its steps and then aborted in gloo's teardown (seen once in CI,
        # 2026-11-27, a run with no PCCL loaded, on a loaded 2-core machine): run it again.
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, f"{backend} harness failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    s = _train("pccl", tmp, ("--compare", "--compare-hpz", "node"))
    return {"pccl": s, "gloo": s["reference"], "hpz": s["hpz_run"]}


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


def test_quantized_weights_and_grads_train_like_the_unquantized_run(tmp_path):
    """INT8 weights and INT4 gradients (ZeRO++'s qwZ/qgZ through the pccl backend): after 300
    steps of a small model on 2 ranks the loss (mean of the last 30 steps) is within 2% of the
    unquantized run with the same seed, and the calls moved ~4x fewer bytes."""
    out = tmp_path / "quantized.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           str(EXAMPLES / "train_fsdp.py"), "--backend", "pccl", "--steps", "300",
           "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "32", "--batch", "4",
           "--quantize-weights", "int8", "--quantize-grads", "int4", "--qblock", "256",
           "--compare-quantized", "--quiet", "--json-out", str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, f"harness failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    with open(out) as f:
        s = json.load(f)
    w, wu = s["wire"], s["unquantized"]["wire"]
    print(f"\nquantized harness: last-30-step loss difference {s['quantized_tail_rel_diff']:.2e}, "
          f"wire bytes per step {w['wire_bytes_per_step']:.0f} vs {wu['wire_bytes_per_step']:.0f}")
    assert w["quantized_calls"] == w["calls"] > 0, w
    assert wu["quantized_calls"] == 0, wu
    assert wu["wire_bytes_per_step"] / w["wire_bytes_per_step"] >= 3.5, (w, wu)
    assert s["quantized_tail_rel_diff"] <= 0.02, s["quantized_tail_rel_diff"]
    assert s["losses"][-1] < s["losses"][0] - 2.0


def test_hpz_keeps_the_backward_all_gathers_inside_the_node(runs):
    """hpZ (--hpz node: FSDP2 reshards each block onto the node's ranks after forward): the
    same losses as the plain run, and fewer bytes between the (pretend) nodes per step, the
    difference now inside them."""
    h = runs["hpz"]
    plain, w = runs["pccl"]["wire"], h["wire"]
    assert w["hpz"] == "node" and plain["hpz"] is None, (w, plain)
    print(f"\nhpZ: inter-node bytes per step {w['inter_node_wire_bytes_per_step']:.0f} "
          f"(plain {plain['inter_node_wire_bytes_per_step']:.0f}), intra-node "
          f"{w['intra_node_wire_bytes_per_step']:.0f}")
    for i, (a, b) in enumerate(zip(h["losses"], runs["pccl"]["losses"])):
        assert abs(a - b) <= 1e-6 * abs(b), f"step {i}: hpZ {a} plain {b}"
    assert plain["intra_node_wire_bytes_per_step"] == 0
    assert w["intra_node_wire_bytes_per_step"] > 0
    assert w["inter_node_wire_bytes_per_step"] < 0.9 * plain["inter_node_wire_bytes_per_step"]
