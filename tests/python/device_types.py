"""A group of the ddp backend serving two device types (cpu and cuda, as `import ddp` registers
it where torch has CUDA): one ddp group (one rendezvous, one set of connections) must serve
both, and run collectives, barrier and object collectives; torch (2.11, 2.13) calls the creator
once for device types that name the same backend (a torch that called it per device would make two
ddp groups under one name, which this test catches). Runs on a CPU-only torch: the registration below
claims cuda without any CUDA tensor being used. CUDA tensors themselves are checked on a GPU
machine (bench/gpu/python_cuda.py). Also where a group runs its CUDA tensors
(ddp.cuda_collectives): on an NCCL lane where this build has ddp's nccl backend, decided at the
first CUDA operation (CPU ones leave it undecided), through the host with
DDP_CUDA_COLLECTIVES=host, and a bad value of that variable fails the group at once, naming it.
Run: ddprun --standalone --nproc-per-node N .venv/bin/python device_types.py"""
import os

import torch
import torch.distributed as dist

import ddp
from common import check_equal, done, expect_error, init

# What `import ddp` registered: cuda only where this torch has CUDA.
want = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
check_equal("ddp's registered devices", dist.Backend.backend_capability["ddp"], want)

calls = []


def creator(options, pg_options):
    backend = ddp._create_extended(options, pg_options)
    calls.append(backend)
    return backend


dist.Backend.register_backend("ddp_two_devices", creator, extended_api=True,
                              devices=["cpu", "cuda"])
rank, n = init("ddp_two_devices")
pg = dist.distributed_c10d._get_default_group()
check_equal("creator calls", len(calls), 1)
assert pg._get_backend(torch.device("cpu")) is pg._get_backend(torch.device("cuda"))

t = torch.full((5,), float(rank + 1))
dist.all_reduce(t)
check_equal("all_reduce", t, torch.full((5,), float(n * (n + 1) // 2)))
objects = [None] * n
dist.all_gather_object(objects, {"rank": rank})
check_equal("all_gather_object", objects, [{"rank": r} for r in range(n)])

# A subgroup through the same creator is a group of its own.
sub = dist.new_group(ranks=list(range(n)), backend="ddp_two_devices")
check_equal("creator calls after new_group", len(calls), 2)
assert calls[1] is not calls[0], "new_group reused the default group"
u = torch.ones(3)
dist.all_reduce(u, group=sub)
check_equal("subgroup all_reduce", u, torch.full((3,), float(n)))

# Where CUDA tensors go. CPU operations ran on both groups: they decide nothing.
lanes = "nccl" in ddp._C._available_backends()
check_equal("cuda_collectives of the default group", ddp.cuda_collectives(),
            "undecided" if lanes else "host")
check_equal("cuda_collectives of the subgroup", ddp.cuda_collectives(sub),
            "undecided" if lanes else "host")
os.environ["DDP_CUDA_COLLECTIVES"] = "host"
staged = dist.new_group(ranks=list(range(n)), backend="ddp")
check_equal("cuda_collectives with DDP_CUDA_COLLECTIVES=host", ddp.cuda_collectives(staged),
            "host")
os.environ["DDP_CUDA_COLLECTIVES"] = "device"
expect_error("DDP_CUDA_COLLECTIVES=device",
             lambda: dist.new_group(ranks=list(range(n)), backend="ddp"),
             "DDP_CUDA_COLLECTIVES=device: say 'nccl'")
del os.environ["DDP_CUDA_COLLECTIVES"]
v = torch.ones(2)
dist.all_reduce(v, group=staged)
check_equal("all_reduce after the refused group", v, torch.full((2,), float(n)))
done("device_types")
