#include "nccl_bootstrap.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/store/store.hpp"
#include "ddp/util/error.hpp"

namespace ddp::nccl_detail {

namespace {

// The store prefix of every group with this identity. The member list is hashed (FNV-1a 64)
// so a 1024-rank group does not make kilobyte keys; the size is spelled out as well, so
// groups of different sizes never share a prefix.
std::string identity_prefix(const GroupIdentity& group) {
  if (group.member_ranks.empty()) return fmt::format("ddp_nccl/{}/n{}", group.name, group.size);
  uint64_t hash = 1469598103934665603ull;
  for (int r : group.member_ranks) {
    for (int i = 0; i < 4; ++i) {
      hash ^= static_cast<uint8_t>(static_cast<uint32_t>(r) >> (8 * i));
      hash *= 1099511628211ull;
    }
  }
  return fmt::format("ddp_nccl/{}/n{}/ranks-{:016x}", group.name, group.size, hash);
}

// store.wait for `key` up to `timeout` (TimeoutError past it), calling `interrupt` between
// slices of kInterruptPoll when set.
void wait_for_key(Store& store, const std::string& key, std::chrono::milliseconds timeout,
                  const std::function<void()>& interrupt) {
  if (!interrupt) return store.wait({key}, timeout);
  constexpr std::chrono::milliseconds kInterruptPoll{100};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    interrupt();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= kInterruptPoll)
      return store.wait({key}, std::max(left, std::chrono::milliseconds(1)));
    try {
      return store.wait({key}, kInterruptPoll);
    } catch (const TimeoutError&) {
    }
  }
}

std::string describe(const GroupIdentity& group) {
  if (group.member_ranks.empty()) return fmt::format("group '{}'", group.name);
  return fmt::format("group '{}' of global ranks [{}]", group.name,
                     fmt::join(group.member_ranks, ", "));
}

}  // namespace

std::string exchange_group_secret(Store& store, const GroupIdentity& group, int rank,
                                  std::chrono::milliseconds timeout,
                                  const std::function<std::string()>& create,
                                  const std::function<void()>& interrupt) {
  const int size = group.size;
  // Members of one group agree on the prefix; each counts its own groups under it, so the
  // k-th group of this identity is the k-th for every member.
  const std::string prefix = identity_prefix(group);
  const int64_t index = store.add(fmt::format("{}/rank{}/groups", prefix, rank), 1);
  const std::string key = fmt::format("{}/{}/unique_id", prefix, index);
  if (rank == 0) {
    std::string secret = create();
    store.set(key, secret);
    return secret;
  }
  try {
    wait_for_key(store, key, timeout, interrupt);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format(
        "nccl backend: rank {} of {} in {}: rank 0 did not publish the NCCL unique id (store "
        "key '{}') within {} ms: is rank 0 running, using the same store, and creating the "
        "same groups in the same order (same group_name and member_ranks)? ({})",
        rank, size, describe(group), key, timeout.count(), e.what()));
  }
  return store.get(key);
}

void check_one_rank_per_gpu(Store& store, const GroupIdentity& group, int rank,
                            std::chrono::milliseconds timeout, const std::string& gpu,
                            const std::function<void()>& interrupt) {
  const std::string prefix = identity_prefix(group);
  const int64_t index = store.add(fmt::format("{}/rank{}/gpu_checks", prefix, rank), 1);
  const std::string base = fmt::format("{}/{}/gpu_check", prefix, index);
  // Ranks already on this GPU, this one included. Bus ids hold ':' and '.', which keys allow.
  const int64_t on_my_gpu = store.add(fmt::format("{}/gpu/{}", base, gpu), 1);
  if (on_my_gpu > 1) store.add(base + "/shared", 1);
  // Counted after "shared": when the last member arrives, every share is counted.
  const std::string verdict_key = base + "/verdict";
  if (store.add(base + "/arrived", 1) == group.size) {
    store.set(verdict_key, std::to_string(store.add(base + "/shared", 0)));
  }
  try {
    wait_for_key(store, verdict_key, timeout, interrupt);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format(
        "nccl backend: rank {} of {} in {}: {} of the {} members arrived to create the group "
        "within {} ms ({})",
        rank, group.size, describe(group), store.add(base + "/arrived", 0), group.size,
        timeout.count(), e.what()));
  }
  const std::string verdict = store.get(verdict_key);
  if (verdict == "0") return;
  throw SharedGpuError(fmt::format(
      "nccl backend: rank {} of {} in {}: {} member(s) use a GPU that another member of the "
      "group uses too ({}this rank's GPU: {}); NCCL takes one rank per GPU: give each rank its "
      "own device (LOCAL_RANK, CUDA_VISIBLE_DEVICES), or use a host backend (gloo, cpu, ddp) "
      "for ranks that share a GPU",
      rank, group.size, describe(group), verdict, on_my_gpu > 1 ? "among them " : "not ", gpu));
}

ncclUniqueId exchange_unique_id(Store& store, const GroupIdentity& group, int rank,
                                std::chrono::milliseconds timeout,
                                const std::function<void()>& interrupt) {
  ncclUniqueId id;
  const std::string value = exchange_group_secret(
      store, group, rank, timeout,
      [&] {
        const ncclResult_t result = ncclGetUniqueId(&id);
        if (result != ncclSuccess) {
          throw CollectiveError(fmt::format(
              "nccl backend: rank 0 of {}: ncclGetUniqueId failed: {} (NCCL could not open its "
              "bootstrap socket; NCCL_SOCKET_IFNAME selects the interface)",
              group.size, ncclGetErrorString(result)));
        }
        return std::string(id.internal, sizeof id.internal);
      },
      interrupt);
  if (value.size() != sizeof id.internal) {
    throw ProtocolError(fmt::format(
        "nccl backend: rank {} of {}: the group's NCCL unique id in the store has {} bytes, "
        "but an ncclUniqueId has {}: another program wrote the key, or ranks use different "
        "NCCL versions",
        rank, group.size, value.size(), sizeof id.internal));
  }
  std::memcpy(id.internal, value.data(), sizeof id.internal);
  return id;
}

}  // namespace ddp::nccl_detail
