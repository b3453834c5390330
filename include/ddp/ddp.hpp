#pragma once
// ddp's training API in one header: what a C++ trainer includes.
//
//   #include <ddp/ddp.hpp>
//
//   auto pg = ddp::init_process_group(ddp::InitOptions{});  // under ddprun, mpirun or srun
//   ddp::DistributedDataParallel model(net, pg);             // broadcast, bucketed all-reduce
//   ddp::DistributedSampler sampler(dataset.size(), ddp::DistributedSamplerOptions(pg->size(),
//                                                                                  pg->rank()));
//   ddp::SnapshotManager snapshots(ddp::SnapshotOptions("snapshot.pt"));
//   auto stop = std::make_shared<ddp::StopRequest>(ddp::StopRequestOptions().signals({SIGUSR1}));
//   // DistributedDataParallelOptions().stop_request(stop); after a step: if (stop->agreed()) {
//   //   checkpoint; return ddp::kRequeueExitStatus; }   (preemption, stop_request.hpp)
//
// examples/toy/main.cpp and examples/mnist/main.cpp are complete trainers.
// CMake: find_package(ddp CONFIG REQUIRED) and target_link_libraries(trainer PRIVATE ddp::ddp).
// Layers without LibTorch (store, comm, launcher) have their own headers under ddp/ and their
// own targets (ddp::store, ddp::comm, ...); this header needs LibTorch.

#include "ddp/version.hpp"

// Process groups and their collectives.
#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/comm/recoverable_group.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/comm/world_info.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/exit_status.hpp"

// DistributedDataParallel, its options and communication hooks, Join for uneven inputs, the
// device of this rank.
#include "ddp/torch/ddp/comm_hooks.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/join.hpp"
#include "ddp/torch/ddp/local_device.hpp"
#include "ddp/torch/ddp/options.hpp"
#include "ddp/torch/ddp/powersgd_hook.hpp"
#include "ddp/torch/ddp/stop_request.hpp"

// SyncBatchNorm{1,2,3}d and convert_sync_batchnorm.
#include "ddp/torch/nn/sync_batch_norm.hpp"

// Data: the sampler, datasets and the prefetching loader.
#include "ddp/torch/data/distributed_sampler.hpp"
#include "ddp/torch/data/idx_dataset.hpp"
#include "ddp/torch/data/prefetch_loader.hpp"
#include "ddp/torch/data/step_batches.hpp"
#include "ddp/torch/data/synthetic_dataset.hpp"
#include "ddp/torch/data/tensor_dataset.hpp"

// Optimizers (FusedAdam, ZeroRedundancyOptimizer), checkpoints (per step, async, DCP layout),
// snapshots, progress.
#include "ddp/torch/checkpoint/checkpoint.hpp"
#include "ddp/torch/optim/fused_adam.hpp"
#include "ddp/torch/optim/optimizer_state_bytes.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/torch/progress/progress.hpp"
#include "ddp/torch/recovery/peer_heal.hpp"
#include "ddp/torch/recovery/step_manager.hpp"
#include "ddp/torch/snapshot/snapshot.hpp"
#include "ddp/util/malloc_tuning.hpp"
