"""ddprun's command line against torchrun's (issue 50): for every command line and PET_* set of
the table below, torchrun's own parser (torch.distributed.run.get_args_parser, from the
interpreter running this) is the oracle, and ddprun's parser (the parse_dump test program, the
same code as ddprun) must give the same meaning, or fail with a clear error where torchrun
fails. Then the flags are run for real: --numa-binding sets each worker's CPU affinity,
--virtual-local-rank its LOCAL_RANK and CUDA_VISIBLE_DEVICES, --run-path runs the script as
__main__, --duplicate-stdout-filters fills filtered_stdout.log, --event-log-handler console
prints the final event.

    python torchrun_parity_test.py PARSE_DUMP DDPRUN

Where ddprun departs from torchrun on purpose, the row says so (DEVIATIONS below, also in
docs/ddprun.md): the test checks ddprun's side of it.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

from torch.distributed.run import determine_local_world_size, get_args_parser

PARSE_DUMP, DDPRUN = sys.argv[1], sys.argv[2]

# (argv, env). Each row runs torchrun's parser and ddprun's with exactly this environment
# (no other PET_ variable), and compares the fields both decide.
SAME_MEANING = [
    (["train.py"], {}),
    (["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "h0",
      "--master-port", "29600", "train.py", "--lr", "0.1"], {}),
    (["--nproc_per_node=2", "--max_restarts=3", "--monitor_interval=0.5", "--role", "trainer",
      "train.py"], {}),
    (["--standalone", "--nproc-per-node", "2", "train.py"], {}),
    (["--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h0:29400",
      "--rdzv-id", "job7", "--rdzv-conf", "join_timeout=600,last_call_timeout=5", "train.py"], {}),
    (["-m", "pkg.train"], {}),
    (["--no-python", "./a.out", "x"], {}),
    (["--run-path", "/abs/train.py"], {}),
    (["--log-dir", "/tmp/logs", "--redirects", "3", "--tee", "0:1,1:2", "train.py"], {}),
    (["--local-ranks-filter", "0,2", "train.py"], {}),
    (["--duplicate-stdout-filters", "loss,,x,step", "--duplicate-stderr-filters", "Error",
      "train.py"], {}),
    (["--numa-binding", "node", "train.py"], {}),
    (["--numa-binding", "core-complex", "train.py"], {}),
    (["--virtual-local-rank", "train.py"], {}),
    (["--event-log-handler", "console", "train.py"], {}),
    (["--signals-to-handle", "SIGTERM,SIGUSR1", "--shutdown-timeout", "5", "train.py"], {}),
    (["--local-addr", "10.0.0.5", "train.py"], {}),
    # Every PET_ variable torchrun reads, as Kubernetes operators set them.
    (["train.py"], {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "3", "PET_NODE_RANK": "1",
                    "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456"}),
    (["train.py"], {"PET_NNODES": "1:3", "PET_RDZV_BACKEND": "c10d",
                    "PET_RDZV_ENDPOINT": "job-worker-0:29400", "PET_RDZV_ID": "job",
                    "PET_RDZV_CONF": "join_timeout=300", "PET_MAX_RESTARTS": "2"}),
    (["train.py"], {"PET_STANDALONE": "1", "PET_MONITOR_INTERVAL": "1", "PET_ROLE": "w",
                    "PET_MODULE": "0", "PET_NO_PYTHON": "0", "PET_RUN_PATH": "1",
                    "PET_LOG_DIR": "/l", "PET_REDIRECTS": "2", "PET_TEE": "1",
                    "PET_LOCAL_RANKS_FILTER": "1", "PET_DUPLICATE_STDOUT_FILTERS": "a,b",
                    "PET_DUPLICATE_STDERR_FILTERS": "c", "PET_LOCAL_ADDR": "10.1.1.1",
                    "PET_SIGNALS_TO_HANDLE": "SIGINT", "PET_SHUTDOWN_TIMEOUT": "7",
                    "PET_VIRTUAL_LOCAL_RANK": "1", "PET_EVENT_LOG_HANDLER": "console",
                    "PET_START_METHOD": "fork"}),
    # The flag wins over its variable; torchrun reads no variable for --numa-binding.
    (["--nproc-per-node", "2", "--standalone", "train.py"],
     {"PET_NPROC_PER_NODE": "5", "PET_STANDALONE": "0", "PET_NUMA_BINDING": "socket"}),
    (["--nproc-per-node", "cpu", "train.py"], {}),
    (["--nproc-per-node", "auto", "train.py"], {}),
]

# Both must refuse these (torchrun at parse time or when it builds its config).
BOTH_FAIL = [
    (["--nproc-per-node", "two", "train.py"], {}),
    (["--numa-binding", "nodes", "train.py"], {}),
    (["--max-restarts", "x", "train.py"], {}),
    (["--no-such-flag", "train.py"], {}),
    (["train.py"], {"PET_STANDALONE": "yes"}),
]
if not __import__("torch").cuda.is_available():
    # Both count GPUs: none here.
    BOTH_FAIL += [(["--nproc-per-node", "gpu", "train.py"], {}),
                  (["train.py"], {"PET_NPROC_PER_NODE": "gpu"})]

# Where ddprun departs on purpose: (argv, env, what ddprun must do).
DEVIATIONS = [
    # PyTorchJob sets PET_STANDALONE="" for standalone: true; torchrun dies on int("").
    (["train.py"], {"PET_STANDALONE": ""}, {"standalone": True}),
    # torchrun fails only at the end (its registry has null, console, dynamic_rendezvous) or
    # when it loads the plugin; ddprun refuses at once.
    (["--event-log-handler", "file", "train.py"], {}, "error"),
    (["--logs-specs", "mine", "train.py"], {}, "error"),
    # torchrun takes an empty PET_ value as the value ("" role, "" node count); ddprun as unset.
    (["train.py"], {"PET_ROLE": ""}, {"role": "default"}),
]


def torchrun_parse(argv, env):
    """torchrun's meaning of argv under env, normalized to parse_dump's fields, or an error."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k, v in saved.items() if not k.startswith("PET_")}, **env)
    try:
        devnull = open(os.devnull, "w")
        saved_err, sys.stderr = sys.stderr, devnull
        try:
            a = get_args_parser().parse_args(argv)
        finally:
            sys.stderr = saved_err
            devnull.close()
        nproc = determine_local_world_size(a.nproc_per_node)
        nnodes = a.nnodes if ":" in a.nnodes else f"{a.nnodes}:{a.nnodes}"
        out = {
            "nnodes": nnodes, "nproc_per_node": nproc, "rdzv_backend": a.rdzv_backend,
            "rdzv_endpoint": a.rdzv_endpoint, "rdzv_id": a.rdzv_id, "rdzv_conf": a.rdzv_conf,
            "standalone": a.standalone, "max_restarts": int(a.max_restarts),
            "monitor_interval": float(a.monitor_interval), "role": a.role,
            "module": a.module, "no_python": a.no_python, "run_path": a.run_path,
            "log_dir": a.log_dir, "redirects": str(a.redirects), "tee": str(a.tee),
            "local_ranks_filter": ([int(r) for r in a.local_ranks_filter.split(",")]
                                   if a.local_ranks_filter else None),
            "duplicate_stdout_filters": list(a.duplicate_stdout_filters),
            "duplicate_stderr_filters": list(a.duplicate_stderr_filters),
            "node_rank": int(a.node_rank), "master_addr": a.master_addr,
            "master_port": int(a.master_port) if a.master_port is not None else None,
            "local_addr": a.local_addr, "numa_binding": a.numa_binding,
            "signals_to_handle": [signal.Signals[s.strip()].value
                                  for s in a.signals_to_handle.split(",")],
            "shutdown_timeout": (float(a.shutdown_timeout) if a.shutdown_timeout is not None
                                 else None),
            "virtual_local_rank": a.virtual_local_rank,
            "event_log_handler": a.event_log_handler,
            "training_script": a.training_script,
            "training_script_args": list(a.training_script_args),
        }
        return out
    except (SystemExit, ValueError) as e:
        return {"error": repr(e)}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def ddprun_parse(argv, env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    r = subprocess.run([PARSE_DUMP, *argv], env={**base, **env}, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# Defaults the two state differently, compared only when the row gives the value: ddprun
# resolves --standalone's run id and the master port when it starts; --shutdown-timeout's
# default is 30 s in both, kept as None by torchrun's parser; ddprun's default signal list
# adds SIGUSR1 and SIGUSR2 (forwarded, docs/ddprun.md).
GIVEN_ONLY = {"rdzv_id": ("--rdzv-id", "--rdzv_id", "PET_RDZV_ID"),
              "shutdown_timeout": ("--shutdown-timeout", "PET_SHUTDOWN_TIMEOUT"),
              "signals_to_handle": ("--signals-to-handle", "PET_SIGNALS_TO_HANDLE")}


def given(argv, env, names):
    return any(a.split("=")[0] in names for a in argv) or any(k in names for k in env)


def differences(argv, env, torch_side, ddp_side):
    diffs = []
    for key, want in torch_side.items():
        if key in GIVEN_ONLY and not given(argv, env, GIVEN_ONLY[key]):
            continue
        got = ddp_side.get(key)
        if isinstance(want, float) or isinstance(got, float):
            same = got is not None and want is not None and abs(float(got) - float(want)) < 1e-9
        else:
            same = got == want
        if not same:
            diffs.append(f"{key}: torchrun {want!r}, ddprun {got!r}")
    return diffs


def check_parsers():
    failures = []
    for argv, env in SAME_MEANING:
        t, d = torchrun_parse(argv, env), ddprun_parse(argv, env)
        if "error" in t:
            failures.append(f"{argv} {env}: the oracle itself failed: {t['error']}")
        elif "error" in d:
            failures.append(f"{argv} {env}: ddprun refused what torchrun takes: {d['error']}")
        else:
            failures += [f"{argv} {env}: {x}" for x in differences(argv, env, t, d)]
    for argv, env in BOTH_FAIL:
        t, d = torchrun_parse(argv, env), ddprun_parse(argv, env)
        if "error" not in t:
            failures.append(f"{argv} {env}: torchrun takes it now; move the row")
        if "error" not in d:
            failures.append(f"{argv} {env}: ddprun took what torchrun refuses: {d}")
        elif not re.search(r"expected|unknown|not |cannot|\bno [^;]* found", d["error"]):
            failures.append(f"{argv} {env}: ddprun's error does not say what is wrong: {d}")
    for argv, env, want in DEVIATIONS:
        d = ddprun_parse(argv, env)
        if want == "error":
            if "error" not in d:
                failures.append(f"{argv} {env}: ddprun should refuse it at once: {d}")
        else:
            failures += [f"{argv} {env}: {k}: ddprun {d.get(k)!r}, expected {v!r}"
                         for k, v in want.items() if d.get(k) != v]
    rows = len(SAME_MEANING) + len(BOTH_FAIL) + len(DEVIATIONS)
    return rows, failures


WORKER = r"""
import os
status = open("/proc/self/status").read()
cpus = status.split("Cpus_allowed_list:")[1].split()[0]
print(f"worker rank={os.environ['RANK']} cpus={cpus} local_rank={os.environ['LOCAL_RANK']} "
      f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} name={__name__}", flush=True)
print("an unfiltered line", flush=True)
"""


def physical_cores():
    cores = set()
    for cpu in os.sched_getaffinity(0):
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            cores.add((open(f"{base}/physical_package_id").read().strip(),
                       open(f"{base}/core_id").read().strip()))
        except OSError:
            cores.add(("?", str(cpu)))
    return len(cores)


def check_run():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        n = max(1, min(physical_cores(), 4))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(7 - i) for i in range(n))
        r = subprocess.run(
            [DDPRUN, "--standalone", "--nproc-per-node", str(n), "--numa-binding", "exclusive",
             "--virtual-local-rank", "--run-path", "--tee", "3", "--log-dir", tmp, "--run-id",
             "parity", "--duplicate-stdout-filters", "worker rank", "--event-log-handler",
             "console", script],
            env=env, capture_output=True, text=True, timeout=120)
        out = r.stdout + r.stderr
        if r.returncode != 0:
            return [f"the flags' run failed ({r.returncode}):\n{out}"]
        planned = dict(re.findall(r"local rank (\d+) runs on CPUs (\S+)", r.stderr))
        seen = {m[0]: m for m in re.findall(
            r"worker rank=(\d+) cpus=(\S+) local_rank=(\d+) visible=(\S+) name=(\S+)", r.stdout)}
        if len(planned) != n or len(seen) != n:
            return [f"expected {n} planned bindings and {n} workers:\n{out}"]
        bound = []
        for rank in range(n):
            _, cpus, local_rank, visible, name = seen[str(rank)]
            if cpus != planned[str(rank)]:
                failures.append(f"rank {rank} runs on CPUs {cpus}, ddprun planned "
                                f"{planned[str(rank)]}")
            bound.append(cpus)
            if local_rank != "0" or visible != str(7 - rank) or name != "__main__":
                failures.append(f"rank {rank}: LOCAL_RANK={local_rank} "
                                f"CUDA_VISIBLE_DEVICES={visible} __name__={name}")
        if len(set(bound)) != n:
            failures.append(f"--numa-binding exclusive gave workers shared CPUs: {bound}")
        filtered = open(os.path.join(tmp, "parity", "attempt_0", "filtered_stdout.log")).read()
        lines = sorted(filtered.splitlines())
        if (len(lines) != n or any("unfiltered" in x for x in lines)
                or not all(x.startswith(f"[default{i}]:worker rank={i} ")
                           for i, x in enumerate(lines))):
            failures.append(f"filtered_stdout.log:\n{filtered}")
        events = [json.loads(x) for x in r.stderr.splitlines() if x.startswith('{"')]
        if [e.get("name") for e in events] != ["torchelastic.worker.status.SUCCEEDED"] or \
                events[0]["metadata"]["run_id"] != "parity":
            failures.append(f"expected one SUCCEEDED event on stderr:\n{r.stderr}")
    return failures


def main():
    rows, failures = check_parsers()
    print(f"torchrun_parity: {rows} command lines compared with torchrun's parser")
    run_failures = check_run()
    print("torchrun_parity: --numa-binding, --virtual-local-rank, --run-path, "
          "--duplicate-stdout-filters, --event-log-handler run for real")
    failures += run_failures
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print("torchrun_parity: OK")


if __name__ == "__main__":
    main()
