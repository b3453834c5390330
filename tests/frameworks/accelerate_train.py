"""A small Accelerate training run for launchers (ddprun, torchrun, accelerate launch).

    ddprun --standalone --nproc-per-node 2 accelerate_train.py [--cpu] [--steps N]

Trains a 2-layer MLP on a fixed synthetic regression task through `accelerate.Accelerator`
(which reads the launcher's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* variables and makes the
process group), then prints one JSON line from the main process: the world size, the device,
the loss of the first and last step, and whether every rank ended with the same parameters
(gathered). Exit status 1 when the loss did not fall or the ranks disagree.
"""
import argparse
import json
import sys

import torch
from accelerate import Accelerator


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="train on the CPU even with a GPU")
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()

    accelerator = Accelerator(cpu=a.cpu)
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
    ok = same and losses[-1] < losses[0]
    if accelerator.is_main_process:
        print(json.dumps({"bench": "framework", "framework": "accelerate",
                          "world": accelerator.num_processes, "device": str(accelerator.device),
                          "distributed_type": str(accelerator.distributed_type),
                          "backend": torch.distributed.get_backend()
                          if torch.distributed.is_initialized() else None,
                          "first_loss": losses[0], "last_loss": losses[-1],
                          "ranks_equal": same, "ok": ok}), flush=True)
    accelerator.end_training()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
