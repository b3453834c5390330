#include "ddp/torch/ddp_consistency.hpp"

#include <fmt/format.h>

#include <sstream>

#include "ddp/torch/tensor_adapter.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

std::string describe(const NamedTensor& t) {
  return fmt::format("{} shape {} dtype {}{}", t.name, c10::str(t.tensor.sizes()),
                     c10::toString(t.tensor.scalar_type()),
                     t.tensor.requires_grad() ? "" : " (requires_grad=false)");
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

void verify_same_tensors(ProcessGroup& pg, const std::vector<NamedTensor>& tensors,
                         const std::string& what, std::chrono::milliseconds timeout) {
  std::string mine;
  for (const auto& t : tensors) mine += describe(t) + "\n";
  const int world = pg.size();
  std::vector<int64_t> hashes(world);
  const int64_t my_hash = static_cast<int64_t>(fnv1a(mine));
  pg.all_gather(&my_hash, hashes.data(), 1, DataType::kInt64)->wait(timeout);
  if (std::all_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h == hashes[0]; })) {
    return;
  }

  // Mismatch: gather every rank's description to name the first difference.
  std::vector<int64_t> lengths(world);
  const int64_t my_length = static_cast<int64_t>(mine.size());
  pg.all_gather(&my_length, lengths.data(), 1, DataType::kInt64)->wait(timeout);
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::string all(total, '\0');
  pg.all_gather_v(mine.data(), all.data(), counts, DataType::kUInt8)->wait(timeout);

  std::vector<std::vector<std::string>> per_rank;
  size_t offset = 0;
  for (int r = 0; r < world; ++r) {
    per_rank.push_back(split_lines(all.substr(offset, counts[r])));
    offset += counts[r];
  }
  const auto& base = per_rank[0];
  for (int r = 1; r < world; ++r) {
    const auto& other = per_rank[r];
    if (other == base) continue;
    std::vector<int> differing;
    for (int q = 1; q < world; ++q) {
      if (per_rank[q] != base) differing.push_back(q);
    }
    size_t k = 0;
    while (k < base.size() && k < other.size() && base[k] == other[k]) ++k;
    std::string detail;
    if (k < base.size() && k < other.size()) {
      detail =
          fmt::format("entry {}: rank 0 has '{}' but rank {} has '{}'", k, base[k], r, other[k]);
    } else if (k < base.size()) {
      detail = fmt::format("rank 0 has {} entries, rank {} only {}; first missing on rank {}: '{}'",
                           base.size(), r, other.size(), r, base[k]);
    } else {
      detail = fmt::format("rank {} has {} entries, rank 0 only {}; first extra on rank {}: '{}'",
                           r, other.size(), base.size(), r, other[k]);
    }
    throw UsageError(fmt::format(
        "DistributedDataParallel: the ranks' models differ in their {} (ranks differing from "
        "rank 0: {}); {}. Build the same model (same layers, sizes and dtypes, in the same "
        "order) on every rank before wrapping it",
        what, fmt::join(differing, ", "), detail));
  }
  throw UsageError(fmt::format(
      "DistributedDataParallel: the ranks' {} descriptions hash differently but read the same; "
      "this indicates memory corruption or mismatched builds across ranks",
      what));
}

void broadcast_tensors(ProcessGroup& pg, const std::vector<torch::Tensor>& tensors, int root,
                       std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;
  struct Pending {
    torch::Tensor target;
    torch::Tensor wire;  // contiguous (host) tensor the collective writes into
    WorkPtr work;
  };
  std::vector<Pending> pending;
  for (const auto& t : tensors) {
    Pending p{t, t, nullptr};
    if (needs_host_staging(t, pg)) {
      p.wire = t.cpu().contiguous();
    } else if (!t.is_contiguous()) {
      p.wire = t.contiguous();
    }
    p.work = broadcast(pg, p.wire, root);
    pending.push_back(std::move(p));
  }
  for (auto& p : pending) {
    p.work->wait(timeout);
    if (!p.wire.is_same(p.target)) p.target.copy_(p.wire);
  }
}

}  // namespace ddp
