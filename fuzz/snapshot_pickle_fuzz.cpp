// libFuzzer target for the torch.save pickle reader (ddp::parse_torch_pickle, the data.pkl of
// a torch.save archive), under snapshots (snapshot.cpp) and the tensors of DCP checkpoints
// (state_items.cpp): it reads files from disk that may be truncated, corrupted or written by
// someone else. Not the LibTorch-free pickle reader of DCP `.metadata` files: that one is
// dcp_metadata_fuzz.
// Properties checked on every input:
// - parsing never crashes, recurses without bound (a 2,000-deep "((((l" stream; run_fuzzers.sh
//   also executes a 99,999-deep one, longer than its -max_len), leaks a container that holds
//   itself through the memo (LeakSanitizer), or reads out of bounds (ASan; LibTorch itself is
//   not instrumented);
// - malformed input is reported only as ddp::UsageError, also when a storage record is missing
//   (the loader below throws what torch_load_bytes throws then);
// - each storage record is loaded at most once (tensors sharing a storage share it);
// - an accepted value holds only the documented types (None, bool, int, float, str (also for
//   bytes), tuple, list, dict with str or int keys, CPU tensor), nests at most 1,000 containers
//   deep, and every tensor's last element lies inside its storage.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "ddp/util/error.hpp"

namespace {

// The tensor's elements all lie inside its storage. Sizes and strides are re-added in 128 bits
// so that this check cannot wrap where the reader's own might.
bool inside_storage(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu()) return false;
  if (t.numel() == 0) return true;
  __int128 last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 0 || t.stride(d) < 0) return false;
    last += static_cast<__int128>(t.size(d) - 1) * t.stride(d);
  }
  const __int128 end = (last + 1) * static_cast<__int128>(t.element_size());
  return t.storage_offset() >= 0 && end <= static_cast<__int128>(t.storage().nbytes());
}

// Walks an accepted value without recursion; false when a property above does not hold. The
// reader shares what the pickle memo shares (a DAG: 2^40 paths in a few hundred bytes), so a
// container is walked again only when reached deeper than before (its depth bound still holds).
bool well_formed(const c10::IValue& root) {
  std::vector<std::pair<c10::IValue, int>> todo = {{root, 0}};
  std::unordered_map<const void*, int> deepest;
  while (!todo.empty()) {
    auto [v, depth] = std::move(todo.back());
    todo.pop_back();
    if (depth > 1000) return false;
    if (v.isNone() || v.isBool() || v.isInt() || v.isDouble() || v.isString()) continue;
    if (v.isPtrType()) {
      auto [it, first] = deepest.try_emplace(v.internalToPointer(), depth);
      if (!first && it->second >= depth) continue;
      it->second = depth;
    }
    if (v.isTensor()) {
      if (!inside_storage(v.toTensor())) return false;
    } else if (v.isTuple()) {
      for (const auto& x : v.toTupleRef().elements()) todo.emplace_back(x, depth + 1);
    } else if (v.isList()) {
      for (const auto& x : v.toListRef()) todo.emplace_back(x, depth + 1);
    } else if (v.isGenericDict()) {
      for (const auto& kv : v.toGenericDict()) {
        if (!kv.key().isString() && !kv.key().isInt()) return false;
        todo.emplace_back(kv.value(), depth + 1);
      }
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Records data/0 .. data/999 exist, of 256, 128, 64 or 32 bytes (so that short storages are
  // reached too); any other key is a missing record.
  std::map<std::string, int> loads;
  auto storages = [&](const std::string& key) {
    if (++loads[key] > 1) __builtin_trap();
    if (key.empty() || key.size() > 3 || key.find_first_not_of("0123456789") != key.npos) {
      throw ddp::UsageError("fuzz input: cannot read record data/" + key + " of the zip archive");
    }
    std::vector<uint8_t> bytes(size_t{256} >> (std::stoi(key) % 4));
    for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = static_cast<uint8_t>(j * 37 + 11);
    return bytes;
  };
  try {
    const c10::IValue value = ddp::parse_torch_pickle(data, size, storages, "fuzz input");
    if (!well_formed(value)) __builtin_trap();
  } catch (const ddp::UsageError&) {
    // The documented outcome for malformed files.
  }
  return 0;
}
