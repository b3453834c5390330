#pragma once
// Checkpoints that do not stop training: taken at any step, written in the background, one
// shard per rank, in PyTorch's Distributed Checkpoint (DCP) layout.
//
//   ddp::Checkpointer ckpt(ddp::CheckpointOptions("ckpt"), pg);
//   if (auto r = ckpt.load_newest(*model, &optimizer)) progress = r->progress;  // resume
//   for (...) {
//     ... optimizer step ...; ++progress.step; ++progress.batches_in_epoch;
//     if (progress.step % every == 0) ckpt.save(progress, *model, &optimizer);
//   }
//   ckpt.wait();
//
// Layout: DIR/step-<8 digits>/ holds `__<rank>_0.distcp` (rank's items, each a torch.save
// archive) and `.metadata` (DCP's pickled Metadata), which rank 0 writes last, through a
// temporary and a rename, after every rank reported its shard written and synced. A directory
// with `.metadata` is complete; one without (a job killed mid-write) is ignored and removed
// by the next completed save. `torch.distributed.checkpoint.load(sd, checkpoint_id=DIR/step-N)`
// in Python 2.x reads it; ddp reads DCP checkpoints PyTorch wrote the same way.
//
// Keys (DCP's flattened names, as torch.distributed.checkpoint.state_dict.get_state_dict gives
// them under "model" and "optim"):
//   model.<fqn>                         parameters and buffers (state_dict names)
//   optim.state.<fqn>.<name>            Adam/AdamW: step (float32 scalar), exp_avg, exp_avg_sq,
//                                       max_exp_avg_sq (amsgrad); SGD: momentum_buffer
//   optim.param_groups.<g>.<option>     PyTorch's option names, and params (the fqns)
//   trainer.step / .epoch / .batches_in_epoch / .world_size   (ints)
//   rng.<rank>                          that rank's CPU generator state (uint8 tensor)
//   extra.<name>                        the caller's extras
// Each replicated tensor (model, unsharded optimizer state) is written once, by one rank
// (assigned by size, the same on every rank without communication); ZeroRedundancyOptimizer's
// state is written by the rank that owns it, with no gather. Loading reads every entry by name,
// so a checkpoint saved by 4 ranks loads on 2 or 3 (ZeRO's new owners read their parameters'
// state). Tensors split into chunks (FSDP, DTensor) are assembled on load.
//
// Files must be on a file system every rank sees (as for DCP): rank 0 reads the other ranks'
// shard reports from the directory.

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp {

// Where the training loop stands. Resuming at it gives exactly the samples an uninterrupted run
// would see next: set the sampler's epoch to `epoch` and skip its first `batches_in_epoch`
// batches.
struct TrainingProgress {
  int64_t step = 0;              // optimizer steps completed in the whole job
  int64_t epoch = 0;             // the epoch in progress (DistributedSampler::set_epoch value)
  int64_t batches_in_epoch = 0;  // batches of that epoch already trained on
};

// Values the caller stores beside the state: ints, floats, strings, bools, lists, tensors.
using CheckpointExtras = std::map<std::string, c10::IValue>;

// What save() does while the previous background write is still running.
enum class SaveInFlight {
  kWait,  // wait for it, then save (training stalls for the rest of that write)
  kSkip,  // skip this save (every rank skips: they agree in one small all-reduce)
};

struct CheckpointOptions {
  static constexpr int kKeep = 3;

  explicit CheckpointOptions(std::string dir) : dir_(std::move(dir)) {}
  // Complete checkpoints kept (oldest removed after a save completes). Default 3.
  CheckpointOptions& keep(int v) {
    keep_ = v;
    return *this;
  }
  // Write in a background thread (default) or inside save().
  CheckpointOptions& async(bool v) {
    async_ = v;
    return *this;
  }
  CheckpointOptions& in_flight(SaveInFlight v) {
    in_flight_ = v;
    return *this;
  }
  // How long rank 0 waits for the other ranks' shards before giving the checkpoint up.
  CheckpointOptions& timeout(std::chrono::milliseconds v) {
    timeout_ = v;
    return *this;
  }

  std::string dir_;
  int keep_ = kKeep;
  bool async_ = true;
  SaveInFlight in_flight_ = SaveInFlight::kWait;
  std::chrono::milliseconds timeout_ = std::chrono::minutes(10);
};

struct ResumedCheckpoint {
  std::string path;  // the step directory
  TrainingProgress progress;
  CheckpointExtras extras;
  std::vector<std::string> skipped;  // "path: reason" for newer directories that were unusable
};

class Checkpointer {
 public:
  // Throws UsageError for an empty directory or keep < 1. Creates the directory.
  Checkpointer(CheckpointOptions options, ProcessGroupPtr pg);
  // Waits for the write in flight (errors are printed, not thrown).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective, at a step boundary (after the optimizer step). Async: copies the state to host
  // buffers that are reused from save to save and writes them in the background. Sync: writes
  // the live state before returning. Returns false when the save was skipped (SaveInFlight::kSkip).
  // An error of the previous background write is thrown here (or by wait()).
  bool save(const TrainingProgress& progress, const torch::nn::Module& module,
            torch::optim::Optimizer* optimizer, const CheckpointExtras& extras = {});

  // Waits for this rank's write in flight (on rank 0: until the checkpoint is complete) and
  // throws its error, if any. Not collective.
  void wait();

  // Collective: every rank finds the newest complete checkpoint, they check they found the
  // same (else every rank throws UsageError naming the ranks and the fix: a shared file
  // system), then each loads the model, its optimizer state and its RNG state. nullopt when
  // there is none.
  std::optional<ResumedCheckpoint> load_newest(torch::nn::Module& module,
                                               torch::optim::Optimizer* optimizer);

  // Loads one checkpoint directory (ddp's or one PyTorch's DCP wrote) into module and
  // optimizer (either may be null), strictly: a missing or differently shaped entry is a
  // UsageError listing them all. `rank` picks the RNG state to restore (none when absent).
  static ResumedCheckpoint load(const std::string& path, torch::nn::Module* module,
                                torch::optim::Optimizer* optimizer, int rank);

  // Complete checkpoints in `dir`, newest first: (step, path).
  static std::vector<std::pair<int64_t, std::string>> list(const std::string& dir);

  const CheckpointOptions& options() const { return options_; }

 private:
  struct Staging;

  CheckpointOptions options_;
  ProcessGroupPtr pg_;
  std::unique_ptr<Staging> staging_;  // host copies, reused by each save
  std::future<void> in_flight_;
  bool cleared_ = false;  // leftovers of a killed job removed (first save)
  int64_t saves_ = 0;     // the next save's id (its staging directory), agreed by the ranks
};

}  // namespace ddp
