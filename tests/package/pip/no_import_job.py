"""The no-import job of tests/package/pip/wheel_jobs.sh: a plain PyTorch script that never
writes `import ddp` asks for the "ddp" backend, which the environment given as argv[1] registers
through torch's plugin entry point (python/ddp_torch_plugin). Under `ddprun --recovery step`
(DDP_RECOVERY=step) it imports ddp only after init_process_group and still gets ddprun's store
and a recoverable group: ddp.StepManager takes it and runs two steps."""
import os
import sys

import torch
import torch.distributed as dist

env = os.path.realpath(sys.argv[1])
assert os.path.realpath(sys.prefix) == env, sys.prefix
assert "ddp" not in sys.modules, "something imported ddp before the script asked for a group"

dist.init_process_group("ddp")
rank, world = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "ddp", dist.get_backend()
assert os.path.realpath(sys.modules["ddp"].__file__).startswith(env + "/")  # loaded by the group
t = torch.full((100,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((100,), float(sum(range(1, world + 1))))), t[:4]
what = "all_reduce ok"

if os.environ.get("DDP_RECOVERY") == "step":
    import ddp  # after init_process_group: the order no longer matters

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1), init_sync=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = ddp.StepManager(model, opt)
    while steps.step < 2:
        steps.run_step(lambda: model(torch.ones(8, 4) * (rank + 1)).square().mean())
    what += ", ddp.StepManager on ddprun's store ok"

dist.destroy_process_group()
print(f"rank {rank} of {world}: no import ddp, {what}", flush=True)
