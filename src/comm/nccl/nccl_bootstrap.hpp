#pragma once
// How the ranks of a new NCCL group agree on its ncclUniqueId: through the store.

#include <nccl.h>

#include <chrono>

namespace ddp {
class Store;
}

namespace ddp::nccl_detail {

// Rank 0 creates the id and publishes it; the others wait for it (up to `timeout`). Each
// rank counts the NCCL groups it created on this store, so the k-th group of every rank uses
// the same key even when ranks are threads of one process sharing the store.
ncclUniqueId exchange_unique_id(Store& store, int rank, int size,
                                std::chrono::milliseconds timeout);

}  // namespace ddp::nccl_detail
