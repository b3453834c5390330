#include "ddp/launcher/step_store_standbys.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ddp/store/store.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::launcher {

namespace {

constexpr const char* kListKey = "ddp/recovery/standbys";

std::string node_key(int node) {
  return fmt::format("ddp/recovery/standby/{}", node);
}

std::chrono::milliseconds left_until(net::Deadline deadline) {
  return std::max(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - net::Clock::now()),
      std::chrono::milliseconds(1));
}

}  // namespace

StepStoreStandbys::StepStoreStandbys(const StepStandbyOptions& options, Store& store,
                                     TcpStoreServer* primary)
    : token_(options.token) {
  const int last = std::min(options.count, options.num_nodes - 1);
  const auto deadline = deadline_after(options.wait);
  if (options.node_rank == 0) {
    if (primary == nullptr) {
      throw UsageError("StepStoreStandbys: node 0 needs the step store's server");
    }
    for (int node = 1; node <= last; ++node) {
      try {
        store.wait({node_key(node)}, left_until(deadline));
        endpoints_.push_back(store.get(node_key(node)));
      } catch (const TimeoutError&) {
        // That node's agent is slow or gone: the others still count.
      }
    }
    if (!endpoints_.empty()) primary->replicate_to(endpoints_);
    store.set(kListKey, joined());
    return;
  }
  if (options.node_rank <= last) {
    TcpStoreServerOptions so;
    so.port = 0;
    so.token = options.token;
    so.standby = true;
    mine_ = std::make_unique<TcpStoreServer>(so);
    mine_->start();
    store.set(node_key(options.node_rank), net::format_endpoint(options.local_addr, mine_->port()));
  }
  try {
    store.wait({kListKey}, left_until(deadline));
  } catch (const TimeoutError&) {
    return;  // node 0 published none in time: this node's agent and workers do without
  }
  endpoints_ = split_endpoints(store.get(kListKey), kListKey);
}

StepStoreStandbys::~StepStoreStandbys() = default;

std::string StepStoreStandbys::joined() const {
  return fmt::format("{}", fmt::join(endpoints_, ","));
}

std::string StepStoreStandbys::promote(std::chrono::milliseconds per_attempt) const {
  return promote_first_standby(endpoints_, token_, per_attempt);
}

}  // namespace ddp::launcher
