"""Horovod's exception types, under the names scripts catch."""


class HorovodInternalError(RuntimeError):
    """A collective failed: a peer died, timed out, or the ranks disagreed on the operation.

    hvd.elastic.run catches it; ddp then restarts the workers from the last commit (the process
    group cannot be rebuilt in place).
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed. Under ddprun this never comes from inside a running worker:
    ddprun restarts the workers when the membership changes."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
