"""What ddp's plugin entry point costs a process that never uses ddp (issue 50): the wall time
of `python -c "import torch"` with ddp installed in the environment (torch calls
ddp_torch_plugin.register at import) against an environment without ddp, same torch.

    python bench/python/import_torch.py --with VENV_WITH_DDP/bin/python \
        --without VENV_WITHOUT_DDP/bin/python [--runs 20]

The two interpreters alternate run by run (the machine's load hits both alike). Prints one
JSON line per interpreter (median and quartiles of the wall seconds, whether ddp's entry point
is declared there) and one with the ratio of medians (with / without), plus the load average.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

PROBE = ("import importlib.metadata as m, torch; "
         "print(any(e.value == 'ddp_torch_plugin:register' "
         "for e in m.entry_points(group='torch.backends')))")


def once(python):
    t0 = time.perf_counter()
    subprocess.run([python, "-c", "import torch"], check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--with", dest="with_ddp", required=True, help="python with ddp installed")
    ap.add_argument("--without", required=True, help="python of an environment without ddp")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    pythons = {"with_ddp": args.with_ddp, "without_ddp": args.without}
    declared = {k: subprocess.run([p, "-c", PROBE], check=True, capture_output=True,
                                  text=True).stdout.strip() == "True"
                for k, p in pythons.items()}
    if not declared["with_ddp"] or declared["without_ddp"]:
        raise SystemExit(f"import_torch: expected ddp's entry point only in --with: {declared}")
    for p in pythons.values():
        once(p)  # warm the page cache
    load_before = os.getloadavg()[0]
    walls = {k: [] for k in pythons}
    for _ in range(args.runs):
        for k, p in pythons.items():
            walls[k].append(once(p))
    medians = {}
    for k, w in walls.items():
        q = statistics.quantiles(w, n=4)
        medians[k] = statistics.median(w)
        print(json.dumps({"bench": "import_torch", "env": k, "python": pythons[k],
                          "runs": len(w), "median_s": round(medians[k], 4),
                          "q1_s": round(q[0], 4), "q3_s": round(q[2], 4)}))
    print(json.dumps({"bench": "import_torch", "ratio_with_over_without":
                      round(medians["with_ddp"] / medians["without_ddp"], 4),
                      "extra_ms": round(1000 * (medians["with_ddp"] - medians["without_ddp"]), 1),
                      "load_before": round(load_before, 2),
                      "load_after": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
