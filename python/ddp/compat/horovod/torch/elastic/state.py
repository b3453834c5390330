"""Horovod's elastic state objects, kept across ddprun's restarts.

Horovod rebuilds its communicator inside the running processes; ddprun instead restarts the
workers (--max-restarts) when one fails or the membership changes. So commit() also writes the
committed state to a file (rank 0, atomically: a temporary file renamed over the previous one),
and hvd.elastic.run loads it when a restarted worker starts, then sync() gives it to every rank.
The file: $HOROVOD_ELASTIC_STATE_DIR/horovod_elastic_state.pt, else the run directory ddprun
gives the workers (the folder above attempt_<n>/ of TORCHELASTIC_ERROR_FILE); without either,
commits are kept in memory only, as in Horovod.
"""

import copy
import os
import warnings

import torch

from .. import functions as _fn
from .. import runtime as _rt
from .sampler import ElasticSampler

STATE_FILE = "horovod_elastic_state.pt"


def state_path():
    where = os.environ.get("HOROVOD_ELASTIC_STATE_DIR")
    if not where:
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not error_file:
            return None
        # <run dir>/attempt_<n>/<rank>/error.json
        where = os.path.dirname(os.path.dirname(os.path.dirname(error_file)))
    return os.path.join(where, STATE_FILE)


class State:
    """save/restore/sync plus the reset callbacks; subclasses say what the state holds."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def on_hosts_updated(self, timestamp, update_res):
        pass

    def commit(self):
        """Saves the state in memory and, on rank 0, in the state file; a restarted job
        resumes from the newest commit."""
        self.save()
        self._persist()
        self.check_host_updates()

    def check_host_updates(self):
        """Membership changes restart the workers under ddprun: nothing to check in-process."""

    def _persist(self):
        path = state_path()
        if path is None:
            if not getattr(self, "_warned_memory_only", False):
                warnings.warn("hvd.elastic: no HOROVOD_ELASTIC_STATE_DIR and not under ddprun: "
                              "commits are kept in memory only and do not survive a restart")
                self._warned_memory_only = True
            return
        if _rt.rank() != 0:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(self._saved_payload(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load_committed(self):
        """Rank 0 reads the newest commit, if any; True when it found one (then sync())."""
        path = state_path()
        found = False
        if _rt.rank() == 0 and path and os.path.exists(path):
            self._load_payload(torch.load(path, weights_only=False))
            self.restore()
            found = True
        return _fn.broadcast_object(found, 0, "elastic.found")

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def _saved_payload(self):
        raise NotImplementedError

    def _load_payload(self, payload):
        raise NotImplementedError


class ObjectState(State):
    """Plain picklable values (epoch, batch, ...) as attributes."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._values = dict(kwargs)
        self._saved = copy.deepcopy(self._values)
        super().__init__()
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, name, value):
        if not name.startswith("_") and hasattr(self, "_values") and name in self._values:
            self._values[name] = value
        object.__setattr__(self, name, value)

    def save(self):
        self._saved = copy.deepcopy(self._values)

    def restore(self):
        self._values = copy.deepcopy(self._saved)
        for k, v in self._values.items():
            object.__setattr__(self, k, v)

    def sync(self):
        if self._values:
            self._values = _fn.broadcast_object(self._values, 0, "elastic.objects")
            for k, v in self._values.items():
                object.__setattr__(self, k, v)
            self.save()

    def _saved_payload(self):
        return {"objects": self._saved}

    def _load_payload(self, payload):
        self._saved = payload["objects"]


class TorchState(ObjectState):
    """A model, an optimizer, ElasticSamplers and plain values (hvd.elastic.TorchState).

    A sampler's processed samples are merged over the ranks when the state is committed (each
    rank records only its own batches, and only rank 0's commit survives a restart)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)
        samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        for k in samplers:
            del kwargs[k]
        self._samplers = samplers
        self._saved_samplers = {k: v.state_dict() for k, v in samplers.items()}
        self._saved_model = None
        self._saved_optimizer = None
        super().__init__(**kwargs)
        for k, v in samplers.items():
            object.__setattr__(self, k, v)
        self._save_torch()

    def _merge_samplers(self):
        """Every rank's processed samples in every rank's samplers (a collective)."""
        for name, sampler in sorted(self._samplers.items()):
            seen = _fn.allgather_object(sampler.processed_indices, f"elastic.sampler.{name}")
            epoch = _fn.broadcast_object(sampler.epoch, 0, f"elastic.sampler.{name}.epoch")
            sampler.load_state_dict({"epoch": epoch, "processed_indices": set().union(*seen)})

    def _save_torch(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())

    def save(self):
        self._save_torch()
        self._merge_samplers()
        self._saved_samplers = {k: v.state_dict() for k, v in self._samplers.items()}
        super().save()

    def restore(self):
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for k, v in self._samplers.items():
            if k in self._saved_samplers:
                v.load_state_dict(self._saved_samplers[k])
        super().restore()

    def sync(self):
        if self.model is not None:
            _fn.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            _fn.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self._merge_samplers()
        super().sync()

    def _saved_payload(self):
        return {"objects": self._saved, "model": self._saved_model,
                "optimizer": self._saved_optimizer, "samplers": self._saved_samplers}

    def _load_payload(self, payload):
        super()._load_payload(payload)
        self._saved_model = payload.get("model")
        self._saved_optimizer = payload.get("optimizer")
        self._saved_samplers = payload.get("samplers", {})
