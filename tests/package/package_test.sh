#!/usr/bin/env bash
# ddp as a package a C++ user builds against. Installs the build into a fresh prefix, checks
# what landed there, builds tests/package/consumer (find_package(ddp), ddp::ddp, <ddp/ddp.hpp>)
# against it and runs it under the installed ddprun at 2 ranks; then packs the build with
# `cpack -G DEB`, checks the package's metadata, unpacks it with `dpkg-deb -x` and does the
# same against its contents.
#
# Usage: package_test.sh BUILD_DIR SOURCE_DIR [PYTHON]   (PYTHON: the build's interpreter with torch)
set -euo pipefail
BUILD="$(realpath "${1:?usage: package_test.sh BUILD_DIR SOURCE_DIR}")"
SOURCE="$(realpath "${2:?usage: package_test.sh BUILD_DIR SOURCE_DIR}")"
PYTHON="${3:-python3}"
VERSION="$(sed -n 's/^#define DDP_VERSION_STRING "\(.*\)"/\1/p' "$BUILD/include/ddp/version.hpp")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Builds the consumer against PREFIX and runs it under PREFIX's ddprun at 2 ranks. PREFIX is
# TOP/usr and the consumer builds in TOP/build, so with ccache (when installed) and TOP as its
# base folder the compiler's command line is the same for the install prefix and the .deb's
# contents: the second compile of the same file against the same headers is a cache hit (the
# headers' contents are hashed), not 25 s of CPU again; it still configures, links and runs
# against that prefix.
build_and_run_consumer() {
  local prefix="$1" name="$2" launcher=()
  local top="${prefix%/usr}"
  echo "== consumer against $name ($prefix)"
  command -v ccache >/dev/null &&
    launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$top;ccache")
  # As a user whose virtual environment holds torch: its python3 first on PATH, through which
  # find_package(ddp) finds the wheel's LibTorch.
  PATH="$(dirname "$PYTHON"):$PATH" \
  cmake -S "$SOURCE/tests/package/consumer" -B "$top/build" -G Ninja "${launcher[@]}" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >"$WORK/configure-$name.log" 2>&1 ||
    { cat "$WORK/configure-$name.log"; fail "configuring the consumer against $name"; }
  grep -q "ddp $VERSION from $prefix" "$WORK/configure-$name.log" ||
    { cat "$WORK/configure-$name.log"; fail "find_package(ddp) did not find $name's ddp $VERSION"; }
  cmake --build "$top/build" -j 2 >"$WORK/build-$name.log" 2>&1 ||
    { cat "$WORK/build-$name.log"; fail "building the consumer against $name"; }
  local out
  out=$(timeout 120 "$prefix/bin/ddprun" --standalone --nproc-per-node 2 \
          "$top/build/consumer" 2>&1) || { echo "$out"; fail "consumer under $name's ddprun"; }
  echo "$out"
  for rank in 0 1; do
    grep -q "consumer rank $rank of 2: ddp $VERSION, 8 steps, parameters equal across ranks" <<<"$out" ||
      fail "rank $rank did not report equal parameters"
  done
}

# The Python package, when this build has it (build/python/ddp), is installed under PREFIX and
# registers the backend from there: one process joins a world of 1 on it.
check_python() {
  local prefix="$1" name="$2"
  [[ -d "$BUILD/python/ddp" ]] || { echo "$name: no Python package in this build (skipped)"; return; }
  local init
  init="$(find "$prefix" -path '*-packages/ddp/__init__.py' | head -n 1)"
  [[ -n "$init" ]] || fail "$name: the ddp Python package is not installed under $prefix"
  PYTHONPATH="$(dirname "$(dirname "$init")")" "$PYTHON" -c '
import os, ddp, torch, torch.distributed as dist
assert ddp.__file__.startswith(os.environ["PYTHONPATH"]), ddp.__file__
dist.init_process_group("ddp", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(4)
dist.all_reduce(t)
assert t.tolist() == [1.0] * 4
print("python: import ddp from", os.path.dirname(ddp.__file__), "and all_reduce on it: ok")
' || fail "$name: import ddp from the installed package"
}

# The installed tree must hold everything a user needs and nothing from the tests.
check_tree() {
  local prefix="$1" name="$2"
  for f in bin/ddprun include/ddp/ddp.hpp include/ddp/version.hpp \
           include/ddp/torch/ddp/distributed_data_parallel.hpp \
           lib/cmake/ddp/ddpConfig.cmake lib/cmake/ddp/ddpConfigVersion.cmake \
           lib/cmake/ddp/ddpTargets.cmake share/man/man1/ddprun.1.gz share/doc/ddp/ddprun.md; do
    [[ -e "$prefix/$f" ]] || fail "$name: $f is missing"
  done
  ls "$prefix"/lib*/libddp_torch.a "$prefix"/lib*/libddp_comm.a >/dev/null 2>&1 ||
    fail "$name: the static libraries are missing"
  if grep -rl "gtest\|DDP_SNAPSHOT_TEST" "$prefix/include" >/dev/null; then
    fail "$name: test code in the public headers: $(grep -rl 'gtest\|DDP_SNAPSHOT_TEST' "$prefix/include")"
  fi
  [[ "$("$prefix/bin/ddprun" --version)" == "ddprun (ddp) $VERSION" ]] ||
    fail "$name: ddprun --version says '$("$prefix/bin/ddprun" --version)'"
  # Read once, then searched: `gzip -dc | grep -q` fails under pipefail once the page outgrows
  # the pipe's buffer (grep exits at its match, gzip dies of SIGPIPE).
  local man
  man="$(gzip -dc "$prefix/share/man/man1/ddprun.1.gz")" || fail "$name: the man page is unreadable"
  grep -q "^\.TH DDPRUN 1 .*ddp $VERSION" <<<"$man" ||
    fail "$name: the man page does not carry version $VERSION"
  for sub in doctor trace; do
    grep -q "^\.B ddprun $sub" <<<"$man" || fail "$name: the man page's synopsis lacks 'ddprun $sub'"
  done
}

echo "== cmake --install into a fresh prefix"
cmake --install "$BUILD" --prefix "$WORK/install/usr" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "cmake --install"; }
check_tree "$WORK/install/usr" "install prefix"
check_python "$WORK/install/usr" "install prefix"
build_and_run_consumer "$WORK/install/usr" install

echo "== cpack -G DEB"
(cd "$BUILD" && cpack -G DEB -B "$WORK/deb" >"$WORK/cpack.log" 2>&1) ||
  { cat "$WORK/cpack.log"; fail "cpack -G DEB"; }
deb="$(ls "$WORK"/deb/ddp_"$VERSION"_*.deb)"
info="$(dpkg-deb --info "$deb")"
echo "$info" | sed -n '/Package:/,$p'
grep -q "^ Package: ddp$" <<<"$info" || fail "package name"
grep -q "^ Version: $VERSION$" <<<"$info" || fail "package version"
grep -q "^ Description: distributed data-parallel training in C++" <<<"$info" || fail "package summary"
if grep -q "^  ;" <<<"$info"; then fail "CMake list separators in the package description"; fi
# shlibdeps found ddprun's shared libraries (libc, libstdc++, fmt, spdlog ...) ...
grep -q "^ Depends: .*libc6 (>= " <<<"$info" || fail "no shlibdeps-computed libc6 dependency"
grep -q "^ Depends: .*libstdc++6 (>= " <<<"$info" || fail "no shlibdeps-computed libstdc++6 dependency"
# ... and the -dev packages the CMake package's find_dependency calls need are there too.
for dep in libgloo-dev libfmt-dev libspdlog-dev; do
  grep -q "^ Depends: .*$dep" <<<"$info" || fail "Depends lacks $dep"
done
dpkg-deb -x "$deb" "$WORK/deb-root"
check_tree "$WORK/deb-root/usr" ".deb"
check_python "$WORK/deb-root/usr" ".deb"
build_and_run_consumer "$WORK/deb-root/usr" deb
echo "PASS: installed and packaged ddp build and run a find_package(ddp) trainer at 2 ranks"
