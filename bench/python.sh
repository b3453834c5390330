# Sourced by the benchmark scripts. PY is the interpreter their PyTorch peers run (PyTorch 2.13,
# the reference of every ratio): $DDP_PYTHON, else $DDP_VENV's, else the checkout's .venv/
# (scripts/install-deps.sh makes it), else the python3 on PATH. TORCHRUN is that
# installation's torchrun.
_ddp_bench_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n "${DDP_PYTHON:-}" ]]; then
  PY=$DDP_PYTHON
elif [[ -n "${DDP_VENV:-}" && -x "$DDP_VENV/bin/python" ]]; then
  PY=$DDP_VENV/bin/python
elif [[ -x "$_ddp_bench_root/.venv/bin/python" ]]; then
  PY=$_ddp_bench_root/.venv/bin/python
else
  PY=$(command -v python3)
fi
TORCHRUN=$(dirname "$PY")/torchrun
