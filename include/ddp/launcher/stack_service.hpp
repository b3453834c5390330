#pragma once
// The agent's side of `ddprun stacks`: answers requests for its workers' stacks, and in a
// multi-node job collects the other nodes' through the job's store.
//
// - Finding the agent: it writes a record (JSON: run id, host, agent pid, node rank, socket
//   path) named `<run id>.<pid>.json` into the registry folder (stacks_registry_dir(): mode
//   0700, owned by this user) and, with --log-dir, as `ddprun_agent.<host>.<pid>.json` into the
//   run's log folder. Both go when the service does.
// - Asking it: a Unix stream socket in the registry folder (its permissions are the access
//   control: only this user, or root, can connect). A request is one JSON line
//   {"timeout_ms": N, "all_nodes": true}; the answer one JSON object
//   {"stacks": [...], "nodes": K, "answered": [node ranks], "notes": [...]}, then EOF.
// - Other nodes: in a round (join_round()), a thread holds its own connection to the job's
//   store (authenticated like the agent's own; never an unauthenticated one), waits on
//   `ddprun_stacks/<run>/<gen>/req/<n>` in slices of 200 ms, captures its workers' stacks on a
//   request and sets
//   `.../resp/<n>/<node rank>`. The node asked first sets the request and waits for the others'
//   answers until the request's deadline; nodes that do not answer are named.
//
// - One capture of the workers at a time: a process admits one tracer (ptrace), and when a
//   round ends this node's own report and other nodes' requests want its workers at the same
//   moment; a capture asked for while another runs takes that one's result.
// - Other nodes are served and asked only over an authenticated store (a token configured):
//   a request makes every node ptrace its workers. Without one (or with etcd) the answer counts
//   every node of the round, names the others as not asked and why.
//
// Contract: every wait is bounded (a client that sends nothing: 2 s; one that does not read
// the answer: 5 s; a capture: the request's timeout, at most kMaxCapture); threads stop
// within one slice. The accepted sockets are non-blocking. Errors reach the client as
// notes; nothing throws out of the threads.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/stack_capture.hpp"
#include "ddp/store/store.hpp"

namespace ddp::launcher {

// $DDPRUN_RUNTIME_DIR, else $XDG_RUNTIME_DIR/ddprun, else /tmp/ddprun-<uid>.
std::string stacks_registry_dir();

struct StackServiceOptions {
  std::string run_id;
  std::string host;
  // The run's log folder with --log-dir (a copy of the record goes there); "" without.
  std::string log_root;
  StackTools tools;
};

class StackService {
 public:
  static constexpr std::chrono::milliseconds kMaxCapture{30000};
  // Other nodes' requests within this long of a capture get that capture (issue 49, finding 5).
  static constexpr std::chrono::milliseconds kRequestCaptureInterval{1000};

  // Throws ddp::Error naming the folder when the registry cannot be used (the agent goes on
  // without the service and says so).
  explicit StackService(StackServiceOptions options);
  ~StackService();
  StackService(const StackService&) = delete;
  StackService& operator=(const StackService&) = delete;

  // The workers of the running attempt (empty between attempts). Thread-safe.
  void set_workers(std::vector<StackTarget> workers);
  // This node's workers' stacks, by `deadline`.
  std::vector<RankStacks> capture_local(std::chrono::steady_clock::time_point deadline);

  // What a `ddprun stacks` request gets: this node's workers' stacks and, in a round with an
  // authenticated store, every other node's (they capture at the same time), by `deadline`.
  struct Collected {
    std::vector<RankStacks> stacks;
    int nodes = 1;                   // the nodes of the round
    std::vector<int> answered;       // node ranks whose stacks are in `stacks`, this one first
    std::vector<std::string> notes;  // nodes not asked (and why), silent or unreadable
  };
  Collected capture_all_nodes(std::chrono::steady_clock::time_point deadline);

  // Multi-node: serve and ask the other nodes of round `generation` through `store` (a
  // connection of the service's own). leave_round() stops that.
  // A null `store` (etcd, or a store without auth token: see Membership::connect_side_store)
  // serves no other node; requests then count `num_nodes` and say `no_store_reason`.
  void join_round(std::shared_ptr<Store> store, int generation, int node_rank, int num_nodes,
                  std::string no_store_reason = "");
  // A node whose worker failed calls this before it ends the round: it takes the request id its
  // failure report will ask the other nodes with, so each node that sees the round end answers
  // that request before it leaves the round (without it, a node could leave between answering
  // its own report's question and the failing node's asking). No-op outside a multi-node round.
  void reserve_request();
  void leave_round();

  const std::string& socket_path() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ddp::launcher
