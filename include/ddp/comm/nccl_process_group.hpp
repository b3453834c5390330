#pragma once
// The NCCL backend: collectives on CUDA device memory (torch.distributed's "nccl" backend).
//
// Built when CMake finds the CUDA toolkit and NCCL (option DDP_WITH_NCCL; see docs/nccl.md);
// this header needs no CUDA headers, so code that only creates groups compiles without them.
//
// Ordering, per group: collectives run on a dedicated communication stream. Each collective
// first makes that stream wait for everything queued so far on the group's compute stream
// (an event recorded there), and Work::wait() makes the compute stream wait for the
// collective's completion event, so the host never blocks (no cudaDeviceSynchronize) unless
// blocking_wait is set. barrier() always blocks the host.
//
// Failure handling: a watchdog thread polls ncclCommGetAsyncError and every pending
// collective's completion event; when NCCL reports an error, or a collective is still
// incomplete after the group's timeout, it aborts the communicator (ncclCommAbort) and every
// pending and later Work fails with CollectiveError naming the rank, the collective, its
// sequence number and the elapsed time.
//
// Buffers must be device memory of the group's device (or managed memory). NCCL does not
// transmit tags: send/recv pairs between two ranks match in issue order, whatever the tag.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/util/error.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ddp {

class Store;

struct NcclOptions {
  // Limit after which the watchdog aborts an incomplete collective (and the limit of init).
  std::chrono::milliseconds timeout = ProcessGroup::kDefaultTimeout;
  // The stream collectives order against; nullptr is the legacy default stream.
  CUstream_st* compute_stream = nullptr;
  // Whether Work::wait blocks the host until the collective finished (TimeoutError after its
  // timeout) instead of only making the compute stream wait. Env: DDP_NCCL_BLOCKING_WAIT.
  bool blocking_wait = false;
  // How often the watchdog polls. Env: DDP_NCCL_WATCHDOG_INTERVAL_MS.
  std::chrono::milliseconds watchdog_interval{100};
  // What the members agree on to find each other's NCCL unique id in the store. Groups
  // created concurrently on one store must differ in name or member_ranks (two disjoint
  // groups of one job: pass each one's member_ranks); groups of equal identity pair up in
  // creation order, so every member must create them in the same order.
  std::string group_name = "default_pg";
  // The global ranks of the group's members, in group-rank order (empty: not given). When
  // given, its size must equal the group's.
  std::vector<int> member_ranks;
  // Which host this rank runs on (ddp::init_process_group passes the cpu backend's host id):
  // with it, the members check that no two of them use one GPU (SharedGpuError). Empty: no
  // check (NCCL itself then fails such a group, less clearly).
  std::string host_id;
  // Called every few milliseconds while the group is being made (the members' waits in the
  // store, NCCL's own init): an exception it throws abandons the group (a communicator already
  // started is aborted) and reaches the caller. In-place recovery passes one that throws once
  // a newer membership generation is announced, so a member lost while a generation's
  // communicator forms costs the others a watch interval, not the timeout. Empty: none.
  std::function<void()> interrupt;

  // Defaults with `timeout`, overridden by the DDP_NCCL_* variables above.
  static NcclOptions from_env(std::chrono::milliseconds timeout);
};

// Two members of a new NCCL group use one GPU (NcclOptions::host_id); thrown on every member
// alike when the group is made, so callers can agree to fall back (the `ddp` Python backend
// stages CUDA tensors through the host then).
class SharedGpuError : public UsageError {
 public:
  using UsageError::UsageError;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  // Collectives issued afterwards order after the work queued on `stream`, and Work::wait of
  // any Work makes `stream` wait. Per group; set it before issuing from a new stream.
  virtual void set_compute_stream(CUstream_st* stream) = 0;
  virtual CUstream_st* compute_stream() const = 0;
  // The stream NCCL kernels run on (for profiling or explicit ordering).
  virtual CUstream_st* communication_stream() const = 0;
  // The CUDA device ordinal the group's buffers live on.
  virtual int device() const = 0;
  // Aborts the communicator: pending and later operations fail with CollectiveError(reason).
  virtual void abort(const std::string& reason) = 0;

 protected:
  using ProcessGroup::ProcessGroup;
};

// Creates rank `rank` of a `size`-rank NCCL group on CUDA device `device`; every rank calls
// it with the same store. Rank 0 publishes the ncclUniqueId in the store, the others read
// it. Blocks until all ranks joined, or throws TimeoutError after `timeout`. Options come
// from NcclOptions::from_env(timeout). The result is an NcclProcessGroup.
ProcessGroupPtr make_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                        int device, std::chrono::milliseconds timeout);

ProcessGroupPtr make_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                        int device, const NcclOptions& options);

// The PCI bus id of CUDA device `device` of this process ("0000:3B:00.0"): one GPU has the same
// id in every process of its host, whatever CUDA_VISIBLE_DEVICES each was given. Throws
// CollectiveError when CUDA cannot say (no such device).
std::string cuda_pci_bus_id(int device);

}  // namespace ddp
