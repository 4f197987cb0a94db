"""FSDP2 training harness: a small GPT-style decoder on the standard library's own source.

    torchrun --nproc-per-node 4 ffi/python/examples/train_fsdp.py --backend pccl --steps 30
    PCCL_RANKS_PER_NODE=2 torchrun --nproc-per-node 4 ffi/python/examples/train_fsdp.py
    torchrun --nproc-per-node 2 ffi/python/examples/train_fsdp.py --device cuda --compare

``--device cuda`` puts each rank on GPU ``local_rank % device_count`` (and stops with a clear
message when torch sees no GPU); ``--compare`` trains again, same seed, on the reference
backend: nccl on the same GPUs where it can run (one rank, or every rank on its own GPU),
else gloo on the CPU; both runs' losses and step times are reported.

Every transformer block is sharded with FSDP2 ``fully_shard`` (then the root module), so
each step all-gathers parameters (forward and backward) and reduce-scatters gradients. The
corpus is the text of Python's standard library modules, read from disk (byte-level
"characters", vocabulary 256); nothing is downloaded. Each rank trains on its own batches
drawn from a generator seeded by (seed, step, rank), so two runs with the same seed and
world size see the same data whatever the backend.

Prints per step: the loss (mean over ranks), tokens/s (all ranks) and the wall time the
training loop spent blocked in collectives (issue + wait of every torch.distributed call
FSDP makes), and a JSON summary line at the end (``--json-out`` writes it to a file).

``--quantize-weights int8|int4`` / ``--quantize-grads int8|int4`` (pccl backend, CPU or CUDA) route
FSDP's parameter all-gathers and gradient reduce-scatters to PCCL's block-quantized forms
(ZeRO++'s qwZ and qgZ; ``pccl.torch.set_quantization``); the summary then reports the bytes
those calls meant to move and moved per step, and ``--compare-quantized`` trains again
unquantized (same seed, same backend) and reports the loss curves' difference.
``--compare-hpz node|pair`` (pccl) trains again with that hpZ group (same seed, same launch)
and reports the bytes each run moved between and inside the nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ffi/python, for `pccl`


# ---------------------------------------------------------------------------------------
# Data: the standard library's source as bytes.

def load_corpus(max_bytes: int) -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    chunks, total = [], 0
    for p in files:
        try:
            b = p.read_bytes()
        except OSError:
            continue
        chunks.append(b)
        total += len(b)
        if total >= max_bytes:
            break
    data = b"".join(chunks)[:max_bytes]
    if len(data) < 10_000:
        raise RuntimeError(f"stdlib corpus under {root} is too small ({len(data)} bytes)")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)


def get_batch(data, step, rank, seed, batch, seq):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    ix = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
    x = torch.stack([data[i:i + seq] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + seq + 1] for i in ix.tolist()])
    return x, y


# ---------------------------------------------------------------------------------------
# Model: pre-norm decoder blocks with causal self-attention and a GELU MLP.

class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=256, d=128, layers=4, heads=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


# ---------------------------------------------------------------------------------------
# Time spent in collectives: wrap the torch.distributed entry points FSDP2 uses.

class CommTimer:
    NAMES = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
             "reduce_scatter_tensor", "all_reduce", "broadcast", "barrier")

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def install(self):
        for name in self.NAMES:
            fn = getattr(dist, name, None)
            if fn is not None:
                setattr(dist, name, self._wrap(fn))

    def _wrap(self, fn):
        timer = self

        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            work = fn(*args, **kwargs)
            timer.seconds += time.perf_counter() - t0
            timer.calls += 1
            if work is not None and hasattr(work, "wait"):
                return _TimedWork(work, timer)
            return work

        wrapped.__wrapped__ = fn
        return wrapped


class _TimedWork:
    def __init__(self, work, timer):
        self._work = work
        self._timer = timer

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        r = self._work.wait(*args, **kwargs)
        self._timer.seconds += time.perf_counter() - t0
        return r

    def __getattr__(self, name):
        return getattr(self._work, name)


# ---------------------------------------------------------------------------------------

def pick_device(kind: str) -> torch.device:
    """CPU, or CUDA device ``local_rank % device_count`` (fails clearly without CUDA)."""
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise SystemExit("train_fsdp: --device cuda needs a CUDA GPU, and torch sees none "
                         f"(torch {torch.__version__}, built with CUDA "
                         f"{torch.version.cuda}); run with --device cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def reference_backend(device: torch.device, world: int) -> tuple[str, torch.device]:
    """What pccl is compared with: nccl on the same GPUs where it can run (one rank, or every
    rank on a GPU of its own), else gloo on the CPU (the same seed gives the same run)."""
    if device.type == "cuda" and dist.is_nccl_available():
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        if world == 1 or torch.cuda.device_count() >= local_world:
            return "nccl", device
    return "gloo", torch.device("cpu")


def train(args, group, backend, device, rank, world, timer, log):
    """Trains a fresh model (seeded) with FSDP2 over ``group``; returns the run's summary."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    torch.manual_seed(args.seed)
    model = GPT(256, args.d_model, args.layers, args.heads, args.seq).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    # hpZ (ZeRO++): after forward each block keeps a secondary shard over the ranks of its
    # node (or pair), so the backward all-gathers stay inside it (FSDP2's reshard to a
    # smaller group, `reshard_after_forward=<group size>`).
    hpz = hpz_size(args, world) if getattr(args, "hpz", None) else None
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=hpz if hpz else True)
    fully_shard(model, mesh=mesh)
    if backend == "gloo":
        # gloo has no ReduceOp.AVG: reduce-scatter with SUM and divide afterwards.
        model.set_force_sum_reduction_for_comms(True)
        for blk in model.blocks:
            blk.set_force_sum_reduction_for_comms(True)
    quant = backend == "pccl" and (args.quantize_weights or args.quantize_grads)
    if backend == "pccl":
        import pccl.torch as pt
        pt.set_quantization(all_gather=args.quantize_weights if quant else None,
                            reduce_scatter=args.quantize_grads if quant else None,
                            block=args.qblock, group="all")
        pt.wire_bytes(reset=True, all_groups=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    data = load_corpus(args.corpus_bytes)
    if rank == 0 and log:
        print(f"backend={backend} device={device} world={world} params={n_params} "
              f"corpus={len(data)} bytes batch={args.batch}x{args.seq}/rank", flush=True)
    losses, step_times, comm_times = [], [], []
    for step in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        c0 = timer.seconds
        x, y = get_batch(data, step, rank, args.seed, args.batch, args.seq)
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lt = loss.detach().clone().to(torch.float64)
        dist.all_reduce(lt, group=group)  # SUM works on every backend; mean below
        mean_loss = lt.item() / world
        sync(device)
        dt = time.perf_counter() - t0
        losses.append(mean_loss)
        step_times.append(dt)
        comm_times.append(timer.seconds - c0)
        if rank == 0 and log:
            tok_s = world * args.batch * args.seq / dt
            print(f"[{backend}] step {step:3d} loss {mean_loss:.6f} tokens/s {tok_s:9.0f} "
                  f"step {dt * 1e3:7.1f} ms comm {comm_times[-1] * 1e3:7.1f} ms", flush=True)
    warm = step_times[1:] or step_times
    wire = None
    if backend == "pccl":
        import pccl.torch as pt
        b = pt.wire_bytes(all_groups=True)
        wire = {"logical_bytes_per_step": b["logical"] / max(args.steps, 1),
                "inter_node_wire_bytes_per_step": b["inter_wire"] / max(args.steps, 1),
                "intra_node_wire_bytes_per_step": b["intra_wire"] / max(args.steps, 1),
                "hpz": getattr(args, "hpz", None),
                "wire_bytes_per_step": b["wire"] / max(args.steps, 1),
                "quantized_calls": b["quantized_calls"], "calls": b["calls"],
                "weights": args.quantize_weights if quant else None,
                "grads": args.quantize_grads if quant else None}
        pt.set_quantization(group="all")  # off again for whatever runs next
    return {
        "wire": wire,
        "backend": backend, "device": str(device), "world": world, "steps": args.steps,
        "seed": args.seed, "params": n_params, "losses": losses,
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "mean_step_s": sum(warm) / len(warm) if warm else None,
        "tokens_per_s": world * args.batch * args.seq * len(warm) / sum(warm) if warm else None,
        "comm_s_total": sum(comm_times),
        "ranks_per_node": os.environ.get("PCCL_RANKS_PER_NODE"),
    }


def hpz_size(args, world):
    """The size of the group the secondary shard lives in: the node's ranks for ``--hpz
    node`` (PCCL_RANKS_PER_NODE, else torchrun's LOCAL_WORLD_SIZE), 2 for ``--hpz pair``
    (neighbouring ranks, e.g. the two GCDs of an MI250X; inside a node)."""
    m = int(os.environ.get("PCCL_RANKS_PER_NODE") or os.environ.get("LOCAL_WORLD_SIZE") or world)
    size = 2 if args.hpz == "pair" else m
    if size <= 1 or size >= world or world % size or m % size:
        raise SystemExit(f"train_fsdp: --hpz {args.hpz} needs groups of {size} ranks inside "
                         f"nodes of {m} that divide the world of {world}")
    return size


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="pccl", choices=["pccl", "gloo", "nccl"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: each rank on GPU local_rank %% device_count")
    ap.add_argument("--compare", action="store_true",
                    help="after the run, train again on the reference backend (nccl on the "
                         "GPUs where it can run, else gloo on CPU) and report both")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--corpus-bytes", type=int, default=4 << 20)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--quantize-weights", choices=["int8", "int4"], default=None,
                    help="pccl: FSDP's parameter all-gathers block-quantized (qwZ)")
    ap.add_argument("--quantize-grads", choices=["int8", "int4"], default=None,
                    help="pccl: FSDP's gradient reduce-scatters block-quantized (qgZ)")
    ap.add_argument("--qblock", type=int, default=2048, help="elements per scale")
    ap.add_argument("--hpz", choices=["node", "pair"], default=None,
                    help="hpZ: a secondary weight shard inside the node (or a pair of "
                         "neighbouring ranks) after forward, so backward all-gathers stay "
                         "inside it")
    ap.add_argument("--compare-quantized", action="store_true",
                    help="after the quantized run, train again unquantized (same seed) and "
                         "report the loss curves' difference")
    ap.add_argument("--compare-hpz", choices=["node", "pair"], default=None,
                    help="pccl: after the run, train again with this hpZ group (same seed) "
                         "and report both runs' bytes between and inside the nodes")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.compare_hpz and (args.hpz or args.backend != "pccl"):
        raise SystemExit("train_fsdp: --compare-hpz needs --backend pccl and no --hpz")

    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    if args.backend == "pccl":
        import pccl.torch  # noqa: F401  (registers the backend)
    if args.backend == "nccl" and device.type != "cuda":
        raise SystemExit("train_fsdp: --backend nccl needs --device cuda")
    if args.backend == "gloo" and device.type == "cuda":
        device = torch.device("cpu")  # gloo runs the CPU model (same seed, same data)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    timer = CommTimer()
    timer.install()
    summary = train(args, dist.group.WORLD, args.backend, device, rank, world, timer,
                    not args.quiet)
    summary["comm_calls"] = timer.calls
    if (args.quantize_weights or args.quantize_grads) and args.backend != "pccl":
        raise SystemExit("train_fsdp: --quantize-* need --backend pccl")

    def again(**changes):
        """The run again on the same group and backend, same seed, with ``changes``."""
        return train(argparse.Namespace(**{**vars(args), **changes}), dist.group.WORLD,
                     args.backend, device, rank, world, timer, not args.quiet)

    if args.compare_quantized and args.backend == "pccl":
        summary["unquantized"] = again(quantize_weights=None, quantize_grads=None)
        lu = summary["unquantized"]["losses"]
        summary["quantized_last_rel_diff"] = (abs(summary["last_loss"] - lu[-1]) / abs(lu[-1])
                                              if lu else None)
        # The last tenth of the steps, averaged: one batch's loss is noisy.
        k = max(1, len(lu) // 10)
        tail_q = sum(summary["losses"][-k:]) / k
        tail_u = sum(lu[-k:]) / k
        summary["quantized_tail_rel_diff"] = abs(tail_q - tail_u) / abs(tail_u) if lu else None
        if rank == 0:
            w, wu = summary["wire"], summary["unquantized"]["wire"]
            print(f"compare-quantized: weights {args.quantize_weights} grads "
                  f"{args.quantize_grads}: last loss {summary['last_loss']:.6f} vs "
                  f"{lu[-1]:.6f} unquantized (relative difference "
                  f"{summary['quantized_last_rel_diff']:.2e}; over the last {k} steps "
                  f"{summary['quantized_tail_rel_diff']:.2e}); wire bytes per step "
                  f"{w['wire_bytes_per_step']:.0f} vs {wu['wire_bytes_per_step']:.0f} "
                  f"({wu['wire_bytes_per_step'] / w['wire_bytes_per_step']:.2f}x fewer)",
                  flush=True)
    if args.compare_hpz:
        summary["hpz_run"] = again(hpz=args.compare_hpz)
        if rank == 0:
            w, wh = summary["wire"], summary["hpz_run"]["wire"]
            print(f"compare-hpz {args.compare_hpz}: bytes per step between nodes "
                  f"{wh['inter_node_wire_bytes_per_step']:.0f} (plain "
                  f"{w['inter_node_wire_bytes_per_step']:.0f}), inside them "
                  f"{wh['intra_node_wire_bytes_per_step']:.0f} (plain "
                  f"{w['intra_node_wire_bytes_per_step']:.0f}); last loss "
                  f"{summary['hpz_run']['last_loss']:.6f} (plain {summary['last_loss']:.6f})",
                  flush=True)
    if args.compare:
        ref, ref_dev = reference_backend(device, world)
        group = dist.new_group(list(range(world)), backend=ref)
        summary["reference"] = train(args, group, ref, ref_dev, rank, world, timer,
                                     not args.quiet)
        lr_ = summary["reference"]["losses"]
        summary["worst_rel_diff"] = max((abs(a - b) / abs(b) for a, b in
                                         zip(summary["losses"], lr_)), default=0.0)
        if rank == 0:
            print(f"compare: {args.backend} on {device} vs {ref} on {ref_dev}: last loss "
                  f"{summary['last_loss']:.6f} vs {summary['reference']['last_loss']:.6f}, "
                  f"worst relative difference {summary['worst_rel_diff']:.2e}, step "
                  f"{summary['mean_step_s'] * 1e3:.1f} ms vs "
                  f"{summary['reference']['mean_step_s'] * 1e3:.1f} ms", flush=True)
    if rank == 0:
        print("SUMMARY " + json.dumps({k: v for k, v in summary.items()
                                       if k not in ("losses", "reference", "unquantized",
                                                    "hpz_run")}),
              flush=True)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
