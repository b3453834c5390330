#pragma once
// mnist --recovery step: the training loop under ddp::StepManager, for
// `ddprun --recovery step` (docs/recovery.md). A rank that dies is restarted alone by ddprun and
// healed from a live peer; the survivors drop the step in flight and redo it. The batch of every
// step is a function of the step counter (the DistributedSampler's epoch = step / steps per
// epoch + 1, then the step's slice of this rank's indices), so a redone or healed step sees the
// same samples.
//
//   ddprun --standalone --nproc-per-node 3 --recovery step --max-restarts 3
//       build/examples/mnist/mnist --recovery step --total-steps 300   (one command line)
//
// Demo aid: DDP_TEST_KILL_AT_STEP=S (and DDP_TEST_KILL_RANK=R, default 1) make rank R's first
// incarnation SIGKILL itself between forward and backward of step S.
#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <ddp/ddp.hpp>

#include "ddp/torch/models/mnist_cnn.hpp"

namespace mnist_example {

struct StepRecoveryArgs {
  int64_t epochs = 1;
  int64_t batch_size = 32;
  double lr = 1e-3;
  std::string data_dir;
  uint64_t seed = 0;
  int64_t total_steps = -1;  // -1: epochs * steps per epoch
  std::string loss_log;
  ddp::CommHookPtr comm_hook;
  int64_t test_images = -1;  // --test-images: -1 the whole test set, 0 none
};

// How many test images the final evaluation covers: the first `requested` (--test-images), all
// of them when it is negative.
inline int64_t test_images(int64_t requested, int64_t test_set_size) {
  return requested < 0 ? test_set_size : std::min(requested, test_set_size);
}

inline int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::stoll(v) : fallback;
}

inline int run_with_step_recovery(const StepRecoveryArgs& args) {
  ddp::StepManager manager;
  // One DistributedSampler share per launch rank, and a step's global batch is one batch of
  // every share (ddp::StepBatches): after a lost node the live ranks split the shares, so the
  // survivors also train on the lost ranks' data and each step averages the same samples as
  // without the loss; ranks of a node that grew the job bring shares of their own.
  const int launch_rank = manager.slot(), launch_world = manager.launch_world_size();
  auto train = ddp::load_mnist(ddp::MnistOptions().directory(args.data_dir));
  auto test =
      ddp::load_mnist(ddp::MnistOptions().directory(args.data_dir).split(ddp::MnistSplit::kTest));

  torch::manual_seed(args.seed);
  ddp::models::MnistCnn model(ddp::models::MnistCnnOptions::tutorial());
  ddp::FusedAdam optimizer(model->parameters(), torch::optim::AdamOptions(args.lr));
  // No construction broadcast: attach() brings every rank to a healthy peer's state.
  ddp::DistributedDataParallel ddp_model(
      model, manager.process_group(),
      ddp::DistributedDataParallelOptions().init_sync(false).comm_hook(args.comm_hook));
  manager.attach(ddp_model, optimizer);

  ddp::StepBatchesOptions split;
  split.dataset_size = train.size();
  split.batch_size = args.batch_size;
  split.launch_world_size = launch_world;
  split.seed = static_cast<uint64_t>(args.seed);
  split.first_epoch = 1;  // the tutorial counts epochs from 1
  ddp::StepBatches batches(split);
  const int64_t steps_per_epoch = batches.launch_steps_per_epoch();
  const int64_t total = args.total_steps >= 0 ? args.total_steps : args.epochs * steps_per_epoch;
  std::ofstream loss_log;
  if (launch_rank == 0 && !args.loss_log.empty()) loss_log.open(args.loss_log, std::ios::app);
  const bool first_life = env_int("TORCHELASTIC_RESTART_COUNT", 0) == 0;
  const int64_t kill_step = env_int("DDP_TEST_KILL_AT_STEP", -1);
  const int64_t kill_rank = env_int("DDP_TEST_KILL_RANK", 1);

  if (launch_rank == 0) {
    std::cout << fmt::format("Entering training loop at step {} of {} (--recovery step)\n",
                             manager.step(), total)
              << std::flush;
  }
  const auto start = std::chrono::steady_clock::now();
  // The batch of the step being run, read inside run_step's function: a redo after healing
  // runs the healed step, a later one when some rank had committed this one.
  auto batch_of_step = [&](int64_t step) {
    return train.get_batch(batches.indices(step, manager.rank(), manager.world_size()));
  };
  while (manager.step() < total) {
    torch::Tensor loss = manager.run_step([&] {
      const int64_t step = manager.step();
      const auto batch = batch_of_step(step);
      auto l = torch::nll_loss(ddp_model(batch.data), batch.target);
      if (first_life && launch_rank == kill_rank && step == kill_step) ::kill(::getpid(), SIGKILL);
      l.backward();
      return l;
    });
    if (loss_log.is_open()) {
      loss_log << fmt::format("{} {:a}\n", manager.step(), loss.item<float>()) << std::flush;
    }
    if (launch_rank == 0 && manager.step() % 100 == 0) {
      std::cout << fmt::format("step {}/{} (epoch {}) loss {:.6f}\n", manager.step(), total,
                               batches.epoch(), loss.item<float>())
                << std::flush;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  torch::NoGradGuard no_grad;
  model->eval();
  const int rank = manager.rank(), world = manager.world_size();  // the live ranks now
  int64_t correct[2] = {0, 0};
  const int64_t limit = test_images(args.test_images, test.size());
  for (int64_t i = rank; i < limit; i += world * 1000) {
    std::vector<int64_t> idx;
    for (int64_t j = i; j < std::min<int64_t>(limit, i + world * 1000); j += world) {
      idx.push_back(j);
    }
    const auto b = test.get_batch(idx);
    correct[0] += model->forward(b.data).argmax(1).eq(b.target).sum().item<int64_t>();
    correct[1] += static_cast<int64_t>(idx.size());
  }
  auto& pg = *manager.process_group();
  pg.all_reduce(correct, 2, ddp::DataType::kInt64, ddp::ReduceOp::kSum)->wait(pg.timeout());
  if (launch_rank == 0) {
    std::cout << fmt::format(
                     "Training time = {:.2f} s | {} steps on {} ranks | generation {} | {} "
                     "attempts dropped on rank 0 | test accuracy {:.2f}% ({}/{})\n",
                     seconds, manager.step(), world, manager.generation(), manager.steps_dropped(),
                     100.0 * correct[0] / std::max<int64_t>(correct[1], 1), correct[0], correct[1])
              << std::flush;
  }
  return 0;
}

}  // namespace mnist_example
