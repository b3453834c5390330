#!/usr/bin/env bash
# Store benchmark, ddp and PyTorch side by side in one run; prints JSON lines.
# Usage: bench/store/run_store_bench.sh [BUILD_DIR] [--iters N] [--clients N]
# BUILD_DIR defaults to ${DDP_BUILD_DIR:-build}; it must contain bench/store/store_bench.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
root="$(cd "$here/../.." && pwd)"
build="${DDP_BUILD_DIR:-build}"
if [[ $# -gt 0 && "$1" != --* ]]; then build="$1"; shift; fi
[[ "$build" = /* ]] || build="$root/$build"
bin="$build/bench/store/store_bench"
if [[ ! -x "$bin" ]]; then
  echo "run_store_bench.sh: $bin not found; build it with: cmake --build $build --target store_bench" >&2
  exit 2
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
"$bin" "$@"
if "$PY" -c 'import torch.distributed' 2>/dev/null; then
  "$PY" "$here/torch_store_bench.py" "$@"
else
  echo '{"bench":"store_roundtrip","impl":"torch","skipped":"'"$PY"' cannot import torch.distributed (scripts/install-deps.sh makes .venv/)"}'
fi
