#!/usr/bin/env bash
# GPU verification of ddp in one run, on a machine with an NVIDIA GPU, a PyTorch 2.x wheel with
# CUDA (its LibTorch is what ddp builds against), NCCL, nvcc, and no internet. See README.md.
#
#   bench/gpu/verify.sh [OUT_DIR]          (default: $OUT, else ./gpu-verify-<date>)
#
# Environment: PYTHON (the python3 with torch; default python3), BUILD_DIR (default
# <repo>/build-cuda), JOBS (default nproc), CUDA_HOME (default /usr/local/cuda), NCCL_ROOT
# (default: pip's nvidia-nccl package beside torch, else next to CUDA), ROUNDS (step-time
# rounds, default 2), CPU_WORLDS (default "2 4 8"), CPU_STEPS (CNN steps per CPU run, default
# 30), FASHION_MNIST_DIR (default /usr/share/datasets/fashion-mnist), STEP_DEVICE (default cuda;
# "cpu" runs the step-time section on the CPU: a smoke test of this script without a GPU),
# STEP_ARGS (extra arguments of both step benchmarks, e.g. "--steps 5 --blocks 3"), DEPS_DIR
# (default <repo>/.gpu-deps when present: the Debian packages bench/gpu/pack_deps.sh unpacked,
# for a machine without them and without a registry), SKIP (sections left out, of: probe tests
# recovery example step one_gpu data_parallel python cpu), MULTIRANK_FILTER / PROCESSES_FILTER /
# CUDA_FILTER (gtest filters of test_ddp_multirank / test_ddp_processes / test_ddp_cuda in a
# TARGETS run), PYTHON_PARTS (verify_python.sh's parts: cuda tutorial frameworks reform).
#
# Steps (each one JSON status line in results.jsonl, "status": ok | failed | skipped + reason):
#   env        GPU, driver, torch/CUDA/NCCL versions, ABI of the wheel
#   configure  cmake against the wheel's LibTorch (torch_cuda=ON and the nccl backend expected)
#   build      the targets below, together, then each on its own (a failure names the target)
#   probe      which std::filesystem::remove_all a program linked against this LibTorch runs
#              (remove_all_probe.sh) and the DT_NEEDED order of the test programs
#   tests      comm_nccl_test (collectives at world 1, and 2/4 with that many GPUs),
#              test_ddp_cuda (DDP equivalence on CUDA), the whole ddp suite (ctest -L ddp)
#   recovery   ddprun --recovery step, world 2 on GPU 0, a rank killed: bitwise equal to a run
#              without the kill (C++ worker on ddp's cpu backend, Python worker on PyTorch's gloo)
#   example    mnist --device cuda under ddprun (1 rank; accuracy line)
#   step       step time, CNN and ResNet-18, world 1 (and all GPUs when more than one):
#              ddp DDP, plain LibTorch, PyTorch DDP (torchrun, nccl), plain PyTorch; ROUNDS
#              rounds in alternating order; summary with ddp/pytorch ratios
#   cpu        CPU all-reduce (ddp cpu and gloo vs PyTorch gloo) and the Fashion-MNIST CNN
#              (ddp DDP vs PyTorch DDP on gloo) at world sizes CPU_WORLDS
# Results: OUT_DIR/results.jsonl (every JSON line), OUT_DIR/logs/*.log. Exit status 1 when a
# build, test or example step failed, else 0 (skipped steps do not fail the run).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${1:-${OUT:-$PWD/gpu-verify-$(date +%Y%m%d-%H%M%S)}}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD_DIR:-$ROOT/build-cuda}
JOBS=${JOBS:-$(nproc)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
ROUNDS=${ROUNDS:-2}
CPU_WORLDS=${CPU_WORLDS-"2 4 8"}  # empty: no CPU benchmarks
CPU_STEPS=${CPU_STEPS:-30}
DEPS_DIR=${DEPS_DIR:-}
[ -z "$DEPS_DIR" ] && [ -d "$ROOT/.gpu-deps/root" ] && DEPS_DIR=$ROOT/.gpu-deps
MNIST_DIR=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ ! -d "$MNIST_DIR" ] && [ -n "$DEPS_DIR" ] && [ -d "$DEPS_DIR/fashion-mnist" ] && MNIST_DIR=$DEPS_DIR/fashion-mnist
STEP_DEVICE=${STEP_DEVICE:-cuda}
STEP_ARGS=${STEP_ARGS:-}
mkdir -p "$OUT_DIR/logs"
RESULTS=$OUT_DIR/results.jsonl
LOGS=$OUT_DIR/logs
: >"$RESULTS"
FAILED=0

# record STEP STATUS [key=value ...]: one JSON status line (values that parse as JSON stay JSON).
record() {
  "$PYTHON" - "$@" <<'PY' | tee -a "$RESULTS" || true
import json, sys
step, status, *kv = sys.argv[1:]
out = {"bench": "gpu_verify", "step": step, "status": status}
for item in kv:
    k, _, v = item.partition("=")
    try:
        out[k] = json.loads(v)
    except ValueError:
        out[k] = v
print(json.dumps(out), flush=True)
PY
  [ "$2" = failed ] && FAILED=1
  return 0
}

# JSON lines of a command's output (torchrun's "[default0]:" prefixes removed) into results.
keep_json() { sed -u 's/^\[default[0-9]*\]://' | grep --line-buffered '^{' | tee -a "$RESULTS"; }

have() { command -v "$1" >/dev/null 2>&1; }
# want SECTION: false when SKIP names it (probe tests recovery example step one_gpu data_parallel python
# cpu).
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------- env
pyinfo=$("$PYTHON" - <<'PY' 2>"$LOGS/env.log"
import json, os, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cmake_prefix_path": torch.utils.cmake_prefix_path}
try:
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as e:  # CPU wheel
    info["nccl"] = None
if info["gpus"]:
    info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(info["gpus"])]
nccl_root = None
try:  # pip's NCCL beside torch: nvidia/nccl (cu12 wheels) or another folder under nvidia/ (cu13)
    import glob, nvidia
    for base in nvidia.__path__:
        for header in sorted(glob.glob(os.path.join(base, "**", "include", "nccl.h"), recursive=True)):
            nccl_root = os.path.dirname(os.path.dirname(header))
            break
except Exception:
    pass
info["pip_nccl_root"] = nccl_root
print(json.dumps(info))
PY
)
if [ -z "$pyinfo" ]; then
  record env failed reason="$PYTHON cannot import torch (see logs/env.log); set PYTHON to the python3 of the PyTorch installation"
  exit 1
fi
pyget() { "$PYTHON" -c "import json,sys; v=json.loads(sys.argv[1]).get('$1'); print('' if v is None else v)" "$pyinfo"; }
TORCH_PREFIX=$(pyget cmake_prefix_path)
GPUS=$(pyget gpus)
ABI=$(pyget cxx11_abi)
NCCL_ROOT=${NCCL_ROOT:-$(pyget pip_nccl_root)}
nvcc_version=$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1)
smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -8 | paste -sd ';')
record env ok python="$PYTHON" torch_info="$pyinfo" nvcc="${nvcc_version:-none}" nvidia_smi="${smi:-none}" \
  cuda_home="$CUDA_HOME" nccl_root="${NCCL_ROOT:-}" cores="$(nproc)"

# ---------------------------------------------------------------- configure
generator=()
have ninja && generator=(-G Ninja)
cmake_args=(-S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
            -DCUDAToolkit_ROOT="$CUDA_HOME" -DDDP_PYTHON="$(command -v "$PYTHON")")
prefix_path=()
if [ -n "$DEPS_DIR" ]; then
  # The unpacked Debian packages come first on CMake's search path, except OpenSSL and zlib
  # when the machine has its own (their libraries are already loaded by Python and must not be
  # shadowed). At run time, only the libraries the machine lacks are put on LD_LIBRARY_PATH
  # (a folder of links): the build tree's RUNPATH covers direct dependencies but not
  # libgloo's own (hiredis, ibverbs).
  prefix_path+=("$DEPS_DIR/root/usr")
  [ -e /usr/include/openssl/ssl.h ] && cmake_args+=(-DOpenSSL_ROOT=/usr -DOPENSSL_ROOT_DIR=/usr)
  [ -e /usr/include/zlib.h ] && cmake_args+=(-DZLIB_ROOT=/usr)
  mkdir -p "$BUILD/deps-runtime"
  known_libs=$(ldconfig -p 2>/dev/null)
  for lib in "$DEPS_DIR"/root/usr/lib/x86_64-linux-gnu/*.so.* "$DEPS_DIR"/root/usr/lib/*.so.* \
    "$DEPS_DIR"/root/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$lib" ] || continue
    grep -q " $(basename "$lib") " <<<"$known_libs" || ln -sfn "$lib" "$BUILD/deps-runtime/"
  done
  export LD_LIBRARY_PATH=$BUILD/deps-runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -n "$NCCL_ROOT" ] && cmake_args+=(-DNCCL_ROOT="$NCCL_ROOT")
if [ "$ABI" = True ]; then
  prefix_path+=("$TORCH_PREFIX")
  torch_note="LibTorch of the wheel"
else
  # An old-ABI wheel cannot be linked with ddp (docs/gpu.md): build the layers below torch.
  cmake_args+=(-DDDP_WITH_TORCH=OFF)
  torch_note="wheel uses the pre-C++11 ABI: torch layer off"
  record configure skipped reason="torch._C._GLIBCXX_USE_CXX11_ABI is False: ddp refuses old-ABI LibTorch; building without the torch layer (CPU all-reduce only)"
fi
cmake_args+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
if cmake "${cmake_args[@]}" >"$LOGS/configure.log" 2>&1; then
  summary=$(grep -E 'ddp: (gloo|nccl)' "$LOGS/configure.log" | paste -sd ';')
  record configure ok torch="$torch_note" summary="$summary"
  grep -q 'torch_cuda=ON' "$LOGS/configure.log" ||
    record configure failed reason="LibTorch was found without CUDA (torch_cuda=OFF): is $TORCH_PREFIX a CUDA wheel?"
  grep -q 'nccl backend on' "$LOGS/configure.log" ||
    record configure failed reason="the nccl backend is off: set CUDA_HOME / NCCL_ROOT (logs/configure.log)"
else
  record configure failed log=logs/configure.log \
    reason="cmake failed; the Debian packages ddp needs are listed in bench/gpu/README.md" \
    tail="$(tail -5 "$LOGS/configure.log" | tr '\n' ' ')"
  exit 1
fi

# ---------------------------------------------------------------- build
targets=(comm_nccl_test test_ddp_cuda test_ddp_units test_ddp_multirank test_ddp_processes
         bench_gpu_step bench_ddp allreduce_bench ddprun mnist gpt ddp_python_ext recovery_worker)
[ -n "${TARGETS:-}" ] && read -ra targets <<<"$TARGETS"  # a subset, for a short run
built=()
# Read once: `cmake ... | grep -q` would fail under pipefail when grep exits early (SIGPIPE).
known_targets=$(cmake --build "$BUILD" --target help 2>/dev/null)
configured=()
for t in "${targets[@]}"; do
  if grep -qE "(^| |\.\.\. )$t(:| |$)" <<<"$known_targets"; then configured+=("$t")
  else record build skipped target="$t" reason="not configured (dependency missing, see logs/configure.log)"; fi
done
# All targets in one build first (every core busy until the end; ninja -k 0 goes past a failing
# target), then each on its own: nothing left to do for those that built, and a failure's log
# names its target.
start=$(date +%s)
keep_going=()
have ninja && keep_going=(-- -k 0)
cmake --build "$BUILD" --target "${configured[@]}" -j "$JOBS" "${keep_going[@]}" >"$LOGS/build-all.log" 2>&1
rc=$?
record build_all "$([ $rc = 0 ] && echo ok || echo failed)" seconds=$(($(date +%s) - start)) \
  targets="${configured[*]}" log=logs/build-all.log
for t in "${configured[@]}"; do
  start=$(date +%s)
  if cmake --build "$BUILD" --target "$t" -j "$JOBS" >"$LOGS/build-$t.log" 2>&1; then
    record build ok target="$t" seconds=$(($(date +%s) - start))
    built+=("$t")
  else
    record build failed target="$t" log="logs/build-$t.log" \
      tail="$(grep -m3 -E 'error|undefined reference' "$LOGS/build-$t.log" | tr '\n' ' ')"
  fi
done
is_built() { local t; for t in "${built[@]}"; do [ "$t" = "$1" ] && return 0; done; return 1; }
bin() { find "$BUILD" -name "$1" -type f -perm -u+x | head -1; }

# ---------------------------------------------------------------- probe
# Which std::filesystem::remove_all a program linked against this LibTorch runs
# (remove_all_probe.sh), and the DT_NEEDED order of a test program as built here.
if want probe; then
  "$ROOT/bench/gpu/remove_all_probe.sh" "$TORCH_PREFIX/../../lib" "$OUT_DIR/probe" 2>>"$LOGS/probe.log" | keep_json
  for t in test_ddp_processes ddprun; do
    is_built $t || continue
    record probe ok binary=$t needed="$(readelf -d "$(bin $t)" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -6 | paste -sd, -)"
  done
fi

# ---------------------------------------------------------------- tests
gtest() {  # name binary [gtest filter]
  local name=$1 exe; exe=$(bin "$2")
  if ! is_built "$2"; then record tests skipped test="$name" reason="$2 not built"; return; fi
  "$exe" --gtest_filter="${3:-*}" --gtest_output="json:$OUT_DIR/$name.json" >"$LOGS/$name.log" 2>&1
  local rc=$?
  local counts; counts=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\]' "$LOGS/$name.log" | grep -E 'tests?[,.]' | tr '\n' ' ')
  if [ $rc -eq 0 ]; then record tests ok test="$name" summary="$counts"
  else record tests failed test="$name" log="logs/$name.log" summary="$counts"; fi
}
want tests && gtest comm_nccl comm_nccl_test
want tests && gtest ddp_cuda test_ddp_cuda "${CUDA_FILTER:-*}"
if ! want tests; then
  :
elif ! { is_built test_ddp_units && is_built gpt; }; then
  # A short run (TARGETS): no whole suite, but the multi-rank and multi-process binaries.
  gtest ddp_multirank test_ddp_multirank "${MULTIRANK_FILTER:-*}"
  gtest ddp_processes test_ddp_processes "${PROCESSES_FILTER:-*}"
elif is_built test_ddp_multirank && is_built test_ddp_processes; then
  if ctest --test-dir "$BUILD" -L ddp -j "$JOBS" --timeout 600 --output-on-failure >"$LOGS/ctest-ddp.log" 2>&1; then
    record tests ok test="ctest -L ddp" summary="$(grep -E 'tests passed' "$LOGS/ctest-ddp.log")"
  else
    record tests failed test="ctest -L ddp" log=logs/ctest-ddp.log summary="$(grep -E 'tests passed' "$LOGS/ctest-ddp.log")"
  fi
fi

# ---------------------------------------------------------------- recovery with CUDA state
# ddprun --recovery step at world 2 on the one GPU, a rank killed mid-run: every rank's
# parameters bitwise equal to a run without the kill, the CUDA generator (dropout) rewound and
# healed (tests/torch/recovery/recovery_test.py --device): the C++ worker on ddp's cpu backend
# with CUDA tensors (host staging), the Python worker on PyTorch's gloo with CUDA tensors.
recovery_run() {  # name recovery_test.py arguments...
  local name=$1 start rc
  shift
  start=$(date +%s)
  PYTHONPATH="$BUILD/python:$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}" timeout 900 "$PYTHON" \
    "$ROOT/tests/torch/recovery/recovery_test.py" --ddprun "$(bin ddprun)" --device cuda:0 "$@" \
    >"$LOGS/recovery-$name.log" 2>&1
  rc=$?
  record recovery "$([ $rc = 0 ] && echo ok || echo failed)" test="$name" exit="$rc" \
    seconds=$(($(date +%s) - start)) log="logs/recovery-$name.log" \
    result="$(grep -a -E '^(PASS|FAIL|reference)' "$LOGS/recovery-$name.log" | tail -4 | tr '\n' ' ')"
}
if want recovery && is_built ddprun && [ "$GPUS" -ge 1 ]; then
  is_built recovery_worker && recovery_run cpp_cpu_backend --worker "$(bin recovery_worker)"
  is_built ddp_python_ext && recovery_run python_gloo --python "$(command -v "$PYTHON")" \
    --python-worker "$ROOT/tests/python/recovery_worker.py" --backend gloo
fi

# ---------------------------------------------------------------- example
if ! want example; then
  :
elif is_built mnist && is_built ddprun && [ "$GPUS" -ge 1 ] && [ -d "$MNIST_DIR" ]; then
  (cd "$OUT_DIR" && "$(bin ddprun)" --standalone --nproc-per-node 1 "$(bin mnist)" --device cuda \
     --epochs 1 --max-steps 300 --data-dir "$MNIST_DIR") >"$LOGS/mnist.log" 2>&1
  line=$(grep -a 'test accuracy' "$LOGS/mnist.log" | tail -1)
  if [ -n "$line" ]; then record example ok example="mnist --device cuda" result="$line"
  else record example failed example="mnist --device cuda" log=logs/mnist.log; fi
else
  record example skipped example="mnist --device cuda" reason="needs mnist, ddprun, a GPU and Fashion-MNIST at $MNIST_DIR (FASHION_MNIST_DIR)"
fi

# ---------------------------------------------------------------- step time (GPU)
step_ddp() {  # model mode world; at world 1 also with every bucket all-reduced, as PyTorch does
  local extra=()
  for extra in "" --always-allreduce; do
    [ -n "$extra" ] && { [ "$2" != ddp ] || [ "$3" != 1 ]; } && continue
    "$(bin ddprun)" --standalone --nproc-per-node "$3" "$(bin bench_gpu_step)" --model "$1" \
      --mode "$2" --device "$STEP_DEVICE" $extra $STEP_ARGS 2>>"$LOGS/step.log" | keep_json
  done
}
step_torch() {  # model mode world
  if [ "$2" = plain ]; then
    "$PYTHON" "$ROOT/bench/gpu/torch_step.py" --model "$1" --mode plain --device "$STEP_DEVICE" $STEP_ARGS 2>>"$LOGS/step.log" | keep_json
  else
    # --redirects/--tee: torchrun of torch 1.13 fails under Python 3.11 without them.
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$3" --redirects 1 --tee 1 \
      --log_dir "$LOGS/torchrun" "$ROOT/bench/gpu/torch_step.py" --model "$1" --mode ddp \
      --device "$STEP_DEVICE" $STEP_ARGS 2>>"$LOGS/step.log" | keep_json
    # At world 1 also on the ddp package's backend: its CUDA tensors on its NCCL lane.
    if [ "$3" = 1 ] && is_built ddp_python_ext; then
      PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m torch.distributed.run \
        --standalone --nproc_per_node 1 --redirects 1 --tee 1 --log_dir "$LOGS/torchrun" \
        "$ROOT/bench/gpu/torch_step.py" --model "$1" --mode ddp --backend ddp \
        --device "$STEP_DEVICE" $STEP_ARGS 2>>"$LOGS/step.log" | keep_json
    fi
  fi
}
if ! want step; then
  :
elif is_built bench_gpu_step && is_built ddprun && { [ "$GPUS" -ge 1 ] || [ "$STEP_DEVICE" = cpu ]; }; then
  worlds=1
  [ "$GPUS" -gt 1 ] && worlds="1 $((GPUS > 8 ? 8 : GPUS))"
  for ((round = 0; round < ROUNDS; ++round)); do
    for model in cnn resnet18; do
      for world in $worlds; do
        if ((round % 2 == 0)); then order="ddp torch"; else order="torch ddp"; fi
        for impl in $order; do
          step_$impl "$model" ddp "$world"
          [ "$world" = 1 ] && step_$impl "$model" plain 1
        done
      done
    done
  done
  "$PYTHON" - "$RESULTS" "$STEP_DEVICE" <<'PY' | tee -a "$RESULTS"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs = {}
for r in rows:
    if r.get("bench") == "gpu_step" and r.get("device", "").startswith(sys.argv[2]):
        impl = r["impl"] + ("/ddp_backend" if r["impl"] == "pytorch" and r.get("backend") == "ddp" else "")
        runs.setdefault((r["model"], impl, r["world"]), []).append(r["ms_per_step"])
best = {k: min(v) for k, v in runs.items()}
out = {"bench": "gpu_step_summary", "ms_per_step_best": {f"{m}/{i}/w{w}": v for (m, i, w), v in sorted(best.items())}}
for (m, i, w), v in best.items():
    if i == "ddp" and (m, "pytorch", w) in best:
        out[f"{m}_w{w}_ddp_over_pytorch_time"] = v / best[(m, "pytorch", w)]
    if i == "ddp-allreduce" and (m, "pytorch", w) in best:
        out[f"{m}_w{w}_ddp_allreduce_over_pytorch_time"] = v / best[(m, "pytorch", w)]
    if i == "ddp" and w == 1 and (m, "libtorch", 1) in best:
        out[f"{m}_ddp_overhead_over_plain_libtorch"] = v / best[(m, "libtorch", 1)]
    if i == "pytorch/ddp_backend" and (m, "pytorch", w) in best:
        # PyTorch's DDP on the ddp backend (its NCCL lane) over the same on PyTorch's nccl.
        out[f"{m}_w{w}_pytorch_on_ddp_backend_over_nccl_time"] = v / best[(m, "pytorch", w)]
    if i == "pytorch" and w == 1 and (m, "pytorch-plain", 1) in best:
        out[f"{m}_pytorch_ddp_overhead_over_plain"] = v / best[(m, "pytorch-plain", 1)]
out["note"] = "times: lower is better; ddp_over_pytorch_time < 1 means ddp is faster"
print(json.dumps(out))
PY
  grep -q '"bench": *"gpu_step"' "$RESULTS" && record step ok rounds="$ROUNDS" log=logs/step.log ||
    record step failed log=logs/step.log
else
  record step skipped reason="needs bench_gpu_step, ddprun and a GPU"
fi

# ---------------------------------------------------------------- one GPU, two ranks
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the tutorials' users with one
# GPU train world 2 through a host backend: ddp's cpu backend (CUDA buckets staged through the
# host) against PyTorch's gloo. Both ranks use cuda:0 (--device cuda:0).
if want one_gpu && is_built bench_gpu_step && is_built ddprun && [ "$GPUS" = 1 ]; then
  for ((round = 0; round < ROUNDS; ++round)); do
    for model in cnn resnet18; do
      # ddp's staging both ways (host_staging.hpp): overlapped (the default), synchronous.
      for staging in overlap sync; do
        DDP_HOST_STAGING=$staging timeout 300 "$(bin ddprun)" --standalone --nproc-per-node 2 \
          "$(bin bench_gpu_step)" --model "$model" --device cuda:0 --backend cpu $STEP_ARGS \
          2>>"$LOGS/one_gpu.log" | keep_json
      done
      # PyTorch's DDP on gloo, and on the ddp package's backend (CUDA tensors staged by it: the
      # ranks share the GPU, so no NCCL lane), its staging overlapped (default) and synchronous.
      for backend in gloo ddp ddp/sync; do
        [ $backend != gloo ] && ! is_built ddp_python_ext && continue
        DDP_HOST_STAGING=$([ $backend = ddp/sync ] && echo sync || echo overlap) \
        PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" timeout 300 "$PYTHON" \
          -m torch.distributed.run --standalone --nproc_per_node 2 "$ROOT/bench/gpu/torch_step.py" \
          --model "$model" --device cuda:0 --backend ${backend%/sync} $STEP_ARGS \
          2>>"$LOGS/one_gpu.log" | keep_json
      done
    done
  done
  "$PYTHON" - "$RESULTS" <<'PY' | tee -a "$RESULTS"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs = {}
for r in rows:
    if r.get("bench") == "gpu_step" and r.get("world") == 2 and r.get("device") == "cuda:0":
        impl = r["impl"] + "/" + (r["host_staging"] if r["impl"] == "ddp" else r["backend"])
        if r["impl"] == "pytorch" and r["backend"] == "ddp" and r.get("host_staging") == "sync":
            impl += "/sync"
        runs.setdefault((r["model"], impl), []).append(r["ms_per_step"])
out = {"bench": "one_gpu_summary", "ms_per_step_median": {f"{m}/{i}": statistics.median(v) for (m, i), v in sorted(runs.items())}}
for m in ("cnn", "resnet18"):
    gloo = runs.get((m, "pytorch/gloo"))
    for name, impl in (("ddp_overlap", "ddp/overlap"), ("ddp_sync", "ddp/sync"),
                       ("pytorch_on_ddp_backend", "pytorch/ddp"),
                       ("pytorch_on_ddp_backend_sync", "pytorch/ddp/sync")):
        mine = runs.get((m, impl))
        if gloo and mine:
            out[f"{m}_{name}_over_gloo_time"] = statistics.median(mine) / statistics.median(gloo)
out["note"] = ("world 2 on one GPU, ms per step: ddp's C++ DDP on its cpu backend (host staging "
               "overlapped or synchronous) and PyTorch's DDP on the ddp backend (its host staging "
               "overlapped or synchronous), each over PyTorch's DDP on gloo; < 1: faster than gloo")
print(json.dumps(out))
PY
  # Two ranks on one GPU over NCCL: expected to fail at once with NCCL's duplicate-GPU error.
  for impl in ddp pytorch; do
    if [ $impl = ddp ]; then
      cmd=("$(bin ddprun)" --standalone --nproc-per-node 2 "$(bin bench_gpu_step)" --model cnn
           --device cuda:0 --backend nccl --warmup 1 --steps 1 --blocks 1)
    else
      cmd=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 2
           "$ROOT/bench/gpu/torch_step.py" --model cnn --device cuda:0 --backend nccl
           --warmup 1 --steps 1 --blocks 1)
    fi
    start=$(date +%s)
    NCCL_DEBUG=WARN timeout 300 "${cmd[@]}" >"$LOGS/nccl_one_gpu_$impl.log" 2>&1
    rc=$?
    msg=$(grep -a -m1 -iE 'duplicate gpu|invalid usage|ncclInvalidUsage|NCCL takes one rank per GPU' "$LOGS/nccl_one_gpu_$impl.log" | cut -c1-400)
    record one_gpu_nccl "$([ $rc != 0 ] && echo ok || echo failed)" impl=$impl exit="$rc" \
      seconds=$(($(date +%s) - start)) error="${msg:-none found, see logs/nccl_one_gpu_$impl.log}" \
      expect="non-zero exit naming the duplicate GPU (ddp's own check: NCCL takes one rank per GPU; PyTorch: NCCL's refusal)"
  done
fi

# ---------------------------------------------------------------- DataParallel (one process)
if want data_parallel && is_built bench_gpu_step && [ "$GPUS" -ge 1 ]; then
  for model in cnn resnet18; do
    "$(bin bench_gpu_step)" --model "$model" --mode data_parallel --device cuda:0 $STEP_ARGS \
      2>>"$LOGS/data_parallel.log" | keep_json
    "$PYTHON" "$ROOT/bench/gpu/torch_step.py" --model "$model" --mode data_parallel \
      --device cuda:0 $STEP_ARGS 2>>"$LOGS/data_parallel.log" | keep_json
  done
  grep -q '"libtorch-data_parallel"' "$RESULTS" && record data_parallel ok ||
    record data_parallel failed log=logs/data_parallel.log
fi

# ---------------------------------------------------------------- Python and frameworks
if want python && [ "$GPUS" -ge 1 ] && is_built ddprun; then
  PYTHON="$PYTHON" DDPRUN="$(bin ddprun)" DDP_PYTHONPATH="$BUILD/python" SEEDS="${DEPS_DIR:+$DEPS_DIR/seeds}" \
    PARTS="${PYTHON_PARTS:-cuda tutorial frameworks reform}" \
    "$ROOT/bench/gpu/verify_python.sh" "$OUT_DIR" 2>>"$LOGS/python.log" | tee -a "$RESULTS"
  grep -q '"step": "python", "status": "failed"' "$RESULTS" && FAILED=1
fi

# ---------------------------------------------------------------- CPU benchmarks
ar_ddp() {  # backend world
  local port; port=$(free_port)
  local pids=() r
  for ((r = 0; r < $2; r++)); do
    RANK=$r WORLD_SIZE=$2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=$2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 300 "$(bin allreduce_bench)" "$1" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
}
want cpu || CPU_WORLDS=
for world in $CPU_WORLDS; do
  if is_built allreduce_bench; then
    ar_ddp cpu "$world" 2>>"$LOGS/cpu.log" | keep_json
    ar_ddp gloo "$world" 2>>"$LOGS/cpu.log" | keep_json
    timeout 300 "$PYTHON" "$ROOT/bench/allreduce/torch_allreduce.py" "$world" 4096,1048576,16777216,67108864 \
      2>>"$LOGS/cpu.log" | keep_json
    record cpu ok what=allreduce world="$world"
  else
    record cpu skipped what=allreduce world="$world" reason="allreduce_bench not built"
  fi
  if is_built bench_ddp; then
    timeout 300 "$(bin bench_ddp)" train --world "$world" --steps "$CPU_STEPS" 2>>"$LOGS/cpu.log" | keep_json
    timeout 300 "$PYTHON" "$ROOT/bench/ddp/bench_ddp.py" --world "$world" --steps "$CPU_STEPS" 2>>"$LOGS/cpu.log" | keep_json
    record cpu ok what=ddp_cnn world="$world"
  else
    record cpu skipped what=ddp_cnn world="$world" reason="bench_ddp not built"
  fi
done

record done "$([ $FAILED = 0 ] && echo ok || echo failed)" results="$RESULTS"
exit $FAILED
