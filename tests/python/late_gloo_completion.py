"""A lost generation's gloo collective that ends while the interpreter finalizes does not abort
the rank (ddp.StepManager's waits on PyTorch's backends: PendingWaits in
python/ddp/torch_generations.py).

Rank 0 starts an all_reduce on PyTorch's gloo that rank 1 never joins, binds it as StepManager
does, and fails the wait as ddprun's notice of a loss would (the wait must raise the notice's
message). The collective is left hanging, as a lost generation's is. Then, while rank 0's
interpreter finalizes (a module global's __del__, holding no GIL while it sleeps), rank 1 exits:
its sockets close, and gloo's thread in rank 0 fails the collective. When that completion ran a
Python callback, the thread took the GIL during finalization and the rank aborted ("terminate
called after throwing an instance of 'gloo::IoException'", signal 6; seen in CI in
recovery.python_step_lost_node_gloo). The CMake test fails on any SIGABRT or "terminate called".

Run: ddprun --standalone --nproc-per-node 2 .venv/bin/python late_gloo_completion.py"""
import os
import time

import torch
import torch.distributed as dist

from common import expect_error, init
from ddp.torch_generations import PendingWaits

rank, n = init("gloo")
store = dist.distributed_c10d._get_default_store()

if rank == 1:
    store.set("ready", "1")
    store.wait(["exit"])  # rank 0 is finalizing: its collective fails when this process ends
    store.set("exiting", "1")
    os._exit(0)


class PeerExitsWhileFinalizing:
    """Dropped with __main__'s globals, i.e. while Python finalizes."""

    def __init__(self):
        self._store, self._sleep, self._time = store, time.sleep, time.monotonic

    def __del__(self):
        self._store.set("exit", "1")
        self._store.wait(["exiting"])
        deadline = self._time() + 3  # rank 1's sockets close as it ends: gloo's thread sees it
        while self._time() < deadline:
            self._sleep(0.05)  # releases the GIL, as finalization would let a thread take it


store.wait(["ready"])
waits = PendingWaits(generation=0)
hanging = waits.bound(dist.all_reduce(torch.ones(4), async_op=True))
waits.fail_all("rank 1 was lost (membership generation 1)", 0)
expect_error("the failed wait", hanging.wait, "rank 1 was lost")
# A wait bound after the loss fails at once too.
expect_error("a wait bound after fail_all",
             waits.bound(dist.all_reduce(torch.ones(4), async_op=True)).wait, "rank 1 was lost")
print("rank 0: waits failed by the notice; exiting while the collectives still hang", flush=True)
keeper = PeerExitsWhileFinalizing()
