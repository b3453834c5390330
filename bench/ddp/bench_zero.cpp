// ZeroRedundancyOptimizer's step time and optimizer memory per rank: `layers` weight matrices
// of width x width (and biases) with fixed gradients, ranks as threads of this process ("cpu"
// backend over a shared HashStore, one intra-op thread each). Only step() is timed: the local
// optimizer's update of this rank's shard and the all-gather of the shards. One JSON object
// per line (bench_zero.py prints the same for PyTorch's ZeroRedundancyOptimizer):
//
//   bench_zero [--world 2] [--layers 8] [--width 512] [--steps 20] [--optimizer adam|fused-adam]
//              [--recoverable]
//
// --recoverable: as under ddp::StepManager (enable_recovery): every rank also steps a replica
// of another rank's shard and checks the backward first; state_bytes_max_rank then counts the
// replica's state too.
//
// step_ms: median over the timed steps of the slowest rank's step; state_bytes_max_rank: the
// largest per-rank optimizer state (ddp::optimizer_state_bytes); unsharded_state_bytes: an
// unsharded torch::optim::Adam's over the same parameters; unsharded_adam_step_ms: that Adam's
// median step on one thread of this process (no communication), for scale.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/torch/optim/fused_adam.hpp"
#include "ddp/torch/optim/optimizer_state_bytes.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<torch::Tensor> make_params(int layers, int width) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int l = 0; l < layers; ++l) {
    for (auto shape : {std::vector<int64_t>{width, width}, std::vector<int64_t>{width}}) {
      auto p = torch::randn(shape).mul_(0.05).requires_grad_(true);
      p.mutable_grad() = torch::randn(shape).mul_(0.01);
      params.push_back(p);
    }
  }
  return params;
}

struct Result {
  std::vector<double> step_ms;  // per step, the slowest rank
  size_t state_bytes_max_rank = 0;
};

template <typename Opt>
Result run(int world, int layers, int width, int steps, bool recoverable) {
  auto store = std::make_shared<ddp::HashStore>();
  std::vector<std::vector<double>> times(world);
  std::vector<size_t> bytes(world);
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
        auto params = make_params(layers, width);
        ddp::ZeroRedundancyOptimizer<Opt> zero(params, torch::optim::AdamOptions(1e-3), pg);
        if (recoverable) zero.enable_recovery();
        for (int s = 0; s < steps + 3; ++s) {
          const auto t0 = Clock::now();
          zero.step();
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (s >= 3) times[r].push_back(ms);
        }
        bytes[r] = zero.local_state_bytes() + zero.replica_state_bytes();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  Result out;
  for (int s = 0; s < steps; ++s) {
    double worst = 0;
    for (int r = 0; r < world; ++r) worst = std::max(worst, times[r][s]);
    out.step_ms.push_back(worst);
  }
  out.state_bytes_max_rank = *std::max_element(bytes.begin(), bytes.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeroRedundancyOptimizer step time and optimizer memory, JSON lines"};
  int world = 2, layers = 8, width = 512, steps = 20;
  std::string optimizer = "adam";
  bool recoverable = false;
  app.add_option("--world", world, "ranks (threads)");
  app.add_option("--layers", layers, "weight matrices (each with a bias)");
  app.add_option("--width", width, "rows and columns of each weight matrix");
  app.add_option("--steps", steps, "timed steps (after 3 warm-up steps)");
  app.add_option("--optimizer", optimizer, "adam (torch::optim::Adam) or fused-adam")
      ->check(CLI::IsMember({"adam", "fused-adam"}));
  app.add_flag("--recoverable", recoverable, "replicas and the backward check (StepManager's)");
  CLI11_PARSE(app, argc, argv);

  Result result = optimizer == "adam"
                      ? run<torch::optim::Adam>(world, layers, width, steps, recoverable)
                      : run<ddp::FusedAdam>(world, layers, width, steps, recoverable);
  size_t unsharded = 0;
  int64_t numel = 0;
  double adam_ms = 0;
  {
    auto params = make_params(layers, width);
    for (auto& p : params) numel += p.numel();
    torch::set_num_threads(1);
    torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
    std::vector<double> times;
    for (int s = 0; s < steps + 3; ++s) {
      const auto t0 = Clock::now();
      adam.step();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (s >= 3) times.push_back(ms);
    }
    adam_ms = median(times);
    unsharded = ddp::optimizer_state_bytes(adam);
  }
  nlohmann::json line{{"bench", "zero"},
                      {"impl", "ddp"},
                      {"optimizer", optimizer},
                      {"recoverable", recoverable},
                      {"world", world},
                      {"params", numel},
                      {"steps", steps},
                      {"step_ms", median(result.step_ms)},
                      {"unsharded_adam_step_ms", adam_ms},
                      {"state_bytes_max_rank", result.state_bytes_max_rank},
                      {"unsharded_state_bytes", unsharded},
                      {"state_fraction", static_cast<double>(result.state_bytes_max_rank) /
                                             static_cast<double>(unsharded)}};
  fmt::print("{}\n", line.dump());
}
