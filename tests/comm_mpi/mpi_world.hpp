#pragma once
// The MPI worker's world group: created once per process, the same way on every rank.

#include <chrono>

#include "ddp/comm/mpi_process_group.hpp"
#include "reference.hpp"

namespace ddp::test {

// Generous: only a broken backend or a deadlocked test ever reaches it.
constexpr std::chrono::milliseconds kTimeout{std::chrono::seconds(60)};

inline ProcessGroup& world() {
  static ProcessGroupPtr group = make_mpi_process_group(kTimeout);
  return *group;
}

}  // namespace ddp::test
