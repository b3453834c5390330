#include "host_topology.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::detail {

std::vector<int> HostTopology::leaders() const {
  std::vector<int> out;
  for (const auto& ranks : ranks_of_host) out.push_back(ranks.front());
  return out;
}

int HostTopology::local_rank_of(int rank) const {
  const auto& ranks = ranks_of_host[host_of_rank[rank]];
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

HostTopology HostTopology::exchange(Store& store, const std::string& prefix, int rank, int size,
                                    const std::string& host_id, std::chrono::milliseconds timeout) {
  store.set(fmt::format("{}host/{}", prefix, rank), host_id);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}host/{}", prefix, r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(fmt::format(
        "process group {}: rank {} waited {} ms for all {} ranks to join, but ranks {} never "
        "did ({} of {} joined); start every rank with the same world size and store",
        prefix, rank, timeout.count(), size, missing, size - missing.size(), size));
  }
  const auto ids = store.multi_get(keys);
  HostTopology t;
  std::map<std::string, int> index;
  for (int r = 0; r < size; ++r) {
    auto it = index.find(ids[r]);
    if (it == index.end()) {
      it = index.emplace(ids[r], static_cast<int>(t.ranks_of_host.size())).first;
      t.ranks_of_host.emplace_back();
    }
    t.host_of_rank.push_back(it->second);
    t.ranks_of_host[it->second].push_back(r);
  }
  t.my_host = t.host_of_rank[rank];
  const auto& mine = t.ranks_of_host[t.my_host];
  t.local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  return t;
}

std::string default_host_id() {
  if (auto id = env::get("DDP_HOST_ID"); id && !id->empty()) return *id;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

}  // namespace ddp::detail
