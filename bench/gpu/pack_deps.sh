#!/usr/bin/env bash
# Packs what ddp's build needs besides PyTorch, CUDA and NCCL into one folder, for a GPU machine
# that reaches no package registry (bench/gpu/README.md, "An offline GPU machine").
#
#   bench/gpu/pack_deps.sh [DEST]        (default: <repo>/.gpu-deps, which git ignores)
#
# Runs on a Debian 12 machine with apt (as root or not: `apt-get download` needs neither). It
# downloads the Debian packages below and unpacks them, without installing, under DEST/root,
# a prefix that verify.sh puts on CMAKE_PREFIX_PATH and LD_LIBRARY_PATH (DEPS_DIR=DEST). The
# libraries are Debian 12's (glibc 2.36), so they load on any x86-64 Linux with glibc >= 2.36
# (Ubuntu 24.04 and later). Also copied, when present: Fashion-MNIST (DEST/fashion-mnist, for
# the mnist example) and the PyTorch tutorials (DEST/seeds, SEEDS_DIR, default ../shared/seeds)
# whose GPU scripts verify.sh runs under ddprun unmodified.
#
# WHEELS_PYTHON=3.12 (the GPU machine's Python, X.Y; default none): also the wheels tutorial
# 004's scripts need beyond torch, for that Python, in DEST/wheels (about 12 MB): torchvision
# TORCHVISION_VERSION (default 0.26.0, the one made for PyTorch 2.11: PyPI's links CUDA 13) and
# pillow. verify_python.sh installs them into a temporary folder only when its Python lacks
# torchvision. Mind the size: what travels to the lent GPU machine is limited to 64 MiB.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.gpu-deps}
SEEDS_DIR=${SEEDS_DIR:-$ROOT/../shared/seeds}
MNIST_DIR=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}

# Build dependencies (cmake/Dependencies.cmake) and the shared libraries they load at run time.
# OpenSSL and zlib are taken too: a machine may have their libraries but not their headers.
packages=(
  libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libcli11-dev nlohmann-json3-dev
  libgloo-dev libgloo0 libhiredis0.14 libhiredis-dev libibverbs1 libnl-3-200 libnl-route-3-200
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  libssl-dev libssl3 zlib1g-dev zlib1g
)

debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
(cd "$debs" && chmod 777 . && apt-get download "${packages[@]}" >/dev/null) || {
  echo "pack_deps: apt-get download failed; run 'apt-get update' first (needs Debian 12's" \
    "package lists)" >&2
  exit 1
}
rm -rf "$DEST/root"
mkdir -p "$DEST/root"
for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$DEST/root"; done

# Gloo's CMake package names its library by absolute path (/usr/lib/libgloo.so...): make it
# relative to the package's own prefix so the unpacked copy is found, not a system one.
sed -i 's|"/usr/lib/libgloo|"${_IMPORT_PREFIX}/lib/libgloo|g' \
  "$DEST"/root/usr/share/cmake/Gloo/GlooTargets-*.cmake
# Absolute symbolic links (/usr/lib/...) would point outside the copy: make them relative, so
# the folder can move (it travels to the GPU machine).
find "$DEST/root" -type l | while read -r link; do
  target=$(readlink "$link")
  case $target in /*) ln -sfnr "$DEST/root$target" "$link" ;; esac
done
# OpenSSL's configuration headers live in Debian's multiarch include folder, which compilers
# search only under /usr: put them beside the others.
cp -n "$DEST"/root/usr/include/x86_64-linux-gnu/openssl/* "$DEST"/root/usr/include/openssl/
# Docs and the static libraries ddp does not link (it links OpenSSL, zlib and hiredis
# dynamically; GoogleTest's are kept) only add to what travels.
rm -rf "$DEST"/root/usr/share/doc "$DEST"/root/usr/share/man "$DEST"/root/usr/src
find "$DEST/root" \( -name 'libcrypto.a' -o -name 'libssl.a' -o -name 'libz.a' \
  -o -name 'libhiredis.a' \) -delete

if [ -d "$MNIST_DIR" ]; then
  mkdir -p "$DEST/fashion-mnist" && cp "$MNIST_DIR"/*.gz "$DEST/fashion-mnist/"
fi
if [ -d "$SEEDS_DIR" ]; then
  mkdir -p "$DEST/seeds" && cp "$SEEDS_DIR"/* "$DEST/seeds/"
fi
rm -rf "$DEST/wheels"
if [ -n "${WHEELS_PYTHON:-}" ]; then
  mkdir -p "$DEST/wheels"
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$WHEELS_PYTHON" --platform manylinux_2_28_x86_64 -d "$DEST/wheels" \
    "torchvision==${TORCHVISION_VERSION:-0.26.0}" pillow
fi
du -sh "$DEST" | awk '{print "pack_deps: " $1 " in " $2}'
