"""What ddp's Python backend does with CUDA tensors (run under ddprun or torchrun).

    ddprun --standalone --nproc-per-node 2 python_cuda.py

Each case prints one JSON line from rank 0 ({"bench": "gpu_python", "case", "ok", "detail"}):
  cpu_all_reduce          init_process_group("ddp"), all_reduce of a CPU tensor (the baseline)
  cuda_all_reduce         the same with a CUDA tensor on backend "ddp": on the group's NCCL lane
                          (device memory) at world 1, through the host at world 2 (every rank is
                          on cuda:0, and NCCL takes one rank per GPU)
  cuda_path               ddp.cuda_collectives(): "nccl" at world 1, "host" at world 2 (the
                          ranks found they share a GPU and fell back together)
  cuda_collectives        broadcast, all_gather, all_gather_into_tensor, reduce_scatter_tensor,
                          all_to_all_single (through the host, beside the lane's), a non-contiguous
                          all_reduce, all_reduce_coalesced, on CUDA tensors
  cuda_side_stream        an all_reduce issued under a side stream waits for that stream's work
  cuda_future_then        work.get_future().then(...) on a CUDA all_reduce (what comm hooks do)
  cuda_ddp_model          torch DDP of a model on the GPU over backend "ddp": 3 steps, gradients
                          equal to the average computed on the CPU from every rank's batch
  cuda_barrier            dist.barrier() with CUDA registered
  staged_*                cuda_path, cuda_collectives, cuda_side_stream and cuda_future_then on a
                          group made with DDP_CUDA_COLLECTIVES=host (staged through the host)
  mixed_cuda_all_reduce   a group "cpu:ddp,cuda:nccl" (world 1 only: NCCL takes one rank per GPU)
A case that raises reports the exception's text: the point is that it is one clear message.
"""
import datetime
import json
import os
import traceback

import torch
import torch.distributed as dist

import ddp  # registers the "ddp" backend

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
# PYTHON_CUDA_DEVICE=cpu runs the same cases on CPU tensors (a check of the script itself).
device = torch.device(os.environ.get("PYTHON_CUDA_DEVICE", "cuda:0"))


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


def expected_path(group_staged):
    """What ddp.cuda_collectives() must say once the group ran CUDA operations."""
    if group_staged or "nccl" not in ddp._C._available_backends():
        return "host"
    if device.type != "cuda":
        return "undecided"  # CPU tensors (PYTHON_CUDA_DEVICE=cpu) decide nothing
    return "nccl" if world == 1 else "host"  # every rank of this script is on one GPU


def cuda_path(group=None, staged=False):
    path, want = ddp.cuda_collectives(group), expected_path(staged)
    assert path == want, f"ddp.cuda_collectives() is {path!r}, want {want!r}"
    return path


def cuda_collectives(group=None):
    r = float(rank)
    b = torch.full((3,), r, device=device)
    dist.broadcast(b, src=world - 1, group=group)
    assert b.device == device and b.cpu().tolist() == [world - 1.0] * 3, b
    outs = [torch.empty(2, device=device) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), r, device=device), group=group)
    assert [o.cpu().tolist() for o in outs] == [[float(p)] * 2 for p in range(world)], outs
    flat = torch.empty(2 * world, device=device)
    dist.all_gather_into_tensor(flat, torch.full((2,), r, device=device), group=group)
    assert flat.cpu().tolist() == [float(p) for p in range(world) for _ in range(2)], flat
    rs = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world, device=device), group=group)
    assert rs.cpu().tolist() == [world * (2.0 * rank), world * (2.0 * rank + 1)], rs
    a2a = torch.empty(world, device=device)
    dist.all_to_all_single(a2a, torch.full((world,), r, device=device), group=group)
    assert a2a.cpu().tolist() == [float(p) for p in range(world)], a2a
    strided = torch.ones(4, 6, device=device)[:, ::2]  # not contiguous
    dist.all_reduce(strided, group=group)
    assert strided.device == device and strided.cpu().eq(world).all(), strided
    pair = [torch.ones(3, device=device), torch.full((2, 2), 2.0, device=device)]
    dist.all_reduce_coalesced(pair, group=group)
    assert pair[0].cpu().eq(world).all() and pair[1].cpu().eq(2.0 * world).all(), pair
    return ("broadcast, all_gather(+_into_tensor), reduce_scatter_tensor, all_to_all_single, "
            "strided, coalesced")


def cuda_side_stream(group=None):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.ones(1 << 22, device=device)
        for _ in range(20):  # long enough that reading before the stream ran would see stale data
            big.mul_(1.0).add_(0.0)
        big.fill_(float(rank + 1))
        dist.all_reduce(big, group=group)
        total = big.sum().item()
    want = (world * (world + 1) / 2) * (1 << 22)
    assert total == want, (total, want)
    return "the collective waited for the side stream's work"


def cuda_future_then(group=None):
    t = torch.full((4,), float(rank + 1), device=device)
    fut = dist.all_reduce(t, async_op=True, group=group).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert doubled.device == device
    assert doubled.cpu().tolist() == [world * (world + 1)] * 4, doubled
    return "future value on " + str(doubled.device)


def cuda_ddp_model():
    torch.manual_seed(0)
    reference = torch.nn.Linear(8, 2)
    net = torch.nn.Linear(8, 2).to(device)
    net.load_state_dict(reference.state_dict())
    model = torch.nn.parallel.DistributedDataParallel(
        net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        batches = [torch.Generator().manual_seed(100 * step + p) for p in range(world)]
        xs = [torch.randn(4, 8, generator=g) for g in batches]
        opt.zero_grad()
        model(xs[rank].to(device)).sum().backward()
        opt.step()
        # The reference: the average of every rank's gradient, on the CPU.
        ref_opt.zero_grad()
        (sum(reference(x).sum() for x in xs) / world).backward()
        ref_opt.step()
    err = (net.weight.detach().cpu() - reference.weight.detach()).abs().max().item()
    assert err < 1e-5, f"after 3 steps the GPU model is {err} from the CPU reference"
    return f"3 steps, max difference from the CPU reference {err:.1e}"


def cuda_barrier():
    dist.barrier()
    return "barrier returned"


torch.backends.cuda.matmul.allow_tf32 = False  # the DDP case compares with a float32 CPU reference
dist.init_process_group("ddp", timeout=datetime.timedelta(seconds=60))
if device.type == "cuda":
    torch.cuda.set_device(device)
report("cpu_all_reduce", cpu_all_reduce)
report("cuda_all_reduce", cuda_all_reduce)
report("cuda_path", cuda_path)
report("cuda_collectives", cuda_collectives)
report("cuda_side_stream", cuda_side_stream)
report("cuda_future_then", cuda_future_then)
report("cuda_ddp_model", cuda_ddp_model)
report("cuda_barrier", cuda_barrier)
os.environ["DDP_CUDA_COLLECTIVES"] = "host"
staged = dist.new_group(backend="ddp")
del os.environ["DDP_CUDA_COLLECTIVES"]
report("staged_cuda_all_reduce", lambda: cuda_all_reduce(staged))
report("staged_cuda_path", lambda: cuda_path(staged, staged=True))
report("staged_cuda_collectives", lambda: cuda_collectives(staged))
report("staged_cuda_side_stream", lambda: cuda_side_stream(staged))
report("staged_cuda_future_then", lambda: cuda_future_then(staged))
if world == 1:
    mixed = dist.new_group(backend="cpu:ddp,cuda:nccl")
    report("mixed_cuda_all_reduce", lambda: cuda_all_reduce(mixed))
dist.barrier()
dist.destroy_process_group()
