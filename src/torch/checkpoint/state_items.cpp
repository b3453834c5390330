#include "state_items.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <optional>

#include "ddp/torch/nn/random_state.hpp"
#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "ddp/util/error.hpp"

namespace ddp::checkpoint {

namespace {

const std::pair<torch::ScalarType, const char*> kDtypes[] = {{torch::kFloat32, "float32"},
                                                             {torch::kFloat64, "float64"},
                                                             {torch::kFloat16, "float16"},
                                                             {torch::kBFloat16, "bfloat16"},
                                                             {torch::kInt64, "int64"},
                                                             {torch::kInt32, "int32"},
                                                             {torch::kInt16, "int16"},
                                                             {torch::kInt8, "int8"},
                                                             {torch::kUInt8, "uint8"},
                                                             {torch::kBool, "bool"},
                                                             {torch::kComplexFloat, "complex64"},
                                                             {torch::kComplexDouble, "complex128"}};

Item tensor_item(std::string fqn, std::vector<dcp::PathPart> path, torch::Tensor t,
                 WrittenBy writer) {
  Item it;
  it.fqn = std::move(fqn);
  it.path = std::move(path);
  it.tensor = t.detach();
  it.writer = writer;
  return it;
}

Item value_item(std::string fqn, std::vector<dcp::PathPart> path, c10::IValue v) {
  Item it;
  it.fqn = std::move(fqn);
  it.path = std::move(path);
  it.value = std::move(v);
  it.writer = WrittenBy::kRankZero;
  return it;
}

int64_t bytes_of(const Item& it) {
  return it.tensor.defined() ? static_cast<int64_t>(it.tensor.nbytes()) : 64;
}

}  // namespace

std::string dtype_name(torch::ScalarType t) {
  for (const auto& [type, name] : kDtypes) {
    if (type == t) return name;
  }
  throw UsageError(
      fmt::format("checkpoint: tensors of dtype {} cannot be saved; convert them to "
                  "a plain numeric dtype first",
                  c10::toString(t)));
}

torch::ScalarType dtype_from_name(const std::string& name, const std::string& fqn) {
  for (const auto& [type, n] : kDtypes) {
    if (name == n) return type;
  }
  throw UsageError(
      fmt::format("checkpoint entry {} has dtype torch.{}, which ddp does not load", fqn, name));
}

std::vector<Item> collect_items(const TrainingProgress& progress, const torch::nn::Module& module,
                                torch::optim::Optimizer* optimizer, const CheckpointExtras& extras,
                                int rank, int world) {
  std::vector<Item> items;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    items.push_back(
        tensor_item("model." + p.key(), {"model", p.key()}, p.value(), WrittenBy::kAnyRank));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    items.push_back(
        tensor_item("model." + b.key(), {"model", b.key()}, b.value(), WrittenBy::kAnyRank));
  }
  if (optimizer) append_optimizer_items(module, *optimizer, items);
  items.push_back(value_item("trainer.step", {"trainer", "step"}, progress.step));
  items.push_back(value_item("trainer.epoch", {"trainer", "epoch"}, progress.epoch));
  items.push_back(value_item("trainer.batches_in_epoch", {"trainer", "batches_in_epoch"},
                             progress.batches_in_epoch));
  items.push_back(value_item("trainer.world_size", {"trainer", "world_size"}, int64_t{world}));
  const RandomState rng = capture_random_state(cuda_device_of(module));
  items.push_back(tensor_item("rng." + std::to_string(rank), {"rng", std::to_string(rank)}, rng.cpu,
                              WrittenBy::kThisRank));
  if (rng.cuda.defined()) {
    items.push_back(tensor_item("rng_cuda." + std::to_string(rank),
                                {"rng_cuda", std::to_string(rank)}, rng.cuda,
                                WrittenBy::kThisRank));
  }
  for (const auto& [name, v] : extras) {
    if (v.isTensor()) {
      items.push_back(
          tensor_item("extra." + name, {"extra", name}, v.toTensor(), WrittenBy::kRankZero));
    } else {
      items.push_back(value_item("extra." + name, {"extra", name}, v));
    }
  }
  return items;
}

std::vector<Item> items_written_by(std::vector<Item> items, int rank, int world) {
  std::vector<size_t> shared;
  std::vector<Item> mine;
  for (size_t i = 0; i < items.size(); ++i) {
    switch (items[i].writer) {
      case WrittenBy::kThisRank:
        mine.push_back(items[i]);
        break;
      case WrittenBy::kRankZero:
        if (rank == 0) mine.push_back(items[i]);
        break;
      case WrittenBy::kAnyRank:
        shared.push_back(i);
        break;
    }
  }
  std::stable_sort(shared.begin(), shared.end(),
                   [&](size_t a, size_t b) { return bytes_of(items[a]) > bytes_of(items[b]); });
  std::vector<int64_t> load(world, 0);
  for (size_t i : shared) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += bytes_of(items[i]);
    if (r == rank) mine.push_back(items[i]);
  }
  return mine;
}

EntryReader::EntryReader(std::string dir, dcp::Metadata metadata)
    : dir_(std::move(dir)), metadata_(std::move(metadata)) {
  for (const auto& e : metadata_.entries) entries_[e.fqn] = &e;
}

const dcp::Entry* EntryReader::entry(const std::string& fqn) const {
  auto it = entries_.find(fqn);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<std::string> EntryReader::keys_with_prefix(const std::string& prefix) const {
  std::vector<std::string> r;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    r.push_back(it->first);
  }
  return r;
}

std::vector<char> EntryReader::read(const dcp::Storage& s, const std::string& fqn) const {
  const std::string path = dir_ + "/" + s.relative_path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw UsageError(fmt::format("checkpoint {}: cannot open {} (entry {}): {}", dir_, path, fqn,
                                 std::strerror(errno)));
  }
  std::vector<char> buf(static_cast<size_t>(s.length));
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::pread(fd, buf.data() + done, buf.size() - done,
                              static_cast<off_t>(s.offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw UsageError(fmt::format(
          "checkpoint {}: {} ends before entry {} (bytes {}..{}): {}; the file is truncated", dir_,
          path, fqn, s.offset, s.offset + s.length, n < 0 ? std::strerror(err) : "EOF"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return buf;
}

torch::Tensor EntryReader::tensor(const std::string& fqn) const {
  const dcp::Entry* e = entry(fqn);
  if (!e) throw UsageError(fmt::format("checkpoint {} has no entry {}", dir_, fqn));
  if (!e->is_tensor) throw UsageError(fmt::format("checkpoint {}: {} is not a tensor", dir_, fqn));
  const auto dtype = dtype_from_name(e->dtype, fqn);
  torch::Tensor whole;
  int64_t covered = 0;
  for (const auto& c : e->chunks) {
    const std::string source = fmt::format("{}/{} (entry {})", dir_, c.storage.relative_path, fqn);
    c10::IValue v = torch_load_bytes(read(c.storage, fqn), source);
    if (!v.isTensor()) throw UsageError(source + ": the record holds no tensor");
    torch::Tensor part = v.toTensor();
    if (part.sizes() != c10::IntArrayRef(c.sizes)) {
      throw UsageError(
          fmt::format("{}: the record holds a tensor of shape [{}], the metadata "
                      "says [{}]",
                      source, fmt::join(part.sizes(), ", "), fmt::join(c.sizes, ", ")));
    }
    if (e->chunks.size() == 1 && c.sizes == e->size) return part.to(dtype);
    if (!whole.defined()) whole = torch::empty(e->size, torch::TensorOptions().dtype(dtype));
    torch::Tensor view = whole;
    for (size_t d = 0; d < c.offsets.size(); ++d) {
      view = view.narrow(static_cast<int64_t>(d), c.offsets[d], c.sizes[d]);
    }
    view.copy_(part);
    covered += part.numel();
  }
  if (!whole.defined()) whole = torch::empty(e->size, torch::TensorOptions().dtype(dtype));
  if (covered != whole.numel()) {
    throw UsageError(fmt::format("checkpoint {}: the chunks of {} cover {} of its {} elements",
                                 dir_, fqn, covered, whole.numel()));
  }
  return whole;
}

c10::IValue EntryReader::value(const std::string& fqn) const {
  const dcp::Entry* e = entry(fqn);
  if (!e) throw UsageError(fmt::format("checkpoint {} has no entry {}", dir_, fqn));
  if (e->is_tensor) return tensor(fqn);
  return torch_load_bytes(read(e->bytes, fqn),
                          fmt::format("{}/{} (entry {})", dir_, e->bytes.relative_path, fqn));
}

void load_module(const EntryReader& reader, torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> live;
  for (const auto& p : module.named_parameters(true)) live["model." + p.key()] = p.value();
  for (const auto& b : module.named_buffers(true)) live["model." + b.key()] = b.value();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [fqn, t] : live) {
    const dcp::Entry* e = reader.entry(fqn);
    if (!e || !e->is_tensor) {
      missing.push_back(fqn);
    } else if (c10::IntArrayRef(e->size) != t.sizes()) {
      mismatched.push_back(fmt::format("{} (checkpoint [{}], model [{}])", fqn,
                                       fmt::join(e->size, ", "), fmt::join(t.sizes(), ", ")));
    }
  }
  for (const auto& fqn : reader.keys_with_prefix("model.")) {
    if (!live.count(fqn)) unexpected.push_back(fqn);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    throw UsageError(fmt::format(
        "checkpoint {} does not fit the model: missing [{}], unexpected [{}], other shape [{}]; "
        "load it into the model it was saved from",
        reader.dir(), fmt::join(missing, ", "), fmt::join(unexpected, ", "),
        fmt::join(mismatched, ", ")));
  }
  torch::NoGradGuard no_grad;
  for (auto& [fqn, t] : live) t.copy_(reader.tensor(fqn));
}

TrainingProgress load_progress(const EntryReader& reader) {
  TrainingProgress p;
  auto get = [&](const char* key, int64_t& out) {
    if (!reader.has(key)) return;
    const c10::IValue v = reader.value(key);
    if (!v.isInt()) {
      throw UsageError(fmt::format("checkpoint {}: {} is not an int", reader.dir(), key));
    }
    out = v.toInt();
  };
  get("trainer.step", p.step);
  get("trainer.epoch", p.epoch);
  get("trainer.batches_in_epoch", p.batches_in_epoch);
  return p;
}

CheckpointExtras load_extras(const EntryReader& reader) {
  CheckpointExtras extras;
  for (const auto& fqn : reader.keys_with_prefix("extra.")) {
    extras[fqn.substr(6)] = reader.value(fqn);
  }
  return extras;
}

bool load_rng(const EntryReader& reader, int rank, const torch::nn::Module* module) {
  const std::string key = "rng." + std::to_string(rank);
  if (!reader.has(key)) return false;
  RandomState rng;
  rng.cpu = reader.tensor(key);
  const std::string cuda_key = "rng_cuda." + std::to_string(rank);
  const std::optional<c10::Device> device = module ? cuda_device_of(*module) : std::nullopt;
  if (device && reader.has(cuda_key)) rng.cuda = reader.tensor(cuda_key);
  restore_random_state(device, rng);
  return true;
}

}  // namespace ddp::checkpoint
