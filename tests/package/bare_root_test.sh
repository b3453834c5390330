#!/usr/bin/env bash
# Proof on a bare system (issue 51): a minimal Debian root made with debootstrap holds only
# Python, venv and a compiler (none of ddp's dependencies: no Gloo, fmt, spdlog, curl, MPI), and
# a user who is not root installs and runs ddp there as from a shared cluster's login node:
# tests/package/bare/inside.sh (pip install of torch and ddp's wheel into a fresh venv with no
# index; the wheel's jobs of tests/package/pip/wheel_jobs.sh: ddp and gloo, no `import ddp`,
# `ddprun --recovery step` with a kill; the C++ consumer built against the relocatable package of
# scripts/cpp_package.sh; torch.load of the snapshot it saves).
#
# Here, as root: the wheel and the C++ package of package.dist (this test's fixture), `pip
# download` of the other wheels the root's user installs, then the root's run in a private mount
# namespace (its own /proc and /dev/shm, gone when it ends) under `chroot --userspec`.
# The root is kept in BUILD/bare-root for the next run (debootstrap: about a minute).
#
# Skips (77), saying why, where it cannot run: not root, or no debootstrap/unshare.
# Usage: bare_root_test.sh BUILD_DIR SOURCE_DIR PYTHON   (PYTHON: the build's interpreter)
set -euo pipefail
usage="usage: bare_root_test.sh BUILD_DIR SOURCE_DIR PYTHON"
BUILD="$(realpath "${1:?$usage}")"
SOURCE="$(realpath "${2:?$usage}")"
PYTHON="${3:?$usage}"
fail() { echo "FAIL: $*"; exit 1; }
source "$SOURCE/tests/package/pip/steps.sh"  # bare_root_unavailable, dist_wheel
unavailable="$(bare_root_unavailable)"
[[ -z "$unavailable" ]] || { echo "SKIP: $unavailable"; exit 77; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$BUILD/bare-root"
user=trainer
home="$ROOT/home/$user"

# The host's own release (the wheel's manylinux tag needs its glibc or newer), from the mirror
# apt uses (DDP_DEBIAN_MIRROR overrides).
suite="$(. /etc/os-release && echo "${VERSION_CODENAME:?}")"
mirror="${DDP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if [[ ! -f "$ROOT/.ddp-bare-root-$suite" ]]; then
  echo "== debootstrap --variant=minbase $suite (python3-venv, g++) from $mirror"
  rm -rf "$ROOT"
  # In a mount namespace of its own: the /proc and /sys debootstrap mounts in the root go with
  # it, even when it is killed (no mount left behind for the next run's rm -rf to descend into).
  unshare --mount --propagation private -- \
    debootstrap --variant=minbase --include=python3-venv,g++ "$suite" "$ROOT" "$mirror" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log"; fail "debootstrap"; }
  chroot "$ROOT" useradd --create-home --shell /bin/bash "$user"
  touch "$ROOT/.ddp-bare-root-$suite"
fi
# As Debian's installer writes it: this machine's name resolves (gloo binds to its address).
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" >"$ROOT/etc/hosts"
# Bare: none of the libraries ddp's source build needs from Debian.
for lib in libgloo libfmt libspdlog libcurl libmpi; do
  found="$(find "$ROOT/usr/lib" "$ROOT/lib" -name "$lib.so*" 2>/dev/null | head -n 1)"
  [[ -z "$found" ]] || fail "the bare root has $lib: $found"
done
echo "the root has none of Gloo, fmt, spdlog, curl, MPI; user: $user (uid $(chroot "$ROOT" id -u "$user"))"

wheel="$(dist_wheel)"
package="$(ls "$BUILD"/package-dist/ddp-*-linux-*.tar.gz)"
echo "from package.dist: $(basename "$wheel"), $(basename "$package")"

# What the root's user installs from: the wheels, the package, the jobs and the consumer.
in="$home/in"
rm -rf "$home" && mkdir -p "$in/wheels"  # a fresh home: no cache or venv of an earlier run
torch_pin="$(grep -m1 '^torch==' "$SOURCE/scripts/requirements.txt")"
"$PYTHON" -m pip download -q --disable-pip-version-check -d "$BUILD/bare-root-wheels" "$torch_pin" \
  -r "$SOURCE/tests/package/bare/requirements.txt" >"$WORK/download.log" 2>&1 ||
  { cat "$WORK/download.log"; fail "pip download of the root's wheels"; }
cp "$BUILD/bare-root-wheels"/*.whl "$in/wheels/"
echo "$torch_pin" >"$in/torch-pin"
cp "$wheel" "$package" "$in/"
cp -r "$SOURCE/tests/package" "$in/package"
chroot "$ROOT" chown -R "$user:$user" "/home/$user"

echo "== inside the root as $user"
# A private mount namespace: the root's /proc and /dev/shm (the cpu backend's shared memory)
# are unmounted by the kernel when the namespace's last process ends, however this ends.
mkdir -p "$ROOT/dev/shm"
timeout 900 unshare --mount --propagation private -- bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount -t tmpfs -o mode=1777 tmpfs "$1/dev/shm"
  exec chroot --userspec="$2:$2" "$1" /usr/bin/env -i HOME="/home/$2" USER="$2" LANG=C.UTF-8 \
    PATH=/usr/local/bin:/usr/bin:/bin /bin/bash "/home/$2/in/package/bare/inside.sh" "/home/$2/in"' \
  _ "$ROOT" "$user" || fail "the run inside the bare root (its output is above)"
echo "PASS: a bare Debian root, as a user who is not root: the wheel's ddp and gloo jobs, --recovery step with a kill, the C++ consumer of the relocatable package and torch.load of its snapshot"
