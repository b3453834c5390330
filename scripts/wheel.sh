#!/usr/bin/env bash
# A wheel of ddp that carries its own libraries, for `pip install <wheel>` without root and
# without the Debian packages the source build needs (docs/python.md).
#
#   1. pip wheel of the checkout, built by the build's interpreter against its torch (the wheel
#      then works with that torch release: `import ddp` checks it).
#   2. auditwheel repair: every library ddprun, ddp._C and the mpi plugin load that is not part of
#      the manylinux platform (glibc, libstdc++, ...) is copied into ddp.libs/, and the platform
#      tag names the oldest glibc the wheel runs on. Left out on purpose: torch's own libraries
#      (the user's torch provides them), CUDA's and NCCL's (torch's nvidia-* packages), and MPI
#      (the cluster's own: the mpi backend is a plugin loaded only when asked for).
#   3. The license of every copied library goes into the wheel (scripts/wheel_licenses.py).
#   4. The wheel's version gets the torch it was built for as its local label
#      (ddp-0.1.0+torch2.13.0.cpu-...: scripts/wheel_torch_label.py).
#
# Usage: scripts/wheel.sh [OUT_DIR]   (default dist/; prints the wheel's path last)
# DDP_PYTHON: the interpreter with torch (default: the checkout's .venv, as install-deps.sh
# makes it). The build's C++ dependencies must be installed (scripts/install-deps.sh main).
set -euo pipefail
source "$(dirname "$0")/dist_env.sh"
dist_env wheel.sh "${1:-}"  # root, out, python, torch_version, torch_cuda, tools

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "wheel.sh: pip wheel (built by $python)"
# build-dir: at the main build's depth below the checkout, so ccache gives back its objects
# (tests/package/pip_install_test.sh says why).
settings=(--config-settings=build-dir="${DDP_WHEEL_BUILD_DIR:-$root/build-wheel}")
# A CPU torch has no CUDA tensors for the nccl backend to carry: its wheel leaves the backend
# out, and with it the need for NCCL's library (which the wheel never carries: a CUDA torch
# brings it, pip's nvidia-nccl-cu* package).
if [[ -z "$torch_cuda" ]]; then
  settings+=(--config-settings=cmake.define.DDP_WITH_NCCL=OFF)
fi
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/raw" "${settings[@]}" "$root"
raw="$(ls "$work"/raw/ddp-*.whl)"

echo "wheel.sh: auditwheel repair"
excludes=()
# CUDA's libraries one by one: a pattern as wide as libcu* would also leave out libcurl.
for lib in 'libtorch*.so' 'libc10*.so' 'libshm.so' 'libgomp*.so*' 'libcuda.so*' 'libcudart.so*' \
  'libcudnn*.so*' 'libcublas*.so*' 'libcufft*.so*' 'libcufile*.so*' 'libcurand.so*' \
  'libcusolver*.so*' 'libcusparse*.so*' 'libcupti.so*' 'libnv*.so*' 'libnccl.so*' 'libmpi.so*'; do
  excludes+=(--exclude "$lib")
done
PATH="$tools/bin:$PATH" auditwheel repair -w "$work/repaired" "${excludes[@]}" "$raw" \
  >"$work/repair.log" 2>&1 || { cat "$work/repair.log" >&2; exit 1; }
wheel="$(ls "$work"/repaired/ddp-*.whl)"
"$tools/bin/python" "$root/scripts/wheel_licenses.py" "$wheel"
# The name says which torch the wheel is for: ddp-0.1.0+torch2.13.0.cpu-cp311-...
wheel="$("$tools/bin/python" "$root/scripts/wheel_torch_label.py" "$wheel" "$torch_version")"
mv -f "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
