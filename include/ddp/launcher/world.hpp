#pragma once
// The one place where ranks are assigned. A rendezvous (static today, multi-node later)
// produces a WorldAssignment for each attempt; everything else (worker environment, log
// layout, reports) reads ranks from it.

#include <string>
#include <vector>

namespace ddp::launcher {

struct WorkerIdentity {
  int local_rank = 0;
  int global_rank = 0;  // RANK
  int role_rank = 0;    // ROLE_RANK
};

struct WorldAssignment {
  int group_rank = 0;        // GROUP_RANK: this node's rank among nodes
  int group_world_size = 1;  // GROUP_WORLD_SIZE: number of nodes
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  int world_size = 1;        // WORLD_SIZE
  int role_world_size = 1;   // ROLE_WORLD_SIZE
  std::string master_addr;
  int master_port = 0;
  std::vector<WorkerIdentity> workers;  // one per local rank, in local-rank order
};

struct StaticWorldOptions {
  int node_rank = 0;
  int nnodes = 1;
  int nproc_per_node = 1;
  std::string master_addr;
  int master_port = 0;
};

// Homogeneous nodes with one role: rank = node_rank * nproc_per_node + local_rank.
// Throws UsageError on inconsistent numbers (node_rank outside [0, nnodes), nproc < 1).
WorldAssignment assign_static_world(const StaticWorldOptions& options);

}  // namespace ddp::launcher
