#pragma once
// ddprun --recovery step (docs/recovery.md): a worker that exits abnormally is restarted
// alone, in place (same rank), while the others keep running; each such restart counts against
// --max-restarts (per agent, as torchrun counts restarts). An agent hosts the job's store (the
// workers' MASTER_ADDR:MASTER_PORT, DDP_RECOVERY=step tells them not to host it), so it outlives
// any rank: on one node that agent, on several the agent of the node running rank 0 (the round's
// node 0, at the round's master port); the other nodes' agents connect to it. Each agent
// publishes the losses of its own workers there (recovery_notice.hpp) before the replacement
// starts: survivors on every node learn of it within their watcher's interval
// (RecoverableGroup) and the replacement joins the generation the loss opened. A node lost in
// an elastic job (its agent missed its heartbeats, or left) is recorded the same way by the
// survivor that saw it: its ranks leave the job, and the others go on with fewer ranks.
//
// --recovery shrink is step with one difference: the lost rank leaves the membership at once,
// so the others go on at the smaller size instead of waiting for its replacement's process to
// start, and the replacement, once it runs, claims its slot back and is healed (as a lost
// node's ranks leave and a joining node's come). It changes the global batch of the steps
// between, unless the program splits the launch's batch over the current ranks.
//
// --recovery group (the default) is the whole-group restart the agent always did.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "ddp/launcher/membership.hpp"
#include "ddp/launcher/root_cause.hpp"
#include "ddp/launcher/step_store_standbys.hpp"

namespace ddp {
class TcpStore;
struct TcpStoreOptions;
}  // namespace ddp

namespace ddp::launcher {

enum class RecoveryMode { kGroup, kStep, kShrink };

// "group", "step" or "shrink"; anything else is a UsageError naming `source` (the flag or
// variable).
RecoveryMode parse_recovery_mode(const std::string& value, const std::string& source);

// The variable that tells workers ddprun hosts their store and publishes losses.
inline constexpr const char* kRecoveryEnvVar = "DDP_RECOVERY";

struct StepRecoveryOptions {
  // Host the store (listening on every interface at `port`, 0: a free one), or connect to it
  // at host:port.
  bool serve = true;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // The job's store token; nullopt: $DDP_STORE_TOKEN, as the workers' stores.
  std::optional<std::string> token;
  // Bounds every request (a client waits kServingAgentWait for the serving agent).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // The job's world size at launch (the slots of recovery_notice::members); 0 on one node,
  // where no node can be lost.
  int world_size = 0;
  int max_restarts = 0;
  // Restarts this agent already used in earlier rounds (multi-node: one StepRecovery a round).
  int restarts_used = 0;
  int notice_fd = 2;
  // Several nodes: this node's place in the round and the store's standbys
  // (step_store_standbys.hpp): nodes 1..standby_count keep one, so the store outlives node 0.
  int node_rank = 0;
  int num_nodes = 1;
  int standby_count = 0;
  std::string local_addr;  // this node's address as the others reach it
  // This node takes the place of a node the running round lost.
  bool took_lost_slot = false;
  // --recovery shrink: a lost rank leaves the membership at once ("left:"), so the others go on
  // without waiting for its replacement, which claims the slot back once it runs ("back:").
  bool shrink = false;
};

class StepRecovery {
 public:
  // How long another node's agent waits for the serving agent's store (it starts right after
  // the round, as the others connect).
  static constexpr std::chrono::seconds kServingAgentWait{30};
  // Bounds each store request of recording a lost node (on_node_lost), which holds the
  // membership's heartbeats (the client adds its reply grace). The store is node 0's agent's,
  // which answers at once unless node 0 is lost too; node 0's own loss is refused with no
  // request.
  static constexpr std::chrono::milliseconds kNodeLossRecordLimit{2000};

  // Hosts or connects to the store (options.serve). Throws NetworkError naming the port when
  // it cannot bind, and a UsageError naming the endpoint and the likely cause (node 0 without
  // --recovery step) when no serving agent answers within kServingAgentWait. Construct it
  // after the agent blocked its signals: a serving store's thread must inherit that mask.
  explicit StepRecovery(const StepRecoveryOptions& options);
  ~StepRecovery();

  uint16_t port() const;
  int restarts() const { return restarts_; }
  // The store's standbys for the workers' DDP_STORE_STANDBYS ("host:port,..."; "" for none).
  std::string standbys() const;

  // AttemptSpec::replace_failed: with restarts left, publishes the loss of the failed rank and
  // returns the replacement's TORCHELASTIC_RESTART_COUNT; otherwise nullopt (the attempt then
  // fails and the agent reports it, without a group restart).
  // When no worker of the job announced a StepManager (recovery_notice::step_manager_announced:
  // a program that is not recovery-aware, or one that failed before its loop began), nothing
  // would redo the survivors' step: with restarts left it returns nullopt with group_restart()
  // true, saying why; the agent then restarts the whole group as --recovery group does (and
  // charges that restart).
  // A worker whose rank left the job with its node (this node was declared lost while it
  // still ran) is not restarted either: removed_from_job() then says so. Nor one that failed
  // after a peer finished (`a_peer_finished`: no live peer could heal it): the job then ends,
  // saying why, unless it is not recovery-aware (the group restart above).
  std::optional<int> on_worker_failed(const WorkerFailure& failure, bool a_peer_finished);

  // AttemptSpec::on_worker_succeeded: records in the store that global rank `rank` finished
  // (recovery_notice::publish_finished at the current generation), as its group's destructor
  // does, for a worker that skipped it (exit(), _Exit): a replacement of a peer that died
  // after the last step then fails at once instead of waiting for it. Best effort, each
  // request bounded by kNodeLossRecordLimit.
  void on_worker_succeeded(int rank);

  // A node of the job was lost (LostNodeHandler, on the membership watcher's thread): records
  // that its ranks leave the job, so the survivors re-form without them, and says so. The
  // round's node 0 served this store: its first standby that answers is promoted first, and
  // the store's clients go on with it. Returns false, saying why, when the survivors cannot
  // go on in place: node 0 is lost with no standby to promote, or the store fails. The round
  // then ends as in group mode.
  bool on_node_lost(const LostNode& node);

  // This node joined the running round (before its workers start), in the place of a node it
  // lost or, `grew`, past its size: records that the ranks first_rank .. first_rank +
  // num_ranks - 1 come (back), so the others re-form with them and heal them from a peer, and
  // says so. Throws the store's Error.
  void on_node_joined(int node_rank, int first_rank, int num_ranks, bool grew = false);

  // This node's ranks were taken out of the job by another node's agent (a network split
  // healed, a frozen agent resumed): this agent must leave without ending the others' job.
  bool removed_from_job() const { return removed_from_job_; }
  // The last failure asks for a restart of the whole group (on_worker_failed).
  bool group_restart() const { return group_restart_; }

 private:
  void connect_to_serving_agent(TcpStoreOptions o, std::chrono::milliseconds request_timeout);
  void say(const std::string& line);
  // Whether global rank `rank` is in the current generation (not taken out with its node).
  bool still_a_member(int rank);

  std::mutex mutex_;  // the agent's thread and the membership watcher's both publish
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<StepStoreStandbys> standbys_;  // several nodes with standby_count > 0
  int world_size_;
  int64_t start_generation_ = 0;  // when this agent's round started (its workers' first)
  int max_restarts_;
  int notice_fd_;
  int restarts_;
  bool removed_from_job_ = false;
  bool group_restart_ = false;
  bool shrink_ = false;
  // --recovery shrink: this agent's ranks that left the membership for their replacement
  // (members again once it is back; until then still this agent's to restart).
  std::set<int> left_;
};

}  // namespace ddp::launcher
