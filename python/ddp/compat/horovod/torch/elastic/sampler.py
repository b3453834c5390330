"""hvd.elastic.ElasticSampler: a distributed sampler that resumes mid-epoch.

Contract (Horovod 0.28's): the sampler shards the samples of the current epoch not yet
processed over the ranks; the training loop calls record_batch(batch_idx, batch_size) after
each batch, and the sampler, kept in a TorchState (`TorchState(model, opt, sampler=s)`), is
committed with it. After ddprun restarts the workers, hvd.elastic.run restores the committed
state and sync() merges every rank's processed samples, so the resumed epoch iterates only
the remaining ones, re-sharded over the current ranks. set_epoch(e) starts a new epoch.

Order: with shuffle, the remaining indices are shuffled by random.Random(seed + epoch), the
same permutation on every rank; rank r takes every size-th index starting at r, padded by
repeating the first indices so every rank gets the same count (as DistributedSampler does).
"""

import math
import random

import torch.utils.data

from .. import runtime as _rt


class ElasticSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.indices = []  # this rank's indices of the current pass (set by __iter__)
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks this rank's batch `batch_idx` (of `batch_size` samples) processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's sample indices of batch `batch_idx` in the current pass."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Re-shards the unprocessed samples over the current ranks."""
        self.num_replicas = _rt.size() if _rt.is_initialized() else 1
        self.rank = _rt.rank() if _rt.is_initialized() else 0
        self.remaining_indices = [
            i for i in range(len(self.dataset)) if i not in self.processed_indices
        ]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        order = list(self.remaining_indices)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        if order:
            while len(order) < self.total_size:
                order += order[:self.total_size - len(order)]
        self.indices = order[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
