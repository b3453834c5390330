#!/usr/bin/env bash
# ddp for a Python user: `pip wheel` and `pip install <checkout>` into a fresh virtual
# environment that holds only torch, then a 2-rank job with the environment's own ddprun and
# `import ddp`, as the user runs it (the environment's bin/ first on PATH, as after `activate`).
#
#   1. pip wheel --no-build-isolation, run by the build's interpreter (PYTHON, the .venv with
#      torch and scikit-build-core): the wheel installs into the fresh environment (same torch).
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
# ... and with the main build's compilers: ccache hashes the compiler's name, and CMake under pip
# picks gcc/g++ where the main build has cc/c++ (the same compiler under other names).
CC="$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
CXX="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
export CC CXX
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== a fresh virtual environment with only $TORCH_PIN"
base="$("$PYTHON" -c 'import sys; print(sys._base_executable)')"
"$base" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$TORCH_PIN" >"$WORK/torch.log" 2>&1 ||
  { cat "$WORK/torch.log"; fail "installing $TORCH_PIN"; }
installed="$("$WORK/venv/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | sort | tr '\n' ' ')"
echo "packages: $installed"
[[ " $installed " == *" torch "* ]] || fail "torch is not in the fresh environment"
[[ " $installed " != *" ddp "* ]] || fail "ddp is already in the fresh environment"

# The job: the environment's ddprun, its python3 (first on PATH), its ddp.
run_job() {
  local what="$1" out
  echo "== 2 ranks with the environment's ddprun and ddp ($what)"
  [[ -x "$WORK/venv/bin/ddprun" ]] || fail "$what: no ddprun in the environment's bin/"
  out=$(cd "$WORK" && PATH="$WORK/venv/bin:$PATH" timeout 120 ddprun --standalone \
          --nproc-per-node 2 "$SOURCE/tests/package/pip/job.py" "$WORK/venv" 2>&1) ||
    { echo "$out"; fail "$what: the 2-rank job"; }
  echo "$out"
  for rank in 0 1; do
    grep -q "rank $rank of 2: ddp from the environment, all_reduce and DDP ok" <<<"$out" ||
      fail "$what: rank $rank did not report success"
  done
}

echo "== pip wheel (built by $PYTHON, without build isolation)"
"$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$WORK/wheels" \
  --config-settings=build-dir="$PIP_BUILD.wheel" "$SOURCE" >"$WORK/wheel.log" 2>&1 ||
  { tail -n 60 "$WORK/wheel.log"; fail "pip wheel"; }
wheel="$(ls "$WORK"/wheels/ddp-*.whl)"
echo "wheel: $(basename "$wheel")"
"$PYTHON" -m zipfile -l "$wheel" | awk '{print $1}' >"$WORK/wheel.files"
for f in ddp/__init__.py ddp/_build_info.py ddp_torch_plugin/__init__.py \
  ddp-0.1.0.data/scripts/ddprun; do
  grep -qx "$f" "$WORK/wheel.files" || { cat "$WORK/wheel.files"; fail "the wheel lacks $f"; }
done
grep -q '^ddp/_C\..*\.so$' "$WORK/wheel.files" || fail "the wheel lacks the extension ddp/_C"
"$WORK/venv/bin/python" -m pip install -q --no-deps "$wheel" || fail "installing the wheel"
run_job "pip wheel"

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
      fail "no import ddp, $what: rank $rank did not report '$expected'"
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
run_job "pip install"
echo "PASS: pip wheel and pip install put ddprun and ddp into a fresh environment; 2 ranks ran"
