"""hvd.init() and the job's shape: rank, size, local and cross ranks, the process group.

Where the job's shape comes from, first match wins:
- torchrun/ddprun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
  MASTER_PORT): ddprun, torchrun, ddp's horovodrun;
- Open MPI's (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE): `mpirun -np N python train.py`.
  The store is at MASTER_ADDR:MASTER_PORT when both are exported (horovodrun --mpi does), else,
  when every rank runs on one host, a FileStore named after mpirun's job id;
- neither: a single process (Horovod runs a script started with plain `python` as size 1).

The backend is ddp's ("ddp") unless HOROVOD_DDP_BACKEND names another torch.distributed backend
(gloo, nccl). cross_rank/cross_size follow Horovod: the ranks with the same local rank, one per
host, in rank order; hosts are told apart by DDP_HOST_ID when set, else by the host name.
"""

import dataclasses
import datetime
import os
import socket
import tempfile
import time

import torch.distributed as dist

from ..common.exceptions import HorovodInternalError

# Every blocking call has a timeout: the process group's (HOROVOD_DDP_TIMEOUT_S, default 300 s).
_DEFAULT_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class _Job:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    own_group: bool  # whether hvd.init made the process group (hvd.shutdown then destroys it)


_job = None


def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"hvd.init: {name}={v!r} is not an integer") from None


def _launch_env():
    """(rank, size, local_rank, local_size, init_method or store) from the launcher."""
    if _env_int("WORLD_SIZE") is not None:
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        if rank is None:
            raise ValueError("hvd.init: WORLD_SIZE is set but RANK is not; launch with ddprun, "
                             "torchrun or horovodrun")
        local_rank = _env_int("LOCAL_RANK") or 0
        local_size = _env_int("LOCAL_WORLD_SIZE") or 1
        return rank, size, local_rank, local_size, "env://"
    if _env_int("OMPI_COMM_WORLD_SIZE") is not None:
        rank, size = _env_int("OMPI_COMM_WORLD_RANK"), _env_int("OMPI_COMM_WORLD_SIZE")
        local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK") or 0
        local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE") or 1
        if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            return rank, size, local_rank, local_size, "env://"
        if local_size != size:
            raise ValueError(
                f"hvd.init: mpirun started {size} ranks on more than one host but did not pass a "
                "store address; export MASTER_ADDR (a host of the job) and MASTER_PORT (a free "
                "port) to the ranks: mpirun -x MASTER_ADDR=host -x MASTER_PORT=29500 ..., or "
                "launch with ddp's horovodrun, which does it")
        job = (os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMIX_NAMESPACE")
               or os.environ.get("OMPI_MCA_orte_ess_jobid"))
        if not job:
            raise ValueError("hvd.init: under mpirun without MASTER_ADDR/MASTER_PORT and without "
                             "a job id (OMPI_MCA_ess_base_jobid); export MASTER_ADDR and "
                             "MASTER_PORT to the ranks")
        safe = "".join(c if c.isalnum() else "_" for c in job)
        path = os.path.join(tempfile.gettempdir(), f"ddp-horovod-mpirun-{safe}")
        return rank, size, local_rank, local_size, "file://" + path
    return 0, 1, 0, 1, None


def _timeout():
    s = _env_int("HOROVOD_DDP_TIMEOUT_S")
    return datetime.timedelta(seconds=s if s and s > 0 else _DEFAULT_TIMEOUT_S)


def _choose_backend():
    backend = os.environ.get("HOROVOD_DDP_BACKEND", "ddp")
    if backend == "ddp":
        import ddp  # noqa: F401  (registers the "ddp" backend)
    return backend


def _cross(rank, local_rank, size):
    """(cross_rank, cross_size): this rank's place among the ranks with its local rank."""
    if size == 1:
        return 0, 1
    host = os.environ.get("DDP_HOST_ID") or socket.gethostname()
    everyone = [None] * size
    dist.all_gather_object(everyone, (host, local_rank))
    peers = [r for r, (_, lr) in enumerate(everyone) if lr == local_rank]
    return peers.index(rank), len(peers)


def init(comm=None, process_sets=None):
    """Joins the job: makes the process group (or adopts one the script made)."""
    global _job
    if comm is not None:
        raise NotImplementedError("hvd.init(comm=...): ddp's Horovod layer takes no MPI "
                                  "communicator; the job's ranks come from the launcher")
    if process_sets:
        raise NotImplementedError("hvd.init(process_sets=...): ddp's Horovod layer has only the "
                                  "global process set")
    if _job is not None:
        return
    rank, size, local_rank, local_size, init_method = _launch_env()
    own = False
    if dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        backend = _choose_backend()
        # A plain `python train.py` (no launcher) is a job of one: a group over an in-process store.
        where = {"init_method": init_method} if init_method else {"store": dist.HashStore()}
        try:
            dist.init_process_group(backend, rank=rank, world_size=size, timeout=_timeout(),
                                    **where)
        except (RuntimeError, ValueError) as e:
            raise HorovodInternalError(f"hvd.init: making the {backend} process group failed "
                                       f"(rank {rank} of {size}): {e}") from e
        own = True
    cross_rank, cross_size = _cross(rank, local_rank, size)
    _job = _Job(rank, size, local_rank, local_size, cross_rank, cross_size, own)


def shutdown():
    global _job
    if _job is not None and _job.own_group and dist.is_initialized():
        _destroy_group(_job.rank, _job.size)
    _job = None


def _destroy_group(rank, size):
    """Destroys the group so that rank 0's store outlives every rank's use of it.

    Rank 0 hosts the store; a rank whose group still polls it (ddp's flight recorder watcher)
    when rank 0 exits logs connection errors. So each rank reports through the store once its
    group is gone, and rank 0 waits (10 s at most) for all reports before it lets go.
    """
    store = getattr(dist.distributed_c10d, "_get_default_store", lambda: None)()
    try:
        dist.barrier()
    except RuntimeError:
        store = None  # a peer is gone already: destroying the group is all that is left
    dist.destroy_process_group()
    if store is None or size == 1:
        return
    try:
        store.add("horovod/shutdown", 1)
        if rank == 0:
            deadline = time.monotonic() + 10
            while store.add("horovod/shutdown", 0) < size and time.monotonic() < deadline:
                time.sleep(0.01)
    except RuntimeError:
        pass


def is_initialized():
    return _job is not None


def job():
    if _job is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _job


def rank():
    return job().rank


def size():
    return job().size


def local_rank():
    return job().local_rank


def local_size():
    return job().local_size


def cross_rank():
    return job().cross_rank


def cross_size():
    return job().cross_size


def is_homogeneous():
    return size() == local_size() * cross_size()


# The build queries: what this layer offers, in Horovod's terms. "Gloo" is the controller role
# (no MPI needed); NCCL means the torch build can run the nccl backend.
def mpi_built(verbose=False):
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built(verbose=False):
    return True


def gloo_enabled():
    return True


def nccl_built(verbose=False):
    return bool(dist.is_nccl_available())


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    import torch

    return torch.version.cuda is not None


def rocm_built(verbose=False):
    import torch

    return getattr(torch.version, "hip", None) is not None
