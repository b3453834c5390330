// ddp's side of bench/checkpoint/run.sh: a training-like loop (a fixed matmul workload per
// step) with a checkpoint every few steps, one rank, and the same loop without checkpoints.
// Prints one JSON line: the loop's stall per save (median, seconds), the job time with and
// without checkpoints, and the state's size.
//
//   bench_checkpoint --state 1gb|cnn --mode async|sync --dir DIR [--saves 3] [--every 25]
#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"
#include "ddp/torch/models/mnist_cnn.hpp"
#include "ddp/util/remove_tree.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ~1 GB of float32 parameters in 16 tensors of 16M elements (synthetic: no forward).
struct Synthetic : torch::nn::Module {
  Synthetic() {
    for (int i = 0; i < 16; ++i) {
      register_parameter(fmt::format("w{}", i), torch::full({4096, 4096}, 0.5f + i));
    }
  }
};

// The per-step work both sides run: matmuls worth about 0.1 s on 2 cores.
void step_work(const torch::Tensor& a) {
  torch::NoGradGuard no_grad;
  auto x = a;
  for (int i = 0; i < 8; ++i) x = torch::tanh(torch::mm(x, a));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp checkpoint stall benchmark"};
  std::string state = "1gb", mode = "async", dir;
  int saves = 3, every = 25;
  app.add_option("--state", state)->check(CLI::IsMember({"1gb", "cnn"}));
  app.add_option("--mode", mode)->check(CLI::IsMember({"async", "sync"}));
  app.add_option("--dir", dir)->required();
  app.add_option("--saves", saves);
  app.add_option("--every", every);
  CLI11_PARSE(app, argc, argv);

  ddp::InitOptions init;
  init.rank = 0;
  init.world_size = 1;
  init.store = std::make_shared<ddp::HashStore>();
  auto pg = ddp::init_process_group(init);

  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::Adam> adam;
  if (state == "1gb") {
    model = std::make_shared<Synthetic>();
  } else {
    auto cnn = ddp::models::MnistCnn(ddp::models::MnistCnnOptions::tutorial());
    model = cnn.ptr();
    adam = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions());
    auto loss = cnn->forward(torch::randn({8, 1, 28, 28})).sum();
    loss.backward();
    adam->step();  // Adam's moments exist: the state is model + optimizer, as in training
  }
  int64_t bytes = 0;
  for (const auto& p : model->parameters()) bytes += p.nbytes();
  if (adam) bytes *= 3;

  const auto work = torch::randn({1024, 1024}).div(32);
  const int steps = saves * every;
  // Without checkpoints.
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) step_work(work);
  const double baseline = seconds_since(t0);

  ddp::remove_tree(dir);
  ddp::Checkpointer ckpt(ddp::CheckpointOptions(dir).async(mode == "async").keep(2), pg);
  std::vector<double> stalls;
  t0 = Clock::now();
  for (int s = 1; s <= steps; ++s) {
    step_work(work);
    if (s % every == 0) {
      const auto t = Clock::now();
      ckpt.save({s, 0, s}, *model, adam.get());
      stalls.push_back(seconds_since(t));
    }
  }
  ckpt.wait();
  const double job = seconds_since(t0);
  ddp::remove_tree(dir);
  std::cout << fmt::format(
                   "{{\"bench\":\"checkpoint\",\"impl\":\"ddp\",\"mode\":\"{}\",\"state\":\"{}\","
                   "\"state_bytes\":{},\"saves\":{},\"stall_s_median\":{:.4f},\"stall_s_first\":"
                   "{:.4f},\"job_s\":{:.3f},\"baseline_job_s\":{:.3f},\"slowdown\":{:.4f}}}",
                   mode, state, bytes, saves, median(stalls), stalls.front(), job, baseline,
                   job / baseline - 1)
            << std::endl;
  return 0;
}
