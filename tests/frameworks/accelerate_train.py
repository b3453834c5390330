"""A small Accelerate training run for launchers (ddprun, torchrun, accelerate launch).

    ddprun --standalone --nproc-per-node 2 accelerate_train.py --cpu [--backend gloo|ddp]
    accelerate launch --cpu --num_processes 2 ... accelerate_train.py --cpu --backend ddp

Trains a 2-layer MLP on a fixed synthetic regression task through `accelerate.Accelerator`
(which reads the launcher's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* variables), then prints
one JSON line from the main process: the world size, the device, the process-group backend
torch.distributed reports, the loss of the first and last step, and whether every rank ended
with the same parameters (gathered).

--backend picks the process group's backend:
  auto  Accelerate's choice (nccl on GPUs; gloo, or mpi when torch has it, with --cpu).
  gloo  InitProcessGroupKwargs(backend="gloo"): Accelerate makes the group.
  ddp   `import ddp` (not with --no-import-ddp: then torch's plugin entry point alone names
        the backend) and torch.distributed.init_process_group("ddp") before the Accelerator,
        which then joins that group. Accelerate refuses backend="ddp" itself: with --cpu it
        only takes gloo or mpi ("Your assigned backend ddp is not available, please use gloo").

Exit status 1 when the loss did not fall, the ranks disagree, the run was not distributed
(world 1 under a launcher of several processes) or the backend is not the one asked for.
"""
import argparse
import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true",
                   help="train on the CPU even with a GPU (on a machine without one, Accelerate "
                        "trains distributed only with it or ACCELERATE_USE_CPU=1)")
    p.add_argument("--backend", choices=["auto", "gloo", "ddp"], default="auto")
    p.add_argument("--no-import-ddp", action="store_true",
                   help="never import ddp: the backend comes from torch's plugin entry point")
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()

    handlers = []
    if a.backend == "ddp":
        if not a.no_import_ddp:
            import ddp  # noqa: F401  registers the "ddp" backend with torch.distributed
        torch.distributed.init_process_group("ddp")
    elif a.backend == "gloo":
        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    accelerator = Accelerator(cpu=a.cpu, kwargs_handlers=handlers)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                         shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    step = 0
    while step < a.steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
            step += 1
            if step == a.steps:
                break

    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    gathered = accelerator.gather(flat.unsqueeze(0))
    same = bool((gathered - gathered[0]).abs().max().item() == 0.0)
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    problems = []
    if not same:
        problems.append("the ranks' parameters differ")
    if not losses[-1] < losses[0]:
        problems.append("the loss did not fall")
    if accelerator.num_processes != launched:
        problems.append(f"Accelerate trains {accelerator.num_processes} process(es) but "
                        f"WORLD_SIZE is {launched}")
    if a.backend != "auto" and backend != a.backend:
        problems.append(f"the process group's backend is {backend}, not {a.backend}")
    if accelerator.is_main_process:
        print(json.dumps({"bench": "framework", "framework": "accelerate",
                          "world": accelerator.num_processes, "device": str(accelerator.device),
                          "distributed_type": str(accelerator.distributed_type),
                          "backend": backend, "first_loss": losses[0], "last_loss": losses[-1],
                          "ranks_equal": same, "ok": not problems}), flush=True)
    for problem in problems:
        print(f"accelerate_train: rank {accelerator.process_index}: {problem}", file=sys.stderr)
    # The DistributedDataParallel wrapper goes before the process group: when its Reducer holds
    # the group's last reference, freeing it (at exit) runs ~ProcessGroupGloo with the GIL held,
    # which joins gloo's worker threads, and a worker still releasing the Python tensors of the
    # last collective (the gather above) waits for the GIL: a hang at exit (PyTorch 2.13).
    # end_training() destroys the group, which frees it without the GIL.
    model, optimizer, loader = accelerator.free_memory(model, optimizer, loader)
    accelerator.end_training()
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
