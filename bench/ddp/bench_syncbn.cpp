// SyncBatchNorm's cost per training step: a small CNN with BatchNorm2d layers under DDP, ranks
// as threads of this process ("cpu" backend over a shared HashStore), with plain BatchNorm2d
// against the same model converted by ddp::convert_sync_batchnorm. One JSON object per line:
//
//   bench_syncbn [--world 2] [--batch 32] [--steps 20] [--rounds 3]
//
// Rounds alternate the two variants; each prints the median step time of its rank 0, and the
// last line the ratio of the medians over all rounds.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/nn/sync_batch_norm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Two conv blocks with BatchNorm (CIFAR-sized input), a linear head.
torch::nn::Sequential make_cnn() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(3, 32, 3).padding(1)), BatchNorm2d(32), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(32, 64, 3).padding(1)), BatchNorm2d(64),
                    ReLU(), MaxPool2d(2), Flatten(), Linear(64 * 8 * 8, 10));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median step time (ms) of rank 0 over `steps` steps after 3 warm-up steps.
double run(int world, int batch, int steps, bool sync) {
  auto store = std::make_shared<ddp::HashStore>();
  std::vector<double> rank0;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        torch::set_num_threads(1);
        ddp::InitOptions opts;
        opts.backend = "cpu";
        opts.rank = r;
        opts.world_size = world;
        opts.store = store;
        auto pg = ddp::init_process_group(opts);
        torch::manual_seed(r);
        auto net = make_cnn();
        if (sync) ddp::convert_sync_batchnorm(*net);
        ddp::DistributedDataParallel model(net, pg);
        torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
        auto x = torch::randn({batch, 3, 32, 32});
        auto y = torch::randint(0, 10, {batch}, torch::kLong);
        std::vector<double> times;
        for (int s = 0; s < steps + 3; ++s) {
          const auto t0 = Clock::now();
          opt.zero_grad();
          torch::cross_entropy_loss(model(x), y).backward();
          model.step(opt);
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (s >= 3) times.push_back(ms);
        }
        if (r == 0) rank0 = times;
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return median(rank0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SyncBatchNorm against BatchNorm under DDP, JSON lines"};
  int world = 2, batch = 32, steps = 20, rounds = 3;
  app.add_option("--world", world, "ranks (threads)");
  app.add_option("--batch", batch, "batch per rank");
  app.add_option("--steps", steps, "timed steps per round and variant");
  app.add_option("--rounds", rounds, "alternating rounds");
  CLI11_PARSE(app, argc, argv);
  std::vector<double> plain, sync;
  for (int i = 0; i < rounds; ++i) {
    for (bool s : {false, true}) {
      const double ms = run(world, batch, steps, s);
      (s ? sync : plain).push_back(ms);
      nlohmann::json line{
          {"bench", "syncbn"},         {"world", world}, {"batch", batch}, {"round", i},
          {"norm", s ? "sync" : "bn"}, {"step_ms", ms}};
      fmt::print("{}\n", line.dump());
    }
  }
  const double p = median(plain), q = median(sync);
  nlohmann::json summary{
      {"bench", "syncbn_ratio"}, {"world", world},   {"batch", batch}, {"bn_ms", p}, {"sync_ms", q},
      {"ratio", q / p},          {"extra_ms", q - p}};
  fmt::print("{}\n", summary.dump());
}
