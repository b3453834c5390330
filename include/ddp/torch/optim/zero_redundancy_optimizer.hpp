#pragma once
// ZeroRedundancyOptimizer: ZeRO stage 1, like torch.distributed.optim.ZeroRedundancyOptimizer.
//
//   ddp::DistributedDataParallel model(net, pg);
//   ddp::ZeroRedundancyOptimizer<torch::optim::Adam> opt(model.parameters(),
//                                                        torch::optim::AdamOptions(1e-3), pg);
//   opt.zero_grad(); loss.backward(); opt.step();   // as any optimizer
//
// Each rank owns a shard of the parameters and keeps the optimizer state (Adam's moments, SGD's
// momentum) of that shard only, so per-rank optimizer memory is about 1/world of an unsharded
// optimizer's. step() steps the local shard with a local `Optimizer`, then one all-gather
// hands every rank the updated shards of the others. With gradients averaged by DDP the result
// equals an unsharded optimizer's on every rank.
//
// Shards: within each parameter group, parameters sorted by size (largest first, ties in
// order) go one by one to the rank holding the fewest elements so far: PyTorch's partition,
// so the same parameters land on the same ranks.
//
// Optimizer: torch::optim::Adam, AdamW, SGD, RMSprop, Adagrad or a class derived from one of
// them (ddp::FusedAdam); its options type is deduced. All parameters must share one dtype and
// device (as PyTorch's). Learning-rate changes through param_groups()[g].options() reach the
// shards at the next step(). Groups added with add_param_group (every rank the same) are
// partitioned at the next step(), consolidate_state_dict() or load(), as PyTorch's
// add_param_group does at once: the earlier groups keep their ranks and state.
//
// Snapshots: the state is sharded, so save() works only on the rank given to the last
// consolidate_state_dict(to_rank) (collective), and writes the archive an unsharded `Optimizer`
// over the same parameter groups would write: it loads into one, e.g. through
// ddp::capture_snapshot/restore. load() takes such a full archive on every rank and keeps this
// rank's shard of it. As with LibTorch's own optimizers, the archive carries the per-parameter
// state; the options (learning rate ...) stay those of the optimizer it is loaded into.
//
// Join (join.hpp): a rank that ran out of inputs runs step() once per iteration of the others
// (as PyTorch's ZeRO join hook: its shard is stepped with the gradients it holds, e.g. the last
// averaged ones) and so takes part in every parameter all-gather.
//
// In-place recovery (StepManager::attach turns it on; docs/recovery.md, zero_recovery.cpp):
// every rank also keeps a replica of another rank's shard and steps it with the same averaged
// gradients, so a lost rank's optimizer state survives elsewhere: rank r replicates the shard
// of rank r - LOCAL_WORLD_SIZE (mod world; the rank at its place on the node before) when the
// group spans several nodes, so a lost node takes no shard with it, else of rank r - 1. Twice
// the optimizer state and step compute of plain ZeRO (2/world of an unsharded optimizer's
// memory). step() first agrees that every rank finished
// its backward (a one-element all-reduce): when that completed anywhere, every rank holds the
// step's averaged gradients, so a step cut by a loss after it can be finished (rolled forward)
// on the survivors instead of being half applied. reshard() redistributes shards, replicas and
// their state over a re-formed group (another world size, renumbered ranks, a fresh rank).

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/torch/ddp/join.hpp"

namespace ddp {

namespace detail {
// Overloads naming each LibTorch optimizer's options type (declared only: used in decltype).
torch::optim::AdamOptions optimizer_options_probe(const torch::optim::Adam*);
torch::optim::AdamWOptions optimizer_options_probe(const torch::optim::AdamW*);
torch::optim::SGDOptions optimizer_options_probe(const torch::optim::SGD*);
torch::optim::RMSpropOptions optimizer_options_probe(const torch::optim::RMSprop*);
torch::optim::AdagradOptions optimizer_options_probe(const torch::optim::Adagrad*);
template <typename Optimizer>
using optimizer_options_t =
    decltype(optimizer_options_probe(static_cast<const Optimizer*>(nullptr)));
}  // namespace detail

// Everything that does not depend on the optimizer's type.
class ZeroRedundancyOptimizerBase : public torch::optim::Optimizer, public Joinable {
 public:
  ~ZeroRedundancyOptimizerBase() override;

  // Steps this rank's shard, then all-gathers every shard. Collective. Returns the closure's
  // loss (evaluated by the local optimizer) or an undefined tensor.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Collects every rank's shard state on `to_rank` (as a full, unsharded optimizer state) for
  // save(). Collective; the other ranks drop any state they consolidated before.
  void consolidate_state_dict(int to_rank = 0);
  // The consolidated state (see the header comment); UsageError without one on this rank.
  void save(torch::serialize::OutputArchive& archive) const override;
  // A full state (from save() or an unsharded optimizer of the same type and groups); every
  // rank loads the whole archive and keeps its shard.
  void load(torch::serialize::InputArchive& archive) override;

  int rank() const { return pg_->rank(); }
  int world_size() const { return pg_->size(); }
  // The parameters each rank owns: [rank][group] -> parameters.
  const std::vector<std::vector<std::vector<torch::Tensor>>>& shards() const { return shards_; }
  // The optimizer of this rank's shard (its state is this rank's optimizer state).
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  // Bytes of tensors in this rank's optimizer state (optimizer_state_bytes(local_optimizer())).
  size_t local_state_bytes() const;
  // Bytes of tensors in the state of the shard this rank replicates (0 without recovery).
  size_t replica_state_bytes() const;

  // Joinable.
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  ProcessGroup& join_process_group() const override { return *pg_; }

  // In-place recovery (see the header comment; implemented in zero_recovery.cpp).
  // Keeps a replica of another rank's shard from now on (see above); collective-free, but
  // every rank must call it before the same step().
  void enable_recovery();
  bool recovery_enabled() const { return recovery_; }
  // Where the last step() stopped when it threw: kNone (it finished, or never got past the
  // backward check), kArrived (this rank finished its backward: it holds the step's averaged
  // gradients, nothing applied), kApplied (its shard and replica were stepped; the parameter
  // all-gather did not finish).
  enum class Pending { kNone, kArrived, kApplied };
  Pending pending() const { return pending_; }
  // Rolls a kArrived step forward: steps the shard and the replica with the gradients held.
  void apply_pending();
  // Forgets the pending step (the caller zeroes the gradients).
  void clear_pending() { pending_ = Pending::kNone; }
  // Collective over `pg`, a re-formed group this optimizer moves to: every shard's parameters
  // and optimizer state (and every replica) go from a rank that holds them to the ranks that
  // hold them in `pg`'s partition. `fresh`: this rank was (re)started and holds no state. A
  // shard whose owner and replica were both lost (or every shard, when every rank is fresh)
  // takes its parameters from rank `params_root` of `pg` and starts with fresh optimizer state
  // (logged when some rank had trained).
  void reshard(ProcessGroupPtr pg, bool fresh, int params_root);

 protected:
  ZeroRedundancyOptimizerBase(std::vector<torch::optim::OptimizerParamGroup> groups,
                              std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                              ProcessGroupPtr pg);
  // Builds the shards and the local optimizer; the derived constructor calls it (the factory
  // below is virtual, so the base constructor cannot).
  void init();
  // An optimizer of the wrapped type over `groups` (options per group given).
  virtual std::unique_ptr<torch::optim::Optimizer> make_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups) const = 0;

 private:
  friend class ZeroJoinHook;
  // step() without the Join notification: what a joined rank runs.
  torch::Tensor step_and_sync(LossClosure closure);
  // Every rank's updated shard to every rank.
  void sync_params();
  // Groups over `params` [group] with the exposed groups' current options.
  std::vector<torch::optim::OptimizerParamGroup> groups_with_options(
      const std::vector<std::vector<torch::Tensor>>& params) const;
  // UsageError unless the parameters of groups [from_group, end) are dense, of an all-gatherable
  // dtype, on the group's device, and share dtype and device with the first parameter.
  void check_params(size_t from_group) const;
  // Partitions groups added by add_param_group since the last call and adds this rank's shard
  // of each to the local optimizer.
  void adopt_added_groups();
  // Copies the exposed groups' options (learning rate ...) into `optimizer`'s groups.
  void push_options(torch::optim::Optimizer& optimizer) const;
  // The parameters' dtype on `pg`'s communication device: the buffers shards travel in.
  torch::TensorOptions wire_options(const ProcessGroup& pg) const;
  // The partition of every group over `world` ranks (PyTorch's; see partition_for in the .cpp):
  // [rank][group].
  std::vector<std::vector<std::vector<torch::Tensor>>> partition_for(int world) const;
  // The rank whose shard this rank replicates (see the header comment), or -1 (recovery off,
  // or a world of one).
  int replicated_rank() const;
  // (Re)builds local_ (and replica_) over shards_ for this rank.
  void build_local_optimizers();
  // The recovery part of step(): the backward check, then the shard and replica steps.
  torch::Tensor step_recoverable(LossClosure closure);

  ProcessGroupPtr pg_;
  std::vector<std::vector<std::vector<torch::Tensor>>> shards_;  // [rank][group]
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::unique_ptr<torch::optim::Optimizer> consolidated_;  // on the consolidate target only
  bool recovery_ = false;
  std::unique_ptr<torch::optim::Optimizer> replica_;  // over shards_[replicated_rank()]
  Pending pending_ = Pending::kNone;
};

template <typename OptimizerType>
class ZeroRedundancyOptimizer : public ZeroRedundancyOptimizerBase {
 public:
  using Options = detail::optimizer_options_t<OptimizerType>;

  ZeroRedundancyOptimizer(std::vector<torch::Tensor> params, const Options& options,
                          ProcessGroupPtr pg)
      : ZeroRedundancyOptimizer(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup(std::move(params))},
            options, std::move(pg)) {}

  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                          const Options& options, ProcessGroupPtr pg)
      : ZeroRedundancyOptimizerBase(std::move(groups), std::make_unique<Options>(options),
                                    std::move(pg)) {
    init();
  }

  OptimizerType& local_optimizer() {
    return static_cast<OptimizerType&>(ZeroRedundancyOptimizerBase::local_optimizer());
  }

 private:
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(
      std::vector<torch::optim::OptimizerParamGroup> groups) const override {
    return std::make_unique<OptimizerType>(std::move(groups),
                                           static_cast<const Options&>(defaults()));
  }
};

}  // namespace ddp
