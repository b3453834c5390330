#include "ddp/torch/ddp/state.hpp"

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp {

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.insert(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    out.insert(item.key(), item.value());
  }
  return out;
}

void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  StateDict own = state_dict(module);
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  for (const auto& item : own) {
    if (!state.contains(item.key())) missing.push_back(item.key());
  }
  for (const auto& item : state) {
    if (!own.contains(item.key())) unexpected.push_back(item.key());
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    throw UsageError(fmt::format(
        "load_state_dict: keys do not match the module: missing [{}], unexpected [{}]; load a "
        "state dict of the same architecture or pass strict=false",
        fmt::join(missing, ", "), fmt::join(unexpected, ", ")));
  }
  torch::NoGradGuard no_grad;
  for (auto& item : own) {
    const torch::Tensor* src = state.find(item.key());
    if (!src) continue;
    if (src->sizes() != item.value().sizes()) {
      throw UsageError(
          fmt::format("load_state_dict: '{}' has shape {} in the state dict but {} "
                      "in the module",
                      item.key(), c10::str(src->sizes()), c10::str(item.value().sizes())));
    }
    item.value().copy_(*src);
  }
}

}  // namespace ddp
