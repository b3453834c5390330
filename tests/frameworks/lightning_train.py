"""A small Lightning training run for launchers (ddprun, torchrun, Lightning's own).

    ddprun --standalone --nproc-per-node 2 lightning_train.py [--accelerator cpu|gpu] [--steps N]

Trains a 2-layer MLP on a fixed synthetic regression task with `lightning.Trainer`,
strategy "ddp", devices = the launcher's LOCAL_WORLD_SIZE (Lightning recognises torchrun's
environment and joins the launched processes instead of spawning its own), then prints one
JSON line from rank 0: the world size, the device, the loss of the first and last step, and
whether every rank ended with the same parameters. Exit status 1 when the loss did not fall or
the ranks disagree.
"""
import argparse
import json
import os
import sys

import torch

try:
    import lightning as L
except ImportError:  # the older package name
    import pytorch_lightning as L


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))
        self.losses = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.detach().item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accelerator", default="auto", help="cpu, gpu or auto")
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()

    torch.manual_seed(0)
    model = Regression()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                         shuffle=True)
    trainer = L.Trainer(accelerator=a.accelerator,
                        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) //
                        int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                        strategy="ddp", max_steps=a.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)

    # fit() ends by moving the module back to the CPU; NCCL gathers only from the GPU.
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    gathered = trainer.strategy.all_gather(flat.to(trainer.strategy.root_device))
    gathered = gathered.reshape(trainer.world_size, -1)
    same = bool((gathered - gathered[0]).abs().max().item() == 0.0)
    losses = model.losses
    ok = same and losses[-1] < losses[0]
    if trainer.global_rank == 0:
        print(json.dumps({"bench": "framework", "framework": "lightning",
                          "world": trainer.world_size, "device": str(model.device),
                          "backend": torch.distributed.get_backend()
                          if torch.distributed.is_initialized() else None,
                          "first_loss": losses[0], "last_loss": losses[-1],
                          "ranks_equal": same, "ok": ok}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
