#pragma once
// How the ranks of a new NCCL group agree on its ncclUniqueId: through the store.

#include <nccl.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ddp {
class Store;
}

namespace ddp::nccl_detail {

// What every member of one group knows about it, and so can agree on without talking:
// the group's name, its size and (when known) the global ranks of its members.
struct GroupIdentity {
  std::string name;
  int size = 0;
  std::vector<int> member_ranks;  // empty: not known (the world group)
};

// Rank 0 of the group calls `create` and publishes its bytes under a key derived from
// `group`; the other ranks wait for that key (up to `timeout`) and return its bytes. Every
// rank counts the groups of the same identity it created on this store, so the k-th such
// group of every member uses the same key even when ranks are threads of one process sharing
// the store. Groups created concurrently on one store must differ in identity (disjoint
// member sets, or names). No NCCL calls: `create` supplies the secret.
std::string exchange_group_secret(Store& store, const GroupIdentity& group, int rank,
                                  std::chrono::milliseconds timeout,
                                  const std::function<std::string()>& create);

// exchange_group_secret with ncclGetUniqueId as `create`.
ncclUniqueId exchange_unique_id(Store& store, const GroupIdentity& group, int rank,
                                std::chrono::milliseconds timeout);

}  // namespace ddp::nccl_detail
