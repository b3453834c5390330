"""ddp's collectives as a torch.distributed backend.

    import ddp                                  # registers the "ddp" backend
    import torch.distributed as dist
    dist.init_process_group("ddp")              # env:// (torchrun or ddprun), tcp://, file://,
                                                # or store=, rank=, world_size=

The backend runs ddp's `cpu` backend (shared memory within a host, Gloo between hosts) and
rendezvouses through the store torch.distributed hands it. See docs/python.md.
"""

import torch
import torch.distributed as _dist

from ._build_info import TORCH_VERSION as _BUILT_FOR_TORCH


def _check_torch_version():
    # The extension is compiled against one torch release's C++ ABI: another torch fails to load
    # it with an undefined symbol at best. Say which two versions met instead.
    found = torch.__version__.split("+")[0]
    if found != _BUILT_FOR_TORCH:
        raise ImportError(
            f"ddp was built against torch {_BUILT_FOR_TORCH}, but this environment has torch "
            f"{torch.__version__} ({torch.__file__}); install the ddp wheel made for torch "
            f"{found} (its name says: ddp-<version>+torch{found}...; scripts/wheel.sh makes one "
            f"against this environment's torch), or rebuild ddp for it: pip install "
            f"--force-reinstall --no-deps <ddp checkout> (or scripts/build.sh in the checkout)")


_check_torch_version()

from . import _C  # noqa: E402  (after the version check, which names the mismatch)

import atexit as _atexit  # noqa: E402

# Before Python finalizes: a future's callback still running on a group's completer thread (or
# dropping its Python objects) would take the GIL during finalization, which ends that thread
# in a way that aborts the process (a rank that raised an error then died of SIGABRT instead of
# exiting with its error). Registered at import, so it runs after the user's own atexit hooks.
_atexit.register(_C._quiesce_for_exit, 5.0)

__all__ = ["BACKEND_NAME", "StepManager", "cuda_collectives", "recovery_enabled"]

BACKEND_NAME = "ddp"


def cuda_collectives(group=None):
    """Where a group of the ``ddp`` backend (default: the default group) runs the collectives of
    its CUDA tensors: ``"nccl"`` (on an NCCL communicator of their device, in device memory),
    ``"host"`` (staged through host memory: a build without ddp's nccl backend,
    ``DDP_CUDA_COLLECTIVES=host``, or ranks that share a GPU) or ``"undecided"`` (before the
    group's first operation on CUDA tensors, which makes its communicator). docs/python.md."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    # One backend object serves every device type of a ddp group.
    return _C._cuda_collectives(pg._get_backend(torch.device("cpu")))


def _group_name(group_id):
    # torch numbers groups in creation order: the default group is "0", new_group()s "1", ...
    return "default_pg" if str(group_id) in ("", "0") else "group_" + str(group_id)


def _create_extended(backend_options, pg_options):
    """torch's extended creator API: gets the group id for messages."""
    if pg_options is not None:
        raise RuntimeError("backend ddp takes no pg_options")
    o = backend_options
    return _C._create_process_group(o.store, o.group_rank, o.group_size, o.timeout,
                                    _group_name(getattr(o, "group_id", "")))


def _register():
    # Where ddp is installed, `import torch` has registered the backend already
    # (ddp_torch_plugin, torch's "torch.backends" entry point): its creator forwards here.
    from ddp_torch_plugin import register_backend

    register_backend(_create_extended)


_register()


from .recovery import StepManager, recovery_enabled  # noqa: E402

if recovery_enabled():
    # ddprun --recovery step hosts the job's store: env:// must use it (docs/recovery.md).
    from ddp_torch_plugin import install_env_rendezvous

    from .recovery import _env_rendezvous_over_job_store

    install_env_rendezvous(_env_rendezvous_over_job_store)
