#!/usr/bin/env bash
# What a Python user runs after `pip install <ddp wheel>` into a virtual environment holding
# torch: tests/package/bare/inside.sh runs it in a bare Debian root (package.bare_root); where
# that test cannot run, tests/package/pip_install_test.sh runs it on this machine instead.
#   1. The environment's ddprun and ddp._C find every library they load, and take Gloo, curl,
#      spdlog and fmt from the wheel (ldd).
#   2. 2-rank jobs with the environment's ddprun: the ddp backend and PyTorch's gloo (job.py).
#   3. No `import ddp` (no_import_job.py): the environment registers the backend through torch's
#      plugin entry point, under ddprun, under --recovery step (the script imports ddp only
#      after init_process_group and must still get ddprun's store) and under torchrun.
#   4. `ddprun --recovery step` with rank 1 killed mid-step (recovery_job.py): its replacement
#      runs in ddprun's warm spare.
# Usage: wheel_jobs.sh VENV WORK   (WORK: an empty folder the jobs may write)
set -euo pipefail
venv="$(realpath "${1:?usage: wheel_jobs.sh VENV WORK}")"
work="$(realpath "${2:?usage: wheel_jobs.sh VENV WORK}")"
here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
export PATH="$venv/bin:$PATH"  # as after `activate`

site="$(python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')"
for elf in "$site"/ddp.scripts/ddprun "$site"/ddp/_C.*.so; do
  deps="$(LD_LIBRARY_PATH= ldd "$elf")"
  # Every library found (torch's: _C's RUNPATH reaches the environment's torch/lib).
  if grep -q "not found" <<<"$deps"; then
    fail "$(basename "$elf") of the installed wheel lacks libraries: $(grep "not found" <<<"$deps")"
  fi
  for lib in libgloo libcurl libspdlog libfmt libmpi; do
    line="$(grep "$lib[.-]" <<<"$deps" || true)"
    [[ -z "$line" || "$line" == *"=> $site/"*"ddp.libs/$lib-"* ]] ||
      fail "$(basename "$elf") loads $lib from outside the wheel: $line"
  done
done
echo "ddprun and ddp._C of the wheel load every library, Gloo, curl, spdlog and fmt from the wheel"

# expect_ranks OUTPUT TEXT: each of the 2 ranks printed a line "rank R of 2: TEXT".
expect_ranks() {
  for rank in 0 1; do
    grep -q "rank $rank of 2: $2" <<<"$1" || { echo "$1"; fail "rank $rank did not print '$2'"; }
  done
  grep "rank [01] of 2: " <<<"$1"
}
cd "$work"
for backend in cpu:ddp gloo; do
  echo "== 2 ranks on $backend with the environment's ddprun"
  out="$(timeout 180 ddprun --standalone --nproc-per-node 2 "$here/job.py" "$venv" "$backend" 2>&1)" ||
    { echo "$out"; fail "the 2-rank job on $backend"; }
  expect_ranks "$out" "ddp from the environment, all_reduce and DDP ok ($backend)"
done

# no_import_job WHAT EXPECTED LAUNCHER [FLAGS...]: each rank's line must end with EXPECTED.
no_import_job() {
  local what="$1" expected="$2" out
  shift 2
  echo "== init_process_group(\"ddp\") without import ddp ($what)"
  out="$(timeout 120 "$@" --standalone --nproc-per-node 2 "$here/no_import_job.py" "$venv" 2>&1)" ||
    { echo "$out"; fail "no import ddp, $what"; }
  expect_ranks "$out" "no import ddp, $expected\$"
}
no_import_job ddprun "all_reduce ok" ddprun
no_import_job "ddprun --recovery step" "all_reduce ok, ddp.StepManager on ddprun's store ok" \
  ddprun --recovery step
no_import_job torchrun "all_reduce ok" torchrun

echo "== ddprun --recovery step, rank 1 killed in step 3"
mkdir -p "$work/recovery"
out="$(timeout 180 ddprun --standalone --nproc-per-node 2 --recovery step --max-restarts 2 \
         "$here/recovery_job.py" "$work/recovery" 2>&1)" || { echo "$out"; fail "the --recovery step job"; }
[[ -f "$work/recovery/killed" ]] || { echo "$out"; fail "rank 1 was never killed"; }
expect_ranks "$out" "step 6, recoveries [0-9]*, parameters equal across ranks"
# The survivor re-formed the group; the replacement joined the new one (no re-form of its own).
grep -q "rank 0 of 2: step 6, recoveries [1-9]" <<<"$out" || { echo "$out"; fail "rank 0 never re-formed the group"; }
# The replacement ran in ddprun's warm spare: the wheel's ddp.warm_spare, in this environment's
# Python (as a user who is not root: at normal priority, docs/recovery.md).
grep -q "rank 1 runs in the warm spare" <<<"$out" || { echo "$out"; fail "rank 1 did not run in the warm spare"; }
echo "PASS: the wheel's jobs"
