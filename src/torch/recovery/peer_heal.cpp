#include "ddp/torch/recovery/peer_heal.hpp"

#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

#include "ddp/torch/ddp/consistency.hpp"
#include "ddp/torch/nn/random_state.hpp"
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

HealResult heal_from_peer(ProcessGroup& pg, const HealTarget& target, bool fresh,
                          std::chrono::milliseconds timeout) {
  if (target.module == nullptr || target.step == nullptr) {
    throw UsageError("heal_from_peer: the module and the step counter are required");
  }
  const int n = pg.size();
  int64_t mine[2] = {*target.step, fresh ? 1 : 0};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  wait(pg.all_gather(mine, all.data(), 2, DataType::kInt64), timeout);

  HealResult result;
  int source = -1;
  bool differ = false;
  for (int r = 0; r < n; ++r) {
    const int64_t step = all[2 * r];
    const bool is_fresh = all[2 * r + 1] != 0;
    differ = differ || is_fresh || step != all[0];
    if (is_fresh) continue;
    if (source < 0 || step > all[2 * source]) source = r;
  }
  result.source = source < 0 ? 0 : source;
  if (!differ) return result;  // the survivors of a loss during forming: nothing to send
  result.transferred = true;
  const int root = result.source;

  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors;
  for (const auto& p : target.module->parameters(true)) tensors.push_back(p);
  for (const auto& b : target.module->buffers(true)) tensors.push_back(b);
  broadcast_tensors(pg, tensors, root, timeout);

  if (target.optimizer != nullptr) {
    std::string state = pg.rank() == root ? save_optimizer(*target.optimizer) : std::string();
    state = broadcast_bytes(pg, std::move(state), root, timeout);
    if (pg.rank() != root) load_optimizer(*target.optimizer, state);
  }

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
  *target.step = all[2 * root];
  return result;
}

}  // namespace ddp
