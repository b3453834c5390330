#pragma once
// The membership notice of in-place recovery (ddprun --recovery step, docs/recovery.md): how
// the launcher tells the workers of a job, through the job's store, that a rank was lost.
//
// Keys (under kRecoveryPrefix):
//   generation        the membership generation, an add() counter: 0 (absent) at the start,
//                     +1 for every rank lost. Read with add(key, 0): one round trip, no wait.
//   lost/<g>          the rank whose loss opened generation g (decimal), set before the
//                     counter reaches g, so a reader that saw g finds it.
// The launchers (one agent per node) are the only writers: each claims the next free lost/<g>
// with compare_set, then raises the counter, so the keys lost/1..lost/k are all set whenever
// the counter reads k, even when agents on two nodes record losses at the same moment. Workers
// read the counter from a watcher thread (RecoverableGroup), never on the training step's
// path.

#include <cstdint>
#include <optional>
#include <string>

#include "ddp/store/store.hpp"

namespace ddp::recovery_notice {

inline constexpr const char* kRecoveryPrefix = "ddp/recovery/";

// The current generation (0 when no rank was lost yet).
int64_t read_generation(Store& store);

// The rank whose loss opened `generation`, or nullopt when not recorded (generation 0).
std::optional<int> read_lost_rank(Store& store, int64_t generation);

// Launcher side: records that `rank` was lost and opens the next generation, which it returns
// (the generation whose lost/<g> key it claimed; the counter may already be higher when
// another node's agent recorded a loss at the same time).
int64_t publish_lost_rank(Store& store, int rank);

}  // namespace ddp::recovery_notice
