// Training step time of ddp's DistributedDataParallel (or of plain LibTorch training) on the
// rank's device, one JSON line from rank 0. torch_step.py is the same benchmark in PyTorch;
// bench/gpu/verify.sh runs both in one run.
//
//   ddprun --standalone --nproc-per-node 1 bench_gpu_step --model resnet18 --mode ddp
//   ddprun --standalone --nproc-per-node 2 bench_gpu_step --device cuda:0 --backend cpu
//   bench_gpu_step --mode data_parallel     (one process, LibTorch's data_parallel over all GPUs)
//
// Each rank trains on one fixed random batch kept on its device (no data loading in the
// timing), SGD lr 0.01 momentum 0.9. After `warmup` steps, `blocks` blocks of `steps` steps are
// timed (device synchronised at both ends of a block); the result is the median block's time
// per step.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ddp/comm/init.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/local_device.hpp"
#include "ddp/util/error.hpp"
#include "models.hpp"
#if DDP_WITH_CUDA_TORCH
// Includes c10/cuda headers (CUDA's runtime API): only with a CUDA LibTorch.
#include <torch/nn/parallel/data_parallel.h>
#endif

namespace {

struct Args {
  std::string model = "resnet18";
  std::string mode = "ddp";
  std::string device = "auto";
  std::string backend = "auto";  // auto: nccl on CUDA, cpu otherwise
  int64_t batch = 0;             // 0: 64 for cnn, 32 for resnet18
  int warmup = 10;
  int steps = 20;
  int blocks = 5;
  bool always_allreduce = false;
};

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Times `blocks` blocks of `steps` calls of `step` after `warmup` calls; ms per step per block.
template <typename Step>
std::vector<double> time_blocks(const Args& args, const torch::Device& device, Step&& step) {
  for (int i = 0; i < args.warmup; ++i) step();
  std::vector<double> ms;
  for (int b = 0; b < args.blocks; ++b) {
    sync(device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < args.steps; ++i) step();
    sync(device);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count() /
                 args.steps);
  }
  return ms;
}

template <typename Net>
std::vector<double> run_model(const Args& args, Net net, const torch::Device& device,
                              const torch::Tensor& x, const torch::Tensor& y,
                              ddp::ProcessGroupPtr pg, int64_t& parameters) {
  net->to(device);
  parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  if (args.mode == "data_parallel") {
#if DDP_WITH_CUDA_TORCH
    // The tutorials' single-process alternative: replicate the module on every visible GPU in
    // each step, scatter the batch, gather the outputs on `device` (docs/gpu.md).
    return time_blocks(args, device, [&] {
      opt.zero_grad();
      torch::nll_loss(torch::nn::parallel::data_parallel(net, x), y).backward();
      opt.step();
    });
#else
    throw ddp::UsageError("--mode data_parallel needs a CUDA LibTorch (this one is CPU-only)");
#endif
  }
  if (!pg) {
    return time_blocks(args, device, [&] {
      opt.zero_grad();
      torch::nll_loss(net->forward(x), y).backward();
      opt.step();
    });
  }
  ddp::DistributedDataParallelOptions options;
  if (args.always_allreduce) options.comm_hook(ddp::always_allreduce_hook());
  ddp::DistributedDataParallel model(net, pg, options);
  return time_blocks(args, device, [&] {
    opt.zero_grad();
    torch::nll_loss(model(x), y).backward();
    model.step(opt);
  });
}

int run(const Args& args) {
  if (args.model != "cnn" && args.model != "resnet18") {
    throw ddp::UsageError("--model " + args.model + ": use cnn or resnet18");
  }
  if (args.mode != "ddp" && args.mode != "plain" && args.mode != "data_parallel") {
    throw ddp::UsageError("--mode " + args.mode + ": use ddp, plain or data_parallel");
  }
  const torch::Device device = ddp::local_device(args.device);
  ddp::ProcessGroupPtr pg;
  int rank = 0, world = 1;
  std::string backend = "none";
  if (args.mode == "ddp") {
    ddp::InitOptions init;
    init.backend = args.backend == "auto" ? ddp::default_backend(device) : args.backend;
    if (device.is_cuda()) init.device = device.index();
    pg = ddp::init_process_group(init);
    rank = pg->rank();
    world = pg->size();
    backend = pg->backend_name();
  }
  const bool cnn = args.model == "cnn";
  const int64_t batch = args.batch > 0 ? args.batch : (cnn ? 64 : 32);
  torch::manual_seed(rank);
  auto options = torch::TensorOptions().device(device);
  auto x =
      cnn ? torch::randn({batch, 1, 28, 28}, options) : torch::randn({batch, 3, 224, 224}, options);
  auto y = torch::randint(0, cnn ? 10 : 1000, {batch}, options.dtype(torch::kLong));
  torch::manual_seed(0);
  int64_t parameters = 0;
  const std::vector<double> ms =
      cnn ? run_model(args, ddp::bench::Cnn(), device, x, y, pg, parameters)
          : run_model(args, ddp::bench::ResNet18(), device, x, y, pg, parameters);
  if (pg) pg->barrier()->wait(pg->timeout());
  if (rank == 0) {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    nlohmann::json out = {
        {"bench", "gpu_step"},
        {"impl", args.mode == "data_parallel" ? "libtorch-data_parallel"
                 : args.mode != "ddp"         ? "libtorch"
                 : args.always_allreduce      ? "ddp-allreduce"
                                              : "ddp"},
        {"mode", args.mode},
        {"model", args.model},
        {"parameters", parameters},
        {"world", world},
        {"batch", batch},
        {"device", device.str()},
        {"gpus", device.is_cuda() ? torch::cuda::device_count() : 0},
        {"backend", backend},
        // How CUDA buckets reach a host backend (src/torch/ddp/host_staging.hpp).
        {"host_staging",
         std::getenv("DDP_HOST_STAGING") != nullptr ? std::getenv("DDP_HOST_STAGING") : "overlap"},
        {"ms_per_step", median},
        {"ms_per_step_blocks", ms},
        {"samples_per_s", 1000.0 * static_cast<double>(batch * world) / median}};
    std::cout << out.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"training step time of ddp DDP or plain LibTorch (GPU benchmark)"};
  Args args;
  app.add_option("--model", args.model, "cnn or resnet18 (default: resnet18)");
  app.add_option("--mode", args.mode,
                 "ddp (DistributedDataParallel), plain, or data_parallel (LibTorch's "
                 "torch::nn::parallel::data_parallel over all visible GPUs) (default: ddp)");
  app.add_option(
      "--device", args.device,
      "cpu, cuda (cuda:LOCAL_RANK), cuda:N (every rank on GPU N) or auto (default: auto)");
  app.add_option("--backend", args.backend,
                 "ddp backend: auto (nccl on CUDA, cpu otherwise), nccl, cpu or gloo; cpu and gloo "
                 "stage CUDA buckets through host memory (default: auto)");
  app.add_option("--batch", args.batch, "batch per rank (default: 64 cnn, 32 resnet18)");
  app.add_option("--warmup", args.warmup, "untimed steps (default: 10)");
  app.add_option("--steps", args.steps, "steps per timed block (default: 20)")
      ->check(CLI::PositiveNumber);
  app.add_option("--blocks", args.blocks, "timed blocks (default: 5)")->check(CLI::PositiveNumber);
  app.add_flag("--always-allreduce", args.always_allreduce,
               "all-reduce every bucket even at world size 1 (impl ddp-allreduce)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(args);
  } catch (const ddp::Error& e) {
    std::cerr << "bench_gpu_step: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "bench_gpu_step: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
