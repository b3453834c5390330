#!/usr/bin/env bash
# Installs every Debian package ddp needs that is missing. Idempotent: when everything is
# present it touches neither the network nor dpkg. Usage: install-deps.sh [main|test]
set -euo pipefail

profile="${1:-main}"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libopenmpi-dev openmpi-bin
  libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libssl-dev zlib1g-dev
  dataset-fashion-mnist python3-torch
  # The Python layer (`import ddp`, the "ddp" torch.distributed backend): pybind11 and the
  # headers of the interpreter python3-torch is built for.
  pybind11-dev python3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # LibTorch's Linear layers call libblas.so.3. Without an optimized BLAS (libtorch Recommends
  # one; --no-install-recommends drops it) that is the reference BLAS, and the CNN's step takes
  # 117 ms instead of 40 ms. The OpenMP build follows torch::set_num_threads and
  # OMP_NUM_THREADS, so ranks do not oversubscribe the cores.
  libopenblas0-openmp
)
if [[ "$profile" == "test" ]]; then
  # Multi-host tests (ip netns), the fuzz target, the SLURM cluster test. The sanitizer stage's
  # runtimes (libasan8, libubsan1, libtsan2) come with build-essential's g++-12.
  packages+=(iproute2 clang libclang-rt-14-dev procps psmisc slurm-wlm munge)
fi

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
