"""In-place recovery for PyTorch's DistributedDataParallel on the ddp backend.

Under ``ddprun --recovery step`` a worker that dies is restarted alone; the survivors drop the
step they were in, re-form the default process group in the same processes, hand the
restarted rank their training state over the group and redo the step (docs/recovery.md)::

    import ddp, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("ddp")             # env://: the store ddprun hosts
    model = DDP(net, init_sync=False)          # StepManager.attach syncs instead
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = ddp.StepManager(model, opt)        # every rank: a healthy peer's state

    def forward():                             # the forward of step `steps.step`
        x, y = batch_for_step(steps.step)      # read inside: a redo may run a later step
        return loss_fn(model(x), y)            # run_step backprops and steps the optimizer

    while steps.step < total:
        loss = steps.run_step(forward)
        log(steps.step, loss)                  # only committed steps reach the log

What ddp does for it:

- ``import ddp`` under ``DDP_RECOVERY=step`` makes ``env://`` hand torch.distributed the store
  ddprun hosts (it outlives any rank; rank 0 must not host one), and the ddp backend runs the
  default group on a ddp RecoverableGroup, whose collectives ddprun's notice of a lost rank
  aborts within about 100 ms (a RuntimeError naming the lost rank) and which re-forms in this
  same process group object, so PyTorch's DDP keeps it.
- The manager registers a comm hook (an all-reduce average, as DDP's default) that records a
  failed all-reduce instead of raising inside autograd, so DDP's reducer never sees an error
  and a failed step can be dropped: no ``optimizer.step()``, gradients zeroed, the global
  generators rewound (torch's CPU generator, Python's ``random``, NumPy's ``numpy.random``
  when the program imported NumPy). Register no other comm hook on the model.
- A lost node (an elastic job): the survivors go on with fewer ranks in the same processes.
  A torch.distributed group keeps its rank and size for life, so ``dist.get_rank()`` and
  ``dist.get_world_size()`` keep the launch's (``slot``, ``launch_world_size``) while ``rank``
  and ``world_size`` follow the current generation: pick each step's data from those, as the
  default group's operations take ranks in those terms. A node that takes the lost one's place
  brings its ranks back.
- Healing: every rank, the restarted one included, takes parameters, buffers, optimizer state,
  the step counter and those generators' states from the rank with the most committed steps
  (the lowest such rank), by broadcasts over the group. So seed the generators the same on
  every rank (the usual DDP recipe): a rank's own, different states die with it. DDP's
  gradient buckets are rebuilt on every rank in parameter order (see _same_buckets), so the
  restarted rank's fresh DDP and the survivors' sum the same layout.
"""

import os
import pickle
import random
import sys
import time
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist

from . import _C
from ._bytes import tensor_bytes

__all__ = ["StepManager", "recovery_enabled"]


def recovery_enabled():
    """Whether this worker runs under ``ddprun --recovery step``."""
    return os.environ.get("DDP_RECOVERY") == "step"


def _env_rendezvous_over_job_store(url, timeout=timedelta(minutes=30), **kwargs):
    """env:// with the store ddprun hosts instead of a TCPStore on rank 0."""
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}

    def need(name, key):
        if key in query:
            return int(query[key])
        value = os.environ.get(name)
        if not value:
            raise ValueError(f"env:// rendezvous: environment variable {name} expected, but not set")
        return int(value)

    rank, world_size = need("RANK", "rank"), need("WORLD_SIZE", "world_size")
    yield (_C._connect_job_store(timeout), rank, world_size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def _ddp_backend(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    if not _C._recoverable(backend):
        raise RuntimeError(
            "ddp.StepManager needs the default process group of the 'ddp' backend under "
            "'ddprun --recovery step' (init_process_group(\"ddp\") after import ddp)")
    return backend


def _host_rng_states():
    """The global generators besides torch's CPU one: Python's ``random``, NumPy's
    ``numpy.random`` when the program imported it (never imported here: NumPy is the program's
    choice), and the current CUDA device's when the program initialized CUDA (dropout on the
    GPU draws there; never initialized here)."""
    numpy = sys.modules.get("numpy")
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {"random": random.getstate(),
            "numpy": numpy.random.get_state() if numpy is not None else None,
            "cuda": torch.cuda.get_rng_state() if cuda else None}


def _set_host_rng_states(states):
    random.setstate(states["random"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and states["numpy"] is not None:
        numpy.random.set_state(states["numpy"])
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


class StepManager:
    """Runs training steps that survive the loss of a rank (see the module's docstring).

    model: a torch.nn.parallel.DistributedDataParallel over the default 'ddp' group, made with
        init_sync=False. optimizer: over its parameters. notice_wait: how long a failed
        collective waits for ddprun's notice of a lost rank before it counts as an ordinary
        error (re-raised), in seconds; None: ddprun's DDP_RECOVERY_NOTICE_WAIT_MS (set on
        several nodes, long enough for a lost node's missed heartbeats), else 5.
    """

    def __init__(self, model, optimizer, notice_wait=None):
        self.model = model
        self.optimizer = optimizer
        if notice_wait is None:
            notice_wait = int(os.environ.get("DDP_RECOVERY_NOTICE_WAIT_MS", "5000")) / 1000.0
        self.notice_wait = notice_wait
        self.step = 0
        self.recoveries = 0  # re-forms of the group this process took part in
        self.dropped = 0  # attempts dropped because a rank was lost
        self._backend = _ddp_backend()
        if getattr(model, "process_group", None) is not dist.distributed_c10d._get_default_group():
            raise RuntimeError(
                "ddp.StepManager: the model must be a DistributedDataParallel over the default "
                "process group (DistributedDataParallel(module, init_sync=False))")
        self._world = self.world_size  # what the comm hook divides by (the current generation's)
        self._hook_error = None
        model.register_comm_hook(self, StepManager._average_hook)
        if recovery_enabled():
            # ddprun restarts a lost rank alone only for a job whose loop a StepManager drives
            # (nothing else would redo the survivors' step); otherwise the whole group.
            _C._connect_job_store(timedelta(seconds=60)).add("ddp/recovery/step_managers", 1)
        self._heal_until_done()

    @property
    def generation(self):
        """The membership generation of the current group (0 until a rank is lost)."""
        return _C._generation(self._backend)

    @property
    def rank(self):
        """This rank in the current generation's group. Equal to ``slot`` until a node is lost:
        the survivors are then renumbered 0..world_size-1 in the order of their slots."""
        return _C._group_rank(self._backend)

    @property
    def world_size(self):
        """The number of ranks in the current generation (fewer than ``launch_world_size`` after
        a lost node). ``torch.distributed.get_world_size()`` keeps saying the launch's: a
        torch.distributed group's size is fixed for its lifetime."""
        return _C._group_size(self._backend)

    @property
    def slot(self):
        """The rank this process was launched with (RANK, ``torch.distributed.get_rank()``):
        its identity across generations."""
        return dist.get_rank()

    @property
    def launch_world_size(self):
        """The world size the job was launched with: the launch's slots are 0 .. this - 1. A
        node that grew the job later adds slots from it on; its processes' WORLD_SIZE (and
        ``torch.distributed.get_world_size()``) count those too, ddprun tells them the launch's
        (DDP_RECOVERY_LAUNCH_WORLD_SIZE)."""
        return int(os.environ.get("DDP_RECOVERY_LAUNCH_WORLD_SIZE") or dist.get_world_size())

    # The comm hook: DDP's averaging all-reduce, recording a failure instead of raising it in
    # autograd (the step is dropped after backward returns).
    def _average_hook(self, bucket):
        buffer = bucket.buffer()
        try:
            fut = dist.all_reduce(buffer, async_op=True).get_future()
        except RuntimeError as e:
            self._hook_error = self._hook_error or e
            done = torch.futures.Future()
            done.set_result(buffer)
            return done

        def average(f):
            try:
                return f.value()[0].div_(self._world)
            except RuntimeError as e:
                self._hook_error = self._hook_error or e
                return buffer

        return fut.then(average)

    def run_step(self, fn):
        """Zeroes the gradients, runs fn() (the forward, returning the loss), backpropagates,
        and steps the optimizer: the step is then committed and ``step`` counts it. When a
        rank is lost meanwhile the attempt is dropped, the group re-formed and healed, and fn
        runs again, for ``step`` as healed (the most advanced rank's: a later step when some
        rank had committed this one), so fn must read ``step`` itself to pick its batch.
        Returns fn's loss of the committed attempt."""
        while True:
            if _C._stale(self._backend):
                self._recover()
            rng = torch.get_rng_state()
            host_rngs = _host_rng_states()
            self.optimizer.zero_grad(set_to_none=False)
            self._hook_error = None
            try:
                loss = fn()
                loss.backward()
                error = self._hook_error
            except RuntimeError as e:
                error = e
            if error is None:
                self.optimizer.step()
                self.step += 1
                return loss
            if not self._lost_peer():
                raise error
            self.dropped += 1
            print(f"ddp.StepManager: rank {self.slot} dropped step {self.step} and "
                  f"re-forms the group: {error}", file=sys.stderr, flush=True)
            torch.set_rng_state(rng)
            _set_host_rng_states(host_rngs)
            self.optimizer.zero_grad(set_to_none=False)
            self._recover()

    def _lost_peer(self):
        # A collective that failed because a peer died fails before or after ddprun's notice
        # (the peer's sockets close first): wait a little for the notice.
        deadline = time.monotonic() + self.notice_wait
        while not _C._stale(self._backend):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _recover(self):
        _C._reform(self._backend)
        self.recoveries += 1
        self._heal_until_done()

    def _heal_until_done(self):
        # A rank lost while healing (the replacement itself, or another) opens the next
        # generation: re-form again and heal from the start.
        while True:
            try:
                self._heal()
                return
            except RuntimeError as e:
                if not self._lost_peer():
                    raise
                print(f"ddp.StepManager: rank {self.slot} lost a peer while healing and "
                      f"re-forms the group: {e}", file=sys.stderr, flush=True)
            _C._reform(self._backend)
            self.recoveries += 1

    def _same_buckets(self):
        # DDP lays gradients out in buckets, first in reverse parameter order, then (after the
        # first backward) in the order they became ready; the all-reduce sums buffers position
        # by position. A restarted rank's DDP is new while the survivors' rebuilt long ago, so
        # their layouts would differ and the sums mix different parameters (no error: the
        # sizes match). So on every rank, at the start and at every heal, DDP rebuilds its
        # buckets now, in parameter order, rank 0's layout broadcast (a collective), and never
        # again: every rank, and every run, sums in the same layout.
        self.model._update_process_group(dist.distributed_c10d._get_default_group())
        self.model.reducer._push_all_rebuilt_params()
        self.model.reducer._rebuild_buckets()

    def _heal(self):
        """Every rank takes the state of the rank with the most committed steps (lowest rank
        among equals): parameters and buffers, optimizer state, step, the global generators
        (torch's CPU generator, Python's random, NumPy's if imported). Ranks are the current
        generation's (collectives on the default group take them; a lost node renumbers)."""
        self._same_buckets()
        rank, self._world = self.rank, self.world_size
        key = torch.tensor([self.step * self._world + (self._world - 1 - rank)], dtype=torch.int64)
        dist.all_reduce(key, op=dist.ReduceOp.MAX)
        src = self._world - 1 - int(key.item()) % self._world
        self.step = int(key.item()) // self._world
        with torch.no_grad():
            for t in self.model.module.state_dict(keep_vars=True).values():
                dist.broadcast(t.data if t.requires_grad else t, src)
        state = self._broadcast_object(self.optimizer.state_dict() if rank == src else None, src)
        if rank != src:
            self.optimizer.load_state_dict(state)
        rng = torch.get_rng_state()
        dist.broadcast(rng, src)
        torch.set_rng_state(rng)
        _set_host_rng_states(self._broadcast_object(_host_rng_states() if rank == src else None,
                                                    src))

    def _broadcast_object(self, obj, src):
        """`obj` of the current generation's rank `src`, pickled, on every rank (what
        torch.distributed.broadcast_object_list does, but in the current generation's ranks:
        that function tells the source by torch.distributed.get_rank(), the launch's rank)."""
        if self.rank == src:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, src)
        if self.rank != src:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(payload, src)
        return obj if self.rank == src else pickle.loads(tensor_bytes(payload))
