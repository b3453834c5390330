"""A warm spare: the Python interpreter that ddprun keeps ready under ``--recovery step`` and
``--recovery shrink`` so that a rank restarted in place does not pay for a new interpreter.

ddprun starts ``PYTHON -u -m ddp.warm_spare`` beside the workers (one per node, with the
job's environment but no rank of its own) when they run a Python program. The spare imports
what every ddp.StepManager program imports and what costs most of a Python worker's start
(torch, torch.distributed, PyTorch's DistributedDataParallel and the torch._dynamo it loads,
ddp), then waits on a socket ddprun passed it (``DDP_WARM_SPARE_FD``). When a worker fails and
ddprun restarts its rank in place, it sends the spare that rank's command line, environment
and CPUs instead of starting a new process, and the spare becomes the rank: it takes the
environment, argv and CPUs, and runs the program as Python would have (a script with
``runpy.run_path`` and its folder first on sys.path; ``-m`` with ``runpy.run_module``; ``-c``).
Its pid, output pipes and process group are the rank's from then on.

The message (src/launcher/warm_spare.cpp writes it; docs/recovery.md, "The warm spare"):
NUL-terminated fields, all bytes::

    ddp-warm-spare-1 \\0 <n> \\0 argv[0..n) \\0... <m> \\0 env "K=V" [0..m) \\0... <k> \\0 cpu [0..k) \\0...

then end of file. End of file with no message: the job is over (exit 0, nothing printed). The
spare writes one byte, ``R``, once its imports are done.

ddprun starts the spare in the idle scheduling class where the spare can leave it again (root,
CAP_SYS_NICE, or RLIMIT_NICE >= 20): its imports take only CPU nobody else wants. Two moves back
to the normal class, for two cases: ddprun moves a spare it takes before the "ready" byte (its
imports would otherwise go on at idle priority before it could read its orders), and the spare
moves every thread of its own once it has read them (a spare taken when ready, and any thread
started since ddprun's move). Elsewhere it imports at normal priority.
"""

import os
import runpy
import sys

_MAGIC = b"ddp-warm-spare-1"
_FD_VAR = "DDP_WARM_SPARE_FD"
_READY = b"R"


def _leave_idle_class():
    """Every thread of this process back to the normal class: threads started by the imports
    were started in the idle class too, and would stay there."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:
            pass  # the thread ended meanwhile
        except OSError as e:
            print(f"ddp.warm_spare: cannot leave the idle scheduling class ({e}); this rank runs "
                  f"at idle priority", file=sys.stderr, flush=True)
            return


def _warm_up():
    """The imports a Python worker of ddp.StepManager spends its start on."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    try:
        # PyTorch's DistributedDataParallel imports it in its constructor (1 s and more).
        import torch._dynamo  # noqa: F401
    except Exception:  # a torch without it, or one that fails here: the program will say
        pass
    import ddp  # noqa: F401


def _read_all(fd):
    """Everything until ddprun closes its end. A close that finds our "ready" byte unread in its
    queue (it was written as ddprun took this spare) reaches us as ECONNRESET after the data
    instead of end of file: the same end (decode() checks the message is whole)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def decode(message):
    """(argv, env, cpus) of a message (bytes, bytes "K=V", ints); ValueError when malformed."""
    fields = message.split(b"\0")
    if len(fields) < 2 or fields[0] != _MAGIC or fields[-1] != b"":
        raise ValueError("not a ddprun warm spare message")
    fields.pop()
    pos = 1
    parts = []
    for _ in range(3):
        count = int(fields[pos])
        parts.append(fields[pos + 1:pos + 1 + count])
        if len(parts[-1]) != count:
            raise ValueError("truncated warm spare message")
        pos += 1 + count
    if pos != len(fields):
        raise ValueError("trailing fields in a warm spare message")
    argv, env, cpus = parts
    return argv, env, [int(c) for c in cpus]


def _become(env, cpus):
    os.environb.clear()
    for entry in env:
        key, sep, value = entry.partition(b"=")
        if sep and key:
            os.environb[key] = value
    if cpus:
        os.sched_setaffinity(0, cpus)
    # ddprun's --hang-timeout hook (its sitecustomize) starts its reporter for $RANK at
    # interpreter start; the spare had no rank then.
    hook = getattr(sys.modules.get("sitecustomize"), "_ddprun_start_progress", None)
    if hook is not None:
        hook()


def _set_path0(entry):
    """sys.path[0] as Python sets it for the program. ddprun starts the spare with
    PYTHONSAFEPATH=1 (Python >= 3.11), so the spare's own imports never came from the working
    directory: there the entry is added; an older Python put the working directory first (-m),
    which is replaced."""
    if getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, entry)
    else:
        sys.path[0] = entry


def _run(argv):
    """Runs the worker command `argv` (PYTHON -u SCRIPT|-m MODULE|-c CODE ARGS...) here."""
    args = [os.fsdecode(a) for a in argv[1:]]
    while args and args[0] == "-u":  # this interpreter runs unbuffered already (-u)
        args.pop(0)
    if not args:
        raise SystemExit("ddp.warm_spare: no program in the worker command")
    if args[0] == "-m":
        sys.argv = [args[1]] + args[2:]
        _set_path0(os.getcwd())
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c"] + args[2:]
        _set_path0("")
        main = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(args[1], "<string>", "exec"), main)
    else:
        sys.argv = args
        _set_path0(os.path.dirname(os.path.realpath(args[0])))
        runpy.run_path(args[0], run_name="__main__")


def main():
    if _FD_VAR not in os.environ:
        raise SystemExit(f"ddp.warm_spare is started by ddprun (--warm-spare), which passes "
                         f"{_FD_VAR}; it is not a program to run by hand")
    fd = int(os.environ.pop(_FD_VAR))
    _warm_up()
    try:
        os.write(fd, _READY)  # ddprun says whether the rank it hands over found this done
    except OSError:
        pass  # ddprun is gone: the read below sees the end
    message = _read_all(fd)
    os.close(fd)
    if not message:
        return 0  # ddprun needs no spare any more
    argv, env, cpus = decode(message)
    _leave_idle_class()
    _become(env, cpus)
    _run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
