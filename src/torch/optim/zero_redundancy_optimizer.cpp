#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"

#include <fmt/format.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <sstream>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/optim/optimizer_state_bytes.hpp"
#include "ddp/torch/optim/optimizer_state_key.hpp"
#include "ddp/util/error.hpp"
#include "zero_internal.hpp"

namespace ddp {
namespace zero_detail {

std::string archive_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

void wait_for(ProcessGroup& pg, Work& work, const std::string& what) {
  try {
    wait_on_current_stream(pg, work, pg.timeout());
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format(
        "ZeroRedundancyOptimizer: {} did not finish on rank {}: {}. Every rank must call "
        "step() (and consolidate_state_dict) the same number of times; with uneven inputs "
        "wrap the loop in ddp::Join",
        what, pg.rank(), e.what()));
  }
}

void broadcast_bytes(ProcessGroup& pg, std::string& bytes, int root) {
  const torch::Device device = comm_device(pg);
  auto size = torch::full({1}, static_cast<int64_t>(bytes.size()), torch::kInt64).to(device);
  WorkPtr work = broadcast(pg, size, root);
  wait_for(pg, *work, fmt::format("the state size broadcast from rank {}", root));
  const int64_t n = size.cpu().item<int64_t>();
  auto data = torch::empty({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (pg.rank() == root && n > 0) std::memcpy(data.data_ptr(), bytes.data(), n);
  data = data.to(device);
  work = broadcast(pg, data, root);
  wait_for(pg, *work, fmt::format("the state broadcast from rank {}", root));
  data = data.cpu();
  bytes.assign(reinterpret_cast<const char*>(data.data_ptr()), n);
}

int64_t shard_numel(const Shard& shard) {
  int64_t n = 0;
  for (const auto& group : shard) {
    for (const auto& p : group) n += p.numel();
  }
  return n;
}

torch::Tensor flatten_shard(const Shard& shard, const torch::TensorOptions& options) {
  std::vector<torch::Tensor> flat;
  for (const auto& group : shard) {
    for (const auto& p : group) flat.push_back(p.detach().reshape({-1}));
  }
  return flat.empty() ? torch::empty({0}, options) : torch::cat(flat).to(options);
}

}  // namespace zero_detail

using zero_detail::archive_bytes;
using zero_detail::broadcast_bytes;
using zero_detail::flatten_shard;
using zero_detail::load_bytes;
using zero_detail::shard_numel;
using zero_detail::wait_for;

class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizerBase& zero) : zero_(zero) {}
  // As PyTorch's: step the shard with the gradients at hand and take part in the all-gather.
  void main_hook() override { zero_.step_and_sync(nullptr); }

 private:
  ZeroRedundancyOptimizerBase& zero_;
};

ZeroRedundancyOptimizerBase::ZeroRedundancyOptimizerBase(
    std::vector<torch::optim::OptimizerParamGroup> groups,
    std::unique_ptr<torch::optim::OptimizerOptions> defaults, ProcessGroupPtr pg)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)), pg_(std::move(pg)) {}

ZeroRedundancyOptimizerBase::~ZeroRedundancyOptimizerBase() = default;

void ZeroRedundancyOptimizerBase::check_params(size_t from_group) const {
  const torch::Tensor* first = nullptr;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (const auto& p : param_groups_[g].params()) {
      if (!first) first = &p;
      if (g < from_group) break;  // checked before; `first` is all it is needed for
      if (p.layout() != c10::kStrided || !to_data_type(p.scalar_type())) {
        throw UsageError(fmt::format(
            "ZeroRedundancyOptimizer: a parameter of shape {} is sparse or of dtype {}, which "
            "cannot be all-gathered; use dense float32/float64/float16/bfloat16 parameters",
            c10::str(p.sizes()), c10::toString(p.scalar_type())));
      }
      if (p.scalar_type() != first->scalar_type() || p.device() != first->device()) {
        throw UsageError(fmt::format(
            "ZeroRedundancyOptimizer: parameters must share one dtype and device (the shards "
            "travel as one buffer), found {} on {} and {} on {}; use one optimizer per dtype",
            c10::toString(first->scalar_type()), first->device().str(),
            c10::toString(p.scalar_type()), p.device().str()));
      }
      check_tensor_device(*pg_, p, "a ZeroRedundancyOptimizer parameter");
    }
  }
  if (!first) throw UsageError("ZeroRedundancyOptimizer: no parameters to optimize");
}

torch::TensorOptions ZeroRedundancyOptimizerBase::wire_options(const ProcessGroup& pg) const {
  torch::TensorOptions options;
  for (const auto& group : param_groups_) {
    if (!group.params().empty()) options = group.params().front().options();
  }
  return options.device(comm_device(pg)).requires_grad(false);
}

std::vector<std::vector<std::vector<torch::Tensor>>> ZeroRedundancyOptimizerBase::partition_for(
    int world) const {
  // PyTorch's partition: per group, largest first (stable), each to the least-loaded rank; the
  // loads carry over from group to group, so a group added later leaves the earlier groups'
  // assignment as it was (add_param_group).
  std::vector<std::vector<std::vector<torch::Tensor>>> shards(world);
  std::vector<int64_t> load(world, 0);
  for (const auto& group : param_groups_) {
    for (auto& shard : shards) shard.emplace_back();
    std::vector<torch::Tensor> sorted = group.params();
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.numel() > b.numel(); });
    for (const auto& p : sorted) {
      const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      shards[r].back().push_back(p);
      load[r] += p.numel();
    }
  }
  return shards;
}

void ZeroRedundancyOptimizerBase::build_local_optimizers() {
  local_ = make_optimizer(groups_with_options(shards_[pg_->rank()]));
  const int replicated = replicated_rank();
  replica_ = replicated >= 0 ? make_optimizer(groups_with_options(shards_[replicated])) : nullptr;
}

void ZeroRedundancyOptimizerBase::init() {
  if (!pg_) throw UsageError("ZeroRedundancyOptimizer: the process group is null");
  check_params(0);
  shards_ = partition_for(pg_->size());
  build_local_optimizers();
}

void ZeroRedundancyOptimizerBase::adopt_added_groups() {
  const size_t known = shards_.empty() ? 0 : shards_[0].size();
  if (param_groups_.size() == known) return;
  // add_param_group (LibTorch's, not virtual) added groups since the last call: partition
  // them as PyTorch's ZeroRedundancyOptimizer.add_param_group does, and give the local
  // optimizer this rank's shard of each; the existing shards and their state stay.
  check_params(known);
  shards_ = partition_for(pg_->size());  // the earlier groups keep their ranks
  const int replicated = replicated_rank();
  for (size_t g = known; g < param_groups_.size(); ++g) {
    local_->add_param_group(torch::optim::OptimizerParamGroup(shards_[pg_->rank()][g],
                                                              param_groups_[g].options().clone()));
    if (replica_) {
      replica_->add_param_group(torch::optim::OptimizerParamGroup(
          shards_[replicated][g], param_groups_[g].options().clone()));
    }
  }
}

std::vector<torch::optim::OptimizerParamGroup> ZeroRedundancyOptimizerBase::groups_with_options(
    const std::vector<std::vector<torch::Tensor>>& params) const {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < params.size(); ++g) {
    groups.emplace_back(params[g], param_groups_[g].options().clone());
  }
  return groups;
}

void ZeroRedundancyOptimizerBase::push_options(torch::optim::Optimizer& optimizer) const {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    optimizer.param_groups()[g].set_options(param_groups_[g].options().clone());
  }
}

torch::Tensor ZeroRedundancyOptimizerBase::step(LossClosure closure) {
  Join::notify_join_context(*this);
  return step_and_sync(std::move(closure));
}

torch::Tensor ZeroRedundancyOptimizerBase::step_and_sync(LossClosure closure) {
  adopt_added_groups();
  if (recovery_) return step_recoverable(std::move(closure));
  push_options(*local_);
  torch::Tensor loss = local_->step(std::move(closure));
  sync_params();
  return loss;
}

// One all_gather_v: rank r contributes its shard's parameters flattened in shard order.
void ZeroRedundancyOptimizerBase::sync_params() {
  const int world = pg_->size();
  if (world == 1) return;
  torch::NoGradGuard no_grad;
  const int me = pg_->rank();
  std::vector<size_t> counts(world, 0);
  for (int r = 0; r < world; ++r) counts[r] = static_cast<size_t>(shard_numel(shards_[r]));
  const torch::TensorOptions options = wire_options(*pg_);
  torch::Tensor in = flatten_shard(shards_[me], options);
  if (in.numel() == 0) in = torch::empty({1}, options);  // a valid pointer for an empty shard
  size_t total = 0;
  for (size_t c : counts) total += c;
  torch::Tensor out = torch::empty({static_cast<int64_t>(total)}, options);
  const TensorBuffer in_buf = tensor_buffer(in, "ZeRO's shard");
  const TensorBuffer out_buf = tensor_buffer(out, "ZeRO's gathered parameters");
  use_current_stream(*pg_);
  record_on_comm_stream(*pg_, in);
  record_on_comm_stream(*pg_, out);
  WorkPtr work = pg_->all_gather_v(in_buf.data, out_buf.data, counts, in_buf.dtype);
  wait_for(*pg_, *work, "the parameter all-gather");
  int64_t offset = 0;
  for (int r = 0; r < world; ++r) {
    for (const auto& group : shards_[r]) {
      for (const auto& p : group) {
        if (r != me) p.copy_(out.narrow(0, offset, p.numel()).view(p.sizes()));
        offset += p.numel();
      }
    }
  }
}

void ZeroRedundancyOptimizerBase::consolidate_state_dict(int to_rank) {
  const int world = pg_->size();
  if (to_rank < 0 || to_rank >= world) {
    throw UsageError(fmt::format(
        "ZeroRedundancyOptimizer::consolidate_state_dict: to_rank {} is not a rank of this "
        "group of {}",
        to_rank, world));
  }
  consolidated_.reset();
  adopt_added_groups();
  push_options(*local_);
  const int me = pg_->rank();
  std::unique_ptr<torch::optim::Optimizer> full;
  if (me == to_rank) {
    std::vector<std::vector<torch::Tensor>> all;
    for (const auto& group : param_groups_) all.push_back(group.params());
    full = make_optimizer(groups_with_options(all));
  }
  for (int r = 0; r < world; ++r) {
    // The target rank needs every shard's state; through the bytes of LibTorch's archive, so
    // the consolidated copy shares no tensor with the live state.
    std::string bytes = r == me ? archive_bytes(*local_) : std::string();
    if (r != to_rank) broadcast_bytes(*pg_, bytes, r);
    if (me != to_rank) continue;
    auto shard = make_optimizer(groups_with_options(shards_[r]));
    load_bytes(*shard, bytes);
    for (auto& item : shard->state()) full->state()[item.first] = std::move(item.second);
  }
  consolidated_ = std::move(full);
}

void ZeroRedundancyOptimizerBase::save(torch::serialize::OutputArchive& archive) const {
  if (!consolidated_) {
    throw UsageError(fmt::format(
        "ZeroRedundancyOptimizer::save on rank {}: the optimizer state is sharded over {} "
        "ranks and has not been consolidated on this rank; call consolidate_state_dict({}) on "
        "every rank first, then save on rank {} only",
        pg_->rank(), pg_->size(), pg_->rank(), pg_->rank()));
  }
  push_options(*consolidated_);
  consolidated_->save(archive);
}

void ZeroRedundancyOptimizerBase::load(torch::serialize::InputArchive& archive) {
  adopt_added_groups();
  std::vector<std::vector<torch::Tensor>> all;
  for (const auto& group : param_groups_) all.push_back(group.params());
  auto full = make_optimizer(groups_with_options(all));
  try {
    full->load(archive);
  } catch (const c10::Error& e) {
    throw UsageError(fmt::format(
        "ZeroRedundancyOptimizer::load on rank {}: the archive does not fit this optimizer "
        "(it must hold the full state of the same optimizer type over the same parameter "
        "groups, as save() after consolidate_state_dict writes): {}",
        pg_->rank(), e.what_without_backtrace()));
  }
  const int replicated = replicated_rank();
  for (auto [optimizer, owner] :
       {std::pair{local_.get(), pg_->rank()}, std::pair{replica_.get(), replicated}}) {
    if (optimizer == nullptr) continue;
    optimizer->state().clear();
    for (const auto& group : shards_[owner]) {
      for (const auto& p : group) {
        auto it = full->state().find(optimizer_state_key(p));
        if (it == full->state().end()) continue;
        optimizer->state()[optimizer_state_key(p)] = std::move(it->second);
      }
    }
    push_options(*optimizer);
  }
  consolidated_.reset();
}

size_t ZeroRedundancyOptimizerBase::local_state_bytes() const {
  return optimizer_state_bytes(*local_);
}

size_t ZeroRedundancyOptimizerBase::replica_state_bytes() const {
  return replica_ ? optimizer_state_bytes(*replica_) : 0;
}

std::unique_ptr<JoinHook> ZeroRedundancyOptimizerBase::join_hook(const JoinOptions&) {
  return std::make_unique<ZeroJoinHook>(*this);
}

}  // namespace ddp
