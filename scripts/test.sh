#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs ctest, then the
# sanitizer stage (scripts/sanitizer-tests.sh: ASan+UBSan and TSan trees, label "sanitize").
# DDP_SANITIZERS=0 skips that stage; a failure in either stage fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
scripts/build.sh -DDDP_BUILD_TESTS=ON
echo "=== main stage: ctest (${DDP_BUILD_DIR:-build})"
status=0
(cd "${DDP_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 900 -j "${DDP_TEST_JOBS:-2}") ||
  status=1
if [[ "${DDP_SANITIZERS:-1}" != 0 ]]; then
  scripts/sanitizer-tests.sh || status=1
fi
((status == 0)) && echo "=== test.sh: all stages passed" || echo "=== test.sh: FAILED" >&2
exit $status
