// ZeroRedundancyOptimizer under in-place recovery (StepManager, docs/recovery.md): shard
// replicas, the roll-forward of a step cut after the backward, and resharding over a re-formed
// group. See the header's "In-place recovery" paragraph.
#include <fmt/format.h>

#include <unordered_map>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/optim/optimizer_state_key.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/rank_list.hpp"
#include "zero_internal.hpp"

namespace ddp {

using zero_detail::archive_bytes;
using zero_detail::broadcast_bytes;
using zero_detail::flatten_shard;
using zero_detail::load_bytes;
using zero_detail::shard_numel;
using zero_detail::wait_for;

int ZeroRedundancyOptimizerBase::replicated_rank() const {
  const int world = pg_->size();
  if (!recovery_ || world < 2) return -1;
  // Ranks are numbered node by node (LOCAL_WORLD_SIZE each, ddprun's contract): replicating
  // the shard of the rank one node before puts every replica on another node than its owner,
  // so a lost node takes no shard with it. Within one node, the rank just before.
  const int64_t per_node = env::get_int("LOCAL_WORLD_SIZE").value_or(1);
  const int stride = per_node > 0 && per_node < world ? static_cast<int>(per_node) : 1;
  return (pg_->rank() + world - stride) % world;
}

void ZeroRedundancyOptimizerBase::enable_recovery() {
  if (recovery_) return;
  recovery_ = true;
  const int replicated = replicated_rank();
  if (replicated >= 0) replica_ = make_optimizer(groups_with_options(shards_[replicated]));
}

torch::Tensor ZeroRedundancyOptimizerBase::step_recoverable(LossClosure closure) {
  // Every rank has finished its backward once this all-reduce completed on any rank: then
  // each survivor of a loss from here on holds the step's averaged gradients and can finish
  // the step (apply_pending) instead of leaving it half applied.
  pending_ = Pending::kArrived;
  auto arrived = torch::ones({1}, torch::kInt64).to(comm_device(*pg_));
  WorkPtr work = all_reduce(*pg_, arrived, ReduceOp::kSum);
  wait_for(*pg_, *work, "the backward check before the optimizer step");
  push_options(*local_);
  torch::Tensor loss = local_->step(std::move(closure));
  if (replica_) {
    push_options(*replica_);
    replica_->step(nullptr);
  }
  pending_ = Pending::kApplied;
  sync_params();
  pending_ = Pending::kNone;
  return loss;
}

void ZeroRedundancyOptimizerBase::apply_pending() {
  if (pending_ != Pending::kArrived) return;
  push_options(*local_);
  local_->step(nullptr);
  if (replica_) {
    push_options(*replica_);
    replica_->step(nullptr);
  }
  pending_ = Pending::kApplied;
}

void ZeroRedundancyOptimizerBase::reshard(ProcessGroupPtr pg, bool fresh, int params_root) {
  if (!pg) throw UsageError("ZeroRedundancyOptimizer::reshard: the process group is null");
  adopt_added_groups();
  ProcessGroup& group = *pg;
  const int n = group.size();
  const int me = group.rank();
  const torch::Device device = comm_device(group);

  // Who held what: each rank's rank and world in the group it trained in (-1: fresh), and the
  // shard it replicated there (-1: none).
  auto mine = torch::tensor({static_cast<int64_t>(fresh ? -1 : pg_->rank()),
                             static_cast<int64_t>(fresh ? 0 : pg_->size()),
                             static_cast<int64_t>(!fresh && replica_ ? replicated_rank() : -1)},
                            torch::kInt64)
                  .to(device);
  auto all = torch::empty({3 * static_cast<int64_t>(n)}, torch::kInt64).to(device);
  {
    const TensorBuffer in = tensor_buffer(mine, "ZeRO's reshard header");
    const TensorBuffer out = tensor_buffer(all, "ZeRO's reshard headers");
    use_current_stream(group);
    WorkPtr work = group.all_gather(in.data, out.data, 3, in.dtype);
    wait_for(group, *work, "the reshard header all-gather");
  }
  all = all.cpu();
  const auto* info = all.data_ptr<int64_t>();
  int old_world = 0;
  for (int r = 0; r < n; ++r) {
    if (info[3 * r] < 0) continue;
    if (old_world != 0 && info[3 * r + 1] != old_world) {
      throw Error(fmt::format(
          "ZeroRedundancyOptimizer::reshard: the ranks trained in groups of {} and {} ranks; "
          "every survivor must come from the same generation",
          old_world, info[3 * r + 1]));
    }
    old_world = static_cast<int>(info[3 * r + 1]);
  }

  // Every shard of the old partition, from a rank that holds it (its owner, else the rank that
  // replicated it) to every rank: its parameters and its optimizer state.
  std::unordered_map<OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>> state;
  std::vector<int> lost;
  const torch::TensorOptions options = wire_options(group);
  // No rank trained (the job's start): one shard of everything, from params_root.
  const auto old_shards = partition_for(std::max(old_world, 1));
  for (int s = 0; s < static_cast<int>(old_shards.size()); ++s) {
    int holder = -1;
    bool from_replica = false;
    for (int r = 0; r < n && holder < 0; ++r) {
      if (info[3 * r] == s) holder = r;
    }
    for (int r = 0; r < n && holder < 0; ++r) {
      if (info[3 * r + 2] == s) {
        holder = r;
        from_replica = true;
      }
    }
    const bool has_state = holder >= 0;
    if (!has_state) {
      if (old_world > 0) lost.push_back(s);
      holder = params_root;  // the parameters only
    }
    std::string bytes;
    if (has_state) {
      if (me == holder) bytes = archive_bytes(from_replica ? *replica_ : *local_);
      broadcast_bytes(group, bytes, holder);
    }
    if (shard_numel(old_shards[s]) > 0) {
      torch::NoGradGuard no_grad;
      torch::Tensor flat = me == holder ? flatten_shard(old_shards[s], options)
                                        : torch::empty({shard_numel(old_shards[s])}, options);
      WorkPtr work = broadcast(group, flat, holder);
      wait_on_current_stream(group, *work, group.timeout());
      int64_t offset = 0;
      for (const auto& g : old_shards[s]) {
        for (const auto& p : g) {
          if (me != holder) p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
          offset += p.numel();
        }
      }
    }
    if (!has_state) continue;
    auto shard = make_optimizer(groups_with_options(old_shards[s]));
    load_bytes(*shard, bytes);
    for (auto& item : shard->state()) state[item.first] = std::move(item.second);
  }
  if (!lost.empty()) {
    log::get("ddp.recovery")
        ->warn(
            "ZeroRedundancyOptimizer: both the owner and the replica of shard(s) {} (of {}) "
            "were lost: those parameters go on with fresh optimizer state",
            format_rank_list(lost), old_world);
  }

  // The new partition, with the state each rank now owns or replicates.
  pg_ = std::move(pg);
  shards_ = partition_for(n);
  build_local_optimizers();
  const int replicated = replicated_rank();
  for (auto [optimizer, owner] :
       {std::pair{local_.get(), me}, std::pair{replica_.get(), replicated}}) {
    if (optimizer == nullptr) continue;
    for (const auto& g : shards_[owner]) {
      for (const auto& p : g) {
        auto it = state.find(optimizer_state_key(p));
        if (it != state.end()) optimizer->state()[it->first] = std::move(it->second);
      }
    }
  }
  pending_ = Pending::kNone;
  consolidated_.reset();
}

}  // namespace ddp
