#!/usr/bin/env bash
# Triage of a stuck job, ddprun against torchrun (PyTorch 2.13's defaults), one run:
#   1. time from the start of a hang to the report, and what the report says: hang_at_step.py
#      on gloo, 3 ranks, rank 1 sleeps in its own function before an all_reduce. ddprun runs with
#      --hang-timeout HANG_TIMEOUT (default 15); torchrun with PyTorch's defaults (gloo waits 30
#      minutes), capped at TORCHRUN_CAP seconds (default 300: its report, if any, comes later);
#   2. the cost of the --hang-timeout watchdog (PyTorch's flight recorder plus ddprun's progress
#      hook) on PyTorch DDP's CNN step on gloo: bench/python/ddp_cnn.py under ddprun with and
#      without it, REPEAT pairs (default 3) alternating, samples/s.
# PARTS=hang,cost (default both) selects them. Prints one JSON object per line, then a summary
# with medians.
#
#   bench/triage/run.sh [BUILD_DIR]     (default: build; builds ddprun)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/bench/python.sh"  # PY: the interpreter with PyTorch 2.13
BUILD=${1:-$ROOT/build}
HANG_TIMEOUT=${HANG_TIMEOUT:-15}
TORCHRUN_CAP=${TORCHRUN_CAP:-300}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-60}
PARTS=${PARTS:-hang,cost}
cmake --build "$BUILD" --target ddprun ddp_python_ext -j2 >/dev/null
DDPRUN=$BUILD/apps/ddprun/ddprun
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SCRIPT=$ROOT/bench/triage/hang_at_step.py
LINE=$(grep -n "where rank 1 hangs" "$SCRIPT" | cut -d: -f1)

# One hang under a launcher: prints a JSON line. $1: name, then the launcher's command line
# (the script and its arguments are appended).
hang_case() {
  local name=$1 cap=$2
  shift 2
  local mark=$WORK/$name.mark log=$WORK/$name.log rc=0
  rm -f "$mark"
  local begin
  begin=$(date +%s.%N)
  timeout --signal=KILL "$cap" "$@" "$SCRIPT" "$mark" >"$log" 2>&1 || rc=$?
  local end
  end=$(date +%s.%N)
  pkill -9 -f "hang_at_step.py $mark" 2>/dev/null || true
  "$PY" - "$name" "$mark" "$log" "$begin" "$end" "$rc" "$cap" "$LINE" <<'PY'
import json, os, re, sys
name, mark, log, begin, end, rc, cap, line = sys.argv[1:]
text = open(log, errors="replace").read()
hang_start = float(open(mark).read()) if os.path.exists(mark) else None
capped = int(rc) == 137
out = {"bench": "triage_hang", "launcher": name, "exit_code": int(rc), "capped": capped,
       "cap_s": int(cap),
       "report_s": None if capped or hang_start is None else round(float(end) - hang_start, 1),
       "names_rank_1": bool(re.search(r"rank 1 (is in no collective|is behind|was in)", text)),
       "names_line": f"hang_at_step.py:{line}" in text,
       "log_lines": text.count("\n")}
if capped and hang_start is not None:
    out["no_report_after_s"] = round(float(end) - hang_start, 1)
print(json.dumps(out), flush=True)
PY
}

{
  if [[ ,$PARTS, == *,hang,* ]]; then
    hang_case ddprun $((HANG_TIMEOUT * 8)) "$DDPRUN" --standalone --nproc-per-node 3 \
      --hang-timeout "$HANG_TIMEOUT" --log-dir "$WORK/logs" "$PY"
    hang_case torchrun "$TORCHRUN_CAP" "$TORCHRUN" --standalone --nproc-per-node 3
  fi
  [[ ,$PARTS, == *,cost,* ]] || REPEAT=0
  for ((rep = 0; rep < REPEAT; rep++)); do
    for watchdog in off on; do
      flags=()
      [[ $watchdog == on ]] && flags=(--hang-timeout 300)
      "$DDPRUN" --standalone --nproc-per-node 2 "${flags[@]}" "$PY" \
        "$ROOT/bench/python/ddp_cnn.py" gloo "$STEPS" 2>/dev/null |
        "$PY" -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        d = json.loads(l); d["bench"] = "triage_watchdog_cost"; d["watchdog"] = sys.argv[1]
        print(json.dumps(d), flush=True)' "$watchdog"
    done
  done
} | tee "$WORK/out.jsonl"

"$PY" - "$WORK/out.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if r["bench"] == "triage_hang":
        if r["report_s"] is not None:
            what = f"report {r['report_s']} s after the hang began"
        else:
            what = f"no report within {r.get('no_report_after_s', r['cap_s'])} s (capped)"
        print(f"summary: hang, {r['launcher']}: {what}; names rank 1: {r['names_rank_1']}; "
              f"names the line: {r['names_line']}")
by = {"on": [], "off": []}
for r in rows:
    if r["bench"] == "triage_watchdog_cost":
        by[r["watchdog"]].append(r["samples_per_s"])
if by["on"] and by["off"]:
    on, off = statistics.median(by["on"]), statistics.median(by["off"])
    print(f"summary: CNN on gloo, samples/s median: watchdog off {off}, on {on} "
          f"(ratio {on / off:.3f}; runs off {by['off']}, on {by['on']})")
PY
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
