# Sourced by the package tests. run_job VENV WHAT: tests/package/pip/job.py at 2 ranks with
# VENV's own ddprun and python3 (its bin/ first on PATH, as after `activate`); each rank must
# report ddp from VENV, all_reduce and DDP. Uses the caller's SOURCE, WORK and fail().
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
