"""Run under mpiexec with PCCL_TORCH_BOOTSTRAP=mpi: the default group uses pcclCommInitMPIWorld."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pccl.torch  # noqa: E402,F401

r, n = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
dist.init_process_group("pccl", init_method=sys.argv[1], rank=r, world_size=n)
x = torch.full((1001,), float(r))
dist.all_reduce(x)
assert torch.equal(x, torch.full((1001,), float(sum(range(n))))), x[:4]
out = torch.empty(3 * n, dtype=torch.int64)
dist.all_gather_into_tensor(out, torch.full((3,), r, dtype=torch.int64))
assert out.tolist() == [i for i in range(n) for _ in range(3)], out
g = dist.new_group([0, 1], backend="pccl")  # a sub-group: bootstrapped through the store
if r < 2:
    y = torch.ones(3)
    dist.all_reduce(y, group=g)
    assert y.tolist() == [2.0] * 3, y
dist.barrier()
dist.destroy_process_group()
print(f"rank {r} ok", flush=True)
