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
// `interrupt` (NcclOptions::interrupt), when set, is called between slices of the wait; what
// it throws ends the wait (so for every wait below).
std::string exchange_group_secret(Store& store, const GroupIdentity& group, int rank,
                                  std::chrono::milliseconds timeout,
                                  const std::function<std::string()>& create,
                                  const std::function<void()>& interrupt = {});

// Every member says which GPU it uses (`gpu`: its host and PCI bus id) before
// the group's communicator is made; throws SharedGpuError on every member alike when two
// members use one GPU (NCCL refuses such a communicator with an error that names neither rank;
// the `ddp` Python backend then stages the group's CUDA tensors through the host). A constant
// number of store operations per member, whatever the group's size: each adds to a counter per
// GPU, those that found their GPU taken add to a shared count, and the last member to arrive
// publishes that count. Keyed like exchange_group_secret (the k-th check of an identity), on a
// counter of its own. TimeoutError after `timeout` naming how many members arrived.
void check_one_rank_per_gpu(Store& store, const GroupIdentity& group, int rank,
                            std::chrono::milliseconds timeout, const std::string& gpu,
                            const std::function<void()>& interrupt = {});

// exchange_group_secret with ncclGetUniqueId as `create`.
ncclUniqueId exchange_unique_id(Store& store, const GroupIdentity& group, int rank,
                                std::chrono::milliseconds timeout,
                                const std::function<void()>& interrupt = {});

}  // namespace ddp::nccl_detail
