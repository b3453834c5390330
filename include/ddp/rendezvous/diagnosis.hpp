#pragma once
// What a rendezvous that timed out knows, and the message it prints. Building the message is
// a pure function so tests can pin it and every field can be checked.
//
// The message names the endpoint, the run id, how many nodes joined out of how many were
// expected, which hosts joined (with their node ranks), which node ranks are missing, how
// long the agent waited and the likely causes, most likely first. When agents of other run
// ids were seen at the same endpoint, "a different --rdzv-id" moves to the top and names them.

#include <string>
#include <utility>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/util/error.hpp"

namespace ddp::rdzv {

struct JoinedNode {
  int node_rank = 0;
  std::string host;
  std::string addr;
  int local_world_size = 0;
  std::string standby;  // HOST:PORT of its standby store (c10d), empty for none
};

struct OtherRun {
  std::string run_id;
  std::vector<std::string> hosts;  // agents that registered with it (may repeat a host)
};

struct TimeoutDiagnosis {
  // What the agent was waiting for: "nodes to join", "admission to the running job", ...
  std::string phase = "nodes to join";
  std::string endpoint;  // "host:port"
  std::string run_id;
  Backend backend = Backend::kC10d;
  int64_t generation = 0;
  int min_nodes = 1;
  int max_nodes = 1;
  std::vector<JoinedNode> joined;  // in node-rank order
  int joined_count = 0;            // may exceed joined.size() when the list was capped
  std::vector<int> missing_ranks;
  Millis waited{0};
  Millis limit{0};
  std::vector<OtherRun> other_runs;
};

// The full multi-line message (no trailing newline).
std::string format_timeout_diagnosis(const TimeoutDiagnosis& d);

// A rendezvous that ran past join_timeout; what() is format_timeout_diagnosis(diagnosis()).
class RendezvousTimeoutError : public TimeoutError {
 public:
  explicit RendezvousTimeoutError(TimeoutDiagnosis d)
      : TimeoutError(format_timeout_diagnosis(d)), diagnosis_(std::move(d)) {}
  const TimeoutDiagnosis& diagnosis() const { return diagnosis_; }

 private:
  TimeoutDiagnosis diagnosis_;
};

// The run was shut down by one of its agents (it gave up after --max-restarts, or was
// interrupted); what() carries that agent's reason.
class RendezvousClosedError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddp::rdzv
