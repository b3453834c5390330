"""Runs PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
shipped in the torch wheel) on one backend, the way PyTorch's test/distributed/
test_distributed_spawn.py does (that file is not in the wheel): a MultiProcessTestCase +
DistributedTest._DistTestBase class whose every test spawns WORLD_SIZE processes.

Driven by the environment, read when the module is imported (the spawned ranks import it again as
__mp_main__ and must see the same): BACKEND (gloo, ddp, ...), WORLD_SIZE (default 2),
DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (seconds per test, torch's default 300; a test past it is
killed and fails). tests/python/torch_suite.sh sets them and compares two backends.

    BACKEND=ddp PYTHONPATH=build/python python torch_suite_driver.py [-k PATTERN]... \
        [--results FILE] [--shard I/N] [--list]

-k PATTERN: a shell-style pattern matched against the test's name (test_all_reduce_*); a pattern
without wildcards matches the names that contain it; "=NAME" matches NAME exactly. Several -k
select the union. Each test's outcome (passed, failed, error, skipped) goes to --results as one
JSON line, written as soon as the test ends; --label names the backend there.

TORCH_SUITE_LIFT_SKIPS=name,... runs those tests without their import-time skips (diagnosis of
tests the suite runs for gloo only). TORCH_SUITE_SPAWN_ALL=1 spawns the ranks even for tests
whose skip this process can tell in advance (see _skip_in_parent).

The ranks start from a forkserver that imported this file (torch, ddp, distributed_test) once:
each is a fresh fork of a process that has run no test, as a spawned rank is, without importing
the suite again (5 CPU-s a rank on this machine, most of a short test). Each rank still gets the
environment of its test's setUp (TEMP_DIR, INIT_METHOD), as a spawned one does.
TORCH_SUITE_START_METHOD=spawn starts every rank the way PyTorch's own CI does.
"""
import multiprocessing

import os
import sys
import tempfile
import unittest

os.environ.setdefault("WORLD_SIZE", "2")
if "BACKEND" not in os.environ:
    sys.exit("torch_suite_driver.py: set BACKEND (gloo, ddp, ...)")
# distributed_test reads TEMP_DIR and INIT_METHOD when it is imported. Each test's setUp makes a
# fresh TEMP_DIR and points INIT_METHOD at a file in it, which its spawned ranks inherit: they
# always run the file:// variant of PyTorch's CI, so the parent decides its skips for file:// too.
os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(tempfile.gettempdir(), "init"))

BACKEND = os.environ["BACKEND"]

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if BACKEND == "ddp":
    import ddp  # noqa: F401,E402  (registers the "ddp" backend)

    # The feature sets the suite's skip decorators consult while distributed_test is imported:
    # ddp is a third-party backend ("plugin"), runs DistributedDataParallel ("ddp") and makes
    # subgroups ("subgroup"). Not "gpu"/"cuda": the suite runs on the CPU-only wheel here (CUDA
    # tensors, staged through the host, are checked by bench/gpu/python_cuda.py on a GPU).
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("ddp")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

torch.backends.cuda.matmul.allow_tf32 = False


def _skip_in_parent(fn):
    """The skip a test's decorators would take in its spawned ranks (exit with a skip code) that
    this process can tell already, with the same message; None when it would run.

    Only the decorators whose condition is fixed for the run: the accelerator ones on a machine
    without accelerators, and the world-size ones. Spawning two ranks only to skip costs about
    3 s a test on 2 cores; a third of the suite skips that way."""
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.common_utils import TEST_CUDA, TEST_HPU, TEST_XPU

    no_accelerator = not (TEST_CUDA or TEST_HPU or TEST_XPU)
    world = int(os.environ["WORLD_SIZE"])
    f = fn
    while f is not None:
        # functools.wraps copies the test's __qualname__ onto the wrapper; its code keeps its own.
        code = getattr(f, "__code__", None)
        q = code.co_qualname if code and code.co_filename.endswith("common_distributed.py") else ""
        if q == "skip_if_no_gpu.<locals>.wrapper" and no_accelerator:
            return TEST_SKIPS["no_cuda"].message
        if q == "skip_if_lt_x_gpu.<locals>.decorator.<locals>.wrapper" and no_accelerator:
            free = dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__)))
            if not free.get("allow_cpu", False):
                return TEST_SKIPS[f"multi-gpu-{free['x']}"].message
        if q == "skip_if_small_worldsize.<locals>.wrapper" and BACKEND != "mpi" and world < 8:
            return TEST_SKIPS["small_worldsize"].message
        if q == "skip_if_odd_worldsize.<locals>.wrapper" and BACKEND != "mpi" and world % 2:
            return TEST_SKIPS["odd_worldsize"].message
        f = getattr(f, "__wrapped__", None)
    return None


class _ForkserverRank(multiprocessing.get_context("forkserver").Process):
    """A rank forked from the forkserver, with the environment its parent had when it started
    it: the server's own is that of the first test, and each test's setUp points TEMP_DIR (the
    suite's barrier and lock files) at a new folder."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._environ = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self._environ)
        super().run()


_START_METHOD = os.environ.get("TORCH_SUITE_START_METHOD", "forkserver")
if _START_METHOD not in ("forkserver", "spawn"):
    sys.exit(f"torch_suite_driver.py: TORCH_SUITE_START_METHOD={_START_METHOD}: expected "
             "forkserver or spawn")


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        if os.environ.get("TORCH_SUITE_SPAWN_ALL") != "1":
            reason = _skip_in_parent(getattr(type(self), self._testMethodName))
            if reason:
                raise unittest.SkipTest(reason)
        super().setUp()
        if _START_METHOD == "forkserver":
            self._start_processes(_ForkserverRank)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


def _lift_skips(cls, name):
    """Removes the unittest skips (decided when distributed_test was imported, from BACKEND and
    the feature sets) from test `name`, wherever they sit in its decorator stack, so that it runs
    as it does for gloo. Only for diagnosis: a test that passes on gloo but is skipped on this
    backend is skipped by a backend gate (the run on gloo shows no other skip applies)."""
    top = getattr(cls, name)
    parent, f = None, top
    while f is not None:
        inner = getattr(f, "__wrapped__", None)
        code = getattr(f, "__code__", None)
        if code is not None and code.co_name == "skip_wrapper" and inner is not None:
            if parent is None:
                top = inner
            else:  # the enclosing wrapper calls the skip wrapper through its closure
                for cell in parent.__closure__ or ():
                    if cell.cell_contents is f:
                        cell.cell_contents = inner
                parent.__wrapped__ = inner
        else:
            parent = f
        f = inner
    f = top
    while f is not None:  # functools.wraps copied the skip marks onto the enclosing wrappers
        if getattr(f, "__unittest_skip__", False):
            f.__unittest_skip__ = False
        f = getattr(f, "__wrapped__", None)
    setattr(cls, name, top)


# TORCH_SUITE_LIFT_SKIPS=name,name: run these tests without their import-time skips (set by
# torch_suite.sh for the tests that pass on gloo and are skipped on ddp; the spawned ranks see it
# too).
for _name in filter(None, os.environ.get("TORCH_SUITE_LIFT_SKIPS", "").split(",")):
    _lift_skips(TestDistBackendWithSpawn, _name)


def _main():
    import argparse
    import fnmatch
    import json
    import re
    import time
    import traceback

    from torch.testing._internal import common_utils

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", dest="patterns", action="append", default=[],
                    help="select tests by name (repeatable)")
    ap.add_argument("--results", help="append one JSON line per test to this file")
    ap.add_argument("--shard", default="1/1", help="I/N: run every N-th selected test from the I-th")
    ap.add_argument("--list", action="store_true", help="print the selected tests' names and exit")
    ap.add_argument("--label", default=BACKEND, help="the results' backend field (default BACKEND)")
    args = ap.parse_args()

    def selected(name):
        if not args.patterns:
            return True
        for p in args.patterns:
            if p.startswith("="):
                if name == p[1:]:
                    return True
            elif any(c in p for c in "*?["):
                if fnmatch.fnmatchcase(name, p):
                    return True
            elif p in name:
                return True
        return False

    names = sorted(n for n in unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)
                   if selected(n))
    shard_i, shard_n = (int(x) for x in args.shard.split("/"))
    names = names[shard_i - 1::shard_n]
    if args.list:
        print("\n".join(names))
        return 0

    # The state torch's run_tests() sets up (seed, flags), without its argument parsing.
    saved_argv, sys.argv = sys.argv, sys.argv[:1]
    common_utils.parse_cmd_line_args()
    sys.argv = saved_argv

    # The forkserver imports this file as a module before it forks the first rank (_main does
    # not run there). Not as "__main__": CPython 3.11's forkserver never receives the main
    # module's path (it asks for "main_path", spawn names it "init_main_from_path"). Each rank
    # still runs this file again as __mp_main__, as a spawned one does, with the imports cached.
    # The server imports before it applies the sys.path it is given (3.11), and swallows an
    # ImportError: this folder goes on PYTHONPATH, which it inherits.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        [os.path.splitext(os.path.basename(__file__))[0]])
    out = open(args.results, "a", buffering=1) if args.results else None

    class Result(unittest.TextTestResult):
        def startTest(self, test):
            self._t0 = time.monotonic()
            super().startTest(test)

        def _record(self, test, outcome, detail=""):
            rec = {"backend": args.label, "test": test._testMethodName, "outcome": outcome,
                   "seconds": round(time.monotonic() - self._t0, 2)}
            if detail:
                rec["detail"] = detail
            if out:
                out.write(json.dumps(rec) + "\n")

        def addSuccess(self, test):
            super().addSuccess(test)
            self._record(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._record(test, "failed", _err_text(err))

        def addError(self, test, err):
            super().addError(test, err)
            self._record(test, "error", _err_text(err))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._record(test, "skipped", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._record(test, "passed", "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._record(test, "failed", "unexpected success")

    exc_line = re.compile(r"^(?:\[rank\d+\]:)?((?:\w+\.)*\w*(?:Error|Exception|Exit|Timeout)\w*: .*)")

    def _err_text(err):
        # The parent's error holds each failed rank's traceback ("Process 0 exited with error code
        # 10 and exception: ..."): lead with the exception lines, then the whole text.
        text = "".join(traceback.format_exception_only(err[0], err[1])).strip()
        found = []
        for line in text.splitlines():
            m = exc_line.match(line.strip())
            if m and m.group(1) not in found:
                found.append(m.group(1))
        # "RuntimeError: Process 0 exited with error code 10 ..." only frames the ranks' errors.
        inner = [f for f in found if not re.match(r"RuntimeError: Process \d+ (exited|terminated)", f)]
        found = inner or found
        # The last exception of a traceback is the one that ended the test: it leads.
        return "\n".join(reversed(found[-3:])) + "\n----\n" + text[-4000:] if found else text[-4000:]

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result)
    result = runner.run(suite)
    if out:
        out.close()
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(_main())
