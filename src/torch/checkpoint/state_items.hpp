#pragma once
// The training state as DCP entries (checkpoint.hpp lists the keys) and back: the module's
// parameters and buffers, the optimizer's state and options under PyTorch's names, the loop's
// progress, RNG states and the caller's extras.

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "dcp_metadata.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"

namespace ddp::checkpoint {

// Who writes an item.
enum class WrittenBy {
  kAnyRank,   // the same on every rank: one rank, assigned by size
  kThisRank,  // only this rank holds it (ZeRO's shard, this rank's RNG)
  kRankZero,  // small values every rank holds (options, progress, extras)
};

struct Item {
  std::string fqn;
  std::vector<dcp::PathPart> path;
  torch::Tensor tensor;  // defined: a tensor entry
  c10::IValue value;     // otherwise: a pickled value
  WrittenBy writer = WrittenBy::kAnyRank;
};

// Every item of this rank's state (tensors not yet copied: they alias the live state).
std::vector<Item> collect_items(const TrainingProgress& progress, const torch::nn::Module& module,
                                torch::optim::Optimizer* optimizer, const CheckpointExtras& extras,
                                int rank, int world);

// The optimizer's part of collect_items (optimizer_items.cpp).
void append_optimizer_items(const torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                            std::vector<Item>& out);

// The items `rank` writes. kAnyRank items go, largest first, to the rank with the fewest bytes
// so far (ties: lowest rank), the same on every rank.
std::vector<Item> items_written_by(std::vector<Item> items, int rank, int world);

// Reads entries of one checkpoint directory by name.
class EntryReader {
 public:
  EntryReader(std::string dir, dcp::Metadata metadata);

  bool has(const std::string& fqn) const { return entries_.count(fqn) > 0; }
  const dcp::Entry* entry(const std::string& fqn) const;
  // The whole tensor (chunks assembled), on the CPU.
  torch::Tensor tensor(const std::string& fqn) const;
  c10::IValue value(const std::string& fqn) const;
  // Keys starting with `prefix`.
  std::vector<std::string> keys_with_prefix(const std::string& prefix) const;
  const std::string& dir() const { return dir_; }

 private:
  std::vector<char> read(const dcp::Storage& s, const std::string& fqn) const;

  std::string dir_;
  dcp::Metadata metadata_;
  std::map<std::string, const dcp::Entry*> entries_;
};

// Strict, like load_state_dict(strict=True): UsageError listing every missing, unexpected or
// differently shaped entry.
void load_module(const EntryReader& reader, torch::nn::Module& module);
// Options of every group and the state of every parameter this rank's optimizer holds (for
// ZeroRedundancyOptimizer: its shard's).
void load_optimizer(const EntryReader& reader, const torch::nn::Module& module,
                    torch::optim::Optimizer& optimizer);
TrainingProgress load_progress(const EntryReader& reader);
CheckpointExtras load_extras(const EntryReader& reader);
// Restores the CPU generator from rng.<rank> and, when `module` is on a CUDA device and the
// checkpoint has rng_cuda.<rank> (saved from a module on a GPU), that device's generator; false
// when the checkpoint has no rng.<rank>.
bool load_rng(const EntryReader& reader, int rank, const torch::nn::Module* module);

// "float32" <-> torch::kFloat32 (DCP writes torch's attribute names).
std::string dtype_name(torch::ScalarType t);
torch::ScalarType dtype_from_name(const std::string& name, const std::string& fqn);

}  // namespace ddp::checkpoint
