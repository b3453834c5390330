"""ddp.StepManager on PyTorch's nccl (or gloo) at world 1 through forced re-forms, nothing killed.

    ddprun --standalone --nproc-per-node 1 --recovery step bench/gpu/python_nccl_reform.py \
        [--reforms 20] [--steps-between 2] [--warmup 3]

Environment: PYTHON_NCCL_BACKEND (default nccl; gloo on a machine without a GPU; ddp: the ddp
backend, whose CUDA tensors run on its NCCL lane, aborted and re-made in every generation),
PYTHON_NCCL_DEVICE (default cuda:0 for nccl, else cpu), PYTHONPATH with ddp's build/python.

PyTorch's DistributedDataParallel (init_sync=False) over a small MLP with dropout on the device,
ddp.StepManager(model, opt), a few steps; then N times: a notice of a lost rank 0 published
into ddprun's job store by ddprun's own code (`ddp._C._publish_lost_rank`:
recovery_notice::publish_lost_rank), as tests/comm_nccl/nccl_recovery_test.cpp's
force_generation does in C++; the StepManager must see
its group stale and re-form into generation g (a new PyTorch group; on nccl the old one is
aborted), heal, and train on. Checks: the generation rose by exactly N (each re-form to the
notice's generation), N recoveries, the step count, finite losses, no growth of threads
(/proc/self/task) or descriptors (/proc/self/fd) and, on CUDA, of allocated or used GPU memory
over the re-forms after the first (the baseline: what NCCL and CUDA allocate once per process is
in it, as in the C++ test). Prints one JSON line, {"bench": "gpu_python_reform", ...}, and exits
0 only when every check passed; otherwise 1, with a message on stderr naming what failed.
ms_per_reform: the median time of the run_step that re-forms (re-form + heal + one step), from
when the group read stale; ms_notice: the median time from the notice to stale.
"""
import argparse
import faulthandler
import gc
import json
import math
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp
from ddp import _C

BENCH = "gpu_python_reform"
# One lost generation's group may still be held at the end, whatever the run's length (seen
# on a loaded 2-core machine in about a third of the runs: gloo's 3 threads and 4 descriptors,
# holder not found); a leak grows with the re-forms (before the fix: +57 threads over 19).
THREAD_SLACK = 2 + 3
FD_SLACK = 2 + 4
GPU_FREE_SLACK = 64 << 20  # bytes of free GPU memory the re-forms may cost (C++ test: 64 MiB)
GPU_ALLOC_SLACK = 1 << 20  # bytes torch's allocator may hold more


def fail(message):
    print(f"python_nccl_reform: FAILED: {message}", file=sys.stderr, flush=True)


def count(folder):
    # A lost generation's group is freed once nothing refers to it; some of PyTorch's objects
    # refer to it from reference cycles, which only the cyclic collector frees: collect first,
    # so a group that is merely waiting for it is not counted as grown.
    gc.collect()
    return len(os.listdir(folder))


def settled_count(folder, limit, seconds=10.0):
    """count(folder) once it is at most `limit`, else its count after `seconds`: the group the
    last re-form let go ends its threads and closes its sockets by itself, later on a busy
    machine (seen: one gloo group's 3 threads and 4 descriptors still there). A leak never
    settles; a late group does."""
    deadline = time.monotonic() + seconds
    n = count(folder)
    while n > limit and time.monotonic() < deadline:
        time.sleep(0.1)
        n = count(folder)
    return n


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 128)
        self.fc2 = torch.nn.Linear(128, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(torch.nn.functional.dropout(h, 0.2, self.training))


def cuda_mem(device):
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated": torch.cuda.memory_allocated(device), "free": free, "total": total}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reforms", type=int, default=20)
    ap.add_argument("--steps-between", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--stale-timeout", type=float, default=30.0,
                    help="seconds to wait for the group to read stale after a notice")
    ap.add_argument("--hang-dump", type=float, default=240.0,
                    help="after this many seconds, print every thread's Python stack and exit 1")
    a = ap.parse_args()
    faulthandler.dump_traceback_later(a.hang_dump, exit=True)
    if a.reforms < 2:
        ap.error("--reforms must be at least 2 (the first one sets the baseline)")

    backend = os.environ.get("PYTHON_NCCL_BACKEND", "nccl")
    device = torch.device(os.environ.get("PYTHON_NCCL_DEVICE",
                                         "cuda:0" if backend == "nccl" else "cpu"))
    out = {"bench": BENCH, "backend": backend, "device": str(device), "reforms": 0,
           "generation": None, "steps": 0, "ok": False}
    problems = []

    def finish():
        out["ok"] = not problems
        if problems:
            out["failed"] = "; ".join(problems)
        print(json.dumps(out), flush=True)
        for p in problems:
            fail(p)
        return 0 if not problems else 1

    if not ddp.recovery_enabled():
        problems.append("not started by 'ddprun --recovery step' (DDP_RECOVERY is not 'step')")
        return finish()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            problems.append(f"device {device} asked for, but torch.cuda.is_available() is False")
            return finish()
        torch.cuda.set_device(device)

    dist.init_process_group(backend)
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.manual_seed(0)
    net = Net().to(device)
    model = DDP(net, device_ids=[device] if device.type == "cuda" else None, init_sync=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = ddp.StepManager(model, opt)
    groups = steps._groups  # stale(): what run_step reads; no public accessor
    start_generation = steps.generation

    losses = []

    def forward():
        g = torch.Generator().manual_seed(steps.step)
        x = torch.randn(64, 32, generator=g).to(device)
        y = torch.randint(0, 4, (64,), generator=g).to(device)
        return torch.nn.functional.cross_entropy(model(x), y)

    def train(n):
        for _ in range(n):
            losses.append(float(steps.run_step(forward).item()))

    notice_ms, reform_ms = [], []

    def force_generation():
        before = steps.generation
        t0 = time.perf_counter()
        g = _C._publish_lost_rank(0, timedelta(seconds=60))
        deadline = time.monotonic() + a.stale_timeout
        while not groups.stale():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group did not read stale within {a.stale_timeout} s of "
                                   f"the notice of generation {g}")
            time.sleep(0.001)
        t1 = time.perf_counter()
        train(1)  # run_step re-forms (stale), heals, then runs the step
        t2 = time.perf_counter()
        notice_ms.append((t1 - t0) * 1e3)
        reform_ms.append((t2 - t1) * 1e3)
        if g != before + 1 or steps.generation != g:
            problems.append(f"re-form {out['reforms'] + 1}: generation {before} -> "
                            f"{steps.generation}, the notice opened {g} (want {before + 1})")
        out["reforms"] += 1
        print(f"python_nccl_reform: re-form {out['reforms']}: generation {steps.generation}, "
              f"notice {notice_ms[-1]:.1f} ms, re-form + heal + step {reform_ms[-1]:.1f} ms",
              file=sys.stderr, flush=True)
        train(a.steps_between - 1)

    try:
        train(a.warmup)
        force_generation()  # the first: what is allocated once per process is in the baseline
        threads_before, fds_before = count("/proc/self/task"), count("/proc/self/fd")
        mem_before = cuda_mem(device)
        for _ in range(a.reforms - 1):
            force_generation()
        train(1)
        threads_after = settled_count("/proc/self/task", threads_before + THREAD_SLACK)
        fds_after = settled_count("/proc/self/fd", fds_before + FD_SLACK)
        mem_after = cuda_mem(device)
    except Exception as e:  # noqa: BLE001: every failure is reported as the bench's
        out.update(generation=steps.generation, steps=steps.step, recoveries=steps.recoveries,
                   dropped=steps.dropped)
        problems.append(f"after {out['reforms']} re-forms, at step {steps.step}: "
                        f"{type(e).__name__}: {e}")
        return finish()

    want_steps = a.warmup + a.reforms * a.steps_between + 1
    out.update(generation=steps.generation, start_generation=start_generation, steps=steps.step,
               recoveries=steps.recoveries, dropped=steps.dropped,
               threads_before=threads_before, threads_after=threads_after,
               fds_before=fds_before, fds_after=fds_after,
               cuda_mem_before=mem_before, cuda_mem_after=mem_after,
               ms_per_reform=round(statistics.median(reform_ms), 2),
               ms_notice=round(statistics.median(notice_ms), 2),
               first_loss=losses[0], last_loss=losses[-1], torch=torch.__version__)
    if steps.generation != start_generation + a.reforms:
        problems.append(f"generation {steps.generation}, want {start_generation} + {a.reforms}")
    if steps.recoveries != a.reforms:
        problems.append(f"{steps.recoveries} recoveries, want {a.reforms}")
    if steps.step != want_steps or len(losses) != want_steps:
        problems.append(f"step {steps.step} ({len(losses)} losses), want {want_steps}")
    if not all(math.isfinite(v) for v in losses):
        problems.append(f"a loss is not finite: {losses}")
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        problems.append("a parameter is not finite")
    if threads_after > threads_before + THREAD_SLACK:
        problems.append(f"threads grew from {threads_before} to {threads_after} over "
                        f"{a.reforms - 1} re-forms")
    if fds_after > fds_before + FD_SLACK:
        problems.append(f"descriptors grew from {fds_before} to {fds_after} over "
                        f"{a.reforms - 1} re-forms")
    if mem_before is not None:
        grown = mem_after["allocated"] - mem_before["allocated"]
        shrunk = mem_before["free"] - mem_after["free"]
        if grown > GPU_ALLOC_SLACK:
            problems.append(f"torch's allocated GPU memory grew by {grown} bytes over "
                            f"{a.reforms - 1} re-forms")
        if shrunk > GPU_FREE_SLACK:
            problems.append(f"free GPU memory shrank by {shrunk >> 20} MiB over "
                            f"{a.reforms - 1} re-forms")
    # The current generation's group still reduces (a collective of the program's own).
    t = torch.ones(4, device=device)
    steps.group.allreduce([t]).wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if t.sum().item() != 4.0 * steps.world_size:
        problems.append(f"an all-reduce on the last generation's group gave {t.tolist()}")
    if backend == "ddp":
        # The ddp backend's CUDA tensors ran on its NCCL lane, re-made in every generation.
        out["cuda_collectives"] = ddp.cuda_collectives()
        lane = device.type == "cuda" and "nccl" in _C._available_backends()
        want = "nccl" if lane else ("undecided" if device.type == "cpu" and
                                    "nccl" in _C._available_backends() else "host")
        if out["cuda_collectives"] != want:
            problems.append(f"ddp.cuda_collectives() is {out['cuda_collectives']!r}, want {want!r}")
    rc = finish()
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
