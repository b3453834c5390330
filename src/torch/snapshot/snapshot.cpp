#include "ddp/torch/snapshot/snapshot.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <sstream>

#include "ddp/torch/snapshot/snapshot_file.hpp"
#include "ddp/torch/snapshot/torch_pickle.hpp"
#include "ddp/torch/snapshot/torch_save.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

namespace {

constexpr const char* kFormat = "ddp-snapshot-1";

torch::Tensor bytes_tensor(const std::string& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

Snapshot capture_snapshot(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                          int64_t epochs_run, int64_t sampler_epoch) {
  Snapshot s;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    s.model_state.emplace_back(p.key(), p.value().detach().to(torch::kCPU).contiguous().clone());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    s.model_state.emplace_back(b.key(), b.value().detach().to(torch::kCPU).contiguous().clone());
  }
  if (optimizer) {
    torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    std::ostringstream out;
    archive.save_to(out);
    s.optimizer_state = bytes_tensor(out.str());
  }
  s.epochs_run = epochs_run;
  s.sampler_epoch = sampler_epoch;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.rng_state = gen.get_state();
  }
  return s;
}

void restore_snapshot(const Snapshot& snapshot, torch::nn::Module& module,
                      torch::optim::Optimizer* optimizer) {
  std::map<std::string, torch::Tensor> saved(snapshot.model_state.begin(),
                                             snapshot.model_state.end());
  std::map<std::string, torch::Tensor> live;
  for (const auto& p : module.named_parameters(true)) live[p.key()] = p.value();
  for (const auto& b : module.named_buffers(true)) live[b.key()] = b.value();

  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : live) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != t.sizes()) {
      mismatched.push_back(fmt::format("{} (snapshot [{}], model [{}])", name,
                                       fmt::join(it->second.sizes(), ", "),
                                       fmt::join(t.sizes(), ", ")));
    }
  }
  for (const auto& kv : saved) {
    if (!live.count(kv.first)) unexpected.push_back(kv.first);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    throw UsageError(fmt::format(
        "snapshot does not fit the model: missing keys [{}], unexpected keys [{}], shape "
        "mismatches [{}]; was it saved from a different model?",
        fmt::join(missing, ", "), fmt::join(unexpected, ", "), fmt::join(mismatched, ", ")));
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : live) t.copy_(saved.at(name));
  }
  if (optimizer && snapshot.optimizer_state.defined()) {
    const auto& bytes = snapshot.optimizer_state;
    std::istringstream in(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      optimizer->load(archive);
    } catch (const c10::Error& e) {
      throw UsageError(
          fmt::format("snapshot's OPTIMIZER_STATE does not fit this optimizer (saved "
                      "from a different optimizer type or parameter list?): {}",
                      e.what_without_backtrace()));
    }
  }
  if (snapshot.rng_state.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(snapshot.rng_state);
    } catch (const c10::Error& e) {
      throw UsageError(fmt::format("snapshot's RNG_STATE is not a CPU generator state: {}",
                                   e.what_without_backtrace()));
    }
  }
}

std::vector<char> encode_snapshot(const Snapshot& s) {
  c10::Dict<std::string, torch::Tensor> model;
  for (const auto& [name, t] : s.model_state) model.insert(name, t.contiguous());
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("MODEL_STATE", model);
  d.insert("EPOCHS_RUN", s.epochs_run);
  if (s.optimizer_state.defined()) d.insert("OPTIMIZER_STATE", s.optimizer_state);
  d.insert("SAMPLER_EPOCH", s.sampler_epoch);
  if (s.rng_state.defined()) d.insert("RNG_STATE", s.rng_state);
  d.insert("FORMAT", std::string(kFormat));
  return add_zip_checksum(torch_save_bytes(d));
}

Snapshot decode_snapshot(const std::vector<char>& bytes, const std::string& source) {
  const c10::IValue root = torch_load_bytes(bytes, source);
  auto fail = [&](const std::string& what) {
    return UsageError(
        fmt::format("{}: not a training snapshot: {}. A snapshot is a dict with "
                    "MODEL_STATE (name -> tensor) and EPOCHS_RUN (int)",
                    source, what));
  };
  if (!root.isGenericDict() ||
      !root.toGenericDict().keyType()->isSubtypeOf(*c10::StringType::get())) {
    throw fail("the file holds a " + root.tagKind() + ", not a dict with string keys");
  }
  const auto dict = root.toGenericDict();
  auto get = [&](const char* key) -> std::optional<c10::IValue> {
    auto it = dict.find(std::string(key));
    if (it == dict.end()) return std::nullopt;
    return it->value();
  };
  Snapshot s;
  auto model = get("MODEL_STATE");
  if (!model || !model->isGenericDict()) throw fail("no MODEL_STATE dict");
  for (const auto& kv : model->toGenericDict()) {
    if (!kv.key().isString() || !kv.value().isTensor()) {
      throw fail("MODEL_STATE entries must map names to tensors");
    }
    s.model_state.emplace_back(kv.key().toStringRef(), kv.value().toTensor());
  }
  auto epochs = get("EPOCHS_RUN");
  if (!epochs || !epochs->isInt()) throw fail("no integer EPOCHS_RUN");
  s.epochs_run = epochs->toInt();
  s.sampler_epoch = s.epochs_run;
  if (auto e = get("SAMPLER_EPOCH"); e && e->isInt()) s.sampler_epoch = e->toInt();
  // Byte blobs are taken as stored: a view (e.g. stride 0) could declare far more elements
  // than its storage holds, and making it contiguous would allocate them all.
  auto blob = [&](const char* key, const torch::Tensor& t) {
    if (!t.is_contiguous()) {
      throw fail(
          fmt::format("{} is a strided view of {} elements over a storage of {} bytes, "
                      "not a plain byte tensor",
                      key, t.numel(), t.storage().nbytes()));
    }
    return t;
  };
  // A Python optimizer state_dict is a dict, which LibTorch optimizers cannot load: skipped.
  if (auto o = get("OPTIMIZER_STATE");
      o && o->isTensor() && o->toTensor().dtype() == torch::kUInt8) {
    s.optimizer_state = blob("OPTIMIZER_STATE", o->toTensor());
  }
  if (auto r = get("RNG_STATE"); r && r->isTensor()) {
    s.rng_state = blob("RNG_STATE", r->toTensor());
  }
  return s;
}

}  // namespace ddp
