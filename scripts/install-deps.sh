#!/usr/bin/env bash
# Installs every Debian package ddp needs that is missing, then makes the Python environment:
# a virtual environment at $DDP_VENV (default .venv/ in the checkout) with the exact pins of
# scripts/requirements.txt (torch 2.13.0 from the package index; its LibTorch is the one the C++
# build uses). The test profile adds the training frameworks of scripts/requirements-frameworks.txt
# (tests/frameworks/), installed after torch. Idempotent: when everything is present it touches
# neither the network, dpkg nor pip. Usage: install-deps.sh [main|test] [system|python]
# The second argument does one part only: `system` the Debian packages, `python` the virtual
# environment (scripts/test.sh builds the sanitizer trees, which need no Python, while pip runs).
set -euo pipefail

profile="${1:-main}"
part="${2:-all}"
case "$profile/$part" in
  main/all | main/system | main/python | test/all | test/system | test/python) ;;
  *) echo "install-deps: usage: install-deps.sh [main|test] [system|python] (got: $*)" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${DDP_VENV:-$root/.venv}"
requirements="$root/scripts/requirements.txt"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libgloo-dev libopenmpi-dev openmpi-bin
  libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libssl-dev zlib1g-dev
  libcurl4-openssl-dev
  dataset-fashion-mnist
  libgtest-dev libgmock-dev libbenchmark-dev
  # eu-stack: native stacks of C++ workers for `ddprun stacks` and ddprun's reports.
  elfutils
)
if [[ "$profile" == "test" ]]; then
  # Multi-host tests (ip netns), the fuzz target, the SLURM cluster test. The sanitizer stage's
  # runtimes (libasan8, libubsan1, libtsan2) come with build-essential's g++-12.
  packages+=(iproute2 clang libclang-rt-14-dev procps psmisc slurm-wlm munge)
  # The bare-system test of the wheel and the C++ package (tests/package/bare_root_test.sh)
  # makes a minimal Debian root with debootstrap.
  packages+=(debootstrap)
  # Debian's two BLAS builds, for the tests of ddp's BLAS check (`ddprun doctor`, DDP's warning
  # about the reference BLAS), which preload each. The PyTorch wheel's LibTorch carries its own
  # BLAS (MKL) and loads neither; a LibTorch linked against the system's libblas.so.3 does.
  packages+=(libblas3 libopenblas0-openmp)
  # The etcd rendezvous tests (tests/rendezvous/etcd_test.sh, etcd_tests) start a real etcd
  # and make TLS certificates with openssl.
  packages+=(etcd-server openssl)
fi

# The virtual environment's base interpreter: $DDP_PYTHON_BASE, else the python3 on PATH, when it
# is CPython 3.11 (the torch wheel is cp311) with the venv module and Python's headers (the
# extension compiles against them); else Debian's python3.11 with python3-venv and python3-dev.
base_python="${DDP_PYTHON_BASE:-$(command -v python3 || true)}"
usable_base() {
  [[ -n "$1" ]] && "$1" -c 'import sys, sysconfig, os, venv, ensurepip
assert sys.version_info[:2] == (3, 11)
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null
}
if [[ ! -x "$venv/bin/python" ]] && ! usable_base "$base_python"; then
  packages+=(python3 python3-venv python3-dev)
  base_python=/usr/bin/python3
fi

missing=()
[[ "$part" == python ]] && packages=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [[ "$part" == python ]]; then
  :
elif ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    SUDO=sudo
  else
    SUDO=
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ "$part" == system ]] && exit 0

# The venv records the requirements it was made from; the same file again installs nothing.
stamp="$venv/.ddp-requirements.txt"
if [[ -x "$venv/bin/python" ]] && cmp -s "$requirements" "$stamp"; then
  echo "install-deps: $venv has scripts/requirements.txt"
else
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "install-deps: making the virtual environment $venv with $base_python"
    "$base_python" -m venv "$venv"
  fi
  echo "install-deps: installing scripts/requirements.txt into $venv"
  # torch first, alone: with 2.13.0 present, nothing after it can pull another torch.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$(grep -m1 '^torch==' "$requirements")"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi

# The test profile adds the training frameworks of tests/frameworks/ (Accelerate, Lightning,
# Transformers), after torch is in so that its 2.13.0 satisfies their torch requirement; their
# own stamp, so a changed pin reinstalls only them.
if [[ "$profile" == "test" ]]; then
  frameworks="$root/scripts/requirements-frameworks.txt"
  frameworks_stamp="$venv/.ddp-requirements-frameworks.txt"
  if cmp -s "$frameworks" "$frameworks_stamp"; then
    echo "install-deps: $venv has scripts/requirements-frameworks.txt"
  else
    echo "install-deps: installing scripts/requirements-frameworks.txt into $venv"
    torch_pin="$(grep -m1 '^torch==' "$requirements")"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$frameworks" "$torch_pin"
    cp "$frameworks" "$frameworks_stamp"
  fi
fi
