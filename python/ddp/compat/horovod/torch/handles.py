"""Horovod's integer handles for asynchronous collectives: poll(), synchronize()."""

import itertools

from ..common.exceptions import HorovodInternalError


class Pending:
    """One collective in flight: torch.distributed works to wait on, then `finish()` makes the
    result (scaling, trimming, decompression) once they are done."""

    def __init__(self, works, finish):
        self._works = [w for w in works if w is not None]
        self._finish = finish

    def done(self):
        return all(w.is_completed() for w in self._works)

    def wait(self):
        for w in self._works:
            w.wait()
        return self._finish()


_next = itertools.count(1)
_pending = {}


def register(pending):
    h = next(_next)
    _pending[h] = pending
    return h


def poll(handle):
    """True once the collective behind `handle` has completed (synchronize will not block)."""
    p = _pending.get(handle)
    if p is None:
        raise ValueError(f"hvd.poll: handle {handle} is unknown or already synchronized")
    try:
        return p.done()
    except RuntimeError as e:
        raise HorovodInternalError(str(e)) from e


def synchronize(handle):
    """Waits for the collective behind `handle` and returns its result (None for an unknown
    handle, as Horovod)."""
    p = _pending.pop(handle, None)
    if p is None:
        return None
    try:
        return p.wait()
    except RuntimeError as e:
        raise HorovodInternalError(str(e)) from e
