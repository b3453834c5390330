#include "ddp/torch/recovery/peer_heal.hpp"

#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

#include "ddp/torch/ddp/consistency.hpp"
#include "ddp/torch/nn/random_state.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

namespace {

void wait(const WorkPtr& work, std::chrono::milliseconds timeout) {
  work->wait(timeout);
}

std::string save_optimizer(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  optimizer.load(archive);
}

// Broadcasts a byte string of any length from root (length first).
std::string broadcast_bytes(ProcessGroup& pg, std::string bytes, int root,
                            std::chrono::milliseconds timeout) {
  int64_t size = static_cast<int64_t>(bytes.size());
  wait(pg.broadcast(&size, 1, DataType::kInt64, root), timeout);
  bytes.resize(static_cast<size_t>(size));
  wait(pg.broadcast(bytes.data(), bytes.size(), DataType::kUInt8, root), timeout);
  return bytes;
}

}  // namespace

HealResult heal_from_peer(const ProcessGroupPtr& group, const HealTarget& target, bool fresh,
                          std::chrono::milliseconds timeout) {
  if (target.module == nullptr || target.step == nullptr) {
    throw UsageError("heal_from_peer: the module and the step counter are required");
  }
  ProcessGroup& pg = *group;
  auto* zero = dynamic_cast<ZeroRedundancyOptimizerBase*>(target.optimizer);
  using Pending = ZeroRedundancyOptimizerBase::Pending;
  const Pending pending = zero != nullptr && !fresh ? zero->pending() : Pending::kNone;
  const int n = pg.size();
  int64_t mine[3] = {*target.step, fresh ? 1 : 0, static_cast<int64_t>(pending)};
  std::vector<int64_t> all(3 * static_cast<size_t>(n));
  wait(pg.all_gather(mine, all.data(), 3, DataType::kInt64), timeout);

  // A ZeRO step cut by the loss: rolled forward on every survivor when any had applied it,
  // else dropped (header comment). Every rank reads the same table, so all decide alike.
  bool any_applied = false;
  for (int r = 0; r < n; ++r) {
    any_applied = any_applied || all[3 * r + 2] == static_cast<int64_t>(Pending::kApplied);
  }
  if (any_applied) {
    for (int r = 0; r < n; ++r) {
      if (all[3 * r + 2] != static_cast<int64_t>(Pending::kNone)) ++all[3 * r];
    }
  }
  // Rolling forward changes state that a retried heal (a loss during this one) must see: the
  // step stays pending (kApplied) until the heal completed. Dropping waits until then too.
  if (pending != Pending::kNone && any_applied) zero->apply_pending();
  const bool drop = pending != Pending::kNone && !any_applied;

  HealResult result;
  int source = -1;
  bool differ = zero != nullptr;  // a ZeRO optimizer is resharded over the new group always
  for (int r = 0; r < n; ++r) {
    const int64_t step = all[3 * r];
    const bool is_fresh = all[3 * r + 1] != 0;
    differ = differ || is_fresh || step != all[0];
    if (is_fresh) continue;
    if (source < 0 || step > all[3 * source]) source = r;
  }
  if (any_applied) {
    // Every survivor had finished the step's backward (its check completed somewhere), so
    // every survivor has applied the step now, and none may be behind it.
    for (int r = 0; r < n; ++r) {
      if (all[3 * r + 1] == 0 && all[3 * r] != all[3 * source]) {
        throw Error(fmt::format(
            "heal: rank {} is at step {} while the ZeroRedundancyOptimizer step {} was applied "
            "on other survivors; the optimizer state cannot be made consistent",
            r, all[3 * r], all[3 * source]));
      }
    }
  }
  result.source = source < 0 ? 0 : source;
  if (!differ) return result;  // the survivors of a loss during forming: nothing to send
  // (differ holds with ZeRO, so a pending step is always settled below.)
  result.transferred = true;
  const int root = result.source;

  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors;
  // With ZeRO the parameters come shard by shard from the ranks that stepped them (reshard):
  // the source's own copy of another rank's shard may be a step behind.
  if (zero == nullptr) {
    for (const auto& p : target.module->parameters(true)) tensors.push_back(p);
  }
  for (const auto& b : target.module->buffers(true)) tensors.push_back(b);
  if (!tensors.empty()) broadcast_tensors(pg, tensors, root, timeout);

  if (zero != nullptr) {
    // Sharded state: every shard from a rank that holds it (parameters too, which settles a
    // step whose parameter all-gather did not finish anywhere).
    zero->reshard(group, fresh, root);
  } else if (target.optimizer != nullptr) {
    std::string state = pg.rank() == root ? save_optimizer(*target.optimizer) : std::string();
    state = broadcast_bytes(pg, std::move(state), root, timeout);
    if (pg.rank() != root) load_optimizer(*target.optimizer, state);
  }

  if (drop && target.drop_pending) target.drop_pending();  // before the generators travel
  if (zero != nullptr) zero->clear_pending();

  // Every rank runs the same program: a module on a CUDA device on one is on one on all.
  const std::optional<c10::Device> cuda_device = cuda_device_of(*target.module);
  RandomState rng = capture_random_state(cuda_device);
  for (torch::Tensor* state : {&rng.cpu, &rng.cuda}) {
    if (!state->defined()) continue;
    *state = state->contiguous();
    wait(pg.broadcast(state->data_ptr(), static_cast<size_t>(state->numel()), DataType::kUInt8,
                      root),
         timeout);
  }
  if (pg.rank() != root) restore_random_state(cuda_device, rng);
  *target.step = all[3 * root];
  return result;
}

}  // namespace ddp
