#include "ddp/torch/ddp/reducer.hpp"

// The Reducer's construction (checks of the parameters, the hooks on their gradient
// accumulators), its state switches and accessors. The rest lives beside it by phase:
// reducer_buckets.cpp (the flat buffers and their rebuild), reducer_backward.cpp (hooks firing
// while backward runs, launching buckets), reducer_finalize.cpp (the end of a backward) and
// reducer_join.cpp (a joined rank's shadow backward).

#include <fmt/format.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ddp/torch/ddp/bucketing.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "static_graph.hpp"

namespace ddp {
namespace {

// Runs `fn` after the AccumulateGrad node it is attached to has accumulated the gradient.
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

Reducer::Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                 ProcessGroupPtr pg, ReducerConfig config)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(pg)),
      config_(std::move(config)),
      stragglers_(config_.straggler_window) {
  has_user_comm_hook_ = config_.comm_hook != nullptr;
  if (!config_.comm_hook) config_.comm_hook = allreduce_hook();
  const size_t n = params_.size();
  std::vector<BucketParam> sizes(n);
  for (size_t i = 0; i < n; ++i) {
    const torch::Tensor& p = params_[i];
    const std::string what = fmt::format("parameter '{}'", names_[i]);
    if (!p.requires_grad() || !p.is_leaf()) {
      throw UsageError(
          fmt::format("{} must be a leaf tensor that requires grad to be averaged by DDP", what));
    }
    if (p.layout() != c10::kStrided) {
      throw UsageError(fmt::format("{} is sparse; DDP averages dense parameters only", what));
    }
    if (!to_data_type(p.scalar_type())) {
      throw UsageError(fmt::format(
          "{} has dtype {}, which DDP cannot all-reduce; use float32/float64/float16/bfloat16",
          what, c10::toString(p.scalar_type())));
    }
    sizes[i].bytes = static_cast<size_t>(p.numel()) * p.element_size();
    sizes[i].group = std::string(c10::toString(p.scalar_type())) + "@" + p.device().str();
  }

  if (config_.static_graph) static_graph_ = std::make_unique<StaticGraph>(n);
  sizes_ = std::move(sizes);
  build_buckets(assign_buckets(sizes_, config_.first_bucket_cap_bytes, config_.bucket_cap_bytes));

  ready_.assign(n, false);
  locally_used_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) {
      throw UsageError(fmt::format("parameter '{}' has no gradient accumulator", names_[i]));
    }
    hook_keys_.push_back(
        acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { on_gradient_ready(i); })));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  abandon_iteration_locked();
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = sync;
}

bool Reducer::sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

int64_t Reducer::unused_parameter_searches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unused_parameter_searches_;
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::lock_guard<std::mutex> lock(mutex_);  // the rebuild replaces buckets_ during a backward
  std::vector<std::vector<std::string>> out;
  for (const Bucket& bucket : buckets_) {
    out.emplace_back();
    for (size_t i : bucket.params) out.back().push_back(names_[i]);
  }
  return out;
}

}  // namespace ddp
