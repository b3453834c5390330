#!/usr/bin/env bash
# ddp against the CUDA build of torch a GPU user has (issue 51): torch==2.14.1 from pip (CUDA 13,
# with its nvidia-* runtime packages) in a virtual environment of its own, on a machine with no
# GPU. Before cmake/TorchCuda.cmake, configuring against it failed in torch's own
# Caffe2Config.cmake ("Your installed Caffe2 version uses CUDA but I cannot find the CUDA
# libraries").
#
#   1. Configure against it with the CUDA toolkit, where one is installed: the configure names
#      the toolkit it gave TorchConfig; the same tree configures again.
#   2. scripts/wheel.sh by that environment's Python with DDP_CUDA_RUNTIME_FROM=wheel, as on a
#      machine without the toolkit (CUDA's headers and runtime from torch's nvidia packages):
#      the wheel's name says torch2.14.1.cu130; it installs into the environment, and a 2-rank
#      CPU job runs with its ddprun and `import ddp` (tests/package/pip/job.py).
#   3. pip install of the checkout into the same environment (pip's build isolation, the same
#      DDP_CUDA_RUNTIME_FROM), and the job again. Its compiles are ccache hits of step 2's.
#
# Skips (exit 77), saying why, where torch 2.14.1's wheel is not on this machine's disk: pip would
# download it and its CUDA packages (about 3 GB). The environment is kept in
# BUILD/torch-2.14.1-cuda-venv for the next run (5.4 GB; made again if its torch is not 2.14.1).
#
# Usage: cuda_torch_build_test.sh BUILD_DIR SOURCE_DIR PYTHON   (PYTHON: the build's interpreter)
set -euo pipefail
usage="usage: cuda_torch_build_test.sh BUILD_DIR SOURCE_DIR PYTHON"
BUILD="$(realpath "${1:?$usage}")"
SOURCE="$(realpath "${2:?$usage}")"
PYTHON="${3:?$usage}"
TORCH_PIN="torch==2.14.1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
base="$("$PYTHON" -c 'import sys; print(sys._base_executable)')"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheel on this machine's disk: in a folder pip's find-links names, or behind a file://
# index of its configuration.
local_wheel="$("$base" - <<'EOF'
import glob, os, re, subprocess, sys, urllib.parse
config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                        text=True).stdout
places = []
for key, value in re.findall(r"^[\w:.-]*?(find-links|index-url)='([^']*)'", config, re.M):
    places += value.split()
for place in places:
    folder = urllib.parse.urlparse(place).path if place.startswith("file:") else place
    if not os.path.isdir(folder):
        continue
    candidates = glob.glob(os.path.join(folder, "torch-2.14.1-cp311-*.whl"))
    index = os.path.join(folder, "torch", "index.html")
    if os.path.isfile(index):
        for href in re.findall(r'href="([^"#]*torch-2\.14\.1-cp311-[^"#]*\.whl)', open(index).read()):
            candidates.append(os.path.normpath(os.path.join(folder, "torch", href)))
    for wheel in candidates:
        if os.path.isfile(wheel):
            print(wheel)
            raise SystemExit
EOF
)"
if [[ -z "$local_wheel" || "$("$base" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" != True ]]; then
  echo "SKIP: torch 2.14.1's CUDA wheel for Python 3.11 is not on this machine's disk (pip's" \
    "find-links and file:// indexes); the test would download it and its CUDA packages (~3 GB)"
  exit 77
fi
echo "== $TORCH_PIN from $local_wheel"

venv="$BUILD/torch-2.14.1-cuda-venv"
torch_of() { "$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true; }
if [[ "$(torch_of)" != 2.14.1+cu* ]]; then
  rm -rf "$venv"
  "$base" -m venv "$venv"
  # --no-compile: the jobs' imports write the bytecode they need (pip's default compiles all
  # of torch's modules). scikit-build-core: scripts/wheel.sh builds without build isolation.
  "$venv/bin/python" -m pip install -q --no-compile "$local_wheel" \
    "$(grep -m1 '^scikit-build-core==' "$SOURCE/scripts/requirements.txt")" >"$WORK/venv.log" 2>&1 ||
    { tail -n 40 "$WORK/venv.log"; fail "installing $TORCH_PIN into $venv"; }
fi
torch_version="$(torch_of)"
[[ "$torch_version" == 2.14.1+cu* ]] || fail "$venv's torch is '$torch_version', not 2.14.1's CUDA build"
echo "environment: $venv (torch $torch_version)"

if [[ -x /usr/local/cuda/bin/nvcc || -n "${CUDA_HOME:-}" ]] || command -v nvcc >/dev/null; then
  echo "== configure against it with the CUDA toolkit"
  cmake -S "$SOURCE" -B "$WORK/configure" -G Ninja -DDDP_PYTHON="$venv/bin/python" \
    -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF -DDDP_CCACHE=off >"$WORK/configure.log" 2>&1 ||
    { tail -n 40 "$WORK/configure.log"; fail "configuring against $TORCH_PIN with the toolkit"; }
  grep "^-- ddp: " "$WORK/configure.log"
  grep -q "^-- ddp: .*torch=ON torch_cuda=ON" "$WORK/configure.log" ||
    fail "the configure did not take $TORCH_PIN as a CUDA LibTorch"
  grep -q "^-- ddp: CUDA for the CUDA LibTorch from the toolkit " "$WORK/configure.log" ||
    fail "the configure did not name the CUDA toolkit it used"
  # Configured again (ninja does so when a CMakeLists.txt changes), with LibTorch's Torch_DIR
  # now cached: it once skipped the CUDA preparation and failed in TorchConfig.cmake.
  cmake "$WORK/configure" >"$WORK/reconfigure.log" 2>&1 ||
    { tail -n 40 "$WORK/reconfigure.log"; fail "configuring the same tree again"; }
else
  echo "== no CUDA toolkit on this machine: the configure with one is not checked here"
fi

# The builds below take CUDA from torch's own nvidia packages, as on a machine without the
# toolkit; their folders sit at the main build's depth below the checkout (ccache: see
# pip_install_test.sh), with the main build's compilers.
export DDP_CUDA_RUNTIME_FROM=wheel
source "$SOURCE/tests/package/pip/steps.sh"  # use_main_build_compilers, build_wheel, run_job
use_main_build_compilers
pip_build="$BUILD-cuda-torch"

echo "== scripts/wheel.sh by $venv/bin/python, CUDA from torch's nvidia packages"
build_wheel "$venv/bin/python" "$pip_build.wheel"
[[ "$(basename "$wheel")" == "ddp-0.1.0+torch${torch_version/+/.}-"*-manylinux_2_*_x86_64.whl ]] ||
  fail "the wheel's name does not say torch $torch_version and manylinux: $(basename "$wheel")"
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$wheel" || fail "installing the wheel"
run_job "$venv" "the wheel of scripts/wheel.sh"

echo "== pip install $SOURCE (with pip's build isolation)"
"$venv/bin/python" -m pip uninstall -q -y ddp
"$venv/bin/python" -m pip install -v --config-settings=build-dir="$pip_build.install" "$SOURCE" \
  >"$WORK/install.log" 2>&1 || { tail -n 60 "$WORK/install.log"; fail "pip install"; }
grep -q "ddp: CUDA for the CUDA LibTorch from the wheel " "$WORK/install.log" ||
  { grep "ddp" "$WORK/install.log" | head -n 20; fail "pip install did not take CUDA from torch's nvidia packages"; }
run_job "$venv" "pip install"
"$venv/bin/python" -m pip uninstall -q -y ddp
echo "PASS: ddp against $TORCH_PIN ($torch_version): configured with the CUDA toolkit, built without it (wheel and pip install); 2 CPU ranks ran"
