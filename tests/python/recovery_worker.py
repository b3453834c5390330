"""The Python twin of tests/torch/recovery/recovery_worker.cpp: PyTorch's DDP on the ddp backend
under ddprun --recovery step, trained with ddp.StepManager (a small MLP with dropout, Adam,
synthetic data that is a pure function of the step, augmented with draws from Python's and
NumPy's global generators), with the same fault injection and the same
outputs, so tests/torch/recovery/recovery_test.py checks both.

  recovery_worker.py --steps N --out DIR

DDP_TEST_KILL_AT_STEP=S, DDP_TEST_KILL_RANK=R, DDP_TEST_KILL_PHASE=forward|backward|between:
rank R of the first incarnation SIGKILLs itself at step S (lists: several failures);
DDP_TEST_KILL_IN_HEAL=1: the first replacement dies after joining, before it is healed.
DDP_TEST_KILL_NODE_AT_STEP=S: after step S the worker SIGKILLs its agent (its node's other
workers die with it) and itself.
Writes DIR/rank<R>.params (every parameter's bytes, in order) and DIR/rank<R>.json."""
import argparse
import json
import os
import random
import signal

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.nn.functional.dropout(h, 0.2, self.training)
        return self.fc3(torch.relu(self.fc2(h)))


def batch_for(step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)


def ints(text):
    return [int(v) for v in text.split(",")] if text else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    dist.init_process_group("ddp")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = DDP(Net(), init_sync=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    restart_count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("DDP_TEST_KILL_IN_HEAL") == "1" and restart_count == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    steps = ddp.StepManager(model, opt)

    kill_steps = ints(os.environ.get("DDP_TEST_KILL_AT_STEP", ""))
    kill_ranks = ints(os.environ.get("DDP_TEST_KILL_RANK", ""))
    kill_phase = os.environ.get("DDP_TEST_KILL_PHASE", "backward")

    def maybe_die(phase):
        if restart_count != "0" or phase != kill_phase:
            return
        for s, r in zip(kill_steps, kill_ranks):
            if rank == r and steps.step == s:
                os.kill(os.getpid(), signal.SIGKILL)

    def forward():
        maybe_die("forward")
        x, y = batch_for(steps.step, rank)  # the step being run (a redo may run a later one)
        # Augmentation from Python's and NumPy's global generators (seeded alike on every
        # rank): a redo must draw what the dropped attempt drew, and a replacement must go on
        # from its peers' states, or the parameters differ from a run without the failure.
        x = x * (1.0 + 0.1 * random.random()) + torch.from_numpy(
            np.random.normal(0.0, 0.1, size=16).astype(np.float32))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        maybe_die("backward")
        return loss

    kill_node_at = int(os.environ.get("DDP_TEST_KILL_NODE_AT_STEP", "-1"))
    while steps.step < args.steps:
        steps.run_step(forward)
        maybe_die("between")
        if steps.step == kill_node_at:  # the whole node: the agent, then this worker
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    with open(os.path.join(args.out, f"rank{rank}.params"), "wb") as f:
        for p in model.parameters():
            f.write(p.detach().contiguous().numpy().tobytes())
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "step": steps.step, "dropped": steps.dropped,
                   "recoveries": steps.recoveries, "generation": steps.generation,
                   "restart_count": int(restart_count)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
