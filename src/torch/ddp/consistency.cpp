#include "ddp/torch/ddp/consistency.hpp"

#include <fmt/format.h>

#include <sstream>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
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

// The small host-side collectives of the check go through tensors on the group's device: the
// nccl backend takes device memory only. For host backends the copies are no-ops.
std::vector<int64_t> all_gather_int64(ProcessGroup& pg, int64_t mine,
                                      std::chrono::milliseconds timeout) {
  const torch::Device device = comm_device(pg);
  auto in = torch::full({1}, mine, torch::kInt64).to(device);
  auto out = torch::empty({pg.size()}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  use_current_stream(pg);
  auto work = pg.all_gather(in.data_ptr(), out.data_ptr(), 1, DataType::kInt64);
  record_on_comm_stream(pg, in);
  record_on_comm_stream(pg, out);
  wait_on_current_stream(pg, *work, timeout);
  out = out.cpu();
  return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + pg.size());
}

std::string all_gather_bytes(ProcessGroup& pg, std::string mine, const std::vector<size_t>& counts,
                             std::chrono::milliseconds timeout) {
  const torch::Device device = comm_device(pg);
  size_t total = 0;
  for (size_t c : counts) total += c;
  auto in =
      torch::from_blob(mine.data(), {static_cast<int64_t>(mine.size())}, torch::kUInt8).to(device);
  auto out = torch::empty({static_cast<int64_t>(total)},
                          torch::TensorOptions().dtype(torch::kUInt8).device(device));
  use_current_stream(pg);
  auto work = pg.all_gather_v(in.data_ptr(), out.data_ptr(), counts, DataType::kUInt8);
  record_on_comm_stream(pg, in);
  record_on_comm_stream(pg, out);
  wait_on_current_stream(pg, *work, timeout);
  out = out.cpu();
  return std::string(static_cast<const char*>(out.data_ptr()), total);
}

}  // namespace

void verify_same_tensors(ProcessGroup& pg, const std::vector<NamedTensor>& tensors,
                         const std::string& what, std::chrono::milliseconds timeout) {
  std::string mine;
  for (const auto& t : tensors) mine += describe(t) + "\n";
  const int world = pg.size();
  const std::vector<int64_t> hashes =
      all_gather_int64(pg, static_cast<int64_t>(fnv1a(mine)), timeout);
  if (std::all_of(hashes.begin(), hashes.end(), [&](int64_t h) { return h == hashes[0]; })) {
    return;
  }

  // Mismatch: gather every rank's description to name the first difference.
  const std::vector<int64_t> lengths =
      all_gather_int64(pg, static_cast<int64_t>(mine.size()), timeout);
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  const std::string all = all_gather_bytes(pg, mine, counts, timeout);

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
    wait_on_current_stream(pg, *p.work, timeout);
    if (!p.wire.is_same(p.target)) p.target.copy_(p.wire);
  }
}

}  // namespace ddp
