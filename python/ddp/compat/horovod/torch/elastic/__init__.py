"""hvd.elastic on ddprun's elastic restarts.

    @hvd.elastic.run
    def train(state): ...          # state.commit() at each safe point
    train(hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0))

When a worker fails, ddprun (--max-restarts N) restarts all workers; the restarted run() loads
the newest commit on rank 0 (state.py), calls the reset callbacks, gives the state to every rank
(sync) and calls the function again, which continues from the committed epoch and batch.
A HorovodInternalError inside the function ends the process (non-zero) so that ddprun restarts
it: the process group cannot be rebuilt inside a running process here.
"""

import functools
import os
import sys

from ...common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from .. import runtime as _rt
from .sampler import ElasticSampler  # noqa: F401
from .state import ObjectState, State, TorchState  # noqa: F401


def run(func):
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not _rt.is_initialized():
            _rt.init()
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        resumed = state.load_committed()
        state.sync()
        if resumed or restarts > 0:
            state.on_reset()  # after sync: the callbacks see the state every rank resumes from
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError as e:
            print(f"hvd.elastic.run: rank {_rt.rank()}: a collective failed ({e}); exiting so "
                  "that ddprun restarts the workers from the last state.commit() "
                  "(needs ddprun --max-restarts)", file=sys.stderr, flush=True)
            raise

    return wrapper


__all__ = ["TorchState", "ObjectState", "State", "ElasticSampler", "run"]
