// PowerSGD: the hook against Python's own powerSGD_hook (torch 1.13, gloo, 2 processes) on the
// same gradients, and DDP with the hook against one-process training.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../data/python_helper.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/join.hpp"
#include "ddp/torch/ddp/powersgd_hook.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::PowerSGDOptions;
using ddp::test::run_ranks;

// Two buckets of parameter shapes: matrices worth compressing, a repeated shape (PyTorch
// groups equal matrix shapes: the order of Ps and Qs differs from the parameter order), a 3-D
// tensor viewed as [4, 6], biases that stay uncompressed.
constexpr int kIterations = 5;

// Runs powerSGD_hook in 2 gloo processes for two configurations over kIterations iterations of
// 2 buckets; rank 0 prints, per configuration, iteration and bucket, both ranks' inputs and the
// hook's result (the same on every rank), and the final compression stats.
const char* kPythonReference = R"PY(
import json, os, sys, tempfile
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

SHAPES = json.loads(sys.argv[1])
CONFIGS = json.loads(sys.argv[2])
ITERS = int(sys.argv[3])
store = tempfile.mktemp(prefix="ddp_powersgd_store_")

class Bucket:  # the part of dist.GradBucket that powerSGD_hook uses
    def __init__(self, index, count, buf, shapes):
        self.i, self.n, self.buf, self.shapes = index, count, buf, shapes
    def buffer(self): return self.buf
    def index(self): return self.i
    def is_last(self): return self.i == self.n - 1
    def gradients(self):
        out, at = [], 0
        for s in self.shapes:
            k = 1
            for d in s: k *= d
            out.append(self.buf[at:at + k].view(s))
            at += k
        return out

def numel(shapes):
    total = 0
    for s in shapes:
        k = 1
        for d in s: k *= d
        total += k
    return total

def run(rank):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    torch.manual_seed(1234)
    inputs = [[[[torch.randn(numel(b)) for r in range(2)] for b in SHAPES]
               for it in range(ITERS)] for c in CONFIGS]
    report = []
    for c, cfg in enumerate(CONFIGS):
        state = ps.PowerSGDState(process_group=None, **cfg)
        per_iter = []
        for it in range(ITERS):
            per_bucket = []
            for b, shapes in enumerate(SHAPES):
                buf = inputs[c][it][b][rank].clone()
                out = ps.powerSGD_hook(state, Bucket(b, len(SHAPES), buf, shapes)).wait()
                per_bucket.append({"inputs": [inputs[c][it][b][r].tolist() for r in range(2)],
                                   "output": out.tolist()})
            per_iter.append(per_bucket)
        stats = state.compression_stats()
        report.append({"iterations": per_iter, "iter": state.iter,
                       "stats": [stats[1], stats[2]]})
    dist.barrier()
    if rank == 0:
        print(json.dumps(report))

pid = os.fork()
if pid == 0:
    try:
        run(1)
    finally:
        os._exit(0)
run(0)
_, status = os.waitpid(pid, 0)
os.unlink(store) if os.path.exists(store) else None
sys.exit(1 if status else 0)
)PY";

const std::vector<std::vector<std::vector<int64_t>>> kShapes = {
    {{8, 6}, {8}, {4, 2, 3}, {8, 6}},
    {{5, 5}, {12, 10}, {3}},
};

struct Config {
  nlohmann::json python;  // PowerSGDState's keyword arguments
  PowerSGDOptions options;
};

std::vector<Config> configs() {
  return {
      // Rank 1 (Gram-Schmidt), error feedback and warm start on.
      {{{"matrix_approximation_rank", 1},
        {"start_powerSGD_iter", 2},
        {"min_compression_rate", 2},
        {"use_error_feedback", true},
        {"warm_start", true},
        {"orthogonalization_epsilon", 0},
        {"random_seed", 0}},
       PowerSGDOptions()
           .matrix_approximation_rank(1)
           .start_powerSGD_iter(2)
           .min_compression_rate(2)
           .use_error_feedback(true)
           .warm_start(true)
           .orthogonalization_epsilon(0)
           .random_seed(0)},
      // Rank 3 (QR), new random Qs every iteration, epsilon, another seed.
      {{{"matrix_approximation_rank", 3},
        {"start_powerSGD_iter", 2},
        {"min_compression_rate", 1},
        {"use_error_feedback", true},
        {"warm_start", false},
        {"orthogonalization_epsilon", 1e-8},
        {"random_seed", 7}},
       PowerSGDOptions()
           .matrix_approximation_rank(3)
           .start_powerSGD_iter(2)
           .min_compression_rate(1)
           .use_error_feedback(true)
           .warm_start(false)
           .orthogonalization_epsilon(1e-8)
           .random_seed(7)},
  };
}

ddp::BucketInfo bucket_info(size_t index) {
  ddp::BucketInfo info;
  info.index = index;
  info.bucket_count = kShapes.size();
  int64_t at = 0;
  for (const auto& shape : kShapes[index]) {
    info.offsets.push_back(at);
    info.shapes.push_back(shape);
    info.names.push_back("p" + std::to_string(info.names.size()));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    at += n;
  }
  return info;
}

torch::Tensor from_json(const nlohmann::json& values) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kFloat64).to(torch::kFloat32);
}

TEST(PowerSGD, MatchesPythonPowerSGDHook) {
  if (auto why = ddp::test::python_torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  torch::set_num_threads(1);
  nlohmann::json python_configs = nlohmann::json::array();
  for (const auto& c : configs()) python_configs.push_back(c.python);
  auto quote = [](const std::string& s) { return "'" + s + "'"; };
  auto result = ddp::test::run_python(kPythonReference, quote(nlohmann::json(kShapes).dump()) +
                                                            " " + quote(python_configs.dump()) +
                                                            " " + std::to_string(kIterations));
  ASSERT_EQ(result.status, 0) << "the Python reference failed; its stdout: " << result.out;
  const auto report = nlohmann::json::parse(result.out);
  ASSERT_EQ(report.size(), configs().size());

  for (size_t c = 0; c < configs().size(); ++c) {
    SCOPED_TRACE("configuration " + std::to_string(c));
    const auto& iterations = report[c].at("iterations");
    // Per rank, iteration, bucket: the hook's result.
    std::vector<std::vector<std::vector<torch::Tensor>>> got(
        2, std::vector<std::vector<torch::Tensor>>(kIterations));
    std::vector<std::shared_ptr<ddp::PowerSGDHook>> hooks(2);
    run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
      hooks[rank] = ddp::powerSGD_hook(configs()[c].options);
      for (int it = 0; it < kIterations; ++it) {
        // As DDP does: every bucket launched in order, then every bucket finished in order.
        std::vector<torch::Tensor> buckets;
        std::vector<std::unique_ptr<ddp::BucketReduction>> reductions;
        for (size_t b = 0; b < kShapes.size(); ++b) {
          buckets.push_back(from_json(iterations[it][b].at("inputs")[rank]));
          ddp::BucketInfo info = bucket_info(b);
          info.iteration = it;
          reductions.push_back(hooks[rank]->launch(*pg, buckets.back(), info));
        }
        for (auto& r : reductions) r->finish(std::chrono::seconds(30));
        got[rank][it] = buckets;
      }
    });
    for (int rank = 0; rank < 2; ++rank) {
      for (int it = 0; it < kIterations; ++it) {
        for (size_t b = 0; b < kShapes.size(); ++b) {
          const torch::Tensor want = from_json(iterations[it][b].at("output"));
          const torch::Tensor& have = got[rank][it][b];
          const double err = (have - want).norm().item<double>() / want.norm().item<double>();
          EXPECT_LT(err, 1e-5) << "rank " << rank << " iteration " << it << " bucket " << b;
          if (it >= 2) {
            // Past start_powerSGD_iter the result is a low-rank approximation, not the average.
            const torch::Tensor average = (from_json(iterations[it][b].at("inputs")[0]) +
                                           from_json(iterations[it][b].at("inputs")[1])) /
                                          2;
            EXPECT_GT((have - average).norm().item<double>(), 1e-3 * average.norm().item<double>())
                << "compression did not happen: rank " << rank << " iteration " << it;
          }
        }
      }
      EXPECT_EQ(hooks[rank]->iteration(), report[c].at("iter").get<int64_t>());
      const auto stats = hooks[rank]->compression_stats();
      EXPECT_EQ(stats.numel_before_compression, report[c].at("stats")[0].get<int64_t>());
      EXPECT_EQ(stats.numel_after_compression, report[c].at("stats")[1].get<int64_t>());
    }
  }
}

// With the approximation rank at least the smaller side of every matrix (and no minimum
// compression rate) PowerSGD reconstructs the average exactly up to rounding: DDP with it must
// train like one process on the whole batch. This checks the layout DDP hands to the hook
// (offsets and shapes, after the buckets were rebuilt) end to end. A rank-1 run must keep the
// ranks' parameters identical while differing from exact training.
TEST(PowerSGD, DdpWithFullRankPowerSGDTrainsLikeOneProcess) {
  torch::set_num_threads(1);
  const int world = 2, B = 3, steps = 5;
  torch::manual_seed(11);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(torch::randn({world * B, 10}));
    ys.push_back(torch::randn({world * B, 4}));
  }
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(10, 7), torch::nn::Tanh(),
                                 torch::nn::Linear(7, 4));
  };
  auto ref = make();
  auto initial = make();
  ddp::test::copy_state(*ref, *initial);
  auto step = [](const torch::Tensor& out, const torch::Tensor& y, torch::optim::Optimizer& opt) {
    torch::mse_loss(out, y).backward();
    opt.step();
    opt.zero_grad();
  };
  {
    torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < steps; ++s) step(ref->forward(xs[s]), ys[s], opt);
  }
  for (int64_t rank : {int64_t{7}, int64_t{1}}) {
    SCOPED_TRACE("matrix_approximation_rank " + std::to_string(rank));
    std::vector<torch::nn::Sequential> nets;
    for (int r = 0; r < world; ++r) {
      nets.push_back(make());
      ddp::test::copy_state(*initial, *nets.back());
    }
    run_ranks(world, [&](int r, ddp::ProcessGroupPtr pg) {
      auto hook = ddp::powerSGD_hook(PowerSGDOptions()
                                         .matrix_approximation_rank(rank)
                                         .start_powerSGD_iter(2)
                                         .min_compression_rate(0));
      ddp::DistributedDataParallel model(nets[r], pg,
                                         ddp::DistributedDataParallelOptions().comm_hook(hook));
      torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int s = 0; s < steps; ++s) {
        step(model(xs[s].narrow(0, r * B, B)), ys[s].narrow(0, r * B, B), opt);
      }
      EXPECT_EQ(hook->iteration(), steps);
      EXPECT_GT(hook->compression_stats().numel_after_compression, 0);
    });
    EXPECT_LT(ddp::test::max_relative_error(*nets[0], *nets[1]), 1e-6) << "ranks diverged";
    const double error = ddp::test::max_relative_error(*nets[0], *ref);
    if (rank == 7) {
      EXPECT_LT(error, 1e-5) << "full-rank PowerSGD must equal exact averaging";
    } else {
      EXPECT_GT(error, 1e-4) << "rank-1 PowerSGD should differ from exact averaging";
    }
  }
}

// Under ddp::Join a rank that ran out of inputs runs the hook on zero buckets (as PyTorch's
// join hook runs the comm hook), through launch(pg, bucket, info): PowerSGD's three
// all-reduces per bucket stay matched, and its iteration count follows the ranks still
// training (rank 0: 5 batches, rank 1: 3; compression from iteration 2).
TEST(PowerSGD, UnevenInputsUnderJoin) {
  torch::set_num_threads(1);
  std::vector<int64_t> iterations(2, -1);
  run_ranks(2, [&](int r, ddp::ProcessGroupPtr pg) {
    torch::manual_seed(5);
    auto net =
        torch::nn::Sequential(torch::nn::Linear(10, 7), torch::nn::Tanh(), torch::nn::Linear(7, 4));
    auto hook = ddp::powerSGD_hook(PowerSGDOptions().start_powerSGD_iter(2));
    ddp::DistributedDataParallel model(net, pg,
                                       ddp::DistributedDataParallelOptions().comm_hook(hook));
    torch::optim::SGD opt(model.parameters(), 0.1);
    {
      ddp::Join joined({&model});
      for (int s = 0; s < (r == 0 ? 5 : 3); ++s) {
        opt.zero_grad();
        torch::mse_loss(model(torch::randn({3, 10})), torch::randn({3, 4})).backward();
        opt.step();
      }
    }
    iterations[r] = hook->iteration();
  });
  EXPECT_EQ(iterations[0], 5);
  EXPECT_EQ(iterations[1], 5) << "the joined rank's hook must count the shadowed iterations";
}

}  // namespace
