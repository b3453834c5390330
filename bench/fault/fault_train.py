#!/usr/bin/env python3
"""The PyTorch side of bench/fault: the tutorials' Fashion-MNIST CNN (bench/ddp/bench_ddp.py's
model and data; batch 64 per rank, Adam 1e-3, one intra-op thread per process), trained under
one of two fault-tolerance recipes. Rank 0 (replica group 0 for torchft) appends
"<step> <loss>" to LOSS_LOG after every committed step, which bench/fault/fault_driver.py
watches to inject the kill at the same step for every system.

The batch of global step s (1-based after it commits) is the same in every recipe and in
examples/mnist: DistributedSampler(world, rank, seed 0) at epoch s // steps_per_epoch + 1, then
the (s % steps_per_epoch)-th batch of this rank's indices.

  torchrun recipe (the seed tutorial's, shared/seeds/000_*.txt: snapshot of MODEL_STATE and
  EPOCHS_RUN written by rank 0 with torch.save after every `save_every` epochs, loaded at start
  when the file exists; torchrun --max-restarts restarts the whole group):
    torchrun --standalone --nproc-per-node 3 --max-restarts 1 fault_train.py torchrun \
        --epochs 2 --snapshot /tmp/snap.pt --loss-log /tmp/loss.log
  One change to the tutorial: its snapshot stores EPOCHS_RUN = epoch (the epoch just finished)
  and resumes at range(EPOCHS_RUN, max_epochs), i.e. it trains the saved epoch a second time;
  here EPOCHS_RUN = epoch + 1 (--literal-tutorial keeps the tutorial's off-by-one).

  torchft (torchft.Manager + torchft.DistributedDataParallel + torchft.Optimizer on torchft's
  ProcessGroupGloo, one process per replica group as in torchft's train_ddp.py; the lighthouse
  and one torchrun per replica group are started by bench/fault/torchft_job.sh):
    REPLICA_GROUP_ID=i NUM_REPLICA_GROUPS=3 TORCHFT_LIGHTHOUSE=http://127.0.0.1:PORT \
        torchrun --standalone --nproc-per-node 1 --max-restarts 1 fault_train.py torchft \
        --total-steps 624 --loss-log /tmp/loss.log
  The step counter is torchft's (manager.current_step()); a replica that (re)joins is healed
  from a live peer by torchft (PGTransport, as in train_ddp.py). Rank 0 prints
  "attempts dropped: N" (steps whose optimizer step torchft did not commit) at the end.

  ddp_step (PyTorch's DistributedDataParallel on the `ddp` backend with ddp.StepManager under
  ddprun --recovery step: ddprun restarts the killed rank alone, the survivors drop the step,
  re-form and heal it from a live peer; docs/recovery.md):
    ddprun --standalone --nproc-per-node 3 --recovery step --max-restarts 1 .venv/bin/python \
        fault_train.py ddp_step --total-steps 624 --loss-log /tmp/loss.log
  With --backend gloo the same on PyTorch's own gloo (StepManager makes each membership
  generation's gloo group).
"""
import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ddp"))
from bench_ddp import BATCH, Cnn, load_data  # noqa: E402


class StepData:
    """The batch of any global step for one data-parallel rank out of `world`."""

    def __init__(self, images, labels, world, rank):
        self.images, self.labels = images, labels
        self.sampler = DistributedSampler(range(images.shape[0]), num_replicas=world, rank=rank,
                                          shuffle=True, seed=0)
        self.steps_per_epoch = self.sampler.num_samples // BATCH
        self._epoch, self._indices = None, None

    def batch(self, step):
        epoch = step // self.steps_per_epoch + 1
        if epoch != self._epoch:
            self.sampler.set_epoch(epoch)
            self._indices = torch.tensor(list(iter(self.sampler)), dtype=torch.int64)
            self._epoch = epoch
        first = (step % self.steps_per_epoch) * BATCH
        idx = self._indices[first:first + BATCH]
        return self.images.index_select(0, idx), self.labels.index_select(0, idx)


def open_log(path, enabled):
    return open(path, "a", buffering=1) if enabled and path else None


def log_step(log, step, loss):
    """One committed step in the loss log: "<step> <loss> <CPU seconds of this process>" (the
    CPU time lets bench/fault/overhead.sh compare CPU per step, steadier than wall time on an
    oversubscribed machine)."""
    log.write(f"{step} {loss.item()!r} {time.process_time()!r}\n")


class Trainer:
    """The seed tutorial's Trainer (snapshot recipe), with the data position from the step."""

    def __init__(self, model, data, optimizer, save_every, snapshot_path, literal, loss_log):
        self.rank = dist.get_rank()
        self.model, self.data, self.optimizer = model, data, optimizer
        self.save_every, self.snapshot_path, self.literal = save_every, snapshot_path, literal
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            print("Loading snapshot", flush=True)
            self._load_snapshot(snapshot_path)
        self.model = torch.nn.parallel.DistributedDataParallel(self.model)
        self.log = open_log(loss_log, self.rank == 0)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.nll_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        spe = self.data.steps_per_epoch
        for b in range(spe):
            step = epoch * spe + b
            loss = self._run_batch(*self.data.batch(step))
            if self.log:
                log_step(self.log, step + 1, loss)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(),
                    "EPOCHS_RUN": epoch if self.literal else epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def run_torchrun(args):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels, _ = load_data()
    torch.manual_seed(0)
    model = Cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, StepData(images, labels, world, rank), optimizer, args.save_every,
                      args.snapshot, args.literal_tutorial, args.loss_log)
    begin = time.perf_counter()
    trainer.train(args.epochs)
    if rank == 0:
        print(f"Training time = {time.perf_counter() - begin:.2f} s", flush=True)
    dist.destroy_process_group()


def run_torchft(args):
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    images, labels, _ = load_data()
    data = StepData(images, labels, groups, group)
    torch.manual_seed(0)
    model = Cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    # On network-namespace hosts (bench/fault/netns.sh) every node has the same host name and
    # torchrun --standalone's MASTER_ADDR is localhost: both would name this node to the
    # others by an address they cannot reach, so the replica advertises its node's address.
    node = os.environ.get("FAULT_NODE_ADDR")
    where = {"hostname": node, "store_addr": node} if node else {}
    manager = Manager(pg=pg, **where, min_replica_size=args.min_replicas, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"fault_{group}",
                      timeout=timedelta(seconds=30),
                      checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10),
                                                       device=torch.device("cpu")))
    ddp_wrapper = DistributedDataParallel
    if args.fix_comm_hook:
        # torchft 0.2.0's DistributedDataParallel._comm_hook asserts `fut._fut` after
        # work.wait(); when the all-reduce fails (a peer died in it) wait() only reports the
        # error to the manager and returns False, _fut stays None and the AssertionError kills
        # the surviving replica. This variant hands DDP the (unreduced) bucket instead: the
        # manager already knows of the error, so should_commit() is False and the step is
        # dropped, which is what torchft intends.
        class FixedHookDDP(DistributedDataParallel):
            @staticmethod
            def _comm_hook(state, bucket):
                work = state.allreduce(bucket.buffer())
                work.wait()
                # After a failure get_future() is not even a _ManagedFuture (0.2.0).
                fut = getattr(work.get_future(), "_fut", None)
                if fut is None:
                    fut = torch.futures.Future()
                    fut.set_result(bucket.buffer())
                return fut

        ddp_wrapper = FixedHookDDP
    ddp_model = ddp_wrapper(manager, model)
    ft_optimizer = Optimizer(manager, optimizer)
    log = open_log(args.loss_log, group == 0)
    dropped = 0
    begin = time.perf_counter()
    while manager.current_step() < args.total_steps:
        step = manager.current_step()
        source, targets = data.batch(step)
        ft_optimizer.zero_grad()  # starts the quorum
        loss = F.nll_loss(ddp_model(source), targets)
        loss.backward()
        ft_optimizer.step()  # commits only if every participant's all-reduce succeeded
        if manager.current_step() > step:
            if log:
                log_step(log, manager.current_step(), loss)
        else:
            dropped += 1
    if group == 0:
        print(f"Training time = {time.perf_counter() - begin:.2f} s | attempts dropped: "
              f"{dropped}", flush=True)
    manager.shutdown(wait=False)


def run_ddp_step(args):
    import ddp
    from torch.nn.parallel import DistributedDataParallel

    # env:// gives the store ddprun hosts (import ddp); --backend gloo: PyTorch's own gloo, a
    # group of StepManager's per membership generation (python/ddp/torch_generations.py).
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels, _ = load_data()
    data = StepData(images, labels, world, rank)
    torch.manual_seed(0)
    model = DistributedDataParallel(Cnn(), init_sync=False)  # StepManager syncs instead
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = ddp.StepManager(model, optimizer)  # a restarted rank gets a live peer's state here
    log = open_log(args.loss_log, rank == 0)

    def forward():
        # The batch of the step being run (a redo after healing may run a later step).
        source, targets = data.batch(steps.step)
        return F.nll_loss(model(source), targets)

    begin = time.perf_counter()
    while steps.step < args.total_steps:
        loss = steps.run_step(forward)
        if log:
            log_step(log, steps.step, loss)
    if rank == 0:
        print(f"Training time = {time.perf_counter() - begin:.2f} s | attempts dropped: "
              f"{steps.dropped}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("recipe", choices=["torchrun", "torchft", "ddp_step"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--save-every", type=int, default=1)
    p.add_argument("--snapshot", default="snapshot.pt")
    p.add_argument("--literal-tutorial", action="store_true")
    p.add_argument("--total-steps", type=int, default=624)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--loss-log", default="")
    p.add_argument("--backend", default="ddp", choices=["ddp", "gloo"],
                   help="ddp_step: the default group's backend (PyTorch's gloo or ddp's)")
    p.add_argument("--fix-comm-hook", action="store_true",
                   help="torchft: work around torchft 0.2.0's comm-hook assertion (see above)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.recipe == "torchrun":
        run_torchrun(args)
    elif args.recipe == "ddp_step":
        run_ddp_step(args)
    else:
        run_torchft(args)


if __name__ == "__main__":
    main()
