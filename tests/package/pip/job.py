"""The 2-rank job of the package tests (tests/package/pip/wheel_jobs.sh, run_job of steps.sh):
`import ddp` must come from the environment given as argv[1] (not from a build tree), and
collectives and DDP must work on it, through both spellings of the backend (argv[2] "gloo": on
PyTorch's gloo instead)."""
import os
import sys

import torch
import torch.distributed as dist

import ddp

env = os.path.realpath(sys.argv[1])
assert os.path.realpath(ddp.__file__).startswith(env + "/"), ddp.__file__
assert os.path.realpath(sys.prefix) == env, sys.prefix  # the environment's python3 ran this

backend = sys.argv[2] if len(sys.argv) > 2 else "cpu:ddp"
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() in (("gloo",) if backend == "gloo" else ("ddp", "cpu:ddp")), dist.get_backend()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), float(sum(range(1, world + 1))))), t[:4]

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(rank)  # different data per rank: only averaged gradients keep replicas equal
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(16, 8)).square().sum().backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
assert all(torch.equal(g, gathered[0]) for g in gathered), "replicas diverged"
dist.destroy_process_group()
print(f"rank {rank} of {world}: ddp from the environment, all_reduce and DDP ok ({backend})",
      flush=True)
if backend == "gloo":
    # PyTorch's gloo can abort the process at interpreter exit ("terminate called without an
    # active exception", pytorch/pytorch#190489: a gloo worker thread releases a tensor's Python
    # object after finalization began), even after destroy_process_group: 6 of 16 runs of a
    # plain torchrun gloo script without ddp aborted so on this machine. Not ddp's to test here.
    os._exit(0)
