"""PyTorch twin of bench_gpu_step: training step time of torch.nn.parallel.DistributedDataParallel
(mode ddp, under torchrun, nccl on CUDA / gloo on the CPU) or of plain training (mode plain), one
JSON line from rank 0 in bench_gpu_step's format (impl "pytorch" / "pytorch-plain").

  python3 -m torch.distributed.run --standalone --nproc-per-node 1 torch_step.py --model resnet18

Same models (layer for layer), fixed random batch on the device, SGD lr 0.01 momentum 0.9,
warmup, then blocks of steps with the device synchronised at both ends; median block.
No torchvision needed.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# The tutorials' CNN without dropout, defined once for the CPU and GPU benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ddp"))
from bench_ddp import Cnn  # noqa: E402


def conv(cin, cout, k, stride, pad):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(conv(cin, cout, 1, stride, 0), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv(3, 64, 7, 2, 3)
        self.stem_bn = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for stage, width in enumerate((64, 128, 256, 512)):
            for b in range(2):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and b == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.stem_bn(self.stem(x))), 3, 2, 1)
        x = self.blocks(x)
        return F.log_softmax(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)), dim=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18", choices=["cnn", "resnet18"])
    p.add_argument("--mode", default="ddp", choices=["ddp", "plain", "data_parallel"])
    p.add_argument("--device", default="auto",
                   help="cpu, cuda (cuda:LOCAL_RANK), cuda:N (every rank on GPU N) or auto")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo", "ddp"],
                   help="auto: nccl on CUDA, gloo otherwise (gloo stages CUDA tensors; so does "
                        "ddp, the ddp package's backend)")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=5)
    a = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(f"cuda:{local_rank}" if a.device == "cuda" else a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank, world, backend = 0, 1, "none"
    if a.mode == "ddp":
        backend = a.backend if a.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if backend == "ddp":
            import ddp  # noqa: F401  (registers the backend where no entry point does)
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
        rank, world = dist.get_rank(), dist.get_world_size()

    cnn = a.model == "cnn"
    batch = a.batch or (64 if cnn else 32)
    torch.manual_seed(rank)
    shape = (batch, 1, 28, 28) if cnn else (batch, 3, 224, 224)
    x = torch.randn(*shape, device=device)
    y = torch.randint(0, 10 if cnn else 1000, (batch,), device=device)
    torch.manual_seed(0)
    net = (Cnn() if cnn else ResNet18()).to(device)
    parameters = sum(t.numel() for t in net.parameters())
    model = net
    if a.mode == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(net, device_ids=ids)
    elif a.mode == "data_parallel":
        model = nn.DataParallel(net)  # one process over every visible GPU
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step():
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    ms = []
    for _ in range(a.blocks):
        sync()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        sync()
        ms.append((time.perf_counter() - t0) * 1000.0 / a.steps)
    if a.mode == "ddp":
        dist.barrier()
    if rank == 0:
        median = sorted(ms)[len(ms) // 2]
        print(json.dumps({
            "bench": "gpu_step", "impl": {"ddp": "pytorch", "plain": "pytorch-plain",
                     "data_parallel": "pytorch-data_parallel"}[a.mode],
            "mode": a.mode, "model": a.model, "parameters": parameters, "world": world,
            "batch": batch, "device": str(device), "backend": backend,
            # The ddp backend's way with CUDA tensors (docs/python.md): its NCCL lane, or
            # host staging (overlapped, or synchronous with DDP_HOST_STAGING=sync).
            **({"cuda_collectives": ddp_cuda_path(),
                "host_staging": os.environ.get("DDP_HOST_STAGING", "overlap")}
               if backend == "ddp" and a.mode == "ddp" else {}),
            "ms_per_step": median,
            "ms_per_step_blocks": ms, "samples_per_s": 1000.0 * batch * world / median,
            "torch": torch.__version__}), flush=True)
    if a.mode == "ddp":
        dist.destroy_process_group()


def ddp_cuda_path():
    import ddp
    return ddp.cuda_collectives()


if __name__ == "__main__":
    main()
