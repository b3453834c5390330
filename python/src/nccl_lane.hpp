#pragma once
// NcclLane: where a `ddp`-backend group runs the collectives of its CUDA tensors
// (docs/python.md, "CUDA tensors"). Where this build has ddp's nccl backend they run on an NCCL
// communicator of the tensors' device, in device memory: no host copies. They are staged
// through the host group instead (the CPU path, as gloo does) when
// - DDP_CUDA_COLLECTIVES=host, or the build has no nccl backend (no lane at all);
// - ranks of the group share a GPU, which NCCL refuses: ddp's nccl backend finds it when the
//   communicator is made and fails every rank alike (SharedGpuError), so every rank falls back
//   together (under step recovery for that generation: the next one's members check again,
//   a replacement among them); said once on stderr;
// - the process is a replacement that has not claimed its slot back yet (--recovery step's
//   defer_return: its group is one of its own until then).
//
// The communicator is made at the group's first operation on CUDA tensors (a collective: every
// rank issues it), on their device; a group's CUDA tensors live on one device.
//
// Under ddprun --recovery step the lane is a RecoverableSubgroup of the job's RecoverableGroup:
// the whole job for the default group, a new_group's ranks for a new_group. ddprun's notice
// aborts its communicator (ddp's nccl backend makes non-blocking ones, so the abort returns at
// once) and the first CUDA operation after the default group re-formed makes a new communicator
// in the new generation, under that generation's store prefix, where a replacement meets the
// survivors.
//
// Thread-safety: any thread that issues the group's operations (the training thread, the
// completer's running a future's callback); issue() serializes the stream setting with the
// operation it orders.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recoverable_group.hpp"
#include "ddp/comm/recoverable_subgroup.hpp"
#include "ddp/store/store.hpp"

namespace ddp::python {

// Whether this process runs CUDA tensors on NCCL lanes: DDP_CUDA_COLLECTIVES is "nccl" (the
// default where the build has ddp's nccl backend) or "host". UsageError naming the choices for
// any other value, and for "nccl" in a build without the backend.
bool nccl_lanes_enabled();

class NcclLane {
 public:
  // A plain group's lane: its ranks meet in `store` (the group's own) under "cuda/".
  NcclLane(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds timeout,
           std::string group_name);
  // A lane under step recovery, following `job`'s generations. `subgroup`: the new_group's name,
  // rank and size, or whole_job for the default group; its backend and device are set here.
  NcclLane(std::shared_ptr<RecoverableGroup> job, RecoverableSubgroupOptions subgroup);
  ~NcclLane();
  NcclLane(const NcclLane&) = delete;
  NcclLane& operator=(const NcclLane&) = delete;

  // The NCCL group for CUDA device `device`, made at the first call (collective); under step
  // recovery made again at the first call of each generation (PeerLostError while the job's
  // group is stale). Null when this group's CUDA tensors are staged through the host (above).
  // UsageError for a device other than the first call's. `before_reform`: run before a new
  // generation's communicator replaces the old one (the caller lets its operations on the old
  // one end).
  std::shared_ptr<NcclProcessGroup> group(int device, const std::function<void()>& before_reform);

  // "nccl" once a communicator was made, "host" when the group's CUDA tensors are staged through
  // the host for good (ranks share a GPU), "undecided" before the first CUDA operation.
  std::string path() const;

  // Runs `op` on `nccl` (a group() result) after making its collectives order after the work
  // queued on `stream` (the caller's current CUDA stream, a cudaStream_t), atomically with
  // respect to other issue() calls of this lane. The Work's wait() makes that same stream wait
  // for the collective (whatever stream issued on the lane since).
  WorkPtr issue(const std::shared_ptr<NcclProcessGroup>& nccl, void* stream,
                const std::function<WorkPtr(ProcessGroup&)>& op);

  // Keeps `buffers` (whatever references the device memory an operation's collectives read
  // and write) until each of `works` (issue() results) completed on the device. NCCL uses that
  // memory on its own stream, which the caching allocator knows nothing of: a tensor allocated
  // on one stream and waited for on another could otherwise be freed after wait() and reused
  // on its allocation stream while the collective still writes it (torch's nccl records the
  // memory on its stream for this). Released at a later call once complete, in issue order.
  void hold_until_complete(std::vector<WorkPtr> works, std::shared_ptr<const void> buffers);

 private:
  ProcessGroupPtr make_group(int device);
  // Whether the group's CUDA tensors go through the host now (state_mutex_ held).
  bool staging() const;
  // Marks the lane as staging after `error` (ranks share a GPU): for good on a plain lane, for
  // the current generation under step recovery; prints why once. With state_mutex_ held.
  void fall_back(const SharedGpuError& error);

  std::string name_;
  // A plain group's lane.
  std::shared_ptr<Store> store_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_{0};
  ProcessGroupPtr plain_;
  // Under step recovery: made at the first group() call, when the device is known.
  std::shared_ptr<RecoverableGroup> job_;
  RecoverableSubgroupOptions subgroup_options_;
  std::unique_ptr<RecoverableSubgroup> subgroup_;

  // Guards the members above and below but issue_mutex_; held while a plain lane's
  // communicator is made (group() may be called from the training and the completer thread).
  mutable std::mutex state_mutex_;
  std::optional<int> device_;
  // The generation (0 for a plain lane) in which the group's ranks were found to share a GPU:
  // its CUDA tensors go through the host; -1 while not.
  int64_t staging_generation_ = -1;
  // DDP_NCCL_BLOCKING_WAIT, which ddp's nccl backend reads for the lane's groups
  // (NcclOptions::from_env; not called here: this file builds without the backend too).
  const bool blocking_wait_;
  // hold_until_complete's entries, oldest first.
  struct Held {
    std::vector<WorkPtr> works;
    std::shared_ptr<const void> buffers;
  };
  std::mutex held_mutex_;
  std::deque<Held> held_;

  // Serializes issue() and the waits of its Works (LaneWork); shared with the Works, which may
  // outlive the lane.
  std::shared_ptr<std::mutex> issue_mutex_ = std::make_shared<std::mutex>();
};

}  // namespace ddp::python
