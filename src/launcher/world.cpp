#include "ddp/launcher/world.hpp"

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

WorldAssignment assign_static_world(const StaticWorldOptions& options) {
  if (options.nnodes < 1) {
    throw UsageError(fmt::format("--nnodes must be at least 1, got {}", options.nnodes));
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw UsageError(fmt::format("--node-rank {} is outside [0, {}) for --nnodes {}",
                                 options.node_rank, options.nnodes, options.nnodes));
  }
  if (options.nproc_per_node < 1) {
    throw UsageError(
        fmt::format("--nproc-per-node must be at least 1, got {}", options.nproc_per_node));
  }
  WorldAssignment world;
  world.group_rank = options.node_rank;
  world.group_world_size = options.nnodes;
  world.local_world_size = options.nproc_per_node;
  world.world_size = options.nnodes * options.nproc_per_node;
  world.role_world_size = world.world_size;  // one role
  world.master_addr = options.master_addr;
  world.master_port = options.master_port;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    WorkerIdentity id;
    id.local_rank = local;
    id.global_rank = options.node_rank * options.nproc_per_node + local;
    id.role_rank = id.global_rank;
    world.workers.push_back(id);
  }
  return world;
}

}  // namespace ddp::launcher
