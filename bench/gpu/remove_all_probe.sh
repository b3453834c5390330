#!/usr/bin/env bash
# Which std::filesystem::remove_all does a program linked against a PyTorch wheel's LibTorch
# run? The CUDA wheels' libtorch.so exports a copy of it that calls libstdc++'s private
# recursive_directory_iterator::__erase through a weak reference no system libstdc++ exports:
# bound to that copy, remove_all of a non-empty directory jumps to address 0
# (include/ddp/util/remove_tree.hpp, docs/gpu.md). The probe builds a ten-line program twice,
# with libtorch.so before libstdc++ in its DT_NEEDED and after it, runs both and prints one JSON
# line each: {"bench": "remove_all_probe", "link": ..., "needed": [...], "exit": N, ...}.
#
#   bench/gpu/remove_all_probe.sh TORCH_LIB_DIR [WORK_DIR]
set -uo pipefail
LIB=${1:?usage: remove_all_probe.sh TORCH_LIB_DIR [WORK_DIR]}
WORK=${2:-$(mktemp -d)}
CXX=${CXX:-g++}
mkdir -p "$WORK"
cat >"$WORK/probe.cpp" <<'CPP'
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
int main() {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / "ddp_remove_all_probe";
  fs::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "f") << "x";
  auto n = fs::remove_all(root);
  std::printf("removed %ju entries\n", static_cast<std::uintmax_t>(n));
  return fs::exists(root) ? 1 : 0;
}
CPP
exports=$(nm -D --defined-only "$LIB/libtorch.so" 2>/dev/null | grep -c '_ZNSt10filesystem10remove_all')
weak=$(nm -D "$LIB/libtorch.so" 2>/dev/null | grep -E ' w .*recursive_directory_iterator' | awk '{print $2}' | paste -sd, -)
stdcxx=$("$CXX" -print-file-name=libstdc++.so.6)
erase=$(nm -D "$(readlink -f "$stdcxx")" 2>/dev/null | grep -c 'recursive_directory_iterator7__erase')
for order in torch_first stdcxx_first; do
  flags=(-L"$LIB" -Wl,--no-as-needed -ltorch -Wl,-rpath,"$LIB")
  [ $order = stdcxx_first ] && flags=(-Wl,--push-state,--no-as-needed,-lstdc++,--pop-state "${flags[@]}")
  exe=$WORK/probe_$order
  if ! "$CXX" -std=c++17 "$WORK/probe.cpp" -o "$exe" "${flags[@]}" -Wl,--allow-shlib-undefined \
    >"$WORK/build_$order.log" 2>&1; then
    echo "{\"bench\": \"remove_all_probe\", \"link\": \"$order\", \"built\": false, \"log\": \"$(tail -2 "$WORK/build_$order.log" | tr '\n"' '  ')\"}"
    continue
  fi
  needed=$(readelf -d "$exe" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/"\1"/p' | paste -sd, -)
  out=$(timeout 60 "$exe" 2>&1)
  rc=$?
  binding=$(LD_DEBUG=bindings timeout 60 "$exe" 2>&1 | grep -m1 'remove_allERKNS_7__cxx114pathE' |
    sed 's/.*binding file //; s/["`'"'"']//g' | cut -c1-300)
  echo "{\"bench\": \"remove_all_probe\", \"link\": \"$order\", \"needed\": [$needed], \"exit\": $rc, \"output\": \"$(echo "$out" | tr '\n"' '  ')\", \"binding\": \"$binding\", \"libtorch_exports_remove_all\": $exports, \"libtorch_weak_refs\": \"$weak\", \"libstdcxx\": \"$(readlink -f "$stdcxx")\", \"libstdcxx_exports_erase\": $erase}"
done
