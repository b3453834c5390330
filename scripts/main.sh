#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains on local workers through ddprun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh main
scripts/build.sh
exec scripts/main-job.sh
