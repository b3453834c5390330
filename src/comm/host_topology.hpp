#pragma once
// HostTopology: which ranks of a group share a host (internal header). Every rank publishes its
// host id in the store; hosts are numbered in order of their lowest rank, and the lowest rank
// on a host is its leader.

#include <chrono>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp::detail {

struct HostTopology {
  std::vector<int> host_of_rank;                // host index per rank
  std::vector<std::vector<int>> ranks_of_host;  // ranks per host, ascending
  int my_host = 0;
  int local_rank = 0;  // index of this rank within ranks_of_host[my_host]

  int num_hosts() const { return static_cast<int>(ranks_of_host.size()); }
  int local_size() const { return static_cast<int>(ranks_of_host[my_host].size()); }
  bool is_leader() const { return local_rank == 0; }
  std::vector<int> leaders() const;
  // Index of `rank` among the ranks of its host.
  int local_rank_of(int rank) const;

  // Exchanges host ids under `prefix` and waits for all `size` ranks (TimeoutError names
  // the ranks that never published theirs).
  static HostTopology exchange(Store& store, const std::string& prefix, int rank, int size,
                               const std::string& host_id, std::chrono::milliseconds timeout);
};

// DDP_HOST_ID, else hostname plus the kernel boot id (two containers on one machine share the
// boot id but not necessarily /dev/shm; their hostnames differ).
std::string default_host_id();

}  // namespace ddp::detail
