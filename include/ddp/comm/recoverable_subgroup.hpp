#pragma once
// RecoverableSubgroup: a group of some ranks of a job under in-place recovery (new_group under
// ddprun --recovery step) that follows the membership generations of the job's
// RecoverableGroup, its parent (docs/recovery.md, "Groups of some ranks").
//
// - When ddprun announces a lost rank, the subgroup's collective in flight ends within about
//   the parent's watch interval with the parent's PeerLostError (a thread of the subgroup
//   waits on the parent's announcements and aborts the group), whether or not the lost rank
//   is a member: the caller drops its step and re-forms, as for the parent.
// - The group is formed at the first group() call, not when the object is made (as NCCL forms
//   its communicators), and again at the first call after the parent re-formed: a collective
//   over the subgroup's members, under its own store prefix ("<name>/g<generation>" on the
//   parent's store). group() refuses (PeerLostError) while the parent is stale. A replacement
//   process makes its subgroups again (in the same order as the first incarnation did: torch
//   numbers them by creation) and forms each at its first operation in the generation it
//   joined, where the survivors meet it. Forming at the first operation, not when made, keeps
//   a replacement that makes its groups before the default group healed it (a collective with
//   the survivors) from waiting for survivors that are healing it.
// - A job that lost a node renumbers its survivors: a subgroup's members may be gone, so
//   group() then throws UsageError saying so (make the subgroups again from the survivors).
//   A subgroup of every rank of the job (options.whole_job: the CUDA lane of the `ddp` Python
//   backend's default group) follows it instead: each generation's group has the parent's
//   ranks and size.
//
// Thread-safety: group() may be called from several threads (the `ddp` Python backend issues
// from the training thread and from its completer's, running a future's callback): the calls
// are serialized, so a generation is formed once. generation() from any thread.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recoverable_group.hpp"

namespace ddp {

struct RecoverableSubgroupOptions {
  // Identifies the subgroup in the store and in messages: the same in every member process
  // (e.g. torch's group name, "group_1").
  std::string name;
  int rank = 0;  // this process's rank in the subgroup
  int size = 1;  // the subgroup's size
  std::string backend = "cpu";
  // nccl only: the CUDA device (unset: LOCAL_RANK's).
  std::optional<int> device;
  // Every rank of the job, in the parent's order: `rank` and `size` are ignored, each
  // generation's group takes the parent's rank() and world_size() of that generation, so it
  // follows a lost node too.
  bool whole_job = false;
  // Bounds forming each generation's group and every collective of it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class RecoverableSubgroup {
 public:
  // Forms nothing yet (group() does). `parent` must have a store (ddprun --recovery step).
  RecoverableSubgroup(std::shared_ptr<RecoverableGroup> parent, RecoverableSubgroupOptions options);
  ~RecoverableSubgroup();
  RecoverableSubgroup(const RecoverableSubgroup&) = delete;
  RecoverableSubgroup& operator=(const RecoverableSubgroup&) = delete;

  // The group of the parent's current generation, formed first at the first call and when the
  // parent re-formed since the last call (blocks until every member joined, TimeoutError after
  // options.timeout). PeerLostError while the parent is stale (a loss announced, not
  // re-formed).
  // `before_reform` runs before a re-form replaces the group, outside any lock of this class:
  // the caller lets the operations it handed to the old group end there (they fail at once:
  // aborted).
  ProcessGroupPtr group(const std::function<void()>& before_reform = {});
  // The parent's generation the current group belongs to (-1 before the first group()).
  int64_t generation() const;
  const RecoverableGroup& parent() const { return *parent_; }

 private:
  // Waits until every member arrived at `generation` (PeerLostError as soon as the parent
  // announces a newer one; TimeoutError after options.timeout), then forms its group.
  // `rank` and `size`: this member's place in that generation's group.
  void await_members(int64_t generation, int rank, int size) const;
  ProcessGroupPtr form(int64_t generation) const;
  void abort_on_announcements();

  std::shared_ptr<RecoverableGroup> parent_;
  RecoverableSubgroupOptions options_;
  int parent_world_size_;     // the parent's world size when this subgroup was made
  mutable std::mutex mutex_;  // guards group_, generation_, stopping_
  std::mutex form_mutex_;     // serializes group(): one forming per generation
  std::condition_variable changed_;
  ProcessGroupPtr group_;
  int64_t generation_ = -1;
  bool stopping_ = false;
  std::thread aborter_;
};

}  // namespace ddp
