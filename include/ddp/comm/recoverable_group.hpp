#pragma once
// RecoverableGroup: a process group that outlives a member (in-place recovery,
// docs/recovery.md). It holds the group of the current membership generation and a watcher
// thread that learns of every generation ddprun --recovery step publishes in the job's store
// (recovery_notice.hpp): on a connection of its own it waits in the store for the next record
// (one round trip after ddprun claims it), on a store it shares it reads the counter every
// watch_interval.
//
// When a rank is lost the watcher
// - marks the group stale (stale(): an atomic load, no store round trip, cheap enough for
//   every training step), and
// - calls notify_peer_lost on it, so the collective in flight ends within milliseconds of
//   ddprun's record (on a shared store: within about watch_interval) with a PeerLostError
//   naming the lost rank and the generation, instead of waiting out the group timeout.
// reform() then builds the group of the newest generation in the same process, under its own
// store key prefix ("<group_name>/g<generation>"), which the restarted rank joins too (it reads
// the generation when it starts).
//
// Membership: a lost rank that ddprun restarts in place keeps its rank and the world size. A
// node lost in a multi-node job takes its ranks out of the job: the survivors re-form with
// fewer ranks, renumbered in the order of their slots (the RANK each was launched with, slot()),
// so rank() and world_size() may change at reform(). recovery_notice.hpp has the records.
//
// Backends: cpu polls the abort in its shared-memory waits and its leaders' ring; a Gloo call
// (the gloo backend, a multi-host cpu group's other cross-host paths) is ended at the notice by
// shutting its connections' sockets down (src/comm/gloo/connection_sockets.hpp), or earlier by
// the dead peer's sockets closing (NetworkError, before the notice).
// nccl: notify_peer_lost aborts its non-blocking communicator (ncclCommAbort returns at once)
// and fails the pending works with the PeerLostError; reform() creates a new communicator, its
// unique id exchanged under the new generation's prefix. Compiled everywhere; it runs only on a
// machine with a GPU (tests/comm_nccl, skipped elsewhere), multi-GPU on none of this project's.
//
// Thread-safety: group(), reform() and generation() are for the training thread; stale() and
// lost_rank() may be called from any thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wait_interrupter.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

// This rank's slot is no longer a member of the job: ddprun declared its node lost (it missed
// its heartbeats) while this process still ran. It has no place in any later generation.
class RemovedFromJobError : public Error {
 public:
  using Error::Error;
};

// A generation this rank forms cannot form: a member it waits for already finished (closed
// its group without an error, after its last step: recovery_notice::publish_finished) and will
// never join, e.g. a replacement started after the job's last step while its peers were exiting.
// Thrown as soon as the record is seen, instead of a TimeoutError after the group timeout.
class PeersFinishedError : public Error {
 public:
  PeersFinishedError(const std::string& what, std::vector<int> finished_slots)
      : Error(what), finished_slots_(std::move(finished_slots)) {}
  // The slots (launch ranks) that finished, ascending.
  const std::vector<int>& finished_slots() const { return finished_slots_; }

 private:
  std::vector<int> finished_slots_;
};

struct RecoverableGroupOptions {
  std::string backend = "cpu";  // cpu (one host), gloo, or nccl (the device of LOCAL_RANK)
  // Bounds forming a generation (every rank, the restarted one included, must join) and every
  // collective of the groups.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long the watcher's wait for the next generation lasts (then it waits again), and on a
  // store shared with the training thread how often it reads the generation counter instead.
  std::chrono::milliseconds watch_interval{100};
  // Unset: from the environment (RANK, WORLD_SIZE as ddprun sets them).
  std::optional<int> rank;
  std::optional<int> world_size;
  // The world size the job was launched with, the same in every process (the slots every
  // process counts from: recovery_notice::members). A process of a node that grew the job
  // past its launch size runs in a slot at or above it, with a larger world_size. Unset:
  // $DDP_RECOVERY_LAUNCH_WORLD_SIZE (ddprun --recovery step sets it), else world_size.
  std::optional<int> launch_world_size;
  // Null: TcpStore clients of MASTER_ADDR:MASTER_PORT. Under ddprun --recovery step
  // (DDP_RECOVERY=step) ddprun hosts that store, so it survives any rank; otherwise rank 0
  // hosts it, as init_process_group does, and no generation ever changes.
  std::shared_ptr<Store> store;
  // The watcher's own connection (a blocking call on `store` must not delay it). Null: a second
  // client from the environment, or `store` itself when `store` was given.
  std::shared_ptr<Store> watch_store;
  std::string group_name = "recovery";
  // The caller forms each generation's group itself (ddp.StepManager on PyTorch's gloo and
  // nccl, python/ddp/torch_generations.py): group() stays null and no process group of ddp's is
  // made. Everything else is the same: the watcher and stale(), the membership of every
  // generation (rank(), world_size()) and reform()'s wait until every member arrived at it.
  bool membership_only = false;
  // --recovery shrink: a replacement (a process restarted in a slot the others went on without,
  // recovery_notice::awaits_return) claims the slot back at claim_return(), not in the
  // constructor. Until then group() is a group of this process alone (rank 0 of 1: nothing it
  // runs reaches another process), on which the program builds its model and DDP wrapper while
  // the others train on: they stop for the heal only, not for this process's start (loading its
  // data, building its model). ddp::StepManager sets it and claims in attach().
  bool defer_return = false;
};

class RecoverableGroup {
 public:
  // Joins the current generation; blocks until every rank joined it (TimeoutError after
  // options.timeout, naming how many did, unless a newer generation was announced meanwhile:
  // then it joins that one, as reform() does). PeersFinishedError, within about
  // options.watch_interval, when a rank it waits for already finished (below).
  explicit RecoverableGroup(RecoverableGroupOptions options = {});
  // Destroyed without an exception in flight, the group records in the job's store that this
  // slot finished (recovery_notice::publish_finished), so a rank still waiting for it to form a
  // generation (a replacement started after the job's last step) fails at once with
  // PeersFinishedError instead of waiting out the timeout. Only where generations can change:
  // under ddprun --recovery step, or with options.store given.
  ~RecoverableGroup();
  RecoverableGroup(const RecoverableGroup&) = delete;
  RecoverableGroup& operator=(const RecoverableGroup&) = delete;

  const ProcessGroupPtr& group() const { return group_; }
  // The job's store (null where generations cannot change: no ddprun --recovery step and no
  // options.store).
  const std::shared_ptr<Store>& store() const { return store_; }
  int64_t generation() const { return generation_.load(); }
  // This rank in the current generation's group, and its size (both may change at reform()
  // when a node was lost).
  int rank() const { return rank_.load(std::memory_order_relaxed); }
  int world_size() const { return world_size_.load(std::memory_order_relaxed); }
  // The rank this process was launched with (RANK): its identity across generations.
  int slot() const { return slot_; }
  // The world size the job was launched with (WORLD_SIZE of its first workers): the launch's
  // slots are 0 .. this - 1; a node that grew the job later added slots from this on.
  int launch_world_size() const { return initial_world_size_; }

  // The newest generation the watcher saw announced (generation() until a loss).
  int64_t announced_generation() const { return announced_.load(std::memory_order_acquire); }
  // Whether a newer generation than group()'s was announced. No store round trip.
  bool stale() const { return announced_.load(std::memory_order_acquire) > generation_; }
  // Blocks until the watcher saw a generation newer than `generation` (true) or `timeout`
  // passed (false). For a thread that must act on a loss at once, e.g. abort a group the
  // caller formed itself (membership_only), whose collectives this object cannot end.
  bool wait_announced_after(int64_t generation, std::chrono::milliseconds timeout) const;

  // The rank slot whose loss opened the newest generation seen (nullopt before any loss).
  std::optional<int> lost_rank() const;
  // What opened the newest generation seen, for messages: "rank 2 was lost" or "ranks 2,3 were
  // lost with their node" ("" before any loss).
  std::string loss_description() const;

  // Aborts the current group (if the watcher has not yet), destroys it and joins the newest
  // generation. Collective over the live ranks and the restarted one. Returns the new group
  // (null with membership_only).
  // Throws RemovedFromJobError when this rank's slot left the job (its node was declared lost
  // while this process still ran, e.g. a network split).
  const ProcessGroupPtr& reform();

  // Whether this process is a replacement that has not claimed its slot back yet
  // (options.defer_return): group() is its own, rank() 0 and world_size() 1.
  bool returning() const { return returning_; }
  // A returning replacement claims its slot back ("back:<slot>", recovery_notice.hpp) and joins
  // the generation that opens with every member, as reform() does (the others make room at
  // once: their step in flight is redone with it). Nothing when not returning(). Returns
  // group().
  const ProcessGroupPtr& claim_return();

 private:
  struct Loss {
    std::optional<int> first;  // the first lost slot
    std::string description;   // loss_description()
  };
  void watch_loop();
  // Waits (`lock` held on entry, released on return) at most watch_interval for the record of
  // the generation after the announced one: kSet when it is set, kNotSet when it is not,
  // kMaySet when this store cannot say (one shared with the training thread: the counter tells),
  // kStop when the group is being destroyed.
  enum class NextRecord { kSet, kNotSet, kMaySet, kStop };
  NextRecord await_next_record(std::unique_lock<std::mutex>& lock);
  // Forms `generation`'s group with this slot's place in it (rank_, world_size_ on success).
  ProcessGroupPtr form(int64_t generation);
  // A group of this process alone, for a returning replacement (options.defer_return).
  ProcessGroupPtr form_alone(int64_t generation);
  // Waits until every slot of `slots` (this one included) arrived at `generation`, before the
  // group's own rendezvous: polls every watch_interval, throws PeersFinishedError as soon as a
  // missing slot finished and TimeoutError, naming the missing slots, after options.timeout.
  void await_members(int64_t generation, const std::vector<int>& slots);
  PeersFinishedError finished_error(int64_t generation, const std::vector<int>& finished) const;
  Loss read_loss(Store& store, int64_t generation) const;
  PeerLostError lost_error(int64_t generation, const Loss& loss) const;

  RecoverableGroupOptions options_;
  int slot_ = 0;
  int initial_world_size_ = 1;
  std::atomic<int> rank_{0};
  std::atomic<int> world_size_{1};
  std::shared_ptr<Store> store_;
  std::shared_ptr<Store> watch_store_;
  // From the environment: a new connection per generation (recoverable_group.cpp); else unset.
  std::function<std::shared_ptr<Store>()> connect_;
  bool records_finish_ = false;  // the destructor publishes this slot's finish (see there)
  // returning() and generation() are read by other threads too (the `ddp` Python backend's
  // lanes, on its completer thread); written by the training thread only. generation_ is stored
  // after rank_ and world_size_, so a reader that sees a generation sees its membership.
  std::atomic<bool> returning_{false};  // returning(): claim_return() not called yet
  ProcessGroupPtr group_;
  std::atomic<int64_t> generation_{0};
  std::optional<int64_t> first_generation_;  // the first one this process formed
  std::atomic<int64_t> announced_{0};

  mutable std::mutex mutex_;  // guards lost_, current_ (the watcher's view of group_)
  Loss lost_;
  ProcessGroupPtr current_;
  std::condition_variable cv_;
  mutable std::condition_variable announced_cv_;  // notified when announced_ grows
  bool stop_ = false;
  WaitInterrupter stop_interrupter_;  // ends the watcher's wait in the store at destruction
  bool store_unreachable_ = false;    // the watcher's last read failed (warned once)
  std::thread watcher_;
};

}  // namespace ddp
