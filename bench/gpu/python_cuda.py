"""What ddp's Python backend does with CUDA tensors (run under ddprun or torchrun).

    ddprun --standalone --nproc-per-node 2 python_cuda.py

Each case prints one JSON line from rank 0 ({"bench": "gpu_python", "case", "ok", "detail"}):
  cpu_all_reduce          init_process_group("ddp"), all_reduce of a CPU tensor (the baseline)
  cuda_all_reduce         the same with a CUDA tensor on backend "ddp"
  cuda_ddp_model          torch DDP of a model on the GPU over backend "ddp"
  mixed_cuda_all_reduce   a group "cpu:ddp,cuda:nccl" (world 1 only: NCCL takes one rank per GPU)
A case that raises reports the exception's text: the point is that it is one clear message.
"""
import json
import os
import traceback

import torch
import torch.distributed as dist

import ddp  # noqa: F401  (registers the "ddp" backend)

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
device = torch.device("cuda:0")


def report(case, fn):
    try:
        detail = fn()
        ok = True
    except Exception as e:  # the message is what is being checked
        ok, detail = False, f"{type(e).__name__}: {e}".strip().splitlines()[0][:400]
        if os.environ.get("DDP_VERBOSE"):
            traceback.print_exc()
    if rank == 0:
        print(json.dumps({"bench": "gpu_python", "case": case, "world": world, "ok": ok,
                          "detail": detail, "torch": torch.__version__}), flush=True)


def cpu_all_reduce():
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [world * (world + 1) / 2] * 4, t
    return "sum correct"


def cuda_all_reduce(group=None):
    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t, group=group)
    assert t.device == device and t.cpu().tolist() == [world * (world + 1) / 2] * 4, t
    return "sum correct, result on " + str(t.device)


def cuda_ddp_model():
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 2).to(device)
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0])
    model(torch.randn(4, 8, device=device)).sum().backward()
    g = net.weight.grad.reshape(1, -1)
    everyone = [torch.empty_like(g.cpu()) for _ in range(world)]
    dist.all_gather(everyone, g.cpu())
    assert all(torch.equal(e, everyone[0]) for e in everyone)
    return "gradients averaged, equal on all ranks"


dist.init_process_group("ddp")
torch.cuda.set_device(device)
report("cpu_all_reduce", cpu_all_reduce)
report("cuda_all_reduce", cuda_all_reduce)
report("cuda_ddp_model", cuda_ddp_model)
if world == 1:
    mixed = dist.new_group(backend="cpu:ddp,cuda:nccl")
    report("mixed_cuda_all_reduce", lambda: cuda_all_reduce(mixed))
dist.barrier()
dist.destroy_process_group()
