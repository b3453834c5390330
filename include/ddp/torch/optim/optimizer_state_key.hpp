#pragma once
// optimizer_state_key: the key a LibTorch optimizer files a parameter's state under, for code
// that reads or fills `optimizer.state()` directly (FusedAdam, ZeroRedundancyOptimizer).
//
// LibTorch keys the state by the parameter's TensorImpl address: as `void*` since the 2.1x
// releases, and before that as the address printed into a string (c10::guts::to_string, an
// ostream's `<<` of the pointer). The key type is read off this LibTorch's map, so ddp builds
// against either.

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace ddp {

using OptimizerStateKey =
    typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// A template so that only the branch of this LibTorch's key type is instantiated.
template <class Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& param) {
  void* impl = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << impl;
    return out.str();
  } else {
    return impl;
  }
}

}  // namespace ddp
