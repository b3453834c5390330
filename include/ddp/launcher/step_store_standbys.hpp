#pragma once
// The --recovery step store's standbys (docs/recovery.md, "When node 0 is lost"): the store
// lives in the agent of the round's node 0, so that node's loss would end the round. Nodes
// 1..count of the round each keep a standby store (TcpStoreServerOptions::standby); node 0's
// store replicates every write to the first of them before answering it (replicate_to); the
// agents and workers get the list (the workers through DDP_STORE_STANDBYS) and fail over to the
// promoted one; the agent that declares node 0 lost promotes the first that answers.
//
// Keys in the step store: ddp/recovery/standby/<node> (each standby node's "host:port") and
// ddp/recovery/standbys (node 0's list, in order; "" for none).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
class Store;
class TcpStoreServer;
}  // namespace ddp

namespace ddp::launcher {

struct StepStandbyOptions {
  int node_rank = 0;
  int num_nodes = 1;
  // How many nodes after node 0 keep a standby (--rdzv-conf standby_stores).
  int count = 0;
  // This node's address as the others reach it (the rendezvous' local address).
  std::string local_addr;
  std::optional<std::string> token;
  // Longest wait for the other nodes' part (registering, the list).
  std::chrono::milliseconds wait{std::chrono::seconds(30)};
};

class StepStoreStandbys {
 public:
  // On node 0 (`primary` is its store's server): waits for the standbys of nodes 1..count to
  // register, at most options.wait in all, makes `primary` replicate to those that did, and
  // publishes the list. On nodes 1..count: starts this node's standby and registers it. On
  // every node other than 0: reads the list (at most options.wait; none then). Throws the
  // store's errors, NetworkError when this node's standby cannot listen.
  StepStoreStandbys(const StepStandbyOptions& options, Store& store, TcpStoreServer* primary);
  ~StepStoreStandbys();

  // The standbys in the order they take over ("host:port"); empty for none.
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // Comma-separated, for DDP_STORE_STANDBYS.
  std::string joined() const;

  // Node 0 is lost: promotes the first standby that answers (each within `per_attempt`) and
  // returns its endpoint; NetworkError naming each failure when none does.
  std::string promote(std::chrono::milliseconds per_attempt) const;

 private:
  std::optional<std::string> token_;
  std::unique_ptr<TcpStoreServer> mine_;  // this node's standby (nodes 1..count)
  std::vector<std::string> endpoints_;
};

}  // namespace ddp::launcher
