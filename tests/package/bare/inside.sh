#!/usr/bin/env bash
# Runs inside the bare Debian root of tests/package/bare_root_test.sh, as its user `trainer`
# (not root), installing from local files only (pip --no-index): what a user on a machine
# without ddp's dependencies does.
#   1. python3 -m venv; pip install torch, ddp's wheel, CMake and Ninja from IN/wheels only.
#   2. tests/package/pip/wheel_jobs.sh: ddprun and ddp._C load every library from the wheel;
#      2-rank jobs on the ddp backend and PyTorch's gloo, without `import ddp` (ddprun,
#      --recovery step, torchrun), and `ddprun --recovery step` with a rank killed mid-step.
#   3. The C++ consumer built against the relocatable package (find_package(ddp), the
#      environment's LibTorch), run at 2 ranks under the package's ddprun; it saves a ddp
#      snapshot, which the environment's Python reads with torch.load.
# Usage: inside.sh IN   (IN: the folder the test copied the wheels, the C++ package and
# tests/package/ into)
set -euo pipefail
in="$1"
fail() { echo "FAIL (inside the bare root): $*"; exit 1; }
say() { echo "== $*"; }

say "python3 -m venv, then pip install torch, ddp's wheel, cmake and ninja (no index)"
python3 -m venv ~/venv
~/venv/bin/pip install -q --no-index --no-compile --disable-pip-version-check \
  --find-links "$in/wheels" "$(cat "$in/torch-pin")" "$in"/ddp-*.whl -r "$in/package/bare/requirements.txt" ||
  fail "pip install"
bash "$in/package/pip/wheel_jobs.sh" ~/venv "$(mkdir -p ~/jobs && echo ~/jobs)" || fail "the wheel's jobs"
export PATH="$HOME/venv/bin:$PATH"

say "the C++ consumer against the relocatable package"
mkdir -p ~/cpp && tar -C ~/cpp -xzf "$in"/ddp-*-linux-*.tar.gz
package="$(echo ~/cpp/ddp-*)"
cmake -S "$in/package/consumer" -B ~/consumer -G Ninja \
  -DCMAKE_PREFIX_PATH="$package" >~/configure.log 2>&1 || { cat ~/configure.log; fail "configuring the consumer"; }
grep "ddp .* from $package" ~/configure.log || { cat ~/configure.log; fail "find_package(ddp) did not find the package"; }
cmake --build ~/consumer >~/build.log 2>&1 || { cat ~/build.log; fail "building the consumer"; }
deps="$(ldd ~/consumer/consumer)"
grep -q "not found" <<<"$deps" && fail "the consumer lacks libraries: $(grep "not found" <<<"$deps")"
for lib in libfmt libspdlog libcurl libgloo; do
  line="$(grep "$lib\." <<<"$deps" || true)"
  [[ -z "$line" || "$line" == *"=> $package/lib/ddp-libs/"* ]] ||
    fail "the consumer loads $lib from outside the package: $line"
done
mkdir -p ~/snapshot
out="$(timeout 180 "$package/bin/ddprun" --standalone --nproc-per-node 2 ~/consumer/consumer \
         ~/snapshot/snapshot.pt 2>&1)" || { echo "$out"; fail "the consumer under the package's ddprun"; }
echo "$out" | grep "consumer rank"
for rank in 0 1; do
  grep -q "consumer rank $rank of 2: .*, 8 steps, parameters equal across ranks" <<<"$out" ||
    fail "consumer rank $rank did not report equal parameters"
done
snapshot="$(sed -n 's/^consumer rank 0: snapshot saved to //p' <<<"$out")"
[[ -f "$snapshot" ]] || fail "the consumer saved no snapshot ($snapshot)"

say "torch.load of the consumer's ddp snapshot"
python - "$snapshot" <<'PY' || fail "torch.load of $snapshot"
import sys
import torch
s = torch.load(sys.argv[1])
assert s["FORMAT"] == "ddp-snapshot-1" and s["EPOCHS_RUN"] == 1, (s["FORMAT"], s["EPOCHS_RUN"])
net = torch.nn.Linear(20, 1)
net.load_state_dict(s["MODEL_STATE"])
print(f"torch.load: {sorted(s)}; MODEL_STATE loads into Linear(20, 1)")
PY
echo "PASS inside the bare root"
