"""ddp.StepManager's groups on PyTorch's own backends (gloo, nccl, "cpu:gloo,cuda:nccl").

A torch.distributed group of PyTorch's backends cannot change its members: a lost rank leaves
it broken for good. So under ``ddprun --recovery step`` every membership generation gets a
group of its own, made here in the same processes: the backends the default group runs (the
same spec, the same timeout) over the job's store under the generation's prefix
("ddp/torch/g<generation>/"), the ranks of that generation. Who is in a generation, and when a
rank is lost, ddp's RecoverableGroup says (ddp._C._RecoveryMembership: ddprun's notices in the
job's store, recovery_notice.hpp), as for the ddp backend. StepManager hands each generation's
group to PyTorch's DistributedDataParallel (``_update_process_group``) and runs its own
collectives on it.

A killed peer's closed sockets end gloo's collectives at once. A peer that is gone without
closing them (a lost node: powered off, cut off) would hold them until the group timeout, and
aborting PyTorch's gloo does not end a collective in flight (measured with 2.13). So every wait
of StepManager's goes through ``bound``: when ddprun announces a loss, a thread fails each
pending one with the notice (and aborts the backends, which ends nccl's), and the training
thread goes on at once. A collective left hanging keeps its group alive (``_retired``) until it
ends by itself, so no destructor waits for it; a lost generation's backends whose collectives
all ended are let go at the next re-form (their threads and sockets with them: a process that
re-forms many times does not grow).

The default group itself keeps the launch's members: after the first loss, collectives of the
program's own belong on ``StepManager.group``. Under --recovery step ddprun starts workers
with TORCH_GLOO_LAZY_INIT=1, so a replacement's ``init_process_group("gloo")`` returns without
waiting for peers that re-formed long ago (its default group connects only when used).
"""

import atexit
import ctypes
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

# The store prefix of generation g's group: apart from the default group's keys and from the
# ddp backend's ("python_recovery/...").
_PREFIX = "ddp/torch/g{}/"
_MEMBERSHIP_NAME = "torch_pg"
# How long the abort thread sleeps between looks at whether the program is closing.
_POLL = timedelta(milliseconds=200)


def backend_spec(group):
    """[(device type, backend name)] of `group`, e.g. [("cpu", "gloo"), ("cuda", "nccl")], from
    its backend config ("gloo", "cpu:gloo,cuda:nccl")."""
    spec = []
    for part in str(dist.get_backend_config(group)).split(","):
        device, _, name = part.strip().rpartition(":")
        spec.append((device or "cpu", name.lower()))
    for _, name in spec:
        if name not in ("gloo", "nccl"):
            raise RuntimeError(
                f"ddp.StepManager runs on the 'ddp' backend or on PyTorch's 'gloo' and 'nccl'; "
                f"the default group runs '{name}' ({dist.get_backend_config(group)})")
    return spec


def group_timeout(group):
    """The timeout of `group`'s first backend (what init_process_group was given)."""
    device, _ = backend_spec(group)[0]
    try:
        return group._get_backend(torch.device(device)).options._timeout
    except (AttributeError, RuntimeError):
        return timedelta(minutes=30)  # torch.distributed's default for gloo


def _make_backend(name, store, rank, size, timeout):
    if name == "gloo":
        backend = dist.ProcessGroupGloo(store, rank, size, timeout)
        kind = dist.ProcessGroup.BackendType.GLOO
    else:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        backend = dist.ProcessGroupNCCL(store, rank, size, options)
        kind = dist.ProcessGroup.BackendType.NCCL
    backend._set_sequence_number_for_group()
    return backend, kind


def make_group(store, prefix, rank, size, spec, timeout):
    """A torch.distributed ProcessGroup of `size` ranks over `store` under `prefix`, with one
    backend per name in `spec`, registered for the devices `spec` gives it. Returns (group, the
    backends)."""
    prefixed = dist.PrefixStore(prefix, store)
    group = dist.ProcessGroup(prefixed, rank, size)
    backends = {}
    for device, name in spec:
        if name not in backends:
            # Each backend its own keys, as init_process_group keeps them for a mixed spec.
            backends[name] = _make_backend(name, dist.PrefixStore(name + "/", prefixed), rank,
                                           size, timeout)
        backend, kind = backends[name]
        group._register_backend(torch.device(device), kind, backend)
    group._set_default_backend(backends[spec[0][1]][1])
    return group, [backend for backend, _ in backends.values()]


class PendingWaits:
    """Waits on one generation's collectives that its loss must end at once: ``bound(work)``
    gives a future that completes as `work`'s does, or fails with the loss's message when
    ``fail_all`` comes first (the collective itself may go on: what waits for it no longer
    does). Generations keep a late ``fail_all`` of an older one from failing a newer one's waits.

    The binding is ddp._C's (python/src/bound_work.hpp): `work`'s completion runs no Python, so
    a lost generation's collective that ends late, even while the interpreter finalizes, takes
    no GIL (a Python callback there aborted the exiting worker)."""

    def __init__(self, generation=0):
        self._lock = threading.Lock()
        self._pending = []  # bound Works not known to be completed
        self._generation = generation
        self._failed = None  # fail_all()'s message for this generation

    def bound(self, work):
        bound = _C._bind_work(work)
        with self._lock:
            # Completed ones are dropped here (no callback of the source's removes them).
            self._pending = [w for w in self._pending if not w.is_completed()]
            failed = self._failed
            if failed is None:
                self._pending.append(bound)
        if failed is not None:
            _C._fail_bound_work(bound, failed)
        return bound.get_future()

    def fail_all(self, message, generation):
        """Fails every pending wait of `generation`, and every later one until reopen(), with
        `message`; nothing when `generation` is not the current one."""
        with self._lock:
            if generation != self._generation:
                return
            self._failed = message
            pending, self._pending = self._pending, []
        for bound in pending:
            _C._fail_bound_work(bound, message)

    def reopen(self, generation):
        """The waits of `generation` begin: none fails until its own fail_all()."""
        with self._lock:
            self._generation = generation
            self._failed = None


class TorchGenerations:
    """The current generation's group of PyTorch's backends (``group``), made anew at every
    reform(). Same interface as the ddp backend's (recovery._DdpBackendGroups)."""

    def __init__(self, default_group, timeout=None):
        self._spec = backend_spec(default_group)
        self._timeout = timeout if timeout is not None else group_timeout(default_group)
        self._store = dist.distributed_c10d._get_default_store()
        self._membership = _C._RecoveryMembership(self._timeout, _MEMBERSHIP_NAME)
        self._lock = threading.Lock()  # guards _backends and _formed (the abort thread reads)
        self._closing = False
        self._waits = None  # made by _form()
        # Earlier generations' [(backends, their collectives)] with a collective that may still
        # hang; the current generation's collectives that may not have ended yet (bound()).
        self._retired = []
        self._works = []
        self._form()
        self._aborter = threading.Thread(target=self._abort_on_notice, daemon=True,
                                         name="ddp-abort-on-loss")
        self._aborter.start()
        atexit.register(self._close_at_exit)

    @property
    def generation(self):
        return self._membership.generation

    @property
    def rank(self):
        return self._membership.rank

    @property
    def world_size(self):
        return self._membership.world_size

    def stale(self):
        return self._membership.stale()

    def loss(self):
        """What opened the newer generation ("rank 2 of 3 was lost (membership generation 1
        ...)"); "" while none is announced."""
        return self._membership.loss()

    def bound(self, work):
        """The future of `work` (a collective on ``group``), ended at once by a loss
        (PendingWaits)."""
        with self._lock:
            self._works = [w for w in self._works if not _ended(w)]
            self._works.append(work)
        return self._waits.bound(work)

    def wait(self, work):
        """Waits for `work` of ``group``; RuntimeError when it fails or a loss is announced."""
        return self.bound(work).wait()

    def reform(self):
        """Aborts the current group, joins the newest generation with every member, and makes
        its group."""
        with self._lock:
            old, works = self._backends, self._works
            self._backends, self._works = [], []
        self._waits.fail_all(self.loss() or "the group is re-formed", self._formed)
        for backend in old:
            _abort(backend)
        # Kept only while one of their collectives has not ended (dropped here, they go once the
        # old group and DDP let go of them).
        self._retired = [(backends, ws) for backends, ws in self._retired + [(old, works)]
                         if not all(_ended(w) for w in ws)]
        self._membership.reform()
        self._form()

    def _form(self):
        m = self._membership
        group, backends = make_group(self._store, _PREFIX.format(m.generation), m.rank,
                                     m.world_size, self._spec, self._timeout)
        self.group = group
        if self._waits is None:
            self._waits = PendingWaits(m.generation)
        self._waits.reopen(m.generation)
        with self._lock:
            self._backends = backends
            self._formed = m.generation

    def _abort_on_notice(self):
        while not self._closing:
            with self._lock:
                formed = self._formed
            if not self._membership.wait_announced_after(formed, _POLL):
                continue
            self._waits.fail_all(self._membership.loss(), formed)
            with self._lock:
                backends = self._backends if self._formed == formed else []
            for backend in backends:
                _abort(backend)
            # Until the training thread re-formed: nothing more to abort meanwhile.
            while not self._closing and self._formed == formed:
                time.sleep(_POLL.total_seconds())

    def _close_at_exit(self):
        # A program that ends by an uncaught exception is failing (ddprun may restart its
        # slot): it records no finish, as ddp's RecoverableGroup does when unwinding.
        self._closing = True
        self._aborter.join()
        if getattr(sys, "last_value", None) is None:
            self._membership.close()
        # A lost generation's group may still wait for a peer that never answers; its
        # destructor would wait as long (gloo joins its threads). The process is ending: those
        # objects are never destroyed (one reference more than anyone holds).
        for backends, _ in self._retired:
            for backend in backends:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))


def _ended(work):
    """Whether `work`, a collective of a group's backend, ended (completed or failed). Its future
    completes first (gloo marks the Work completed after it, on its own thread): a collective
    whose result StepManager had counts as ended."""
    try:
        return work.is_completed() or work.get_future().done()
    except RuntimeError:  # it failed
        return True


def _abort(backend):
    """Ends `backend`'s collectives now where the backend can: nccl's abort ends them. gloo's
    abort (PyTorch 2.13) does not end a collective in flight, and one that fails after it (its
    peer's sockets closing at last) ends the process (an uncaught gloo::IoException): gloo's are
    left to end by themselves; nothing waits for them (PendingWaits)."""
    if isinstance(backend, dist.ProcessGroupGloo):
        return
    try:
        backend.abort()
    except (AttributeError, RuntimeError) as e:
        print(f"ddp.StepManager: cannot abort a group of a lost generation: {e}", file=sys.stderr,
              flush=True)
