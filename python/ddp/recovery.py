"""In-place recovery for PyTorch's DistributedDataParallel: on the ddp backend, and on
PyTorch's own gloo and nccl (torch_generations.py).

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
  aborts within milliseconds (a RuntimeError naming the lost rank) and which re-forms in this
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
- PyTorch's backends (``init_process_group("gloo")``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``):
  the same, except that a torch.distributed group of theirs cannot re-form, so each membership
  generation gets a group of its own (``StepManager.group``), which the manager hands to DDP;
  the default group keeps the launch's members (see torch_generations.py).
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


class _DdpBackendGroups:
    """The ddp backend's default group, which re-forms in place: one c10d object for every
    generation (its backend a ddp RecoverableGroup). Same interface as
    torch_generations.TorchGenerations, the groups of PyTorch's own backends."""

    def __init__(self, default_group):
        self.group = default_group
        self._backend = default_group._get_backend(torch.device("cpu"))
        if not _C._recoverable(self._backend):
            raise RuntimeError(
                "ddp.StepManager needs 'ddprun --recovery step' (the default group of the 'ddp' "
                "backend re-forms only there)")
        # --recovery shrink: a replacement's group was its own until now (the others trained
        # on while this process built its model): it claims its slot back and joins them.
        _C._claim_return(self._backend)

    @property
    def generation(self):
        return _C._generation(self._backend)

    @property
    def rank(self):
        return _C._group_rank(self._backend)

    @property
    def world_size(self):
        return _C._group_size(self._backend)

    def stale(self):
        return _C._stale(self._backend)

    def reform(self):
        _C._reform(self._backend)

    def loss(self):
        return ""  # the failed collective's PeerLostError says it

    # ddp's RecoverableGroup ends the collectives in flight itself at the notice.
    def bound(self, work):
        return work.get_future()

    def wait(self, work):
        work.wait()


def _step_groups(default_group):
    """The groups StepManager runs on: the ddp backend's, or each generation's of PyTorch's
    gloo and nccl (torch_generations.py)."""
    if dist.get_backend(default_group) == "ddp":
        return _DdpBackendGroups(default_group)
    if not recovery_enabled():
        raise RuntimeError(
            f"ddp.StepManager needs 'ddprun --recovery step' (this process was not started by "
            f"it; backend {dist.get_backend(default_group)})")
    from .torch_generations import TorchGenerations

    return TorchGenerations(default_group)


def _host_rng_states(device):
    """The global generators besides torch's CPU one: Python's ``random``, NumPy's
    ``numpy.random`` when the program imported it (never imported here: NumPy is the program's
    choice), and the CUDA generator of the model's device (`device`) when the program
    initialized CUDA (dropout on the GPU draws there; never initialized here). The model's
    device, not the current one: a model on cuda:1 in a program that never called
    ``torch.cuda.set_device`` draws from cuda:1's generator."""
    numpy = sys.modules.get("numpy")
    cuda = device.type == "cuda" and torch.cuda.is_initialized()
    return {"random": random.getstate(),
            "numpy": numpy.random.get_state() if numpy is not None else None,
            "cuda": torch.cuda.get_rng_state(device) if cuda else None}


def _set_host_rng_states(states, device):
    random.setstate(states["random"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and states["numpy"] is not None:
        numpy.random.set_state(states["numpy"])
    if states.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)


class StepManager:
    """Runs training steps that survive the loss of a rank (see the module's docstring).

    model: a torch.nn.parallel.DistributedDataParallel over the default group, made with
        init_sync=False: the 'ddp' backend, or PyTorch's 'gloo', 'nccl' or a mix of them
        ("cpu:gloo,cuda:nccl"; then each generation gets a group of its own, ``group``).
        optimizer: over its parameters. notice_wait: how long a failed collective waits for
        ddprun's notice of a lost rank before it counts as an ordinary
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
        default_group = dist.distributed_c10d._get_default_group()
        if getattr(model, "process_group", None) is not default_group:
            raise RuntimeError(
                "ddp.StepManager: the model must be a DistributedDataParallel over the default "
                "process group (DistributedDataParallel(module, init_sync=False))")
        self._groups = _step_groups(default_group)
        # Where the heal's own small tensors live: nccl takes only the model's device's.
        self._device = next(model.parameters()).device
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
        return self._groups.generation

    @property
    def rank(self):
        """This rank in the current generation's group. Equal to ``slot`` until a node is lost:
        the survivors are then renumbered 0..world_size-1 in the order of their slots."""
        return self._groups.rank

    @property
    def world_size(self):
        """The number of ranks in the current generation (fewer than ``launch_world_size`` after
        a lost node). ``torch.distributed.get_world_size()`` keeps saying the launch's: a
        torch.distributed group's size is fixed for its lifetime."""
        return self._groups.world_size

    @property
    def group(self):
        """The torch.distributed group of the current generation, for the program's own
        collectives in a step (ranks of this generation). On the 'ddp' backend it is the default
        group, which re-forms in place; on PyTorch's backends a new group per generation (the
        default group keeps the launch's members, and is broken once a rank was lost)."""
        return self._groups.group

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
            fut = self._groups.bound(self._groups.group.allreduce([buffer]))
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
            if self._groups.stale():
                self._recover()
            rng = torch.get_rng_state()
            host_rngs = _host_rng_states(self._device)
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
                  f"re-forms the group: {self._why(error)}", file=sys.stderr, flush=True)
            torch.set_rng_state(rng)
            _set_host_rng_states(host_rngs, self._device)
            self.optimizer.zero_grad(set_to_none=False)
            self._recover()

    def _lost_peer(self):
        # A collective that failed because a peer died fails before or after ddprun's notice
        # (the peer's sockets close first): wait a little for the notice.
        deadline = time.monotonic() + self.notice_wait
        while not self._groups.stale():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _why(self, error):
        """The failed collective's error, led by ddprun's notice of the loss where the error does
        not say it (PyTorch's backends only see a closed connection)."""
        loss = self._groups.loss()
        return f"{loss}; the failed collective: {error}" if loss else str(error)

    def _recover(self):
        self._groups.reform()
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
                      f"re-forms the group: {self._why(e)}", file=sys.stderr, flush=True)
            self._groups.reform()
            self.recoveries += 1

    def _same_buckets(self):
        # DDP lays gradients out in buckets, first all in one, then (after the first backward)
        # in the order they became ready; the all-reduce sums buffers position by position. A
        # restarted rank's DDP is new while the survivors' rebuilt long ago, so their layouts
        # would differ and the sums mix different parameters (no error: the sizes match). So on
        # every rank, at the start and at every heal, DDP rebuilds its buckets now, and never
        # again: every rank, and every run, sums in the same layout. The order is reverse
        # parameter order (python/src/bucket_order.cpp), what a sequential model's backward
        # produces: the last layers' bucket is all-reduced while the first layers' backward
        # runs. The rebuild broadcasts rank 0's layout (a collective), the same on every rank.
        self.model._update_process_group(self._groups.group)
        _C._push_params_in_reverse_order(self.model.reducer)
        self.model.reducer._rebuild_buckets()

    def _heal(self):
        """Every rank takes the state of the rank with the most committed steps (lowest rank
        among equals): parameters and buffers, optimizer state, step, the global generators
        (torch's CPU generator, Python's random, NumPy's if imported). Ranks are the current
        generation's (collectives on the default group take them; a lost node renumbers)."""
        self._same_buckets()
        rank, self._world = self.rank, self.world_size
        key = torch.tensor([self.step * self._world + (self._world - 1 - rank)], dtype=torch.int64,
                           device=self._device)
        self._all_reduce_max(key)
        src = self._world - 1 - int(key.item()) % self._world
        self.step = int(key.item()) // self._world
        with torch.no_grad():
            for t in self.model.module.state_dict(keep_vars=True).values():
                self._broadcast(t.data if t.requires_grad else t, src)
        state = self._broadcast_object(self.optimizer.state_dict() if rank == src else None, src)
        if rank != src:
            self.optimizer.load_state_dict(state)
        rng = torch.get_rng_state().to(self._device)
        self._broadcast(rng, src)
        torch.set_rng_state(rng.cpu())
        states = _host_rng_states(self._device) if rank == src else None
        _set_host_rng_states(self._broadcast_object(states, src), self._device)

    def _broadcast_object(self, obj, src):
        """`obj` of the current generation's rank `src`, pickled, on every rank (what
        torch.distributed.broadcast_object_list does, but in the current generation's ranks:
        that function tells the source by torch.distributed.get_rank(), the launch's rank)."""
        if self.rank == src:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            payload = payload.to(self._device)
            size = torch.tensor([payload.numel()], dtype=torch.int64, device=self._device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=self._device)
        self._broadcast(size, src)
        if self.rank != src:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self._device)
        self._broadcast(payload, src)
        return obj if self.rank == src else pickle.loads(tensor_bytes(payload.cpu()))

    # The heal's collectives, on the current generation's group in its ranks (the group's own
    # calls: torch.distributed's functions take global ranks, and on PyTorch's backends that
    # group is not one of torch.distributed's registered groups).
    def _broadcast(self, tensor, src):
        options = dist.BroadcastOptions()
        options.rootRank = src
        self._groups.wait(self._groups.group.broadcast([tensor], options))

    def _all_reduce_max(self, tensor):
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._groups.wait(self._groups.group.allreduce([tensor], options))
