#pragma once
// The rendezvous protocol: agents (one per node) meet at a Store, agree on a round of
// membership, node ranks and the workers' MASTER_ADDR/PORT, and start a new round whenever
// membership changes. docs/rendezvous.md describes the keys and the steps.
//
// Rounds have a generation number; every key of round g lives under "rdzv/<run_id>/<g>/", so
// an agent of a later round never reads an earlier round's keys. One round, c10d backend:
//   1. slot = add(slot, 1) - 1; publish this node's info and first heartbeat (one multi_set).
//   2. The MAX-th joiner closes the round at once; every joiner from the MIN-th on waits up
//      to last_call_timeout for the round to close and then closes it with compare_set
//      (closed = number of slots taken, capped at MAX). Earlier joiners wait up to
//      join_timeout for the close.
//   3. Joiners whose slot >= closed are too late for this round: they count themselves in
//      "pending" and wait for the round to end (members notice them and start a new round).
//   4. Slot 0 is node rank 0: it reads every node's info, assigns global ranks in node-rank
//      order (heterogeneous local world sizes), picks MASTER_ADDR/PORT and publishes them in
//      one multi_set; each other member reads its own entry (one wait + one multi_get).
// So each agent makes O(1) store calls and node 0 moves O(n) bytes: n agents cost O(n).
// The static backend is the same with slot = --node-rank and closed = nnodes.
//
// Every blocking step is bounded: join_timeout for the round to form (then a
// RendezvousTimeoutError with the full diagnosis), close_timeout for node 0's assignment.
//
// Not thread-safe; one object per agent. The MembershipWatcher (membership_watcher.hpp)
// watches a round from another thread with its own Store connection.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rendezvous/diagnosis.hpp"
#include "ddp/rendezvous/options.hpp"
#include "ddp/store/store.hpp"

namespace ddp::rdzv {

struct RoundInfo {
  int64_t generation = 0;
  int node_rank = 0;    // GROUP_RANK
  int num_nodes = 1;    // GROUP_WORLD_SIZE
  int world_size = 1;   // WORLD_SIZE: the sum of every node's local world size
  int rank_offset = 0;  // RANK of this node's local rank 0
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // Every member, in node-rank order; filled on node rank 0 only (it is O(n)).
  std::vector<JoinedNode> nodes;
  // "HOST:PORT" of the round's standby stores (the first conf.standby_stores members that
  // offered one, in node-rank order): where every member goes when the store is lost.
  std::vector<std::string> standbys;
  // This node joined the round while it ran, in the slot of a node the round lost in place
  // (RendezvousOptions::take_lost_slots): its workers come back in that node's ranks.
  bool took_lost_slot = false;
  // This node joined the round while it ran and grew it (RendezvousOptions::take_lost_slots,
  // no lost place to take, the round below its maximum): it holds a slot past the round's
  // formed size and ranks past its world size (round_growth.hpp). world_size then counts every
  // rank up to this node's, and num_nodes every slot up to its own.
  bool grew_round = false;
  // The nodes the round formed with (slots 0 .. formed_nodes - 1) and their world size: the
  // launch's, the same on every member, whatever nodes grew it later.
  int formed_nodes = 1;
  int launch_world_size = 1;
};

class Rendezvous {
 public:
  // Throws UsageError when options are inconsistent (validate()).
  Rendezvous(RendezvousOptions options, std::shared_ptr<Store> store);

  // Joins the next round (the first call: the current one) and returns this node's place in
  // it. Throws RendezvousTimeoutError after join_timeout, RendezvousClosedError when the run
  // was shut down, UsageError when two static nodes claim one node rank.
  RoundInfo next_round();

  // Ends the current round for everyone (members' watchers wake up); the next next_round()
  // joins the following one. The first reason given for a round is the one everyone sees: it is
  // returned ("" before any round).
  std::string request_new_round(const std::string& reason);
  // This node's workers finished: its heartbeat key says so, so peers stop watching it.
  void mark_finished();
  // This node leaves (interrupted, giving up): peers see it at once and re-form the round.
  void mark_left(const std::string& reason);
  // Ends the whole run: every agent's next_round() throws RendezvousClosedError(reason) and
  // the current round's members are woken.
  void shutdown(const std::string& reason);
  // The reason the run was shut down (shutdown() by any agent), nullopt while it runs.
  std::optional<std::string> shutdown_reason();

  // For the agent hosting the store: waits until every other member of the current round
  // has finished, left, or stopped heartbeating (kMissedHeartbeats periods), or `limit`
  // passes, so the store outlives its users. Returns whether all were accounted for.
  bool wait_for_peers_to_finish(Millis limit);

  // This agent's standby store from the next round on (options().standby); "" for none, e.g.
  // once this agent serves the job's store itself.
  void set_standby(const std::string& standby);
  // Goes on with `store` after the store of the current round was lost (its host died): the
  // next next_round() joins the round after the last one on it, so generations keep
  // increasing across the move. Every member of the lost round moves to the same store.
  void move_to_store(std::shared_ptr<Store> store);
  // Goes on with `store` in the same round: the store moved with its data (a standby that
  // holds a copy of the lost one was promoted), so the round and this node's place in it are
  // there as they were.
  void follow_store(std::shared_ptr<Store> store);

  // The current round; only valid after next_round() returned.
  const RoundInfo& round() const { return round_; }
  bool in_round() const { return in_round_; }
  const RendezvousOptions& options() const { return options_; }
  Store& store() { return *store_; }

  // Gathers what a timed-out agent can learn from the store (joined nodes of generation g,
  // missing ranks, other run ids at the endpoint). Public for tests and the agent's logs.
  TimeoutDiagnosis diagnose(int64_t generation, const std::string& phase, Millis waited);

 private:
  // A node too late for round g (of n members, assigned) takes the first slot the round lost
  // in place whose node had as many workers as this one; nullopt when there is none.
  std::optional<RoundInfo> take_lost_slot(int64_t g, int n,
                                          std::chrono::steady_clock::time_point deadline);
  // A node too late for round g (of n members), in join slot `slot`, grows the round there
  // while it has fewer than MAX live nodes (round_growth.hpp); nullopt when it is full.
  std::optional<RoundInfo> grow_round(int64_t g, int n, int slot,
                                      std::chrono::steady_clock::time_point deadline);
  // Error when the round this node was in went on without it (its slot marked lost, or taken
  // by another node): starting the next round would end the others'.
  void throw_if_lost_in_place();
  // One attempt at round g; nullopt when this agent must move on to a later round.
  std::optional<RoundInfo> try_round(int64_t g, std::chrono::steady_clock::time_point deadline);
  // Slot 0's step 4. nullopt when a member never published its info (round abandoned).
  std::optional<RoundInfo> assemble(int64_t g, int n,
                                    std::chrono::steady_clock::time_point info_deadline);
  std::optional<RoundInfo> read_assignment(int64_t g, int slot, int n,
                                           std::chrono::steady_clock::time_point deadline);
  // A joiner too late for round g (of n members) waits for it to end; it ends the round
  // itself when no member is alive. Throws RendezvousTimeoutError at `deadline`.
  void wait_for_admission(int64_t g, int n, std::chrono::steady_clock::time_point deadline,
                          std::chrono::steady_clock::time_point start);
  int64_t advance_generation();
  void register_run();
  void throw_if_shut_down();
  [[noreturn]] void throw_timeout(int64_t g, const std::string& phase,
                                  std::chrono::steady_clock::time_point start);

  RendezvousOptions options_;
  std::shared_ptr<Store> store_;
  std::string info_;  // this node's published info
  bool registered_ = false;
  // The last round this agent took part in (as member or as a waiting joiner).
  std::optional<int64_t> last_generation_;
  RoundInfo round_;
  int slot_ = -1;
  bool in_round_ = false;
};

}  // namespace ddp::rdzv
