#!/usr/bin/env bash
# The main job: installs what is missing, builds what it needs (ddprun, the mnist example and
# their libraries; scripts/test.sh builds the rest), and trains on local workers through ddprun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh main
DDP_TARGETS="ddprun mnist" scripts/build.sh
exec scripts/main-job.sh
