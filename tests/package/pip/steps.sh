# Steps the package tests share (sourced; they use the caller's SOURCE, BUILD, WORK and fail()).

# use_main_build_compilers: CC and CXX exported as the main build tree (BUILD) has them. ccache
# hashes the compiler's name, and CMake under pip would pick gcc/g++ where the main build has
# cc/c++ (the same compiler under other names) or clang: only with the same names do pip's
# builds get the main build's objects back.
use_main_build_compilers() {
  CC="$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
  CXX="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
  export CC CXX
}

# build_wheel PYTHON BUILD_DIR: scripts/wheel.sh by PYTHON (pip wheel, auditwheel repair) in
# BUILD_DIR, into WORK/wheels; sets `wheel` to the wheel's path and prints its name and size.
build_wheel() {
  local python="$1" build_dir="$2"
  DDP_PYTHON="$python" DDP_WHEEL_BUILD_DIR="$build_dir" \
    DDP_WHEEL_TOOLS_VENV="$BUILD/wheel-tools-venv" "$SOURCE/scripts/wheel.sh" "$WORK/wheels" \
    >"$WORK/wheel.log" 2>&1 || { tail -n 60 "$WORK/wheel.log"; fail "scripts/wheel.sh"; }
  wheel="$(tail -n 1 "$WORK/wheel.log")"
  [[ -f "$wheel" ]] || { cat "$WORK/wheel.log"; fail "scripts/wheel.sh did not name its wheel last"; }
  echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
}

# run_job VENV WHAT: tests/package/pip/job.py at 2 ranks with VENV's own ddprun and python3
# (its bin/ first on PATH, as after `activate`); each rank must report ddp from VENV,
# all_reduce and DDP.
run_job() {
  local venv="$1" what="$2" out
  echo "== 2 ranks with the environment's ddprun and ddp ($what)"
  [[ -x "$venv/bin/ddprun" ]] || fail "$what: no ddprun in the environment's bin/"
  out=$(cd "$WORK" && PATH="$venv/bin:$PATH" timeout 180 ddprun --standalone \
          --nproc-per-node 2 "$SOURCE/tests/package/pip/job.py" "$venv" 2>&1) ||
    { echo "$out"; fail "$what: the 2-rank job"; }
  echo "$out"
  for rank in 0 1; do
    grep -q "rank $rank of 2: ddp from the environment, all_reduce and DDP ok" <<<"$out" ||
      fail "$what: rank $rank did not report success"
  done
}

# bare_root_unavailable: why package.bare_root cannot run on this machine (empty when it can):
# debootstrap, chroot and the root's mounts need root and these tools.
bare_root_unavailable() {
  [[ "$(id -u)" == 0 ]] || { echo "debootstrap, chroot and the root's mounts need root (CI runs as root)"; return; }
  local tool
  for tool in debootstrap unshare chroot; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed (scripts/install-deps.sh test installs it)"; return; }
  done
}

# dist_wheel: the wheel package.dist (tests/package/dist_test.sh) left in BUILD/package-dist.
dist_wheel() {
  local found
  found="$(ls "$BUILD"/package-dist/ddp-*.whl 2>/dev/null | head -n 1)"
  [[ -f "$found" ]] || fail "no wheel in $BUILD/package-dist: run package.dist first (ctest runs it as this test's fixture)"
  echo "$found"
}
