#include "output_sink.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <string>
#include <type_traits>
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

// A new node in the smart pointer this LibTorch holds autograd nodes in: std::shared_ptr (with
// deleteNode, which frees long chains without deep recursion) before 2.1x, c10::intrusive_ptr
// in 2.13.
template <class NodeType, class... Args>
decltype(torch::autograd::Edge::function) make_node(Args&&... args) {
  using Ptr = decltype(torch::autograd::Edge::function);
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>) {
    // Unqualified, found through the argument's namespace when instantiated: LibTorch 2.13
    // has no deleteNode, and this branch is not instantiated there.
    return Ptr(new NodeType(std::forward<Args>(args)...), [](NodeType* n) { deleteNode(n); });
  } else {
    return c10::make_intrusive<NodeType>(std::forward<Args>(args)...);
  }
}

}  // namespace

std::vector<torch::Tensor> pass_through_sink(const std::vector<torch::Tensor>& outputs,
                                             std::function<void()> on_backward) {
  std::vector<torch::Tensor> differentiable;
  for (const auto& t : outputs) {
    if (t.defined() && t.requires_grad()) differentiable.push_back(t);
  }
  if (differentiable.empty()) return {};
  auto node = make_node<OutputSinkBackward>(std::move(on_backward));
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
