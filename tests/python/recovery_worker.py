"""The Python twin of tests/torch/recovery/recovery_worker.cpp: PyTorch's DDP on the ddp backend
(DDP_TEST_BACKEND=gloo: on PyTorch's gloo) under ddprun --recovery step, trained with
ddp.StepManager (a small MLP with dropout, Adam, synthetic data that is a pure function of the
step, augmented with draws from Python's and NumPy's global generators), with the same fault
injection and the same outputs, so tests/torch/recovery/recovery_test.py checks both.

  recovery_worker.py --steps N --out DIR

The global batch is the launch world's (one share of 32 a launch rank); after a lost node the
live ranks split it (StepManager.rank and world_size: torch.distributed's rank and world size stay
the launch's). DDP_TEST_DROPOUT=P sets the dropout (default 0.2); DDP_TEST_OPTIMIZER=sgd: SGD
with momentum instead of Adam; DDP_TEST_STEP_SLEEP_MS=T: sleep T ms after each committed step.
DDP_TEST_DEVICE=D (default cpu; e.g. cuda:0, which all ranks may share): the model lives on D
(DDP with device_ids=[D's index]); each batch is built on the CPU as always, then moved to D and
augmented there, so dropout draws from D's generator (ddp.StepManager rewinds and heals the
current CUDA device's generator too). The parameters are written from a CPU copy.

DDP_TEST_KILL_AT_STEP=S, DDP_TEST_KILL_RANK=R, DDP_TEST_KILL_PHASE=forward|backward|between:
rank R of the first incarnation SIGKILLs itself at step S (lists: several failures);
DDP_TEST_KILL_IN_HEAL=1: the first replacement dies after joining, before it is healed.
DDP_TEST_KILL_SILENT=1: a rank about to die at step S first forks a child that keeps its
sockets open until a survivor committed step S + 2 (at most 120 s): its peers' connections do
not close, as with a lost host's, so only ddprun's notice can end their collective in flight.
DDP_TEST_KILL_NODE_AT_STEP=S: after step S the worker SIGKILLs its agent (its node's other
workers die with it) and itself. DDP_TEST_SUBGROUP=1: the first and the last launch rank also
all-reduce the step number over a group of their own (dist.new_group) at the start of every
forward, which must give twice the step: the group must end its collective at ddprun's notice
when a member dies, and follow the default group into each new generation (a replacement makes
it again). With it, when a rank outside the pair is killed in a forward or backward, the pair
also probes operations deferred across the re-form (probe_deferred_across_reform): they must
fail with PeerLostError, not run in the new generation; the rank to be killed waits until the
pair set the probe up, and each member writes how many it checked ("subgroup_probe" in its
JSON). DDP_TEST_QUICK_EXIT=1: after its outputs the worker ends with
os._exit(0), without destroying its process group (ddprun's agent records its finish).
--recovery shrink: DDP_TEST_REJOIN_AFTER_SHRUNK=1: a replacement, after its DDP and before its
ddp.StepManager (which claims its slot back), writes DIR/rank<R>.built and waits until another
rank committed a step without it (at a world size below the launch's), failing after 60 s (the
others waited for it); a rank that committed a step without the others waits for a .built file
before its next step (at most 120 s), so the replacement is between its DDP and its
StepManager while it commits. DDP_TEST_AWAIT_RETURN_AT_STEP=S: a rank that committed step S at
a world size below the launch's waits until the replacement claimed its slot back (at most
120 s), so it is back before the job's last step whatever the load.
Writes DIR/rank<R>.params (every parameter's bytes, in order), DIR/rank<R>.json and appends
"<pid> <step> <world size>" to DIR/rank<R>.commits per committed step; R is the launch rank."""
import argparse
import json
import os
import random
import signal
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp


class Net(torch.nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.dropout = dropout
        self.fc1 = torch.nn.Linear(16, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.nn.functional.dropout(h, self.dropout, self.training)
        return self.fc3(torch.relu(self.fc2(h)))


def share_of(step, share):
    """Launch rank `share`'s part of step `step`'s global batch: the same in every process."""
    g = torch.Generator().manual_seed(step * 1000 + share)
    return torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)


def batch_for(step, rank, world, launch_world):
    """Rank `rank` of `world` takes the shares s with s % world == rank: after a lost node the
    survivors also train on the lost ranks' shares, so a step averages the same samples."""
    parts = [share_of(step, share) for share in range(rank, launch_world, world)]
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def keep_sockets_open(commits_path, step):
    """Forks a child that holds this process's descriptors (its group's sockets) until
    `commits_path` (a survivor's) records step `step` (they went on without this rank) or 120 s
    passed, with its standard streams on /dev/null (ddprun's output pipes must not wait for it).
    """
    if os.fork() != 0:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with open(commits_path) as f:
                if any(int(line.split()[1]) >= step for line in f if line.strip()):
                    break
        except OSError:
            pass
        time.sleep(0.1)
    os._exit(0)


def shrunk_commits(out, slot, world):
    """How many steps the other slots committed at a world size below `world`."""
    count = 0
    for r in range(world):
        path = os.path.join(out, f"rank{r}.commits")
        if r == slot or not os.path.exists(path):
            continue
        with open(path) as f:
            count += sum(1 for line in f if line.strip() and int(line.split()[2]) < world)
    return count


def wait_until(condition, seconds, failure):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            raise RuntimeError(failure)
        time.sleep(0.01)


def probe_deferred_across_reform(pair, ends, slot, steps, out):
    """Sets up, on the pair's two members, operations the group's completer issues only after
    the job re-formed: a future callback on the completer holds it until the default group's
    generation grew, and the operations called meanwhile are deferred behind it (the ddp
    backend's issue order). They belong to the generation they were called in, so each must
    fail with PeerLostError once issued, as on every rank, instead of running in the new
    generation (out of step with the ranks that failed it, after a drain that waited for
    itself). Tensors of 128 KiB: above DDP_CPU_INLINE_BYTES, so the group's worker thread runs
    them, not the caller. Returns the works to check after the step was redone."""
    generation = steps.generation

    def hold(_fut):  # on the pair's completer thread
        wait_until(lambda: steps.generation > generation, 120,
                   "subgroup probe: the job did not re-form within 120 s of the probe")

    def attached(s):
        return os.path.join(out, f"probe{s}.attached")

    def big():
        return torch.ones(32768)

    first, last = ends
    checked = []
    if slot == first:
        # Completes only once `last` issued its own (it waits for this file): its callback
        # runs on the completer, which it holds.
        dist.all_reduce(big(), group=pair, async_op=True).get_future().then(hold)
        open(attached(first), "w").close()
        checked.append(dist.all_reduce(big(), group=pair, async_op=True))  # deferred
    else:
        wait_until(lambda: os.path.exists(attached(first)), 120,
                   "subgroup probe: the pair's first member did not set up its probe")
        dist.all_reduce(big(), group=pair, async_op=True)  # the first one's match
        # Never matched in this generation (the first member's is deferred): it fails at the
        # notice, and its callback then holds this member's completer.
        dist.all_reduce(big(), group=pair, async_op=True).get_future().then(hold)
        open(attached(last), "w").close()
    checked.append(dist.all_reduce(big(), group=pair, async_op=True))  # deferred
    return checked


def check_probe(works):
    for w in works:
        try:
            w.wait()
        except Exception as e:  # noqa: BLE001 - the message says which failure it is
            if "issued after the job re-formed" not in str(e):
                raise AssertionError(f"subgroup probe: a deferred operation failed otherwise: "
                                     f"{e}") from e
        else:
            raise AssertionError("subgroup probe: an operation called before the re-form ran "
                                 "in the new generation")
    return len(works)


def ints(text):
    return [int(v) for v in text.split(",")] if text else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    dist.init_process_group(os.environ.get("DDP_TEST_BACKEND", "ddp"))
    torch.set_num_threads(1)
    slot = dist.get_rank()  # the launch rank: names the files and the kill orders
    pair = None
    if os.environ.get("DDP_TEST_SUBGROUP") == "1":
        ends = [0, dist.get_world_size() - 1]
        pair = dist.new_group(ends)  # every rank calls it; only the two are members
        if slot not in ends:
            pair = None
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    device = torch.device(os.environ.get("DDP_TEST_DEVICE", "cpu"))
    device_ids = None
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        # As PyTorch programs do: torch.cuda's generator calls (StepManager's rewind and heal)
        # take the current device's, which must be the model's.
        torch.cuda.set_device(device)
        device_ids = [device.index]
    # Initialized on the CPU (the same values whatever the device), then moved before wrapping.
    net = Net(float(os.environ.get("DDP_TEST_DROPOUT", "0.2"))).to(device)
    model = DDP(net, device_ids=device_ids, init_sync=False)
    if os.environ.get("DDP_TEST_OPTIMIZER", "adam") == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    restart_count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("DDP_TEST_KILL_IN_HEAL") == "1" and restart_count == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    rejoin_after_shrunk = os.environ.get("DDP_TEST_REJOIN_AFTER_SHRUNK") == "1"
    if rejoin_after_shrunk and restart_count != "0":
        seen = shrunk_commits(args.out, slot, dist.get_world_size())
        open(os.path.join(args.out, f"rank{slot}.built"), "w").close()
        wait_until(lambda: shrunk_commits(args.out, slot, dist.get_world_size()) > seen, 60,
                   "DDP_TEST_REJOIN_AFTER_SHRUNK: for 60 s after this replacement built its DDP "
                   "no other rank committed a step without it: they waited for it before its "
                   "StepManager")
    steps = ddp.StepManager(model, opt)

    kill_steps = ints(os.environ.get("DDP_TEST_KILL_AT_STEP", ""))
    kill_ranks = ints(os.environ.get("DDP_TEST_KILL_RANK", ""))
    kill_phase = os.environ.get("DDP_TEST_KILL_PHASE", "backward")
    # The step at which the pair probes operations deferred across the re-form: the first
    # kill of a rank outside it, in a forward or backward (every process of the launch agrees).
    probe_step = None
    if (os.environ.get("DDP_TEST_SUBGROUP") == "1" and restart_count == "0"
            and kill_phase in ("forward", "backward")):
        ends = [0, dist.get_world_size() - 1]
        probe_step = next((s for s, r in zip(kill_steps, kill_ranks) if r not in ends), None)
    probe_works = []
    probed = 0

    def maybe_die(phase):
        if restart_count != "0" or phase != kill_phase:
            return
        for s, r in zip(kill_steps, kill_ranks):
            if slot == r and steps.step == s:
                if s == probe_step:  # the pair must be set up before the job re-forms
                    ends = [0, dist.get_world_size() - 1]
                    wait_until(lambda: all(os.path.exists(os.path.join(args.out,
                                                                       f"probe{e}.attached"))
                                           for e in ends), 120,
                               "subgroup probe: the pair did not set up its probe in 120 s")
                if os.environ.get("DDP_TEST_KILL_SILENT") == "1":
                    survivor = 0 if slot != 0 else 1
                    keep_sockets_open(os.path.join(args.out, f"rank{survivor}.commits"), s + 2)
                os.kill(os.getpid(), signal.SIGKILL)

    def forward():
        maybe_die("forward")
        if pair is not None:
            check = torch.tensor([float(steps.step)])
            dist.all_reduce(check, group=pair)
            if check.item() != 2.0 * steps.step:
                raise AssertionError(f"the subgroup's all_reduce gave {check.item()} at step "
                                     f"{steps.step}, not {2.0 * steps.step}")
            if steps.step == probe_step and not probe_works and probed == 0:
                probe_works.extend(probe_deferred_across_reform(pair, [0, dist.get_world_size() - 1],
                                                                slot, steps, args.out))
        # The step being run (a redo may run a later one), split over the current ranks.
        x, y = batch_for(steps.step, steps.rank, steps.world_size,
                         max(steps.launch_world_size, steps.world_size))
        x, y = x.to(device), y.to(device)
        # Augmentation from Python's and NumPy's global generators (seeded alike on every
        # rank): a redo must draw what the dropped attempt drew, and a replacement must go on
        # from its peers' states, or the parameters differ from a run without the failure.
        x = x * (1.0 + 0.1 * random.random()) + torch.from_numpy(
            np.random.normal(0.0, 0.1, size=16).astype(np.float32)).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        maybe_die("backward")
        return loss

    kill_node_at = int(os.environ.get("DDP_TEST_KILL_NODE_AT_STEP", "-1"))
    await_return_at = int(os.environ.get("DDP_TEST_AWAIT_RETURN_AT_STEP", "-1"))
    step_sleep = int(os.environ.get("DDP_TEST_STEP_SLEEP_MS", "0")) / 1000.0
    commits = open(os.path.join(args.out, f"rank{slot}.commits"), "a")
    while steps.step < args.steps:
        steps.run_step(forward)
        if probe_works:
            probed = check_probe(probe_works)
            probe_works.clear()
        commits.write(f"{os.getpid()} {steps.step} {steps.world_size}\n")
        commits.flush()
        maybe_die("between")
        if rejoin_after_shrunk and steps.world_size < steps.launch_world_size:
            wait_until(lambda: any(name.endswith(".built") for name in os.listdir(args.out)), 120,
                       "DDP_TEST_REJOIN_AFTER_SHRUNK: no replacement built its DDP within 120 s")
        if steps.step == await_return_at and steps.world_size < steps.launch_world_size:
            wait_until(steps._groups.stale, 120,
                       "DDP_TEST_AWAIT_RETURN_AT_STEP: the replacement did not claim its slot "
                       "back within 120 s")
        if step_sleep:
            time.sleep(step_sleep)
        if steps.step == kill_node_at:  # the whole node: the agent, then this worker
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    # StepManager lays DDP's buckets out in reverse parameter order, on every rank and after
    # every heal (python/src/bucket_order.cpp): the last layers' all-reduce overlaps the first
    # layers' backward. DDP logs its rebuilt layout as "i j k, l m" (buckets, comma-separated).
    layout = model._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices", "")
    indices = [int(i) for i in layout.replace(",", " ").split()]
    parameter_count = len(list(model.parameters()))
    if indices != list(reversed(range(parameter_count))):
        raise AssertionError(f"DDP's buckets are {layout!r}, not in reverse parameter order "
                             f"({parameter_count} parameters)")
    with open(os.path.join(args.out, f"rank{slot}.params"), "wb") as f:
        for p in model.parameters():
            f.write(p.detach().cpu().contiguous().numpy().tobytes())
    with open(os.path.join(args.out, f"rank{slot}.json"), "w") as f:
        json.dump({"rank": steps.rank, "slot": slot, "world_size": steps.world_size,
                   "step": steps.step, "dropped": steps.dropped,
                   "recoveries": steps.recoveries, "generation": steps.generation,
                   "subgroup_probe": probed,
                   "restart_count": int(restart_count)}, f)
    if os.environ.get("DDP_TEST_QUICK_EXIT") == "1":
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
