#!/usr/bin/env bash
# The main job: the tutorial's Fashion-MNIST CNN for one epoch on 2 local workers, launched by
# ddprun, and a check that the test accuracy reaches 85%. Binaries come from
# ${DDP_BUILD_DIR:-build} (scripts/build.sh builds them). Extra arguments go to mnist.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DDP_BUILD_DIR:-build}"
ddprun="$build_dir/apps/ddprun/ddprun"
mnist="$build_dir/examples/mnist/mnist"
for bin in "$ddprun" "$mnist"; do
  if [[ ! -x "$bin" ]]; then
    echo "main job: $bin is missing; build first (scripts/build.sh, DDP_BUILD_DIR=$build_dir)" >&2
    exit 2
  fi
done

log="$(mktemp "${TMPDIR:-/tmp}/ddp-main-job.XXXXXX.log")"
"$ddprun" --standalone --nproc-per-node 2 "$mnist" --epochs 1 "$@" 2>&1 | tee "$log"

# The last line of rank 0: "Training time = ... | test accuracy 88.12% (8812/10000)".
accuracy="$(grep -o 'test accuracy [0-9.]*%' "$log" | tail -n 1 | grep -o '[0-9.]*' || true)"
rm -f "$log"
if [[ -z "$accuracy" ]]; then
  echo "main job: FAILED: no test accuracy line in the output" >&2
  exit 1
fi
if awk -v a="$accuracy" 'BEGIN { exit !(a >= 85.0) }'; then
  echo "main job: OK: test accuracy ${accuracy}% >= 85%"
else
  echo "main job: FAILED: test accuracy ${accuracy}% < 85%" >&2
  exit 1
fi
