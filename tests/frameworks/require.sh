#!/bin/sh
# require.sh PYTHON MODULE COMMAND...: runs COMMAND when PYTHON can import MODULE, else prints
# why and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE 77). The frameworks come
# from scripts/requirements-frameworks.txt (scripts/install-deps.sh test).
python="$1"
module="$2"
shift 2
if ! err=$("$python" -c "import $module" 2>&1); then
  echo "skipped: $python cannot import $module (install scripts/requirements-frameworks.txt:" \
       "scripts/install-deps.sh test): $(printf '%s\n' "$err" | tail -n 1)"
  exit 77
fi
exec "$@"
