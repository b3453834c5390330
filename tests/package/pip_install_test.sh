#!/usr/bin/env bash
# ddp for a Python user: `pip install <checkout>` into a fresh virtual environment that holds
# only torch, then a 2-rank job with the environment's own ddprun and `import ddp`, as the user
# runs it (the environment's bin/ first on PATH, as after `activate`).
#
#   1. The wheel of package.dist (scripts/wheel.sh; its contents are checked there) and its jobs
#      (tests/package/pip/wheel_jobs.sh: ddp and gloo jobs, no `import ddp` under ddprun,
#      --recovery step and torchrun, a kill under --recovery step): here only where
#      package.bare_root, which runs them on a bare Debian system, cannot run.
#   2. pip install SOURCE_DIR into the fresh environment with pip's build isolation
#      (scikit-build-core from the package index): the build finds the environment's torch, not
#      the .venv's.
#
# Usage: pip_install_test.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
BUILD="$(realpath "${1:?usage: pip_install_test.sh BUILD_DIR SOURCE_DIR PYTHON}")"
SOURCE="$(realpath "${2:?usage: pip_install_test.sh BUILD_DIR SOURCE_DIR PYTHON}")"
PYTHON="${3:?usage: pip_install_test.sh BUILD_DIR SOURCE_DIR PYTHON}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
TORCH_PIN="$(grep -m1 '^torch==' "$SOURCE/scripts/requirements.txt")"
# pip's build trees are siblings of the build directory (BUILD-pip-test.wheel, .install), not
# SOURCE/build/pip where a user's `pip install .` builds. At the build directory's own depth
# below the checkout every compiler command line is the main build's (ccache's base_dir makes
# paths relative to the directory the compiler runs in: "../include" from BUILD and from a
# sibling, "../../../include" from BUILD/pip-test/wheel), so ccache gives back the main build's
# objects instead of compiling ddp twice more (issue 47: this test took 298 s).
PIP_BUILD="$BUILD-pip-test"
# ... and with the main build's compilers (use_main_build_compilers, steps.sh).
# build_wheel, run_job, use_main_build_compilers: the steps the package tests share.
source "$SOURCE/tests/package/pip/steps.sh"
use_main_build_compilers
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== a fresh virtual environment with only $TORCH_PIN"
base="$("$PYTHON" -c 'import sys; print(sys._base_executable)')"
"$base" -m venv "$WORK/venv"
# torch's modules become bytecode as the jobs import them, not all of them at install (pip's
# default compiles every module, about 25 s of CPU, most of which no job here imports); so this
# script's Python processes may write bytecode, whatever the caller's PYTHONDONTWRITEBYTECODE.
unset PYTHONDONTWRITEBYTECODE
"$WORK/venv/bin/python" -m pip install -q --no-compile "$TORCH_PIN" >"$WORK/torch.log" 2>&1 ||
  { cat "$WORK/torch.log"; fail "installing $TORCH_PIN"; }
installed="$("$WORK/venv/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | sort | tr '\n' ' ')"
echo "packages: $installed"
[[ " $installed " == *" torch "* ]] || fail "torch is not in the fresh environment"
[[ " $installed " != *" ddp "* ]] || fail "ddp is already in the fresh environment"

# The wheel of package.dist, installed and used as a user does (tests/package/pip/wheel_jobs.sh):
# in package.bare_root, on a bare Debian system, where that test can run; else here.
unavailable="$(bare_root_unavailable)"
if [[ -z "$unavailable" ]]; then
  echo "== the wheel's jobs run in package.bare_root (a bare Debian root), not here"
else
  echo "== the wheel of package.dist and its jobs here (package.bare_root cannot run: $unavailable)"
  "$WORK/venv/bin/python" -m pip install -q --no-deps "$(dist_wheel)" || fail "installing the wheel"
  mkdir -p "$WORK/jobs"
  "$SOURCE/tests/package/pip/wheel_jobs.sh" "$WORK/venv" "$WORK/jobs" || fail "the wheel's jobs"
  "$WORK/venv/bin/python" -m pip uninstall -q -y ddp
fi

echo "== pip install $SOURCE (with pip's build isolation)"
"$WORK/venv/bin/python" -m pip install -v --config-settings=build-dir="$PIP_BUILD.install" \
  "$SOURCE" >"$WORK/install.log" 2>&1 || { tail -n 60 "$WORK/install.log"; fail "pip install"; }
grep -q "ddp python: building the 'ddp' torch.distributed backend for $WORK/venv/bin/python" \
  "$WORK/install.log" || { grep "ddp python" "$WORK/install.log"; fail "pip install did not build for the environment's own Python"; }
run_job "$WORK/venv" "pip install"
echo "PASS: pip install put ddprun and ddp into a fresh environment; 2 ranks ran"
