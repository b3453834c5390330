"""horovodrun for ddp: Horovod's launcher flags, ddprun (or mpirun) underneath.

    horovodrun -np 4 python train.py                       # this host: ddprun --standalone
    horovodrun -np 8 -H a:4,b:4 python train.py            # one ddprun per host, over ssh
    horovodrun -np 8 --hostfile hosts --mpi python train.py  # mpirun
    horovodrun -cb                                          # what this layer offers

The workers get ddp's Horovod layer on their PYTHONPATH (python -m ddp.horovod), so
`import horovod.torch as hvd` scripts run unmodified. Horovod's tuning flags are accepted and
exported as their HOROVOD_* variables; --fusion-threshold-mb and --gloo-timeout-seconds take
effect, the others have no counterpart and are reported with --verbose. Exit status: the
workers' (ddprun's or mpirun's); 2 for a usage error. HOROVODRUN_SSH replaces `ssh` for the
multi-host gloo mode (a wrapper for `kubectl exec`, a container runtime, or a test).
"""

import argparse
import os
import shlex
import shutil
import socket
import sys

from . import horovod as _layer

_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}

# Horovod's tuning flags: flag -> (HOROVOD_* variable, what ddp does with it).
_TUNABLES = {
    "fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", "bucket size of DistributedOptimizer"),
    "gloo_timeout_seconds": ("HOROVOD_DDP_TIMEOUT_S", "timeout of every collective"),
    "cycle_time_ms": ("HOROVOD_CYCLE_TIME", None),
    "cache_capacity": ("HOROVOD_CACHE_CAPACITY", None),
    "hierarchical_allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", None),
    "hierarchical_allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", None),
    "autotune": ("HOROVOD_AUTOTUNE", None),
    "timeline_filename": ("HOROVOD_TIMELINE", None),
    "log_level": ("HOROVOD_LOG_LEVEL", None),
    "num_nccl_streams": ("HOROVOD_NUM_NCCL_STREAMS", None),
    "thread_affinity": ("HOROVOD_THREAD_AFFINITY", None),
    "stall_check_warning_time_seconds": ("HOROVOD_STALL_CHECK_TIME_SECONDS", None),
    "stall_check_shutdown_time_seconds": ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", None),
}


class UsageError(Exception):
    pass


def _parser():
    p = argparse.ArgumentParser(
        prog="horovodrun", description="Horovod's launcher on ddp (ddprun or mpirun).",
        allow_abbrev=False)
    p.add_argument("-v", "--version", action="store_true", help="print the version")
    p.add_argument("-np", "--num-proc", dest="num_proc", type=int, help="total processes")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show what this Horovod layer offers")
    p.add_argument("-H", "--hosts", help="host:slots,... (default localhost:np)")
    p.add_argument("-hostfile", "--hostfile", help="lines 'host slots=N' or 'host:N'")
    p.add_argument("--gloo", action="store_true", dest="use_gloo",
                   help="one ddprun per host (default)")
    p.add_argument("--mpi", action="store_true", dest="use_mpi", help="start through mpirun")
    p.add_argument("--jsrun", action="store_true", dest="use_jsrun")
    p.add_argument("-p", "--ssh-port", type=int)
    p.add_argument("-i", "--ssh-identity-file")
    p.add_argument("--start-timeout", type=int, help="seconds for the workers to meet")
    p.add_argument("--network-interfaces", "--network-interface", dest="nics",
                   help="NICs for the data path (comma-separated)")
    p.add_argument("--output-filename", help="keep the workers' logs in this folder")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--disable-cache", action="store_true")
    p.add_argument("--config-file")
    p.add_argument("--mpi-args", help="extra arguments for mpirun")
    p.add_argument("--tcp", action="store_true", dest="tcp_flag")
    p.add_argument("--binding-args")
    p.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int)
    p.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int)
    p.add_argument("--slots-per-host", dest="slots", type=int)
    p.add_argument("--elastic-timeout", type=int)
    p.add_argument("--reset-limit", type=int, help="restarts after a failure (elastic)")
    p.add_argument("--blacklist-cooldown-range", type=int, nargs=2)
    p.add_argument("--host-discovery-script")
    p.add_argument("--fusion-threshold-mb", type=int)
    p.add_argument("--gloo-timeout-seconds", type=int)
    p.add_argument("--cycle-time-ms", type=float)
    p.add_argument("--cache-capacity", type=int)
    p.add_argument("--hierarchical-allreduce", action="store_const", const=1)
    p.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce",
                   action="store_const", const=0)
    p.add_argument("--hierarchical-allgather", action="store_const", const=1)
    p.add_argument("--no-hierarchical-allgather", dest="hierarchical_allgather",
                   action="store_const", const=0)
    p.add_argument("--autotune", action="store_const", const=1)
    p.add_argument("--no-autotune", dest="autotune", action="store_const", const=0)
    p.add_argument("--timeline-filename")
    p.add_argument("--log-level")
    p.add_argument("--num-nccl-streams", type=int)
    p.add_argument("--thread-affinity", type=int)
    p.add_argument("--stall-check-warning-time-seconds", type=int)
    p.add_argument("--stall-check-shutdown-time-seconds", type=int)
    p.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command")
    return p


def _parse_hosts(text):
    """'a:2,b:4' -> [('a', 2), ('b', 4)]; a host without slots has 1."""
    hosts = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, slots = item.partition(":")
        try:
            hosts.append((name, int(slots) if slots else 1))
        except ValueError:
            raise UsageError(f"-H: {item!r} is not host or host:slots") from None
    if not hosts:
        raise UsageError("-H: no hosts given")
    return hosts


def _read_hostfile(path):
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise UsageError(f"--hostfile {path}: {e.strerror}") from None
    hosts = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if "slots=" in line:
            try:
                slots = int(line.split("slots=", 1)[1].split()[0])
            except ValueError:
                raise UsageError(f"--hostfile {path}:{n}: bad slots in {line!r}") from None
            hosts.append((parts[0], slots))
        else:
            hosts += _parse_hosts(parts[0])
    if not hosts:
        raise UsageError(f"--hostfile {path}: no hosts")
    return hosts


def _placement(hosts, np_):
    """How many processes each host runs: hosts filled in order, as Horovod does."""
    if sum(s for _, s in hosts) < np_:
        raise UsageError(f"-np {np_} needs {np_} slots but the hosts have "
                         f"{sum(s for _, s in hosts)} ({', '.join(f'{h}:{s}' for h, s in hosts)})")
    out, left = [], np_
    for h, s in hosts:
        if left == 0:
            break
        out.append((h, min(s, left)))
        left -= out[-1][1]
    return out


def _is_local(host):
    return host in _LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn())


def _free_port():
    """The job's store port: MASTER_PORT when the caller exported one (a port it reserved, as
    for torchrun's --master-port), else a free one found by binding port 0 whose next port is
    free too (ddprun's static rendezvous serves its store on --master-port + 1)."""
    chosen = os.environ.get("MASTER_PORT", "")
    if chosen:
        if not chosen.isdigit() or not 0 < int(chosen) < 65535:
            raise UsageError(f"MASTER_PORT={chosen!r} is not a port number: export a port in "
                             "1-65534, or unset it and horovodrun picks a free one")
        return int(chosen)
    for _ in range(100):
        with socket.socket() as s, socket.socket() as after:
            s.bind(("", 0))
            port = s.getsockname()[1]
            if port >= 65535:
                continue
            try:
                after.bind(("", port + 1))
            except OSError:
                continue
            return port
    raise UsageError("no two consecutive free ports found for the job's stores: export "
                     "MASTER_PORT (a free port whose next port is free too)")


def _tool(name, env_var):
    path = os.environ.get(env_var) or shutil.which(name)
    if not path:
        raise UsageError(f"{name} not found: put it on PATH (pip install ddp installs ddprun) "
                         f"or set {env_var}")
    return path


def _worker_env(args):
    env = {"PYTHONPATH": _layer.pythonpath()}
    ignored = []
    for flag, (var, effect) in _TUNABLES.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if flag == "fusion_threshold_mb":
            value = value * 1024 * 1024
        env[var] = str(value)
        if effect is None:
            ignored.append("--" + flag.replace("_", "-"))
    if args.nics:
        env["GLOO_SOCKET_IFNAME"] = env["DDP_GLOO_IFNAME"] = args.nics.split(",")[0]
    if args.start_timeout:
        env.setdefault("HOROVOD_DDP_TIMEOUT_S", str(args.start_timeout))
    return env, ignored


def _ddprun_flags(args, nproc):
    flags = ["--nproc-per-node", str(nproc)]
    restarts = args.reset_limit
    if restarts is None and (args.min_num_proc or args.max_num_proc):
        restarts = 3  # elastic without a limit: a few restarts, not forever
    if restarts:
        flags += ["--max-restarts", str(restarts)]
    if args.output_filename:
        flags += ["--log-dir", args.output_filename, "--tee", "3"]
    return flags


def build_commands(args):
    """[(argv, env)]: one local command, or one ssh command per host."""
    if args.use_jsrun:
        raise UsageError("--jsrun is not supported: use --mpi or the default (ddprun)")
    if args.host_discovery_script:
        raise UsageError("--host-discovery-script is not supported: start ddprun with --nnodes "
                         "MIN:MAX on each host instead (docs/rendezvous.md)")
    if args.use_gloo and args.use_mpi:
        raise UsageError("--gloo and --mpi exclude each other")
    if not args.num_proc or args.num_proc < 1:
        raise UsageError("-np N (N >= 1) is required")
    if not args.command:
        raise UsageError("no training command given (horovodrun -np 2 python train.py)")
    if args.hosts and args.hostfile:
        raise UsageError("-H and --hostfile exclude each other")
    hosts = (_parse_hosts(args.hosts) if args.hosts else
             _read_hostfile(args.hostfile) if args.hostfile else [("localhost", args.num_proc)])
    if args.slots:
        hosts = [(h, args.slots) for h, _ in hosts]
    placement = _placement(hosts, args.num_proc)
    env, ignored = _worker_env(args)
    if ignored and args.verbose:
        print(f"horovodrun: {', '.join(ignored)}: exported, no counterpart in ddp",
              file=sys.stderr)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.use_mpi:
        return [(_mpirun_argv(args, placement, env, command), env)]
    if len(placement) == 1 and _is_local(placement[0][0]):
        argv = [_tool("ddprun", "DDPRUN"), "--standalone"] + _ddprun_flags(args, args.num_proc)
        return [(argv + command, env)]
    counts = {n for _, n in placement}
    if len(counts) != 1:
        raise UsageError("the gloo mode runs the same number of processes on every host; got "
                         f"{', '.join(f'{h}:{n}' for h, n in placement)}: change -np or the "
                         "slots, or use --mpi")
    master, port = placement[0][0], _free_port()
    run_id = f"horovodrun-{os.getpid()}-{port}"
    ddprun = os.environ.get("DDPRUN") or shutil.which("ddprun") or "ddprun"
    ssh = shlex.split(os.environ.get("HOROVODRUN_SSH", "ssh -o BatchMode=yes"))
    if args.ssh_port:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        ssh += ["-i", args.ssh_identity_file]
    out = []
    for node_rank, (host, n) in enumerate(placement):
        remote = (["cd", os.getcwd(), "&&", "env"] + [f"{k}={v}" for k, v in env.items()] +
                  [ddprun, "--nnodes", str(len(placement)), "--node-rank", str(node_rank),
                   "--master-addr", master, "--master-port", str(port), "--run-id", run_id] +
                  _ddprun_flags(args, n) + command)
        out.append((ssh + [host, " ".join(shlex.quote(x) if x != "&&" else x
                                          for x in remote)], env))
    return out


def _mpirun_argv(args, placement, env, command):
    mpirun = _tool("mpirun", "MPIRUN")
    local = len(placement) == 1 and _is_local(placement[0][0])
    env["MASTER_ADDR"] = "127.0.0.1" if local else placement[0][0]
    env["MASTER_PORT"] = str(_free_port())
    argv = [mpirun, "-np", str(args.num_proc), "--bind-to", "none", "--oversubscribe"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if not local:
        argv += ["-H", ",".join(f"{h}:{n}" for h, n in placement)]
    for k in sorted(env):
        argv += ["-x", k]
    if args.mpi_args:
        argv += shlex.split(args.mpi_args)
    return argv + command


def check_build():
    import torch.distributed as dist

    mark = lambda ok: "X" if ok else " "  # noqa: E731
    has_mpirun = shutil.which("mpirun") is not None
    print(f"""Horovod v{_version()} (ddp's Horovod API layer, {_layer.path()[0]}):

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [{mark(has_mpirun)}] MPI
    [X] Gloo

Available Tensor Operations:
    [{mark(dist.is_nccl_available())}] NCCL
    [ ] DDL
    [ ] CCL
    [ ] MPI
    [X] Gloo""")


def _version():
    sys.path.insert(0, _layer.path()[0])
    try:
        import horovod

        return horovod.__version__
    finally:
        sys.path.pop(0)


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.version:
        print(_version())
        return 0
    if args.check_build:
        try:
            check_build()
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader stopped early (`horovodrun -cb | grep -q ...`): not this program's error,
            # and no traceback; stdout goes to /dev/null so the exit's flush cannot fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    try:
        commands = build_commands(args)
    except UsageError as e:
        print(f"horovodrun: {e}", file=sys.stderr)
        return 2
    if args.verbose:
        for argv_, env in commands:
            print("horovodrun: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) +
                  " " + " ".join(shlex.quote(a) for a in argv_), file=sys.stderr)
    if len(commands) == 1:
        argv_, env = commands[0]
        os.environ.update(env)
        os.execvp(argv_[0], argv_)
    return _run_all(commands)


def _run_all(commands):
    """One ssh per host; the first failure's status, after every host has ended."""
    import subprocess

    procs = [subprocess.Popen(a) for a, _ in commands]
    status = 0
    for p in procs:
        rc = p.wait()
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())
