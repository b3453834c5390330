#pragma once
// Training snapshots: what a restarted job needs to continue where it stopped, in files that
// Python's torch.load reads, kept K deep, written atomically by rank 0.
//
// File content (torch.load gives this dict; the first three keys are the tutorial's):
//   MODEL_STATE      {name: tensor}, the module's parameters and buffers (state_dict names)
//   EPOCHS_RUN       int, epochs completed: training resumes at this epoch
//   OPTIMIZER_STATE  uint8 tensor holding LibTorch's optimizer archive (opaque to Python);
//                    absent when no optimizer was captured
//   SAMPLER_EPOCH    int, the DistributedSampler epoch to resume with
//   RNG_STATE        uint8 tensor, the default CPU generator's state (dropout, init)
//   FORMAT           "ddp-snapshot-1"
// The file is checksummed (snapshot_file.hpp). A file written by Python's torch.save with at
// least MODEL_STATE and EPOCHS_RUN is accepted as well (without checksum).
//
// Names on disk for --snapshot DIR/NAME.EXT: every save writes DIR/NAME.epoch-<EPOCHS_RUN>.EXT
// (6 digits), then makes DIR/NAME.EXT a hard link to it (so `torch.load("NAME.EXT")` gives the
// newest, like the tutorial), then deletes all but the newest `keep` epoch files.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

class ProcessGroup;

struct Snapshot {
  std::vector<std::pair<std::string, torch::Tensor>> model_state;
  torch::Tensor optimizer_state;  // undefined: none
  int64_t epochs_run = 0;
  int64_t sampler_epoch = 0;
  torch::Tensor rng_state;  // undefined: none
};

// Copies the module's parameters and buffers, the optimizer's state (when given) and the
// default CPU generator's state.
Snapshot capture_snapshot(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                          int64_t epochs_run, int64_t sampler_epoch);

// Loads a snapshot into module and optimizer (when both it and the snapshot have one) and
// restores the CPU generator (when the snapshot has its state). Strict like
// load_state_dict(strict=True): a missing, unexpected or differently shaped entry is a
// UsageError listing them all.
void restore_snapshot(const Snapshot& snapshot, torch::nn::Module& module,
                      torch::optim::Optimizer* optimizer);

// The checksummed file bytes / the snapshot in such bytes (or in a Python torch.save file).
// `source` names the file in errors.
std::vector<char> encode_snapshot(const Snapshot& snapshot);
Snapshot decode_snapshot(const std::vector<char>& bytes, const std::string& source);

struct SnapshotOptions {
  static constexpr int kKeep = 3;

  explicit SnapshotOptions(std::string path) : path_(std::move(path)) {}
  SnapshotOptions& keep(int v) {
    keep_ = v;
    return *this;
  }

  std::string path_;
  int keep_ = kKeep;
};

struct ResumePoint {
  Snapshot snapshot;
  std::string path;                  // the file it came from
  std::string verification;          // "sha256 ... verified" or why unverified
  std::string sha256;                // of the whole file, hex: identifies it across ranks
  std::vector<std::string> skipped;  // "file: reason" for each newer file that was unusable
};

class SnapshotManager {
 public:
  // Throws UsageError for keep < 1 or an empty path.
  explicit SnapshotManager(SnapshotOptions options);

  // Writes the snapshot (call on rank 0 only) and returns the epoch file's path. Temporary
  // files that a killed writer left beside this series' snapshots are removed first (only
  // this series' own, and only when their writer's pid is no longer alive on this host).
  std::string save(const Snapshot& snapshot);

  // The newest snapshot that reads and verifies, trying epoch files newest first and the
  // main path itself; nullopt when there is none. Files that fail are listed in `skipped`
  // (also when no file succeeds, through `skipped_out`).
  std::optional<ResumePoint> load_newest_valid(
      std::vector<std::string>* skipped_out = nullptr) const;

  // load_newest_valid on every rank of `pg` (a collective: call it on every rank), then the
  // ranks check they resume from the same snapshot, (epochs_run, file SHA-256) compared with
  // one all-gather. Every rank then gets the same answer, or nullopt when no rank has a
  // snapshot. When they differ (--snapshot on node-local disks: node 0 has its snapshots,
  // node 1 none, so node 1 would start from epoch 0 with a fresh optimizer, the parameters
  // drift and the ranks hang at the first epoch one side lacks) every rank throws UsageError
  // naming which ranks hold what and the fix: a shared file system, or a copy of the snapshot
  // directory on every node. Works on every backend (the exchange buffer lives on
  // comm_device(pg)).
  std::optional<ResumePoint> load_agreed(ProcessGroup& pg) const;

  // Existing epoch files, newest first, as (epochs_run, path).
  std::vector<std::pair<int64_t, std::string>> epoch_files() const;

  std::string epoch_file(int64_t epochs_run) const;
  const std::string& path() const { return options_.path_; }

 private:
  void remove_stale_temporaries() const;
  // Whether `base` is a file name this series writes: NAME.EXT or NAME.epoch-<digits>.EXT.
  bool is_series_file(const std::string& base) const;

  SnapshotOptions options_;
  std::string dir_;
  std::string stem_;  // file name without extension
  std::string ext_;   // ".pt" or empty
};

}  // namespace ddp
