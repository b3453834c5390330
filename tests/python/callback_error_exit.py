"""A rank whose future callback failed exits with that error, not with SIGABRT.

Every rank's callback issues a collective of a different size (a mismatch, as when a comm hook
goes wrong), so every wait raises and each rank exits on the uncaught error while the group's
completer thread is still dropping the callback's Python objects (here one that takes 0.5 s to
drop, so the rank always gets to exit meanwhile). Python ends a thread that takes the GIL
during finalization, and before ddp quiesced its completer threads at exit that aborted the
rank ("terminate called without an active exception", signal 6; seen in CI). The CMake test
passes on ddprun's report of exit code 1 and fails on any SIGABRT.

Run: ddprun --standalone --nproc-per-node 3 .venv/bin/python callback_error_exit.py"""
import time

import torch
import torch.distributed as dist

from common import init

rank, n = init()


class SlowToDrop:
    def __del__(self):
        time.sleep(0.5)  # releases the GIL: the main thread goes on to exit


def make_callback():
    held = SlowToDrop()

    def mismatched(_):
        assert held is not None  # the callback holds it: dropping the callback drops it
        t = torch.ones(3 + rank)
        dist.all_reduce(t)
        return t

    return mismatched


fut = dist.all_reduce(torch.ones(1 << 20), async_op=True).get_future().then(make_callback())
fut.wait()  # raises: the ranks issued different collectives
