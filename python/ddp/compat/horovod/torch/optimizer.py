"""hvd.DistributedOptimizer: averages gradients across ranks while backward runs.

The wrapped optimizer's class is subclassed (isinstance checks and its step() keep working).
Gradients are fused into buckets in reverse parameter order, as DDP does: a bucket's allreduce
starts during backward as soon as its gradients and those of every earlier bucket are ready,
so all ranks issue the same collectives in the same order whatever order autograd produces the
gradients in (Horovod negotiates by name instead; ddp fixes the order). Bucket size:
HOROVOD_FUSION_THRESHOLD bytes (default 25 MiB: buckets here are fixed, not formed per cycle,
so a smaller bucket keeps the overlap), or the `groups` argument.
"""

import os
import warnings
from contextlib import contextmanager

import torch

from . import handles as _handles
from . import mpi_ops as _ops
from . import runtime as _rt
from .compression import Compression

_DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


def _bucket_bytes():
    v = os.environ.get("HOROVOD_FUSION_THRESHOLD")
    if not v:
        return _DEFAULT_BUCKET_BYTES
    try:
        return max(1, int(v))
    except ValueError:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD={v!r} is not a number of bytes") from None


class _Bucket:
    def __init__(self, params):
        self.params = params
        self.ready = 0
        self.handle = None
        self.contexts = None


class _DistributedMixin:
    """The methods added to the user's optimizer class."""

    def _ddp_hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense):
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(x, tuple) for x in named_parameters):
                raise ValueError("named_parameters should be a sequence of tuples (name, "
                                 "parameter), usually produced by model.named_parameters().")
            names = [n for n, _ in named_parameters]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError("Parameter names in named_parameters must be unique. Found "
                                 "duplicates: " + ", ".join(dups))
            named_ids = {id(p) for _, p in named_parameters}
            unnamed = [id(p) for p in all_params if id(p) not in named_ids]
            if unnamed:
                raise ValueError("named_parameters was specified, but one or more model "
                                 "parameters were not named. Python object ids: "
                                 + ", ".join(str(i) for i in unnamed))
            self._names = {p: n for n, p in named_parameters}
        else:
            self._names = {p: f"allreduce.noname.{i}" for i, p in enumerate(all_params)}
        if op == _ops.Adasum and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor not supported with op == Adasum")
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._sparse_as_dense = sparse_as_dense
        self._synchronized = False
        self._should_synchronize = True
        trainable = [p for p in all_params if p.requires_grad]
        self._buckets = self._make_buckets(trainable, groups)
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._delay = {p: backward_passes_per_step for p in trainable}
        self._next_bucket = 0
        self._hooks = []
        if _rt.size() > 1:
            for p in trainable:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    @staticmethod
    def _make_buckets(trainable, groups):
        if groups is not None and not isinstance(groups, int):
            seen, buckets = set(), []
            for group in groups:
                ps = [p for p in group if p.requires_grad]
                if any(id(p) in seen for p in ps):
                    raise ValueError("A parameter can only appear once in groups.")
                seen.update(id(p) for p in ps)
                buckets.append(_Bucket(ps))
            buckets += [_Bucket([p]) for p in trainable if id(p) not in seen]
            return [b for b in buckets if b.params]
        ordered = list(reversed(trainable))
        if groups:  # an int: that many groups of (nearly) equal parameter counts
            if groups < 0:
                raise ValueError("groups should be a non-negative integer or a list of list of "
                                 "torch.Tensor.")
            k, rest = divmod(len(ordered), groups)
            out, start = [], 0
            for i in range(groups):
                end = start + k + (1 if i < rest else 0)
                out.append(_Bucket(ordered[start:end]))
                start = end
            return [b for b in out if b.params]
        limit, buckets, current, size = _bucket_bytes(), [], [], 0
        for p in ordered:
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > limit:
                buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            buckets.append(_Bucket(current))
        return buckets

    def _grad_ready(self, p):
        if self._delay[p] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step "
                                 "times before call to step(). Increase "
                                 "backward_passes_per_step to accumulate gradients locally.")
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._bucket_of[p].ready += 1
            self._launch_in_order(only_complete=True)

    def _launch_in_order(self, only_complete):
        while self._next_bucket < len(self._buckets):
            b = self._buckets[self._next_bucket]
            if only_complete and b.ready < len(b.params):
                return
            self._launch(b)
            self._next_bucket += 1

    def _launch(self, bucket):
        grads = []
        for p in bucket.params:
            if p.grad is None:
                # Unused on this rank, perhaps not on another: it still takes part.
                p.grad = torch.zeros_like(p)
            g = p.grad
            if g.is_sparse:
                if not self._sparse_as_dense:
                    raise NotImplementedError(
                        f"{self._names.get(p)} has a sparse gradient: pass sparse_as_dense=True "
                        "to hvd.DistributedOptimizer (ddp's Horovod layer reduces dense tensors)")
                g = g.to_dense()
            grads.append(g)
        compressed = [self._compression.compress(g) for g in grads]
        if self.op == _ops.Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            pre, post = 1.0, 1.0
        bucket.contexts = compressed
        bucket.handle = _ops.grouped_allreduce_async(
            [c for c, _ in compressed], name=self._names.get(bucket.params[0]), op=self.op,
            prescale_factor=pre, postscale_factor=post)

    def synchronize(self):
        """Finishes every gradient allreduce of this step and writes the averaged gradients."""
        if not self._buckets or _rt.size() == 1:
            self._synchronized = True
            return
        self._launch_in_order(only_complete=False)
        for b in self._buckets:
            outputs = _handles.synchronize(b.handle)
            for p, out, (_, ctx) in zip(b.params, outputs, b.contexts):
                reduced = self._compression.decompress(out, ctx)
                if p.grad.is_sparse:
                    p.grad = reduced.to_sparse()
                else:
                    p.grad.copy_(reduced)
            b.handle, b.contexts, b.ready = None, None, 0
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._next_bucket = 0
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """optimizer.synchronize(); with optimizer.skip_synchronize(): optimizer.step()"""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You "
                              "may want to consider using optimizer.skip_synchronize() context "
                              "if you use optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if any(b.handle is not None for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def load_state_dict(self, *args, **kwargs):
        for b in self._buckets:
            b.handle, b.contexts, b.ready = None, None, 0
        self._next_bucket = 0
        self._synchronized = False
        self._should_synchronize = True
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        return super(self.__class__, self).load_state_dict(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=_ops.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=_ops.global_process_set):
    """Wraps `optimizer` so that step() uses gradients averaged (op) over all ranks."""
    _ops._global_only(process_set)
    if gradient_predivide_factor != 1.0 and op != _ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    base = optimizer.__class__
    cls = type(base.__name__, (base,), {k: v for k, v in _DistributedMixin.__dict__.items()
                                        if not k.startswith("__")})
    wrapped = cls.__new__(cls)
    # The user's optimizer already validated its hyper-parameters: take its groups and
    # defaults as they are instead of calling its __init__ again.
    wrapped.__dict__.update(optimizer.__dict__)
    if hasattr(wrapped, "_patch_step_function"):
        wrapped._patch_step_function()  # torch's step hooks and profiler label
    wrapped._ddp_hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor, groups, sparse_as_dense)
    return wrapped
