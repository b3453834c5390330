#include "output_sink.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <string>
#include <utility>

namespace ddp {
namespace {

// Identity in backward: gradient k of the sink's outputs is gradient k of its inputs.
class OutputSinkBackward : public torch::autograd::Node {
 public:
  explicit OutputSinkBackward(std::function<void()> on_backward)
      : on_backward_(std::move(on_backward)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    on_backward_();
    return std::move(grads);
  }
  std::string name() const override { return "ddp::OutputSinkBackward"; }

 private:
  std::function<void()> on_backward_;
};

}  // namespace

std::vector<torch::Tensor> pass_through_sink(const std::vector<torch::Tensor>& outputs,
                                             std::function<void()> on_backward) {
  std::vector<torch::Tensor> differentiable;
  for (const auto& t : outputs) {
    if (t.defined() && t.requires_grad()) differentiable.push_back(t);
  }
  if (differentiable.empty()) return {};
  std::shared_ptr<OutputSinkBackward> node(new OutputSinkBackward(std::move(on_backward)),
                                           torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(differentiable));
  std::vector<torch::Tensor> out;
  out.reserve(outputs.size());
  for (const auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) {
      out.push_back(t);
      continue;
    }
    torch::Tensor copy;
    {
      torch::NoGradGuard no_grad;
      copy = t.clone();
    }
    // In the order of `differentiable`: copy k's gradient is the node's input k, handed on to
    // next edge k (output k's own graph).
    torch::autograd::set_history(copy, node);
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace ddp
