#pragma once
// The store behind a rendezvous: the agent on the endpoint host serves it (TcpStoreServer on
// the endpoint port, every interface), every agent (the host too) talks to it as a client.
//
// Reaching the endpoint fails fast: connection refused is retried only for connect_timeout
// (a few seconds, in case the host agent is still starting), while a connection the endpoint
// accepted may wait up to call_timeout for the hello reply (a store host starved of CPU by
// a thousand agents answers late; it is not unreachable). Then a NetworkError names the
// endpoint, this node's route to it and the last error ("connection refused", "no route to
// host", "timed out"), says how long it retried and what to check. A token mismatch is a
// StoreError saying the tokens differ.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"

namespace ddp::rdzv {

// Whether `host` names this machine: it resolves to loopback or to an address of a local
// interface. Resolution is bounded by `timeout`; an unresolvable host is not local.
bool is_local_host(const std::string& host, Millis timeout = Millis(3000));

// The address peers should use to reach this node, as seen on the route to `peer_host`
// (the source address the kernel picks); the host name when that cannot be determined.
std::string local_address_towards(const std::string& peer_host, Millis timeout = Millis(3000));

// A warning for the agent that serves the store when `open_files_limit` (the process's
// RLIMIT_NOFILE after raising it to the hard limit) cannot hold a connection per agent
// (`max_nodes`) plus this agent's own files (`local_workers` workers' pipes and logs, and a
// reserve); nullopt when it can. Running out makes the store stop accepting agents (they fail
// with "could not connect ... receiving timed out") or this agent fail to start its workers.
std::optional<std::string> store_host_fd_warning(uint64_t open_files_limit, int max_nodes,
                                                 int local_workers);

struct EndpointStoreOptions {
  Endpoint endpoint;
  // Serve the store here (this agent is on the endpoint host).
  bool host = false;
  // nullopt: $DDP_STORE_TOKEN, else none (TcpStore's rule).
  std::optional<std::string> token;
  Millis connect_timeout = RendezvousConf::kDefaultConnectTimeout;
  // Bound of every later store call.
  Millis call_timeout{60000};
};

class EndpointStore {
 public:
  explicit EndpointStore(EndpointStoreOptions options);
  ~EndpointStore();

  // The client connection of this agent.
  const std::shared_ptr<TcpStore>& store() const { return store_; }
  // Another connection (e.g. for the MembershipWatcher); fails like the constructor.
  std::shared_ptr<TcpStore> connect_another() const;
  // The server when this agent hosts it, else nullptr.
  TcpStoreServer* server() { return server_.get(); }
  bool is_host() const { return server_ != nullptr; }
  // The port actually served/used (differs from options when hosting port 0).
  uint16_t port() const { return port_; }
  // The endpoint this agent's connection goes to: the --rdzv-endpoint, or the standby store
  // it moved to (fail_over).
  const Endpoint& endpoint() const { return options_.endpoint; }

  // Starts this agent's standby store: a second store server on an ephemeral port of every
  // interface, with the same token, in standby mode (it refuses clients until promoted and
  // takes the copy the store's host replicates to it: replicate_to), which the agents move to
  // when the store's host is lost (fail_over). Only for an agent that does not serve the
  // store. Returns its port.
  uint16_t start_standby();
  uint16_t standby_port() const;  // 0 when no standby runs

  // The store that this agent serves replicates to `standbys` ("HOST:PORT", in order) from
  // now on (TcpStoreServer::replicate_to). Nothing when it serves none.
  void replicate_to(const std::vector<std::string>& standbys);

  // The store was lost (its host died): promotes the first of `candidates` ("HOST:PORT", in
  // the round's order of preference) that answers, retrying one that refuses for
  // `per_candidate` (promoting one that was promoted already does nothing: every agent moves
  // to the same), and connects to it. When that is `mine` (this agent's standby), this agent
  // serves the store from then on (is_host()). Returns the candidate now used; a NetworkError
  // naming every candidate and its error when none answers.
  std::string fail_over(const std::vector<std::string>& candidates, const std::string& mine,
                        Millis per_candidate);

 private:
  std::shared_ptr<TcpStore> connect(Millis connect_timeout) const;

  EndpointStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreServer> standby_;
  uint16_t port_ = 0;
  std::shared_ptr<TcpStore> store_;
};

}  // namespace ddp::rdzv
