#pragma once
// Healing from a live peer (in-place recovery, docs/recovery.md): after a group re-formed, every
// rank ends with the training state of one healthy rank, sent over the group (not read from
// disk).
//
// The source is the rank with the most committed steps among those that were not just
// (re)started, the lowest such rank on a tie; when every rank is fresh (the job's start) it is
// rank 0. A rank can be one step ahead of another when the loss struck after its last
// collective of the step (it committed, the other dropped it): taking the most advanced state
// keeps that committed step and applies it exactly once everywhere.
//
// What is sent: parameters and buffers (in place), the optimizer's state (serialized, so a
// restarted rank's lazily created Adam moments arrive too), the step counter and the random
// state (random_state.hpp: the CPU generator's, and the module's CUDA device's), so dropout
// and other randomness continue as on the source. The
// data position follows from the step counter (StepManager).
//
// A ZeroRedundancyOptimizer (its state is sharded: no rank holds all of it) is healed by its
// reshard() instead of one rank's serialized state. First its step cut by the loss is settled:
// when any survivor had stepped its shard (the backward check had completed, so every rank
// had finished its backward and holds the averaged gradients), every survivor finishes that
// step (apply_pending) and counts it committed: rolled forward. Otherwise nobody applied
// anything and the step is dropped (`drop_pending`: the caller's zeroing of the gradients and
// rewinding of the generators, which it had held back for this decision).

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>

#include "ddp/comm/process_group.hpp"

namespace ddp {

struct HealTarget {
  torch::nn::Module* module = nullptr;           // parameters and buffers
  torch::optim::Optimizer* optimizer = nullptr;  // may be null
  int64_t* step = nullptr;                       // committed steps
  // With a ZeroRedundancyOptimizer whose step was cut (pending): what dropping that step takes
  // on this rank (zero the gradients, rewind the generators). May be empty.
  std::function<void()> drop_pending;
};

struct HealResult {
  bool transferred = false;  // false: every rank already held the same state, nothing was sent
  int source = 0;            // the rank whose state every rank holds now
};

// Collective over `pg`. `fresh`: this rank was just (re)started and holds no trained state.
// Throws what the group's collectives throw (PeerLostError when another rank is lost meanwhile).
HealResult heal_from_peer(const ProcessGroupPtr& pg, const HealTarget& target, bool fresh,
                          std::chrono::milliseconds timeout);

}  // namespace ddp
