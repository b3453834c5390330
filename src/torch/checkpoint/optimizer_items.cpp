// The optimizer under PyTorch's names (torch.distributed.checkpoint.state_dict.get_state_dict):
// optim.state.<fqn>.<name> and optim.param_groups.<g>.<option>, for torch::optim::Adam, AdamW
// and SGD, classes derived from them (ddp::FusedAdam), and ZeroRedundancyOptimizer over them.
// PyTorch's Adam keeps `step` as a float32 scalar tensor; LibTorch keeps an int64.
#include <fmt/format.h>

#include <cmath>

#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/util/error.hpp"
#include "state_items.hpp"

namespace ddp::checkpoint {

namespace {

using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

// TensorImpl -> the parameter's name in the module.
std::map<const void*, std::string> parameter_names(const torch::nn::Module& module) {
  std::map<const void*, std::string> names;
  for (const auto& p : module.named_parameters(true))
    names[p.value().unsafeGetTensorImpl()] = p.key();
  return names;
}

const std::string& name_of(const std::map<const void*, std::string>& names,
                           const torch::Tensor& p) {
  auto it = names.find(p.unsafeGetTensorImpl());
  if (it == names.end()) {
    throw UsageError(
        "checkpoint: the optimizer holds a parameter the module does not have; pass the module "
        "whose parameters the optimizer updates");
  }
  return it->second;
}

// The optimizer whose state() holds this rank's state: ZeRO's local shard, else itself.
torch::optim::Optimizer& state_holder(torch::optim::Optimizer& optimizer, bool* sharded) {
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizerBase*>(&optimizer)) {
    *sharded = true;
    return zero->local_optimizer();
  }
  *sharded = false;
  return optimizer;
}

c10::IValue betas_value(const std::tuple<double, double>& b) {
  return c10::ivalue::Tuple::create({std::get<0>(b), std::get<1>(b)});
}

// Adam's and AdamW's options (the same fields; PyTorch 2.13's AdamW is Adam with
// decoupled_weight_decay=True).
template <typename Options>
std::vector<std::pair<std::string, c10::IValue>> adam_options(const Options& a, bool decoupled) {
  return {{"lr", a.lr()},
          {"betas", betas_value(a.betas())},
          {"eps", a.eps()},
          {"weight_decay", a.weight_decay()},
          {"amsgrad", a.amsgrad()},
          {"maximize", false},
          {"foreach", c10::IValue()},
          {"capturable", false},
          {"differentiable", false},
          {"fused", c10::IValue()},
          {"decoupled_weight_decay", decoupled}};
}

// PyTorch 2.13's options of the group, in its names (the ones LibTorch lacks at their defaults).
std::vector<std::pair<std::string, c10::IValue>> group_options(
    const torch::optim::OptimizerOptions& o) {
  if (const auto* a = dynamic_cast<const AdamOptions*>(&o)) return adam_options(*a, false);
  if (const auto* a = dynamic_cast<const AdamWOptions*>(&o)) return adam_options(*a, true);
  if (const auto* s = dynamic_cast<const SGDOptions*>(&o)) {
    return {{"lr", s->lr()},
            {"momentum", s->momentum()},
            {"dampening", s->dampening()},
            {"weight_decay", s->weight_decay()},
            {"nesterov", s->nesterov()},
            {"maximize", false},
            {"foreach", c10::IValue()},
            {"differentiable", false},
            {"fused", c10::IValue()}};
  }
  throw UsageError(
      "checkpoint: the optimizer is not Adam, AdamW or SGD (or a class derived from them, or "
      "ZeroRedundancyOptimizer over one); save its state with capture_snapshot instead");
}

torch::Tensor step_tensor(int64_t step) {
  return torch::scalar_tensor(static_cast<double>(step), torch::kFloat32);
}

std::vector<std::pair<std::string, torch::Tensor>> state_tensors(
    const torch::optim::OptimizerParamState& st) {
  std::vector<std::pair<std::string, torch::Tensor>> r;
  auto add = [&](const char* name, const torch::Tensor& t) {
    if (t.defined()) r.emplace_back(name, t);
  };
  auto adam = [&](const auto& a) {
    r.emplace_back("step", step_tensor(a.step()));
    add("exp_avg", a.exp_avg());
    add("exp_avg_sq", a.exp_avg_sq());
    add("max_exp_avg_sq", a.max_exp_avg_sq());
  };
  if (const auto* a = dynamic_cast<const AdamParamState*>(&st)) {
    adam(*a);
  } else if (const auto* w = dynamic_cast<const AdamWParamState*>(&st)) {
    adam(*w);
  } else if (const auto* s = dynamic_cast<const SGDParamState*>(&st)) {
    add("momentum_buffer", s->momentum_buffer());
  } else {
    throw UsageError("checkpoint: unknown optimizer state type (Adam, AdamW and SGD are known)");
  }
  return r;
}

}  // namespace

void append_optimizer_items(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                            std::vector<Item>& out) {
  const auto names = parameter_names(module);
  bool sharded = false;
  torch::optim::Optimizer& holder = state_holder(optimizer, &sharded);
  for (const auto& group : holder.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = holder.state().find(p.unsafeGetTensorImpl());
      if (it == holder.state().end()) continue;
      const std::string& fqn = name_of(names, p);
      for (auto& [name, t] : state_tensors(*it->second)) {
        Item item;
        item.fqn = fmt::format("optim.state.{}.{}", fqn, name);
        item.path = {"optim", "state", fqn, name};
        item.tensor = t.detach();
        item.writer = sharded ? WrittenBy::kThisRank : WrittenBy::kAnyRank;
        out.push_back(std::move(item));
      }
    }
  }
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    auto add = [&](const std::string& key, c10::IValue v) {
      Item item;
      item.fqn = fmt::format("optim.param_groups.{}.{}", g, key);
      item.path = {"optim", "param_groups", static_cast<int64_t>(g), key};
      item.value = std::move(v);
      item.writer = WrittenBy::kRankZero;
      out.push_back(std::move(item));
    };
    for (auto& [key, v] : group_options(groups[g].options())) add(key, v);
    c10::List<std::string> params;
    for (const auto& p : groups[g].params()) params.push_back(name_of(names, p));
    add("params", params);
  }
}

namespace {

double as_double(const c10::IValue& v, const std::string& what) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  throw UsageError(fmt::format("checkpoint: {} is not a number", what));
}

bool as_bool(const c10::IValue& v, const std::string& what) {
  if (v.isBool()) return v.toBool();
  throw UsageError(fmt::format("checkpoint: {} is not a bool", what));
}

// Sets the options the checkpoint has (PyTorch's names) on a LibTorch group's options.
void restore_options(const EntryReader& r, size_t g, torch::optim::OptimizerOptions& o) {
  const std::string prefix = fmt::format("optim.param_groups.{}.", g);
  auto num = [&](const char* key, auto&& set) {
    if (r.has(prefix + key)) set(as_double(r.value(prefix + key), prefix + key));
  };
  auto flag = [&](const char* key, auto&& set) {
    if (r.has(prefix + key)) set(as_bool(r.value(prefix + key), prefix + key));
  };
  auto betas = [&](auto& opts) {
    if (!r.has(prefix + "betas")) return;
    const c10::IValue v = r.value(prefix + "betas");
    std::vector<c10::IValue> items;
    if (v.isTuple()) {
      items = v.toTupleRef().elements().vec();
    } else if (v.isList()) {
      for (const auto& x : v.toListRef()) items.push_back(x);
    }
    if (items.size() != 2) throw UsageError("checkpoint: " + prefix + "betas is not a pair");
    opts.betas(std::make_tuple(as_double(items[0], prefix + "betas"),
                               as_double(items[1], prefix + "betas")));
  };
  auto adam = [&](auto& a) {
    num("lr", [&](double v) { a.lr(v); });
    num("eps", [&](double v) { a.eps(v); });
    num("weight_decay", [&](double v) { a.weight_decay(v); });
    flag("amsgrad", [&](bool v) { a.amsgrad(v); });
    betas(a);
  };
  if (auto* a = dynamic_cast<AdamOptions*>(&o)) {
    adam(*a);
  } else if (auto* w = dynamic_cast<AdamWOptions*>(&o)) {
    adam(*w);
  } else if (auto* s = dynamic_cast<SGDOptions*>(&o)) {
    num("lr", [&](double v) { s->lr(v); });
    num("momentum", [&](double v) { s->momentum(v); });
    num("dampening", [&](double v) { s->dampening(v); });
    num("weight_decay", [&](double v) { s->weight_decay(v); });
    flag("nesterov", [&](bool v) { s->nesterov(v); });
  } else {
    group_options(o);  // throws the unsupported-optimizer error
  }
}

// A state tensor for parameter p: the checkpoint's values in p's dtype and device.
torch::Tensor like_param(const EntryReader& r, const std::string& key, const torch::Tensor& p) {
  torch::Tensor t = r.tensor(key);
  if (t.sizes() != p.sizes()) {
    throw UsageError(fmt::format("checkpoint {}: {} has shape [{}], its parameter [{}]", r.dir(),
                                 key, fmt::join(t.sizes(), ", "), fmt::join(p.sizes(), ", ")));
  }
  return t.to(p.device(), p.scalar_type()).contiguous();
}

int64_t step_of(const EntryReader& r, const std::string& key) {
  const c10::IValue v = r.value(key);
  if (v.isTensor()) return static_cast<int64_t>(std::llround(v.toTensor().item<double>()));
  return static_cast<int64_t>(std::llround(as_double(v, key)));
}

std::unique_ptr<torch::optim::OptimizerParamState> load_state(
    const EntryReader& r, const std::string& prefix, const torch::Tensor& p,
    const torch::optim::OptimizerOptions& kind) {
  auto t = [&](const char* name) {
    return r.has(prefix + name) ? like_param(r, prefix + name, p) : torch::Tensor();
  };
  auto adam = [&](auto state) {
    state->step(step_of(r, prefix + "step"));
    state->exp_avg(t("exp_avg"));
    state->exp_avg_sq(t("exp_avg_sq"));
    state->max_exp_avg_sq(t("max_exp_avg_sq"));
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  };
  if (dynamic_cast<const AdamOptions*>(&kind)) return adam(std::make_unique<AdamParamState>());
  if (dynamic_cast<const AdamWOptions*>(&kind)) return adam(std::make_unique<AdamWParamState>());
  auto s = std::make_unique<SGDParamState>();
  s->momentum_buffer(t("momentum_buffer"));
  return s;
}

}  // namespace

void load_optimizer(const EntryReader& reader, const torch::nn::Module& module,
                    torch::optim::Optimizer& optimizer) {
  const auto names = parameter_names(module);
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string key = fmt::format("optim.param_groups.{}.params", g);
    if (reader.has(key)) {
      const c10::IValue saved = reader.value(key);
      std::vector<std::string> want, have;
      for (const auto& p : groups[g].params()) want.push_back(name_of(names, p));
      if (saved.isList()) {
        for (const auto& x : saved.toListRef()) {
          if (x.isString()) have.push_back(x.toStringRef());
        }
      }
      if (want != have) {
        throw UsageError(fmt::format(
            "checkpoint {}: optimizer group {} holds [{}], the optimizer's holds [{}]; build "
            "the optimizer over the same parameter groups it was saved with",
            reader.dir(), g, fmt::join(have, ", "), fmt::join(want, ", ")));
      }
    }
    restore_options(reader, g, groups[g].options());
  }
  if (reader.has(fmt::format("optim.param_groups.{}.params", groups.size()))) {
    throw UsageError(fmt::format("checkpoint {} has more optimizer groups than the optimizer's {}",
                                 reader.dir(), groups.size()));
  }

  bool sharded = false;
  torch::optim::Optimizer& holder = state_holder(optimizer, &sharded);
  const torch::optim::OptimizerOptions& kind = groups.at(0).options();
  for (const auto& group : holder.param_groups()) {
    for (const auto& p : group.params()) {
      const std::string prefix = fmt::format("optim.state.{}.", name_of(names, p));
      if (reader.keys_with_prefix(prefix).empty()) {
        holder.state().erase(p.unsafeGetTensorImpl());
        continue;
      }
      holder.state()[p.unsafeGetTensorImpl()] = load_state(reader, prefix, p, kind);
    }
  }
  // ZeroRedundancyOptimizer hands the exposed groups' options to its shard at the next step().
}

}  // namespace ddp::checkpoint
