"""A small Lightning training run for launchers (ddprun, torchrun, Lightning's own).

    ddprun --standalone --nproc-per-node 2 lightning_train.py --accelerator cpu [--backend gloo|ddp]
    python lightning_train.py --accelerator cpu --devices 2 [--backend gloo|ddp]   # Lightning launches

Trains a 2-layer MLP on a fixed synthetic regression task with `lightning.Trainer`, strategy
DDPStrategy. Under a launcher, devices = the launcher's LOCAL_WORLD_SIZE and num_nodes =
WORLD_SIZE / LOCAL_WORLD_SIZE (Lightning recognises torchrun's environment and joins the
launched processes instead of starting its own); started as one process with --devices N,
Lightning's own launcher starts the other N - 1 processes (it runs this script again with
LOCAL_RANK set). Prints one JSON line from rank 0: the world size, the device, the process
group's backend (torch.distributed.get_backend()), the loss of the first and last step, and
whether every rank ended with the same parameters.

--backend picks the process group's backend: DDPStrategy(process_group_backend=...), which
Lightning hands to torch.distributed.init_process_group unchanged; for "ddp" the script does
`import ddp` first (here, so that the processes Lightning starts import it too), unless
--no-import-ddp: then the backend must come from torch's plugin entry point alone (an installed
ddp, or the build tree's dist-info), as in a Lightning script nobody changed. "auto" leaves
Lightning's choice (nccl on GPUs, gloo on the CPU).

Exit status 1 when the loss did not fall, the ranks disagree, the world is not the one asked
for or the backend is not the one asked for.
"""
import argparse
import json
import os
import sys

import torch

try:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the older package name
    import pytorch_lightning as L
    from pytorch_lightning.strategies import DDPStrategy


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


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accelerator", default="auto", help="cpu, gpu or auto")
    p.add_argument("--backend", choices=["auto", "gloo", "ddp"], default="auto")
    p.add_argument("--no-import-ddp", action="store_true",
                   help="never import ddp: the backend comes from torch's plugin entry point")
    p.add_argument("--devices", type=int, default=None,
                   help="processes on this node; default: the launcher's LOCAL_WORLD_SIZE, else 1 "
                        "(more than 1 without a launcher: Lightning starts them)")
    p.add_argument("--steps", type=int, default=30)
    return p.parse_args()


def main(a):
    # A torchrun-style launcher (ddprun) sets LOCAL_WORLD_SIZE; the processes Lightning's own
    # launcher starts get WORLD_SIZE (devices x num_nodes) but no LOCAL_WORLD_SIZE.
    if "LOCAL_WORLD_SIZE" in os.environ:
        local_world = int(os.environ["LOCAL_WORLD_SIZE"])
        num_nodes = int(os.environ.get("WORLD_SIZE", str(local_world))) // local_world
    else:
        local_world, num_nodes = 1, 1
    devices = a.devices if a.devices is not None else local_world
    strategy = DDPStrategy(process_group_backend=None if a.backend == "auto" else a.backend)

    torch.manual_seed(0)
    model = Regression()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                         shuffle=True)
    trainer = L.Trainer(accelerator=a.accelerator, devices=devices, num_nodes=num_nodes,
                        strategy=strategy, max_steps=a.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)

    # fit() ends by moving the module back to the CPU; NCCL gathers only from the GPU.
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    gathered = trainer.strategy.all_gather(flat.to(trainer.strategy.root_device))
    gathered = gathered.reshape(trainer.world_size, -1)
    same = bool((gathered - gathered[0]).abs().max().item() == 0.0)
    losses = model.losses
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    problems = []
    if not same:
        problems.append("the ranks' parameters differ")
    if not losses[-1] < losses[0]:
        problems.append("the loss did not fall")
    if trainer.world_size != devices * num_nodes:
        problems.append(f"Lightning trains {trainer.world_size} process(es), "
                        f"not {devices * num_nodes}")
    if a.backend != "auto" and backend != a.backend:
        problems.append(f"the process group's backend is {backend}, not {a.backend}")
    if trainer.global_rank == 0:
        print(json.dumps({"bench": "framework", "framework": "lightning",
                          "world": trainer.world_size, "device": str(model.device),
                          "backend": backend, "first_loss": losses[0], "last_loss": losses[-1],
                          "ranks_equal": same, "ok": not problems}), flush=True)
    for problem in problems:
        print(f"lightning_train: rank {trainer.global_rank}: {problem}", file=sys.stderr)
    # fit() unwrapped the DistributedDataParallel module; Lightning leaves a gloo group alive.
    # Destroying it here frees it without the GIL, rather than at interpreter exit while a gloo
    # worker may still be releasing the Python tensors of the all_gather above.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    args = parse_args()
    if args.backend == "ddp" and not args.no_import_ddp:
        import ddp  # noqa: F401  registers the "ddp" backend with torch.distributed
    main(args)
