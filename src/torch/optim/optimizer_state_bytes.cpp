#include "ddp/torch/optim/optimizer_state_bytes.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <sstream>

namespace ddp {
namespace {

size_t bytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<size_t>(t.numel()) * t.element_size() : 0;
}

size_t serialized_bytes(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive archive;
  state.serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str().size();
}

}  // namespace

size_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  size_t total = 0;
  for (const auto& item : optimizer.state()) {
    const OptimizerParamState* s = item.second.get();
    if (auto* adam = dynamic_cast<const AdamParamState*>(s)) {
      total += bytes(adam->exp_avg()) + bytes(adam->exp_avg_sq()) + bytes(adam->max_exp_avg_sq());
    } else if (auto* adamw = dynamic_cast<const AdamWParamState*>(s)) {
      total +=
          bytes(adamw->exp_avg()) + bytes(adamw->exp_avg_sq()) + bytes(adamw->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<const SGDParamState*>(s)) {
      total += bytes(sgd->momentum_buffer());
    } else if (auto* rms = dynamic_cast<const RMSpropParamState*>(s)) {
      total += bytes(rms->square_avg()) + bytes(rms->momentum_buffer()) + bytes(rms->grad_avg());
    } else if (auto* ada = dynamic_cast<const AdagradParamState*>(s)) {
      total += bytes(ada->sum());
    } else if (s) {
      total += serialized_bytes(*s);
    }
  }
  return total;
}

}  // namespace ddp
