#!/usr/bin/env bash
# ddp for a Python user: the wheel of scripts/wheel.sh and `pip install <checkout>` into a fresh virtual
# environment that holds only torch, then a 2-rank job with the environment's own ddprun and
# `import ddp`, as the user runs it (the environment's bin/ first on PATH, as after `activate`).
#
#   1. scripts/wheel.sh: pip wheel --no-build-isolation by the build's interpreter (PYTHON, the
#      .venv with torch and scikit-build-core), then auditwheel repair: a manylinux wheel that
#      carries the libraries it loads (Gloo, curl, spdlog, fmt, ..., with their licenses) but no
#      MPI; it installs into the fresh environment (same torch), whose ddprun and ddp._C load
#      those libraries from the wheel.
#   2. pip uninstall, then pip install SOURCE_DIR into the fresh environment with pip's build
#      isolation (scikit-build-core from the package index): the build finds the environment's
#      torch, not the .venv's.
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

echo "== scripts/wheel.sh (pip wheel by $PYTHON, then auditwheel repair)"
build_wheel "$PYTHON" "$PIP_BUILD.wheel"
# The platform tag auditwheel gives only to a wheel whose every other library is inside it, and
# the torch it was built for in its version.
[[ "$(basename "$wheel")" == *-manylinux_2_*_x86_64.whl ]] ||
  fail "the wheel's platform tag is not manylinux: $(basename "$wheel")"
torch_version="$("$PYTHON" -I -c 'import torch; print(torch.__version__.replace("+", "."))')"
dist="ddp-0.1.0+torch$torch_version"
[[ "$(basename "$wheel")" == "$dist"-* ]] ||
  fail "the wheel's name does not say torch $torch_version: $(basename "$wheel")"
"$PYTHON" -m zipfile -l "$wheel" | awk '{print $1}' >"$WORK/wheel.files"
for f in ddp/__init__.py ddp/_build_info.py ddp_torch_plugin/__init__.py \
  "$dist.data/scripts/ddprun" ddp/libddp_comm_mpi.so \
  "$dist.dist-info/licenses/ddp.libs/libgloo0.copyright" \
  "$dist.dist-info/licenses/ddp.libs/libcurl4.copyright"; do
  grep -qx "$f" "$WORK/wheel.files" || { cat "$WORK/wheel.files"; fail "the wheel lacks $f"; }
done
grep -q '^ddp/_C\..*\.so$' "$WORK/wheel.files" || fail "the wheel lacks the extension ddp/_C"
for lib in libgloo libcurl libspdlog libfmt; do
  grep -q "^ddp.libs/$lib-" "$WORK/wheel.files" || fail "the wheel does not carry $lib"
done
# MPI is the cluster's own, loaded by the mpi backend only when asked for: never in the wheel.
if grep -q '^ddp.libs/lib\(mpi\|open-pal\|open-rte\)' "$WORK/wheel.files"; then
  fail "the wheel carries an MPI library: $(grep 'ddp.libs/lib\(mpi\|open-\)' "$WORK/wheel.files")"
fi
"$WORK/venv/bin/python" -m pip install -q --no-deps "$wheel" || fail "installing the wheel"
run_job "$WORK/venv" "the wheel of scripts/wheel.sh"
# ddprun and ddp._C of the installed wheel load the libraries inside it, not the machine's.
site="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')"
for elf in "$site"/ddp.scripts/ddprun "$site"/ddp/_C.*.so; do
  deps="$(LD_LIBRARY_PATH= ldd "$elf")"
  # Every library found (torch's: _C's RUNPATH reaches the environment's torch/lib).
  if grep -q "not found" <<<"$deps"; then
    fail "$(basename "$elf") of the installed wheel lacks libraries: $(grep "not found" <<<"$deps")"
  fi
  for lib in libgloo libcurl libspdlog libfmt libmpi; do
    line="$(grep "$lib[.-]" <<<"$deps" || true)"
    [[ -z "$line" || "$line" == *"=> $site/"*"ddp.libs/$lib-"* ]] ||
      fail "$(basename "$elf") loads $lib from outside the wheel: $line"
  done
done

# No `import ddp`: the environment registers the backend through torch's plugin entry point,
# under ddprun, under --recovery step (the script imports ddp only after init_process_group and
# must still get ddprun's store: StepManager refuses any other group), and under torchrun.
# no_import_job WHAT EXPECTED LAUNCHER [FLAGS...]: each rank's line must end with EXPECTED.
no_import_job() {
  local what="$1" expected="$2" out
  shift 2
  echo "== init_process_group(\"ddp\") without import ddp ($what)"
  out=$(cd "$WORK" && PATH="$WORK/venv/bin:$PATH" timeout 120 "$@" --standalone \
          --nproc-per-node 2 "$SOURCE/tests/package/pip/no_import_job.py" "$WORK/venv" 2>&1) ||
    { echo "$out"; fail "no import ddp, $what"; }
  grep "no import ddp" <<<"$out"
  for rank in 0 1; do
    grep -q "rank $rank of 2: no import ddp, $expected\$" <<<"$out" ||
      { echo "$out"; fail "no import ddp, $what: rank $rank did not report '$expected'"; }
  done
}
no_import_job ddprun "all_reduce ok" "$WORK/venv/bin/ddprun"
no_import_job "ddprun --recovery step" "all_reduce ok, ddp.StepManager on ddprun's store ok" \
  "$WORK/venv/bin/ddprun" --recovery step
no_import_job torchrun "all_reduce ok" "$WORK/venv/bin/torchrun"

echo "== pip install $SOURCE (with pip's build isolation)"
"$WORK/venv/bin/python" -m pip uninstall -q -y ddp
"$WORK/venv/bin/python" -m pip install -v --config-settings=build-dir="$PIP_BUILD.install" \
  "$SOURCE" >"$WORK/install.log" 2>&1 || { tail -n 60 "$WORK/install.log"; fail "pip install"; }
grep -q "ddp python: building the 'ddp' torch.distributed backend for $WORK/venv/bin/python" \
  "$WORK/install.log" || { grep "ddp python" "$WORK/install.log"; fail "pip install did not build for the environment's own Python"; }
run_job "$WORK/venv" "pip install"
echo "PASS: pip wheel and pip install put ddprun and ddp into a fresh environment; 2 ranks ran"
