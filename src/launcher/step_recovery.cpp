#include "ddp/launcher/step_recovery.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "ddp/launcher/output.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::launcher {

namespace {
// Set by the agent serving the step store, so the other nodes' agents know it is one.
constexpr const char* kServedByAgentKey = "ddp/recovery/served_by_agent";

// Whether the worker died because its torch.distributed tried to serve a TCPStore on `port`,
// the store this agent serves ("... port: P, ... EADDRINUSE ..." in its stderr): its env://
// rendezvous was torch's own, not ddp's, which joins this store instead.
bool tried_to_serve_the_job_store(const WorkerFailure& failure, uint16_t port) {
  const std::string at = fmt::format("port: {},", port);
  for (const std::string& line : failure.stderr_tail) {
    if (line.find("EADDRINUSE") != std::string::npos && line.find(at) != std::string::npos) {
      return true;
    }
  }
  return false;
}
}  // namespace

RecoveryMode parse_recovery_mode(const std::string& value, const std::string& source) {
  if (value == "group") return RecoveryMode::kGroup;
  if (value == "step") return RecoveryMode::kStep;
  if (value == "shrink") return RecoveryMode::kShrink;
  throw UsageError(fmt::format(
      "{} '{}': unknown recovery mode; use 'group' (stop every worker and restart the group, "
      "the default), 'step' (restart only the failed worker; the others drop the step in "
      "flight and go on, see docs/recovery.md) or 'shrink' (as step, and the others go on "
      "without it at once until its replacement is back)",
      source, value));
}

StepRecovery::StepRecovery(const StepRecoveryOptions& options)
    : world_size_(options.world_size),
      max_restarts_(options.max_restarts),
      notice_fd_(options.notice_fd),
      restarts_(options.restarts_used),
      shrink_(options.shrink) {
  TcpStoreOptions o;
  // A server's client side talks to it over loopback; it binds every interface.
  o.host = options.serve ? "127.0.0.1" : options.host;
  o.port = options.port;
  o.is_server = options.serve;
  o.token = options.token;
  o.timeout = options.timeout;
  if (options.took_lost_slot && options.node_rank == 0) {
    // Node 0 served the store; after its loss the store lives on a promoted standby, which
    // the round's record (node 0's address) does not name.
    throw UsageError(
        "--recovery step: this node cannot take the place of node 0: node 0 served the job's "
        "step store, which moved to a standby on another node when node 0 was lost");
  }
  if (options.serve) {
    store_ = std::make_unique<TcpStore>(o);
    store_->set(kServedByAgentKey, "1");
  } else {
    connect_to_serving_agent(o, options.timeout);
  }
  if (options.num_nodes > 1 && options.standby_count > 0) {
    StepStandbyOptions so;
    so.node_rank = options.node_rank;
    so.num_nodes = options.num_nodes;
    so.count = options.standby_count;
    so.local_addr = options.local_addr;
    so.token = options.token;
    so.wait = kServingAgentWait;
    standbys_ = std::make_unique<StepStoreStandbys>(so, *store_,
                                                    options.serve ? store_->server() : nullptr);
    if (!options.serve && !standbys_->endpoints().empty()) {
      // From now on this agent's calls go on with the promoted standby if node 0 is lost.
      o.standbys = standbys_->endpoints();
      o.timeout = kServingAgentWait;
      store_ = std::make_unique<TcpStore>(o);
      store_->set_timeout(options.timeout);
    }
  }
  // Readable before any worker runs: 0 at the job's start, later for a node that joined.
  start_generation_ = recovery_notice::read_generation(*store_);
}

void StepRecovery::connect_to_serving_agent(TcpStoreOptions o,
                                            std::chrono::milliseconds request_timeout) {
  // Connecting, the handshake and the key, all within kServingAgentWait: a node 0 started
  // without --recovery step serves no step store, and its rank 0 worker's store at the same
  // address (ddp's, which never sets the key, or PyTorch's TCPStore, which does not answer
  // ddp's handshake) must not be taken for it nor hold this agent for long.
  const auto deadline = std::chrono::steady_clock::now() + kServingAgentWait;
  o.timeout = kServingAgentWait;
  try {
    store_ = std::make_unique<TcpStore>(o);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    store_->wait({kServedByAgentKey}, std::max(left, std::chrono::milliseconds(1)));
  } catch (const Error& e) {
    throw UsageError(fmt::format(
        "--recovery step: no ddprun --recovery step agent served the job's store at {} within "
        "{} s ({}): the node running rank 0 runs without --recovery step (give every node the "
        "same --recovery), or its agent is not reachable from here",
        net::format_endpoint(o.host, o.port),
        std::chrono::duration_cast<std::chrono::seconds>(kServingAgentWait).count(), e.what()));
  }
  store_->set_timeout(request_timeout);
}

StepRecovery::~StepRecovery() = default;

uint16_t StepRecovery::port() const {
  return store_->port();
}

std::string StepRecovery::standbys() const {
  return standbys_ ? standbys_->joined() : "";
}

void StepRecovery::say(const std::string& line) {
  write_fully(notice_fd_, line.data(), line.size());
}

bool StepRecovery::still_a_member(int rank) {
  try {
    const int64_t now = recovery_notice::read_generation(*store_);
    const std::vector<int> members = recovery_notice::members(*store_, now, world_size_);
    // A node that took this node's place has these ranks now, not this agent. A rank that
    // left for its replacement (--recovery shrink) is still this agent's.
    const bool member =
        std::find(members.begin(), members.end(), rank) != members.end() || left_.count(rank) > 0;
    return member && !recovery_notice::removed_between(*store_, rank, start_generation_, now);
  } catch (const Error&) {
    return true;  // the store's error shows where it matters (publishing the restart)
  }
}

std::optional<int> StepRecovery::on_worker_failed(const WorkerFailure& failure,
                                                  bool a_peer_finished) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = describe_failure(failure);
  if (tried_to_serve_the_job_store(failure, store_->port())) {
    say(fmt::format(
        "ddprun: rank {} could not serve torch.distributed's store on port {} (EADDRINUSE): "
        "under --recovery step ddprun serves the job's store on MASTER_PORT itself, and a "
        "worker joins it through the ddp package's env:// rendezvous, which this worker did not "
        "have: its Python cannot import ddp (install the ddp package into the environment that "
        "runs the script), or its torch did not load ddp's backend plugin (add `import ddp` "
        "before init_process_group); or run with --recovery group\n",
        failure.global_rank, store_->port()));
  }
  if (world_size_ > 0 && !still_a_member(failure.global_rank)) {
    removed_from_job_ = true;
    say(fmt::format(
        "ddprun: {}; rank {} left the job with this node (another node's agent declared it "
        "lost: missed heartbeats, e.g. a network split), so it is not restarted; the others go "
        "on without this node\n",
        what, failure.global_rank));
    return std::nullopt;
  }
  if (restarts_ >= max_restarts_) {
    say(fmt::format("ddprun: {}; no restart left (--max-restarts {}), stopping the job\n", what,
                    max_restarts_));
    return std::nullopt;
  }
  bool recovery_aware = false;
  try {
    recovery_aware = recovery_notice::step_manager_announced(*store_);
  } catch (const Error&) {
    // The store is gone: no rank can be healed in place either.
  }
  if (!recovery_aware) {
    group_restart_ = true;
    say(fmt::format(
        "ddprun: {}; no worker runs its training loop under a StepManager (ddp::StepManager, "
        "ddp.StepManager), so nothing would redo the other workers' step: restarting the whole "
        "group instead of rank {} alone, as --recovery group does (--recovery step needs a "
        "StepManager in the training loop: docs/recovery.md)\n",
        what, failure.global_rank));
    return std::nullopt;
  }
  if (a_peer_finished) {
    say(fmt::format(
        "ddprun: {}; another worker already finished its training loop, so no running peer "
        "could heal a replacement of rank {}: stopping the job (--recovery step restarts a rank "
        "only while its peers run)\n",
        what, failure.global_rank));
    return std::nullopt;
  }
  if (shrink_) {
    const int64_t generation = recovery_notice::publish_rank_left(*store_, failure.global_rank);
    left_.insert(failure.global_rank);
    ++restarts_;
    say(fmt::format(
        "ddprun: {}; restarting only rank {} (--recovery shrink, restart {} of {}, membership "
        "generation {}); the other workers go on without it at once, and it rejoins once its "
        "process runs\n",
        what, failure.global_rank, restarts_, max_restarts_, generation));
    return restarts_;
  }
  const int64_t generation = recovery_notice::publish_lost_rank(*store_, failure.global_rank);
  ++restarts_;
  say(fmt::format(
      "ddprun: {}; restarting only rank {} (--recovery step, restart {} of {}, membership "
      "generation {}); the other workers go on\n",
      what, failure.global_rank, restarts_, max_restarts_, generation));
  return restarts_;
}

void StepRecovery::on_worker_succeeded(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto request_timeout = store_->timeout();
  store_->set_timeout(std::min(request_timeout, kNodeLossRecordLimit));
  try {
    recovery_notice::publish_finished(*store_, rank, recovery_notice::read_generation(*store_));
  } catch (const Error&) {
    // The worker's own record (its group's destructor) may be there; at worst a replacement
    // of a peer waits for it until its group timeout, as before.
  }
  store_->set_timeout(request_timeout);
}

void StepRecovery::on_node_joined(int node_rank, int first_rank, int num_ranks, bool grew) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> slots;
  for (int r = first_rank; r < first_rank + num_ranks; ++r) slots.push_back(r);
  const int64_t generation = recovery_notice::publish_joined_node(*store_, slots);
  const std::string ranks =
      num_ranks == 1 ? fmt::format("rank {} comes", first_rank)
                     : fmt::format("ranks {}-{} come", first_rank, first_rank + num_ranks - 1);
  if (grew) {
    say(fmt::format(
        "ddprun: this node joins the running job as node {} and grows it past its launch size "
        "of {} workers: {} with it, healed from a live peer; the other workers make room "
        "(--recovery step, membership generation {})\n",
        node_rank, world_size_, ranks, generation));
    return;
  }
  say(fmt::format(
      "ddprun: this node takes the place of node {}, lost while the job ran: {} back with it, "
      "healed from a live peer; the other workers make room (--recovery step, membership "
      "generation {})\n",
      node_rank, ranks, generation));
}

bool StepRecovery::on_node_lost(const LostNode& node) {
  if (node.node_rank == 0) {
    // That node's agent served this store: its standby takes over, if it has one.
    if (!standbys_ || standbys_->endpoints().empty()) {
      say(fmt::format(
          "ddprun: {}; it served the job's --recovery step store (the round's node 0) and the "
          "store has no standby (--rdzv-conf standby_stores=0, or a job of one node then), so "
          "the others cannot go on without it: ending the round\n",
          node.why));
      return false;
    }
    try {
      const std::string promoted = standbys_->promote(kNodeLossRecordLimit);
      // Its connection to node 0's store may wait in vain for a reply (a cut link): go there.
      store_->prefer_endpoint(promoted);
      say(fmt::format(
          "ddprun: node 0 served the job's --recovery step store: its standby at {} serves it "
          "now, with every write node 0 had answered\n",
          promoted));
    } catch (const Error& e) {
      say(
          fmt::format("ddprun: {}; it served the job's --recovery step store and no standby "
                      "could take over ({}): ending the round\n",
                      node.why, e.what()));
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> slots;
  for (int r = node.first_rank; r < node.first_rank + node.num_ranks; ++r) slots.push_back(r);
  // This runs on the membership watcher's thread, whose heartbeats wait meanwhile: a store that
  // does not answer must not hold them for the client's usual limit.
  const auto request_timeout = store_->timeout();
  store_->set_timeout(std::min(request_timeout, kNodeLossRecordLimit));
  struct RestoreTimeout {
    TcpStore& store;
    std::chrono::milliseconds timeout;
    ~RestoreTimeout() { store.set_timeout(timeout); }
  } restore{*store_, request_timeout};
  try {
    const int64_t generation = recovery_notice::publish_lost_node(*store_, slots);
    const size_t left = recovery_notice::members(*store_, generation, world_size_).size();
    const std::string ranks =
        slots.size() == 1 ? fmt::format("its rank {} leaves", slots.front())
                          : fmt::format("its ranks {}-{} leave", slots.front(), slots.back());
    say(fmt::format(
        "ddprun: {}; {} the job and the other {} worker{} go{} on without {} (--recovery step, "
        "membership generation {}); not counted against --max-restarts\n",
        node.why, ranks, left, left == 1 ? "" : "s", left == 1 ? "es" : "",
        slots.size() == 1 ? "it" : "them", generation));
    return true;
  } catch (const Error& e) {
    say(fmt::format("ddprun: {}; cannot record it in the job's store ({}): ending the round\n",
                    node.why, e.what()));
    return false;
  }
}

}  // namespace ddp::launcher
