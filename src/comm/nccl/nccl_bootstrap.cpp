#include "nccl_bootstrap.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "ddp/store/store.hpp"
#include "ddp/util/error.hpp"

namespace ddp::nccl_detail {

ncclUniqueId exchange_unique_id(Store& store, int rank, int size,
                                std::chrono::milliseconds timeout) {
  const int64_t index = store.add(fmt::format("ddp_nccl/rank{}/groups", rank), 1);
  const std::string key = fmt::format("ddp_nccl/group{}/unique_id", index);
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw CollectiveError(fmt::format(
          "nccl backend: rank 0 of {}: ncclGetUniqueId failed: {} (NCCL could not open its "
          "bootstrap socket; NCCL_SOCKET_IFNAME selects the interface)",
          size, ncclGetErrorString(result)));
    }
    store.set(key, std::string(id.internal, sizeof id.internal));
    return id;
  }
  try {
    store.wait({key}, timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format(
        "nccl backend: rank {} of {}: rank 0 did not publish the NCCL unique id (store key "
        "'{}') within {} ms: is rank 0 running and using the same store? ({})",
        rank, size, key, timeout.count(), e.what()));
  }
  const std::string value = store.get(key);
  if (value.size() != sizeof id.internal) {
    throw ProtocolError(fmt::format(
        "nccl backend: rank {} of {}: store key '{}' holds {} bytes, but an ncclUniqueId has "
        "{}: another program wrote the key, or ranks use different NCCL versions",
        rank, size, key, value.size(), sizeof id.internal));
  }
  std::memcpy(id.internal, value.data(), sizeof id.internal);
  return id;
}

}  // namespace ddp::nccl_detail
