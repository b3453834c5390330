#!/usr/bin/env bash
# What ddp ships, built once for the package tests that use it (ctest fixture package_dist):
# scripts/wheel.sh's wheel and scripts/cpp_package.sh's relocatable C++ package, from one build
# tree (BUILD-pip-test.wheel, at the main build's depth with its compilers: ccache gives back the
# main build's objects), into BUILD/package-dist/. Checks what each carries:
#   - the wheel: a manylinux tag (auditwheel gives it only to a wheel whose every other library
#     is inside it), the torch it was built for in its name, the extension, the mpi plugin,
#     Gloo/curl/spdlog/fmt in ddp.libs/ with their licenses, and no MPI library;
#   - the C++ package: ddprun, the static libraries, the headers with fmt's and spdlog's, the
#     CMake package with its bundled targets and no path of this machine's build in it, the
#     libraries in lib/ddp-libs/ with their licenses, and no MPI library.
# package.pip_install_into_a_fresh_venv and package.bare_root install these.
#
# Usage: dist_test.sh BUILD_DIR SOURCE_DIR PYTHON   (PYTHON: the build's interpreter with torch)
set -euo pipefail
usage="usage: dist_test.sh BUILD_DIR SOURCE_DIR PYTHON"
BUILD="$(realpath "${1:?$usage}")"
SOURCE="$(realpath "${2:?$usage}")"
PYTHON="${3:?$usage}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
DIST="$BUILD/package-dist"
rm -rf "$DIST" && mkdir -p "$DIST"
source "$SOURCE/tests/package/pip/steps.sh"  # build_wheel, use_main_build_compilers
use_main_build_compilers

echo "== scripts/wheel.sh (pip wheel by $PYTHON, then auditwheel repair)"
# DDP_CCACHE=libraries: the torch layer, which only the C++ package needs, compiles without
# ccache. Its objects depend on this tree's precompiled header, so nothing could ever take them
# from the cache (CMakeLists.txt); the other libraries still come back from the main build's.
SKBUILD_CMAKE_DEFINE="DDP_CCACHE=libraries" build_wheel "$PYTHON" "$BUILD-pip-test.wheel"
torch_version="$("$PYTHON" -I -c 'import torch; print(torch.__version__.replace("+", "."))')"
dist="ddp-0.1.0+torch$torch_version"
[[ "$(basename "$wheel")" == "$dist"-*-manylinux_2_*_x86_64.whl ]] ||
  fail "the wheel's name does not say torch $torch_version and manylinux: $(basename "$wheel")"
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
mv "$wheel" "$DIST/"

echo "== scripts/cpp_package.sh (the same build tree)"
DDP_PYTHON="$PYTHON" DDP_CPP_PACKAGE_BUILD_DIR="$BUILD-pip-test.wheel" \
  DDP_WHEEL_TOOLS_VENV="$BUILD/wheel-tools-venv" "$SOURCE/scripts/cpp_package.sh" "$DIST" \
  >"$WORK/cpp_package.log" 2>&1 || { tail -n 40 "$WORK/cpp_package.log"; fail "scripts/cpp_package.sh"; }
package="$(tail -n 1 "$WORK/cpp_package.log")"
name="ddp-0.1.0-torch$torch_version-linux-$(uname -m)"
[[ "$package" == "$DIST/$name.tar.gz" && -f "$package" ]] ||
  { cat "$WORK/cpp_package.log"; fail "scripts/cpp_package.sh did not write $name.tar.gz"; }
grep "^cpp_package_bundle:" "$WORK/cpp_package.log" | cut -c1-200
echo "C++ package: $(basename "$package") ($(du -k "$package" | cut -f1) KiB)"
tar -C "$WORK" -xzf "$package"
top="$WORK/$name"
for f in bin/ddprun include/ddp/ddp.hpp include/ddp/third_party/fmt/format.h \
  include/ddp/third_party/spdlog/spdlog.h lib/libddp_torch.a lib/libddp_util.a \
  lib/libddp_comm_mpi.so lib/cmake/ddp/ddpConfig.cmake lib/cmake/ddp/ddpBundledDependencies.cmake \
  lib/ddp-libs/libgloo.so.0 lib/ddp-libs/libcurl.so.4 lib/ddp-libs/libfmt.so.9 \
  share/doc/ddp/licenses/libgloo0.copyright share/doc/ddp/licenses/libcurl4.copyright; do
  [[ -e "$top/$f" ]] || fail "the C++ package lacks $f"
done
if ls "$top"/lib/ddp-libs | grep -q '^lib\(mpi\|open-pal\|open-rte\)'; then
  fail "the C++ package carries an MPI library"
fi
# What a consumer's link reads: no library or header of this machine by its path.
cmake_files=("$top"/lib/cmake/ddp/ddpTargets*.cmake "$top"/lib/cmake/ddp/ddpBundledDependencies.cmake)
if grep -n "$SOURCE\|$BUILD\|/usr/lib/\|/usr/include\|/usr/local/" "${cmake_files[@]}"; then
  fail "the C++ package's CMake targets name paths of this machine (above)"
fi
echo "PASS: the wheel and the C++ package in $DIST"
