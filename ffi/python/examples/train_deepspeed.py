"""DeepSpeed ZeRO-3 on CPU over the pccl backend (the same model and data as train_fsdp.py).

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 4 ffi/python/examples/train_deepspeed.py \
        --backend pccl --steps 10

DeepSpeed's CPU accelerator, its ``deepspeed.comm`` layer and ZeRO stage 3 run unchanged;
only the torch.distributed backend name differs (``--backend pccl|gloo|nccl``).

``--device cuda`` (DeepSpeed's CUDA accelerator) puts each rank on GPU
``local_rank % device_count`` and stops with a clear message when torch sees no GPU; compare
``--backend pccl`` with ``--backend nccl`` there (nccl needs one rank, or a GPU per rank),
and with ``--backend gloo --device cpu``: the same seed gives the same data and model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

def _device_arg(argv) -> str:
    """--device before argparse runs: DeepSpeed picks its accelerator at import."""
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--device="):
            return a.split("=", 1)[1]
    return "cpu"


os.environ.setdefault("DS_ACCELERATOR", _device_arg(sys.argv[1:]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from train_fsdp import GPT, get_batch, load_corpus, pick_device, sync  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="pccl", choices=["pccl", "gloo", "nccl"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = pick_device(args.device)
    if args.backend == "nccl" and device.type != "cuda":
        raise SystemExit("train_deepspeed: --backend nccl needs --device cuda")
    if args.backend == "pccl":
        import pccl.torch  # noqa: F401
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = GPT(256, 128, 4, 4, args.seq)
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0,
                                                  "torch_adam": True}},
        "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    data = load_corpus(4 << 20)
    losses, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = get_batch(data, step, rank, args.seed, args.batch, args.seq)
        x, y = x.to(device), y.to(device)
        logits = engine(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        engine.backward(loss)
        engine.step()
        lt = loss.detach().clone().to(torch.float64)
        dist.all_reduce(lt)
        losses.append(lt.item() / world)
        sync(device)
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step:3d} loss {losses[-1]:.6f} step {times[-1] * 1e3:7.1f} ms",
                  flush=True)
    if rank == 0:
        s = {"backend": args.backend, "device": str(device), "losses": losses,
             "mean_step_s": sum(times[1:]) / max(1, len(times) - 1)}
        print("SUMMARY " + json.dumps({k: v for k, v in s.items() if k != "losses"}))
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(s, f)
    dist.barrier()


if __name__ == "__main__":
    main()
