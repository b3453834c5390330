#!/usr/bin/env python3
"""The Python twin of examples/mnist/main.cpp, for side-by-side comparisons: the same CNN,
data, normalisation, sampler, optimizer and output lines, with PyTorch's DDP over gloo.

    ddprun --standalone --nproc-per-node 2 examples/mnist/mnist.py --epochs 1
    torchrun --standalone --nproc-per-node 2 --redirects 1 --tee 1 --log-dir /tmp/l \
        examples/mnist/mnist.py --epochs 1
"""
import argparse
import gzip
import os
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    return torch.frombuffer(bytearray(data[4 + 4 * ndims:]), dtype=torch.uint8).reshape(dims)


def load(directory, split):
    images = read_idx(f"{directory}/{split}-images-idx3-ubyte.gz").float().div(255).unsqueeze(1)
    labels = read_idx(f"{directory}/{split}-labels-idx1-ubyte.gz").long()
    return TensorDataset(images.sub(0.1307).div(0.3081), labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", "--batch_size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=-1)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--comm-hook", choices=["allreduce", "fp16", "bf16"], default="allreduce")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    train, test = load(args.data_dir, "train"), load(args.data_dir, "t10k")
    torch.manual_seed(args.seed)
    model = DDP(CNN())
    if args.comm_hook != "allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = {"fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook}[args.comm_hook]
        model.register_comm_hook(None, hook)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if rank == 0:
        print("Entering training loop...", flush=True)
    steps_total = 0
    start = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(loader):
            if args.max_steps >= 0 and batch_idx >= args.max_steps:
                break
            loss = F.nll_loss(model(data), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps_total += 1
            if rank == 0 and batch_idx % 100 == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * args.batch_size}/{len(train)} "
                      f"({100. * batch_idx / len(loader):.0f}%)]\tLoss: {loss.item():.6f}",
                      flush=True)
        dist.barrier()
    seconds = time.monotonic() - start
    if rank == 0:
        print("Exiting training loop...", flush=True)
    model.eval()
    correct = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        idx = torch.arange(rank, len(test), world)
        pred = model.module(test.tensors[0][idx]).argmax(1)
        correct[0] = (pred == test.tensors[1][idx]).sum()
        correct[1] = len(idx)
    dist.all_reduce(correct)
    if rank == 0:
        samples = steps_total * args.batch_size * world
        print(f"Training time = {seconds:.2f} s | {samples / seconds:.1f} samples/s over {world} "
              f"ranks | test accuracy {100. * correct[0] / correct[1]:.2f}% "
              f"({correct[0]}/{correct[1]})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
