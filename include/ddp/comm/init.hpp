#pragma once
// Creating process groups (torch.distributed.init_process_group / new_group).
//
//   ddp::InitOptions opts;            // backend "cpu", rank/world from the environment
//   auto pg = ddp::init_process_group(opts);
//   pg->all_reduce(buf, n, ddp::DataType::kFloat32, ddp::ReduceOp::kSum)->wait(pg->timeout());
//
// Ranks that are threads of one process pass the same store (e.g. a ddp::HashStore) and an
// explicit rank/world_size each. There is no process-wide state: any number of groups may
// live in one process.
//
// Backends: "cpu" (shared memory within a host, Gloo among one leader per host), "gloo" (Gloo
// over TCP only), "mpi" and "nccl" when built (see mpi_process_group.hpp,
// nccl_process_group.hpp).
//
// Environment read here: DDP_DEBUG_COLLECTIVES=1 (compare every collective's fingerprint across
// ranks before running it), DDP_HOST_ID (which ranks share a host; default hostname + boot
// id), DDP_GLOO_IFNAME (network interface for Gloo), DDP_CPU_INLINE_BYTES (operations up to this
// size run in the calling thread, default 65536), DDP_SHM_SLOT_BYTES, DDP_SHM_SPIN_US.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/store/store.hpp"

namespace ddp {

struct InitOptions {
  std::string backend = "cpu";
  std::chrono::milliseconds timeout = ProcessGroup::kDefaultTimeout;
  // Unset: read from the environment (world_info.hpp: torchrun, SLURM, OpenMPI variables).
  std::optional<int> rank;
  std::optional<int> world_size;
  // Null: a TcpStore at MASTER_ADDR:MASTER_PORT, hosted by rank 0 (env:// in PyTorch).
  std::shared_ptr<Store> store;
  // Store key namespace; groups initialised on one store with the same name are numbered in
  // call order, so calling init twice on one store yields two independent groups.
  std::string group_name = "default_pg";
  // Overrides DDP_HOST_ID: ranks with equal host ids share memory (tests simulate hosts).
  std::optional<std::string> host_id;
  // Overrides DDP_DEBUG_COLLECTIVES.
  std::optional<bool> debug_collectives;
  // nccl only: the CUDA device; unset uses LOCAL_RANK.
  std::optional<int> device;
  // nccl only: NcclOptions::interrupt (ends the group's making early, e.g. at a recovery
  // notice).
  std::function<void()> interrupt;
};

// Creates the group every rank of the job joins. Blocks until all world_size ranks joined or
// throws TimeoutError naming how many did ("1 of 2 ranks joined"). Bad input (unknown backend,
// rank out of range, missing environment) is a UsageError saying what to set.
ProcessGroupPtr init_process_group(const InitOptions& options);

// Creates a sub-group of `ranks` (ranks of `parent`, in the order given: ranks[i] becomes rank
// i of the sub-group). Every rank of parent must call it, in the same order relative to its
// other new_group calls; ranks outside the sub-group get nullptr. Same backend as the parent.
ProcessGroupPtr new_group(const ProcessGroupPtr& parent, const std::vector<int>& ranks);

// The backends this build supports ("cpu", "gloo", and "mpi"/"nccl" when built).
std::vector<std::string> available_backends();

}  // namespace ddp
