#pragma once
// What an agent tells its user while it waits for the rendezvous round to form, which can
// last up to join_timeout (10 minutes by default) when a node is missing: one line when the
// wait starts and one every interval after it, each naming the job, the rendezvous store
// (host:port) and whether this node serves it, how many of the expected nodes arrived when
// it can count them, the time waited and the limit with the flag that sets it. The wait
// itself, and its one error at the limit (RendezvousTimeoutError with the full diagnosis),
// stay the rendezvous's (ddp/rendezvous/rendezvous.hpp).
//
// The start line is built from the options alone, so a wait that ends at once costs no
// store request. Counting arrivals costs O(nodes) requests on a second store connection
// (the agent's own one is blocked in the rendezvous' wait), so it is done on the progress
// ticks only, and by the agent serving the store alone in jobs of more than
// kCountedByEveryNode nodes: every agent of a stuck 1000-node job counting 1000 nodes would
// load the store with a million requests per interval.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/store/store.hpp"

namespace ddp::launcher {

// Default time between progress lines; DDPRUN_RDZV_PROGRESS_S overrides it (cli.cpp).
constexpr std::chrono::milliseconds kDefaultJoinProgressInterval{30000};
// Up to this many nodes every waiting agent counts arrivals; above it only the store host.
constexpr int kCountedByEveryNode = 64;

// The facts of one wait that do not change while it lasts.
struct JoinWait {
  rdzv::Backend backend = rdzv::Backend::kStatic;
  std::string run_id;
  std::string endpoint;       // the rendezvous store, "host:port"
  bool serves_store = false;  // this node's agent serves it
  int node_rank = -1;         // static: this node's --node-rank; c10d: -1 (assigned later)
  rdzv::NodeRange nodes;
  rdzv::Millis limit{0};  // join_timeout
};

// Nodes of the round being formed whose agents reached the store.
struct JoinCount {
  int arrived = 0;
  int expected = 0;
  std::vector<int> missing;  // node ranks, ascending
};

// "waiting for the other nodes of static run 'job' (2 nodes): the rendezvous store is
// H:P, served by this node (node rank 0); giving up after 600 s (--rdzv-conf
// join_timeout=SECONDS); a progress line every 30 s".
std::string format_join_start(const JoinWait& wait, rdzv::Millis interval);

// "still waiting for the other nodes of static run 'job': 1 of 2 nodes arrived (missing: node
// rank 1) at the rendezvous store H:P, served by this node; waited 30 s, giving up after
// 600 s (--rdzv-conf join_timeout=SECONDS)". Without a count, `uncounted` (if not empty) says
// why in its place.
std::string format_join_progress(const JoinWait& wait, rdzv::Millis waited,
                                 const std::optional<JoinCount>& count,
                                 const std::string& uncounted);

// Counts the nodes of static round `generation` whose info is in `store`, through
// Rendezvous::diagnose. nullopt when that round does not list this node (options.node_rank),
// i.e. `generation` is not the round this node joined. Store errors propagate.
std::optional<JoinCount> count_static_arrivals(std::shared_ptr<Store> store,
                                               const rdzv::RendezvousOptions& options,
                                               int64_t generation);

// Writes the start line at once and a progress line every `interval` from its own thread,
// until destroyed. `count` (empty: arrivals are not counted) runs on that thread only, so it
// may own a store connection; an exception it throws is named in the line instead of the
// count. `notice` writes one line; it is called from the constructor's thread and from the
// reporter's, never after the destructor began.
class JoinProgress {
 public:
  struct Counter {
    std::function<std::optional<JoinCount>()> count;
    // Said in place of the count when `count` is empty or returns nullopt.
    std::string uncounted;
  };

  JoinProgress(JoinWait wait, rdzv::Millis interval, Counter counter,
               std::function<void(const std::string&)> notice);
  // Stops the thread: at once, or after the count in flight (bounded by its store's timeout).
  ~JoinProgress();

  JoinProgress(const JoinProgress&) = delete;
  JoinProgress& operator=(const JoinProgress&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ddp::launcher
