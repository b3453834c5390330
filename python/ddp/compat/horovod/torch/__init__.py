"""`import horovod.torch as hvd` on ddp: Horovod 0.28.1's PyTorch API over torch.distributed.

Launch with ddprun, torchrun, `mpirun -np N` or ddp's horovodrun; docs/horovod.md lists what
is supported and how it maps.
"""

from ..common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from . import elastic  # noqa: F401
from .compression import Compression  # noqa: F401
from .functions import (allgather_object, broadcast_object,  # noqa: F401
                        broadcast_optimizer_state, broadcast_parameters)
from .mpi_ops import (Adasum, Average, Max, Min, Product, ProcessSet, Sum,  # noqa: F401
                      add_process_set, allgather, allgather_async, allreduce, allreduce_,
                      allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                      broadcast, broadcast_, broadcast_async, broadcast_async_,
                      global_process_set, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, grouped_reducescatter, join, poll,
                      reducescatter, reducescatter_async, remove_process_set,
                      sparse_allreduce_async, start_timeline, stop_timeline, synchronize)
from .optimizer import DistributedOptimizer  # noqa: F401
from .runtime import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,  # noqa: F401
                      gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                      local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                      nccl_built, rank, rocm_built, shutdown, size)


class SyncBatchNorm:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("hvd.SyncBatchNorm is not part of ddp's Horovod layer; use "
                                  "torch.nn.SyncBatchNorm with torch.distributed, or ddp's C++ "
                                  "SyncBatchNorm")
