#include "ddp/rendezvous/endpoint_store.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/cluster/environment.hpp"
#include "ddp/cluster/netinfo.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::rdzv {

bool is_local_host(const std::string& host, Millis timeout) {
  if (host == "localhost") return true;
  std::vector<std::string> addrs;
  try {
    addrs = cluster::resolve_host(host, timeout);
  } catch (const Error&) {
    return false;
  }
  auto interfaces = cluster::list_interfaces();
  for (const auto& a : addrs) {
    if (cluster::is_loopback_address(a)) return true;
    for (const auto& itf : interfaces) {
      if (std::find(itf.addresses.begin(), itf.addresses.end(), a) != itf.addresses.end()) {
        return true;
      }
    }
  }
  return false;
}

std::string local_address_towards(const std::string& peer_host, Millis timeout) {
  try {
    auto addrs = cluster::resolve_host(peer_host, timeout);
    for (const auto& a : addrs) {
      try {
        auto route = cluster::route_to(a);
        if (!route.local_address.empty()) return route.local_address;
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return cluster::local_hostname();
}

std::optional<std::string> store_host_fd_warning(uint64_t open_files_limit, int max_nodes,
                                                 int local_workers) {
  constexpr uint64_t kReserve = 64;   // listener, epoll, logs, this agent's own client
  constexpr uint64_t kPerWorker = 4;  // stdout/stderr pipes, error file, pidfd
  const uint64_t needed = static_cast<uint64_t>(std::max(max_nodes, 1)) + kReserve +
                          kPerWorker * static_cast<uint64_t>(std::max(local_workers, 0));
  if (open_files_limit >= needed) return std::nullopt;
  return fmt::format(
      "warning: this node serves the rendezvous store for up to {} nodes (one connection "
      "each) but may open only {} files; when they run out the store stops accepting agents "
      "(\"could not connect ... timed out\") or this agent cannot start its workers. Raise the "
      "open-files limit to at least {} (ulimit -n; LimitNOFILE= under systemd; docker --ulimit "
      "nofile=)",
      max_nodes, open_files_limit, needed);
}

EndpointStore::EndpointStore(EndpointStoreOptions options) : options_(std::move(options)) {
  port_ = options_.endpoint.port;
  if (options_.host) {
    TcpStoreServerOptions so;
    so.host = options_.endpoint.host.find(':') != std::string::npos ? "::" : "";
    so.port = options_.endpoint.port;
    so.token = options_.token;
    try {
      server_ = std::make_unique<TcpStoreServer>(so);
    } catch (const NetworkError& e) {
      throw NetworkError(fmt::format(
          "this node is the rendezvous endpoint host ({}) but cannot serve the store there: {}. "
          "Is another job using port {}? Pick another port in --rdzv-endpoint",
          net::format_endpoint(options_.endpoint.host, options_.endpoint.port), e.what(),
          options_.endpoint.port));
    }
    server_->start();
    port_ = server_->port();
  }
  store_ = connect(options_.host ? std::max(options_.connect_timeout, Millis(10000))
                                 : options_.connect_timeout);
}

EndpointStore::~EndpointStore() {
  store_.reset();
  if (server_) server_->stop();
  if (standby_) standby_->stop();
}

uint16_t EndpointStore::start_standby() {
  if (server_) throw UsageError("EndpointStore::start_standby: this agent serves the store");
  if (standby_) return standby_->port();
  TcpStoreServerOptions so;
  so.host = options_.endpoint.host.find(':') != std::string::npos ? "::" : "";
  so.port = 0;
  so.token = options_.token;
  so.standby = true;
  standby_ = std::make_unique<TcpStoreServer>(so);
  standby_->start();
  return standby_->port();
}

uint16_t EndpointStore::standby_port() const {
  return standby_ ? standby_->port() : 0;
}

void EndpointStore::replicate_to(const std::vector<std::string>& standbys) {
  if (server_ && !standbys.empty()) server_->replicate_to(standbys);
}

std::string EndpointStore::fail_over(const std::vector<std::string>& candidates,
                                     const std::string& mine, Millis per_candidate) {
  std::string promoted;
  try {
    promoted = promote_first_standby(candidates, options_.token, per_candidate);
  } catch (const Error& err) {
    throw NetworkError(fmt::format(
        "no standby store of the job answered ({}). Every node that kept one is gone: start "
        "the job again",
        candidates.empty() ? "the round named none" : err.what()));
  }
  Endpoint e = parse_endpoint(promoted, 0);
  store_.reset();
  options_.endpoint = e;
  port_ = e.port;
  if (promoted == mine && standby_) {
    server_ = std::move(standby_);
    options_.host = true;
  }
  store_ = connect(std::max(per_candidate, Millis(10000)));
  return promoted;
}

std::shared_ptr<TcpStore> EndpointStore::connect_another() const {
  return connect(options_.connect_timeout);
}

std::shared_ptr<TcpStore> EndpointStore::connect(Millis connect_timeout) const {
  // The host agent talks to its own server over loopback: its endpoint name may resolve to
  // an interface address that is fine for peers but pointless here.
  TcpStoreOptions o;
  o.host = server_ ? (options_.endpoint.host.find(':') != std::string::npos ? "::1" : "127.0.0.1")
                   : options_.endpoint.host;
  o.port = port_;
  // connect_timeout bounds only the retrying of an endpoint that refuses (the host agent may
  // still be starting); a connection that reached the store waits for its hello reply like
  // any call, up to call_timeout: a store host starved of CPU by many agents answers late,
  // and is not unreachable.
  o.connect_retry = connect_timeout;
  o.timeout = std::max(connect_timeout, options_.call_timeout);
  o.token = options_.token;
  std::string endpoint = net::format_endpoint(options_.endpoint.host, port_);
  try {
    auto store = std::make_shared<TcpStore>(o);
    store->set_timeout(options_.call_timeout);
    return store;
  } catch (const TimeoutError& e) {
    std::string route = "unknown";
    try {
      auto addrs = cluster::resolve_host(options_.endpoint.host, Millis(1000));
      if (!addrs.empty()) {
        auto r = cluster::route_to(addrs.front());
        route = fmt::format("{} via {}", r.local_address, r.interface.empty() ? "?" : r.interface);
      }
    } catch (const Error& re) {
      route = re.what();
    }
    throw NetworkError(fmt::format(
        "cannot reach the rendezvous endpoint {} from this node (route: {}): {}. Retried for "
        "{:.1f} s (connect_timeout) in case the host agent was still starting. Check that "
        "ddprun runs on the endpoint host with the same --rdzv-endpoint, that {} is the right "
        "address from here (firewall, interface), or run `ddprun doctor --rdzv-endpoint {}`",
        endpoint, route, e.what(), connect_timeout.count() / 1000.0, options_.endpoint.host,
        endpoint));
  } catch (const StoreError& e) {
    throw StoreError(fmt::format(
        "the rendezvous endpoint {} refused this node: {}. Every node needs the same token "
        "(--rdzv-conf token_file=FILE or DDP_STORE_TOKEN)",
        endpoint, e.what()));
  }
}

}  // namespace ddp::rdzv
