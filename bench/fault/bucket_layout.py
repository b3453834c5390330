"""What ddp.StepManager's gradient bucket layout costs PyTorch's DDP, without StepManager.

StepManager has every rank rebuild DDP's buckets at its start and at every heal
(python/ddp/recovery.py, `_same_buckets`), so that a replacement's new DDP and the survivors'
sum the same parameters position by position. Plain DDP rebuilds them after its first backward
in the order gradients became ready, so its first bucket (the last layers) is all-reduced while
the backward of the first layers still runs. StepManager rebuilt them in parameter order until
2026-12-01: the first bucket then holds the first layers, whose gradients come last, and no
all-reduce starts before the backward ends. It now rebuilds them in reverse parameter order
(python/src/bucket_order.cpp). This script times the same CNN step (bench/ddp/bench_ddp.py's
`Cnn`, batch 64, Adam) with the three layouts in the same processes, alternating blocks, on
PyTorch's gloo:

    PYTHONPATH=build/python ddprun --standalone --nproc-per-node 2 --no-python PYTHON \
        bench/fault/bucket_layout.py

Prints one JSON line (rank 0): `bench` "ddp_bucket_layout", `world`, `step_ms_ready_order`
(plain DDP), `step_ms_parameter_order` (StepManager's old layout),
`step_ms_reverse_parameter_order` (its layout now), `ratio` (parameter order against ready
order), `ratio_reverse` (reverse parameter order against ready order), `layouts` (each DDP's
rebuilt buckets as parameter indices), `blocks`, `steps_per_block`.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ddp"))
from bench_ddp import Cnn  # noqa: E402

import ddp  # noqa: E402  (its extension pushes the parameters in reverse order)

BLOCKS, STEPS, WARMUP = 4, 80, 10


def make(layout):
    model = torch.nn.parallel.DistributedDataParallel(Cnn())
    if layout == "parameter_order":  # what StepManager did
        model.reducer._push_all_rebuilt_params()
        model.reducer._rebuild_buckets()
    elif layout == "reverse_parameter_order":  # what StepManager does
        ddp._C._push_params_in_reverse_order(model.reducer)
        model.reducer._rebuild_buckets()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    models = {layout: make(layout)
              for layout in ("ready_order", "parameter_order", "reverse_parameter_order")}
    times = {name: [] for name in models}
    for _ in range(BLOCKS):
        for name, (model, opt) in models.items():
            for i in range(STEPS):
                begin = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.nll_loss(model(x), y).backward()
                opt.step()
                if i >= WARMUP:
                    times[name].append(time.perf_counter() - begin)
    if dist.get_rank() == 0:
        ready = statistics.median(times["ready_order"]) * 1e3
        param = statistics.median(times["parameter_order"]) * 1e3
        reverse = statistics.median(times["reverse_parameter_order"]) * 1e3
        print(json.dumps({
            "bench": "ddp_bucket_layout", "world": dist.get_world_size(),
            "step_ms_ready_order": round(ready, 2), "step_ms_parameter_order": round(param, 2),
            "step_ms_reverse_parameter_order": round(reverse, 2),
            "ratio": round(param / ready, 3), "ratio_reverse": round(reverse / ready, 3),
            "layouts": {name: model._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices")
                        for name, (model, _) in models.items()},
            "blocks": BLOCKS, "steps_per_block": STEPS - WARMUP}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
