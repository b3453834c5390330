"""The `ddprun --recovery step` job of tests/package/pip/wheel_jobs.sh: PyTorch's DDP on the
ddp backend trained by ddp.StepManager for 6 steps on data that is a function of the step.
Rank 1's first process SIGKILLs itself in step 3's forward (it leaves DIR/killed behind, so its
replacement does not): ddprun restarts it alone, the survivor drops the step, the replacement is
healed from it, and both finish step 6 with the same parameters. Each rank prints one line.

Usage: recovery_job.py DIR"""
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp

killed = os.path.join(sys.argv[1], "killed")
dist.init_process_group("ddp")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 2), init_sync=False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = ddp.StepManager(model, opt)


def forward():
    if rank == 1 and steps.step == 3 and not os.path.exists(killed):
        open(killed, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8) / (steps.step + 1 + rank)
    return model(x).square().mean()


while steps.step < 6:
    steps.run_step(forward)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
same = all(torch.equal(g, gathered[0]) for g in gathered)
dist.destroy_process_group()
print(f"rank {rank} of {world}: step {steps.step}, recoveries {steps.recoveries}, parameters "
      f"{'equal' if same else 'DIFFER'} across ranks", flush=True)
