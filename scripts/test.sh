#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
scripts/build.sh -DDDP_BUILD_TESTS=ON
cd "${DDP_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${DDP_TEST_JOBS:-2}"
