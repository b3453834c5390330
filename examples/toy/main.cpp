// The tutorials' toy job (multigpu_torchrun.py) in C++: Linear(20, 1) trained with SGD
// (lr 1e-3) on 2048 seeded random samples, a DistributedSampler per rank, DDP over the comm
// layer, and fault tolerance through snapshots: rank 0 saves every SAVE_EVERY epochs, and a
// restarted job resumes from the newest valid snapshot.
//
//   ddprun --standalone --nproc-per-node 2 --max-restarts 3 build/examples/toy/toy 50 10
//
// In-place recovery instead of snapshots (docs/recovery.md): a worker that dies is restarted
// alone and healed from a live peer; the others drop the step and redo it:
//   ddprun --standalone --nproc-per-node 2 --recovery step --max-restarts 3
//       build/examples/toy/toy 50 10 --recovery step          (one command line)
//
// Output follows the tutorial:
//   [RANK0] Epoch 0 | Batchsize: 32 | Steps: 32
//   Epoch 0 | Training snapshot saved at snapshot.pt
//   Resuming training from snapshot at Epoch 1
// Differences, on purpose: EPOCHS_RUN is the number of completed epochs (the tutorial stores
// the index of the last one and so trains it twice after a restart), and the loss is MSE (the
// tutorial's cross_entropy over a single output is identically zero, so nothing trains).
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include <ddp/ddp.hpp>

#include "ddp/torch/snapshot/snapshot_file.hpp"

namespace {

struct Args {
  int64_t total_epochs = 0;
  int64_t save_every = 1;
  int64_t batch_size = 32;
  std::string snapshot = "snapshot.pt";
  int keep = ddp::SnapshotOptions::kKeep;
  uint64_t seed = 0;
  std::string backend = "auto";
  std::string device = "auto";
  std::string recovery = "group";
};

// A short digest of the final parameters, so runs can be compared from their logs.
std::string parameter_digest(const torch::nn::Module& m) {
  std::string bytes;
  for (const auto& p : m.named_parameters()) {
    auto t = p.value().detach().cpu().contiguous();
    bytes += p.key();
    bytes.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return ddp::sha256_hex(bytes.data(), bytes.size()).substr(0, 16);
}

int run(const Args& args) {
  // One GPU per process: cuda means cuda:LOCAL_RANK, with the nccl backend unless told.
  const torch::Device device = ddp::local_device(args.device);
  ddp::InitOptions init;
  init.backend = args.backend == "auto" ? ddp::default_backend(device) : args.backend;
  if (device.is_cuda()) init.device = device.index();
  auto pg = ddp::init_process_group(init);
  const int rank = pg->rank();

  auto dataset = ddp::make_synthetic_dataset(ddp::SyntheticOptions().size(2048).seed(args.seed));
  torch::manual_seed(args.seed);
  torch::nn::Linear model(20, 1);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-3));

  ddp::SnapshotManager snapshots(ddp::SnapshotOptions(args.snapshot).keep(args.keep));
  int64_t epochs_run = 0;
  // Every rank resumes from the same snapshot, or all fail naming the ranks that differ
  // (--snapshot on node-local disks).
  if (auto resume = snapshots.load_agreed(*pg)) {
    if (rank == 0) {
      for (const auto& why : resume->skipped) std::cout << "Skipping snapshot " << why << "\n";
      std::cout << "Loading snapshot " << resume->path << " (" << resume->verification << ")\n";
    }
    ddp::restore_snapshot(resume->snapshot, *model, &optimizer);
    epochs_run = resume->snapshot.epochs_run;
    std::cout << "Resuming training from snapshot at Epoch " << epochs_run << "\n" << std::flush;
  }

  ddp::DistributedDataParallel ddp_model(model, pg);
  ddp::DistributedSampler sampler(dataset.size(),
                                  ddp::DistributedSamplerOptions(pg->size(), rank).seed(args.seed));

  for (int64_t epoch = epochs_run; epoch < args.total_epochs; ++epoch) {
    sampler.set_epoch(epoch);
    ddp::PrefetchLoader loader(dataset, sampler.indices(),
                               ddp::PrefetchLoaderOptions().batch_size(args.batch_size));
    std::cout << "[RANK" << rank << "] Epoch " << epoch << " | Batchsize: " << args.batch_size
              << " | Steps: " << loader.num_batches() << "\n"
              << std::flush;
    while (auto batch = loader.next()) {
      optimizer.zero_grad();
      auto loss = torch::mse_loss(ddp_model(batch->data.to(device)), batch->target.to(device));
      loss.backward();
      ddp_model.step(optimizer);
    }
    if (rank == 0 && epoch % args.save_every == 0) {
      snapshots.save(ddp::capture_snapshot(*model, &optimizer, epoch + 1, epoch + 1));
      std::cout << "Epoch " << epoch << " | Training snapshot saved at " << args.snapshot << "\n"
                << std::flush;
    }
  }
  pg->barrier()->wait(pg->timeout());
  if (rank == 0) {
    std::cout << "Training finished | epochs " << args.total_epochs << " | parameters "
              << parameter_digest(*model) << "\n"
              << std::flush;
  }
  return 0;
}

// --recovery step: ddp::StepManager. The batch of every step is a function of the step (the
// sampler's epoch and the batch within it), so a healed rank picks up exactly where the
// group is; no snapshot is written or read. One sampler share per launch rank (ddp::StepBatches):
// after a lost node the live ranks split the shares; a node that grew the job brings its own.
int run_step_recovery(const Args& args) {
  ddp::StepManagerOptions options;
  options.group.backend = args.backend == "auto" ? "cpu" : args.backend;
  ddp::StepManager steps(options);
  const int rank = steps.slot();  // the launch rank: names this process in the output
  auto dataset = ddp::make_synthetic_dataset(ddp::SyntheticOptions().size(2048).seed(args.seed));
  torch::manual_seed(args.seed);
  torch::nn::Linear model(20, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(1e-3));
  ddp::DistributedDataParallel ddp_model(model, steps.process_group(),
                                         ddp::DistributedDataParallelOptions().init_sync(false));
  steps.attach(ddp_model, optimizer);  // every rank: a healthy peer's state
  ddp::StepBatchesOptions split;
  split.dataset_size = dataset.size();
  split.batch_size = args.batch_size;
  split.launch_world_size = steps.launch_world_size();
  split.seed = static_cast<uint64_t>(args.seed);
  ddp::StepBatches batches(split);
  const int64_t steps_per_epoch = batches.launch_steps_per_epoch();
  const int64_t total = args.total_epochs * steps_per_epoch;
  auto batch_of_step = [&](int64_t step) {
    return dataset.get_batch(batches.indices(step, steps.rank(), steps.world_size()));
  };
  if (rank == 0) {
    std::cout << "Training from step " << steps.step() << " of " << total << " (--recovery step, "
              << steps_per_epoch << " steps per epoch)\n"
              << std::flush;
  }
  // Fault injection for tests (examples_test.py), as in examples/mnist: rank
  // DDP_TEST_KILL_RANK of the first incarnation SIGKILLs itself in step DDP_TEST_KILL_AT_STEP,
  // between its forward and its backward.
  const char* kill_at = std::getenv("DDP_TEST_KILL_AT_STEP");
  const char* kill_rank = std::getenv("DDP_TEST_KILL_RANK");
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int64_t kill_step = kill_at != nullptr ? std::atoll(kill_at) : -1;
  const bool victim = (kill_rank != nullptr ? std::atoi(kill_rank) : 1) == rank &&
                      (restarts == nullptr || std::string(restarts) == "0");
  while (steps.step() < total) {
    steps.run_step([&] {
      const auto batch = batch_of_step(steps.step());  // a redo may run a later step
      auto loss = torch::mse_loss(ddp_model(batch.data), batch.target);
      if (victim && steps.step() == kill_step) ::kill(::getpid(), SIGKILL);
      loss.backward();
      return loss;
    });
    if (steps.step() % steps_per_epoch == 0) {
      std::cout << "[RANK" << rank << "] Epoch " << steps.step() / steps_per_epoch - 1
                << " | Batchsize: " << args.batch_size << " | Steps: " << steps_per_epoch << "\n"
                << std::flush;
    }
  }
  if (rank == 0) {
    std::cout << "Training finished | epochs " << args.total_epochs << " | parameters "
              << parameter_digest(*model) << " | steps dropped " << steps.steps_dropped() << "\n"
              << std::flush;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"simple distributed training job (the tutorials' toy workload)"};
  Args args;
  app.add_option("total_epochs", args.total_epochs, "Total epochs to train the model")
      ->required()
      ->check(CLI::NonNegativeNumber);
  app.add_option("save_every", args.save_every, "How often to save a snapshot")
      ->required()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size,--batch_size", args.batch_size,
                 "Input batch size on each rank (default: 32)")
      ->check(CLI::PositiveNumber);
  app.add_option("--snapshot", args.snapshot, "Snapshot path (default: snapshot.pt)");
  app.add_option("--keep", args.keep, "Snapshots to keep (default: 3)")->check(CLI::PositiveNumber);
  app.add_option("--seed", args.seed, "Seed of the data, the model and the sampler");
  app.add_option("--backend", args.backend,
                 "Process-group backend: cpu, gloo, mpi, nccl, or auto: nccl on CUDA, cpu "
                 "otherwise (default: auto)");
  app.add_option("--device", args.device,
                 "cpu, cuda (cuda:LOCAL_RANK), cuda:N, or auto: cuda when a GPU is usable "
                 "(default: auto)");
  app.add_option("--recovery", args.recovery,
                 "group: snapshots, the whole group restarts (default); step: in-place "
                 "recovery under ddprun --recovery step (docs/recovery.md)")
      ->check(CLI::IsMember({"group", "step"}));
  CLI11_PARSE(app, argc, argv);
  try {
    return args.recovery == "step" ? run_step_recovery(args) : run(args);
  } catch (const ddp::Error& e) {
    std::cerr << "toy: " << e.what() << "\n";
    return 1;
  }
}
