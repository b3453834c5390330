#pragma once
// ProcessGroupDDP: the "ddp" torch.distributed backend. A c10d process group (torch 1.x:
// c10d::ProcessGroup; torch 2.x: c10d::Backend) whose operations run on ddp's `cpu` backend
// (shared memory within a host, Gloo between hosts), rendezvousing through the store PyTorch
// hands it.
//
// Tensors: dense CPU or CUDA tensors, one per call (no *_multigpu forms). Contiguous tensors
// are passed by data pointer; others are staged through a contiguous copy. CUDA tensors run on
// the group's NCCL lane where the build has ddp's nccl backend (all_reduce but its bitwise
// operators, all_reduce_coalesced, broadcast, reduce, all_gather of equal sizes,
// all_gather_into_tensor, reduce_scatter and reduce_scatter_tensor: nccl_lane.hpp), and
// through host memory otherwise (tensor_args.hpp). Reductions take
// float32/64, float16, bfloat16, int32/64, uint8 (and bool for MIN/MAX); operations that only
// move data take any dtype. ReduceOp BAND/BOR/BXOR (integer and bool tensors) run as an
// all_gather plus a local reduction in all_reduce; PREMUL_SUM is NCCL's.
//
// Errors are ddp's exceptions (RuntimeError in Python): misuse is reported when the call is
// issued; a collective that fails or times out fails its Work, and the group then refuses
// later operations with the original error (the peers' state is unknown).

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recoverable_group.hpp"
#include "ddp/comm/recoverable_subgroup.hpp"
#include "nccl_lane.hpp"
#include "op_route.hpp"
#include "work_ddp.hpp"

namespace ddp::python {

#if TORCH_VERSION_MAJOR >= 2
using ProcessGroupBase = c10d::Backend;
#else
using ProcessGroupBase = c10d::ProcessGroup;
#endif

class ProcessGroupDDP : public ProcessGroupBase {
 public:
  // Joins the group: blocks until all `size` ranks called it with the same store (or throws
  // TimeoutError naming the ranks that never joined). `group_name` appears in messages.
  ProcessGroupDDP(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, const std::string& group_name);
  ~ProcessGroupDDP() override;

  // torch.distributed.destroy_process_group() calls it: the group's threads stop (its
  // operations still queued finish first, each bounded by the timeout) and its store is no
  // longer polled, so a peer that exits next, rank 0 with the store among them, is not seen
  // as a failure. Idempotent; a later operation on this group is a RuntimeError.
  void shutdown() override;

  const std::string getBackendName() const override { return "ddp"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // In-place recovery (docs/recovery.md, "Python"). Under `ddprun --recovery step`
  // (DDP_RECOVERY=step) the default group ("default_pg") runs on a ddp::RecoverableGroup:
  // the collectives of the current membership generation, which ddprun's notice of a lost
  // rank aborts (PeerLostError) and reform() replaces in this same object, so PyTorch's
  // DistributedDataParallel keeps its process group. A new_group() of such a job follows it
  // (ddp::RecoverableSubgroup): its collectives end at the notice too, and its first operation
  // after the default group re-formed forms it again in the new generation; recoverable() is
  // false for it. Groups without step recovery are plain: the calls below are UsageErrors.
  bool recoverable() const { return recoverable_ != nullptr; }
  int64_t generation() const;
  // A newer generation was announced (one atomic load).
  bool stale() const;
  // The rank whose loss opened the newest generation, -1 before any.
  int lost_rank() const;
  // Waits (bounded by the group timeout) until the operations handed to this group finished
  // (they fail at once once aborted), then joins the newest generation (collective over the
  // live ranks and the restarted one). The training thread's call, with no operation of its
  // own in flight.
  void reform();
  // --recovery shrink: a replacement's default group is one of its own (rank 0 of 1) until
  // this call claims its slot back and joins the others (RecoverableGroupOptions::
  // defer_return), so they train on while it builds its model; ddp.StepManager calls it.
  // Nothing when this process is no returning replacement.
  void claim_return();
  // This rank and the group's size in the current generation. c10d keeps the launch's rank and
  // size for a group's lifetime (getRank(), getSize(), hence torch.distributed.get_rank() and
  // get_world_size()); a node lost under --recovery step renumbers the survivors, and the
  // operations then take ranks (roots, sources, destinations) and list lengths in these terms.
  // Equal to getRank() and getSize() in every other group.
  int group_rank() const;
  int group_size() const;
  // Where this group runs its CUDA tensors' collectives: NcclLane::path(), "host" without a lane.
  std::string cuda_collectives() const { return lane_ ? lane_->path() : "host"; }

  // The number of collectives this group issued (sends and receives not counted), equal on
  // every rank of a group used correctly. torch's ProcessGroupWrapper, which wraps every group
  // under TORCH_DISTRIBUTED_DEBUG=DETAIL, calls setSequenceNumberForGroup() when it is made and
  // compares getSequenceNumberForGroup() across ranks before each collective. Every rank starts
  // at 0 (making a group is collective), so setting it is a no-op.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

 private:
  // Wraps ddp Works into the c10d Work returned to torch; keeps it (and so the buffers its
  // epilogue holds) alive while the operation is in flight, even if the caller drops it.
  // `start` hands the operation to ddp, now or, when futures' callbacks may still issue
  // operations before it, later on the completer (see "Issue order" in work_ddp.hpp).
  // `counted`: whether it counts in getSequenceNumberForGroup (a collective of the caller's).
  // `stream`: an operation on the NCCL lane's caller stream (WorkDDP::set_stream).
  // `route`: where the operation runs (a collective of the caller's); the default is the host
  // group as is.
  c10::intrusive_ptr<WorkDDP> make_work(c10d::OpType type, WorkDDP::Start start,
                                        std::function<void()> epilogue,
                                        std::vector<at::Tensor> outputs, bool counted = true,
                                        const OpRoute& route = {});
  c10::intrusive_ptr<WorkDDP> make_work(const OpRoute& route, c10d::OpType type,
                                        WorkDDP::Start start, std::function<void()> epilogue,
                                        std::vector<at::Tensor> outputs) {
    return make_work(type, std::move(start), std::move(epilogue), std::move(outputs), true, route);
  }
  // Where an operation on `tensors` runs (op_route.hpp): the NCCL lane when they are all CUDA
  // tensors of one device, `lane` allows it and the group has a lane (its communicator is made
  // at the first such call, a collective); else the host group, with overlapped staging when
  // some are CUDA tensors of one device; else the host group as is (CPU tensors, CUDA tensors
  // of several devices, DDP_HOST_STAGING=sync).
  OpRoute route(const std::vector<at::Tensor>& tensors, bool lane = true);
  // Hands `op` to the route's group: the lane's (ordered after the work on the route's stream)
  // or live() (after the route's copies to the host ended). For the operations' Start
  // functions, which may run on the completer's thread.
  WorkPtr run(const OpRoute& route, const std::function<WorkPtr(ProcessGroup&)>& op) const;
  c10::intrusive_ptr<c10d::Work> all_reduce_tensor(const at::Tensor& t, const c10d::ReduceOp& op);
  c10::intrusive_ptr<c10d::Work> bitwise_all_reduce(const at::Tensor& t, const c10d::ReduceOp& op);
  // Blocks of possibly different sizes to and from every rank, as sends and receives.
  // True when every rank's all_to_all moves blocks of `block_elements` elements (this rank
  // passes -1 when its own blocks are uneven): the precondition of the single all_to_all
  // collective. Each rank sees only its own split sizes, so they agree through one small
  // all-reduce (MAX of the block size and of its negation); deciding alone would let ranks
  // run different algorithms and wait for each other until the group timeout.
  bool all_ranks_even(int64_t block_elements);
  // Rank 0 waits up to `limit` for every rank's key in the store, then releases them; TimeoutError
  // naming the missing ranks (all of them with `wait_all_ranks`). `op` names the caller and
  // `stated` the limit it was given (more than `limit` when part of it was spent before).
  void monitored_barrier(std::chrono::milliseconds limit, bool wait_all_ranks, const char* op,
                         std::chrono::milliseconds stated);
  std::vector<WorkPtr> exchange(const std::vector<at::Tensor>& send_blocks,
                                const std::vector<at::Tensor>& recv_blocks);
  void check_root(int64_t root, const char* op) const;
  // The ddp group, or a UsageError once shutdown() ran. A new_group() under step recovery
  // first follows the default group into its current generation (follow_job()).
  ProcessGroup* live() const;
  // Waits (bounded by the group timeout) until the operations handed to this group ended.
  void drain_in_flight() const;
  // drain_in_flight, but not on the completer's thread: before a re-form replaces a group.
  void drain_unless_on_completer() const;
  void follow_job() const;
  RecoverableGroup& recoverable_group() const;

  c10::intrusive_ptr<c10d::Store> store_;  // this group's (torch prefixes its keys per group)
  mutable std::mutex pg_mutex_;            // guards pg_ (reform() replaces it)
  mutable ProcessGroupPtr pg_;             // mutable: live() of a new_group() re-points it
  std::shared_ptr<RecoverableGroup> recoverable_;  // step recovery's default group, else null
  std::unique_ptr<RecoverableSubgroup> subgroup_;  // a new_group() under step recovery, else null
  std::shared_ptr<RecoverableGroup> job_;          // subgroup_'s parent, else null
  std::unique_ptr<NcclLane> lane_;  // the group's CUDA tensors on NCCL; null: through the host
  std::shared_ptr<Completer> completer_;
  std::chrono::milliseconds timeout_;
  // Mutable: live() (const) may drain them when a new_group() follows the job (follow_job).
  mutable std::mutex in_flight_mutex_;
  mutable std::deque<c10::intrusive_ptr<WorkDDP>> in_flight_;
  int64_t exchange_seq_ = 0;      // numbers the send/recv exchanges of uneven all_to_all
  int64_t monitored_seq_ = 0;     // numbers the monitored barriers (their tags)
  std::atomic<uint64_t> seq_{0};  // collectives issued (getSequenceNumberForGroup)
};

}  // namespace ddp::python
