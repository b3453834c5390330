#pragma once
// What the agent needs from a multi-node rendezvous, as an interface, so the agent loop does
// not depend on the protocol (src/launcher/rendezvous_membership.cpp implements it with
// ddp_rendezvous; tests may fake it).
//
// The agent's loop with a Membership (agent.cpp):
//   round = next_round()          // blocks until the round forms (or throws with a diagnosis)
//   fd = start_watching()          // readable once the round must end
//   run the workers with stop_fd = fd
//   stop_watching()
//   success -> finished(); failure -> end_round(reason) and loop; stopped -> loop;
//   interrupted -> leave(reason).
// A round with fewer nodes than the one whose workers failed means a node was lost: that
// restart is a membership change and does not count against --max-restarts (like torchrun).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/world.hpp"
#include "ddp/store/store.hpp"

namespace ddp::launcher {

struct MembershipRound {
  WorldAssignment world;
  // The round number, consistent on every node; names the attempt's log folder. (The workers'
  // TORCHELASTIC_RESTART_COUNT is this agent's own count of restarts after a failure.)
  int generation = 0;
  // One line for the log: "round 1: 2 nodes, 4 workers, master 10.78.0.1:41234".
  std::string summary;
  // --recovery step: this node joined the running round in the place of a node it lost; its
  // workers come back in that node's ranks (StepRecovery::on_node_joined).
  bool took_lost_slot = false;
  // --recovery step: this node joined the running round and grew it past its size; its
  // workers come in new ranks after every earlier one (StepRecovery::on_node_joined).
  bool grew_round = false;
  // The nodes and world size the round formed with (the launch's; world.group_world_size and
  // world.world_size are larger on a node that grew it). --recovery step's workers count their
  // slots from launch_world_size.
  int formed_nodes = 0;
  int launch_world_size = 0;
};

// A node the watcher found dead or gone while its round ran (--recovery step).
struct LostNode {
  int node_rank = 0;
  int first_rank = 0;  // its workers' global ranks: first_rank .. first_rank + num_ranks - 1
  int num_ranks = 0;
  std::string why;
};
// Returns true when the survivors go on without the node (the round then does not end);
// called on the watcher's thread.
using LostNodeHandler = std::function<bool(const LostNode&)>;

class Membership {
 public:
  virtual ~Membership() = default;

  // --recovery step: rounds watched from now on hand a lost node (missed heartbeats, or left)
  // to `handler` first, while the round keeps its minimum of nodes; when it takes the loss the
  // round goes on without that node. Default: not supported (every loss ends the round).
  virtual void set_lost_node_handler(LostNodeHandler handler) { (void)handler; }

  // Joins the next round. Throws ddp::TimeoutError (with the diagnosis) or ddp::Error when
  // the run was shut down or the store is unreachable.
  virtual MembershipRound next_round() = 0;
  // Starts watching the current round; the fd turns readable when it must end. Valid until
  // stop_watching().
  virtual int start_watching() = 0;
  // Stops watching; the reason the round ended, if it did.
  virtual std::optional<std::string> stop_watching() = 0;
  // This node's workers failed: every node leaves the round. Returns the reason the round ended
  // with: the first given by any node ("" when unknown, e.g. the store was lost). Another node's
  // means its failure came first and this node's is likely a consequence (its workers lost
  // their peers). Not while watching.
  virtual std::string end_round(const std::string& reason) = 0;
  // While watching: ends the round with `reason` through the watcher (the first reason still
  // wins; stop_watching() returns the round's). Returns whether it was handed over. Never
  // throws. Default: false.
  virtual bool end_round_while_watching(const std::string& /*reason*/) { return false; }
  // This node's workers succeeded. The node hosting the store waits here until every peer is
  // done (or gone), so the store outlives its users.
  virtual void finished() = 0;
  // This node leaves for good (interrupted).
  virtual void leave(const std::string& reason) = 0;
  // This node gives up (restarts exhausted): the whole run ends on every node. The node hosting
  // the store waits here, as in finished(), until every peer is done (or gone): a peer that has
  // not yet read the reason when the store goes away would take the store for lost, move to a
  // standby store and wait there for nodes that never come.
  virtual void shut_down(const std::string& reason) = 0;
  // After a round ended: if another node shut the run down, marks this node done with it and,
  // hosting the store, waits as finished() does (the other nodes must read the reason before
  // the store goes). Never throws. Default: nothing.
  virtual void finish_if_shut_down() {}

  // After an attempt of round `generation` failed or was stopped: publishes this node's hang
  // report records (`mine`, encode_node_records in hang_report.hpp) and returns every node's
  // that arrived within `limit` (this node's included; "" for the others that did not). Never
  // throws: a store error leaves only this node's records. Default: this node's alone.
  // A new connection to the job's store (authenticated like the agent's), for side requests
  // such as `ddprun stacks` from other nodes; nullptr when there is none. Throws ddp::Error
  // when the store cannot be reached.
  // nullptr too when the store is not authenticated (no token): side requests make every node
  // ptrace its workers, so they are not served to whoever reaches the store's port.
  virtual std::shared_ptr<Store> connect_side_store() { return nullptr; }
  // Why connect_side_store() gives none in a multi-node job, for `ddprun stacks` to print
  // ("" when it gives one, or when there are no other nodes to reach).
  virtual std::string why_no_side_store() const { return ""; }

  virtual std::vector<std::string> exchange_hang_records(int generation, const std::string& mine,
                                                         std::chrono::milliseconds limit) {
    (void)generation;
    (void)limit;
    return {mine};
  }
};

}  // namespace ddp::launcher
