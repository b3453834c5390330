// StopRequest: a stop asked on one rank is agreed on every rank at the same step, carried by
// DDP's gradient all-reduce (no collective of its own), with each built-in comm hook; it
// leaves the gradients as they are; signals request it.
#include <gtest/gtest.h>
#include <signal.h>

#include <mutex>

#include "ddp/torch/ddp/comm_hooks.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/powersgd_hook.hpp"
#include "ddp/torch/ddp/stop_request.hpp"
#include "ddp/util/error.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

constexpr int kWorld = 3;
constexpr int kSteps = 8;

struct SmallNetImpl : torch::nn::Module {
  SmallNetImpl()
      : a(register_module("a", torch::nn::Linear(6, 5))),
        b(register_module("b", torch::nn::Linear(5, 2))) {}
  torch::Tensor forward(torch::Tensor x) { return b(torch::relu(a(x))); }
  torch::nn::Linear a;
  torch::nn::Linear b;
};
TORCH_MODULE(SmallNet);

// The same parameters in every run, without the process-wide generator (shared by the rank
// threads, so seeding it would race).
SmallNet fixed_net() {
  SmallNet net;
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) {
    p.copy_(torch::arange(p.numel(), torch::kFloat32).reshape(p.sizes()).cos() * 0.3);
  }
  return net;
}

// Trains kSteps on every rank; `asker` requests the stop just before the backward of step
// `ask_step` (1-based). Returns, per rank, the first step after which agreed() was true (0:
// never) and the iteration the request object reports.
struct Outcome {
  std::vector<int> agreed_after = std::vector<int>(kWorld, 0);
  std::vector<int64_t> iteration = std::vector<int64_t>(kWorld, 0);
};

Outcome train(const std::function<ddp::CommHookPtr()>& hook, int asker, int ask_step,
              double bucket_cap_mb = 25.0) {
  Outcome out;
  ddp::test::run_ranks(kWorld, [&](int rank, ddp::ProcessGroupPtr pg) {
    SmallNet net = fixed_net();
    auto stop = std::make_shared<ddp::StopRequest>();
    ddp::DistributedDataParallel model(net, pg,
                                       ddp::DistributedDataParallelOptions()
                                           .comm_hook(hook())
                                           .bucket_cap_mb(bucket_cap_mb)
                                           .first_bucket_cap_mb(bucket_cap_mb)
                                           .stop_request(stop));
    torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 1; step <= kSteps; ++step) {
      opt.zero_grad();
      auto x = torch::arange(24, torch::kFloat32).reshape({4, 6}).sin() * (rank + step);
      auto loss = model(x).pow(2).mean();
      if (rank == asker && step == ask_step) stop->request();
      loss.backward();
      model.step(opt);
      if (stop->agreed() && out.agreed_after[rank] == 0) {
        out.agreed_after[rank] = step;
        out.iteration[rank] = stop->agreed_iteration();
      }
    }
  });
  return out;
}

void expect_all_agree_at(const Outcome& o, int step) {
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(o.agreed_after[r], step) << "rank " << r;
    EXPECT_EQ(o.iteration[r], step) << "rank " << r;
  }
}

TEST(StopRequest, OneRanksRequestStopsEveryRankAtTheSameStep) {
  for (int asker = 0; asker < kWorld; ++asker) {
    SCOPED_TRACE("asker " + std::to_string(asker));
    expect_all_agree_at(train(ddp::allreduce_hook, asker, 3), 3);
  }
}

TEST(StopRequest, SeveralBucketsCarryItInTheLastOne) {
  // A tiny cap gives every parameter its own bucket.
  expect_all_agree_at(train(ddp::allreduce_hook, 1, 5, 0.00001), 5);
}

TEST(StopRequest, CompressionHooksCarryIt) {
  expect_all_agree_at(train(ddp::fp16_compress_hook, 2, 4), 4);
  expect_all_agree_at(train(ddp::bf16_compress_hook, 0, 2), 2);
  auto powersgd = [] { return ddp::powerSGD_hook(ddp::PowerSGDOptions().start_powerSGD_iter(2)); };
  expect_all_agree_at(train(powersgd, 1, 1), 1);  // before PowerSGD starts: a plain all-reduce
  expect_all_agree_at(train(powersgd, 1, 6), 6);  // compressed iterations
}

TEST(StopRequest, WithoutARequestNothingIsAgreed) {
  Outcome o = train(ddp::allreduce_hook, /*asker=*/-1, 0);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(o.agreed_after[r], 0) << "rank " << r;
}

TEST(StopRequest, TheFlagLeavesTheGradientsAsTheyAre) {
  std::mutex mutex;
  std::vector<std::vector<torch::Tensor>> grads(2, std::vector<torch::Tensor>(kWorld * 4));
  for (int with = 0; with < 2; ++with) {
    ddp::test::run_ranks(kWorld, [&](int rank, ddp::ProcessGroupPtr pg) {
      SmallNet net = fixed_net();
      auto options = ddp::DistributedDataParallelOptions();
      auto stop = std::make_shared<ddp::StopRequest>();
      if (with) options.stop_request(stop);
      if (with && rank == 1) stop->request();
      ddp::DistributedDataParallel model(net, pg, options);
      // Per-rank inputs without the process-wide generator, which the rank threads share.
      auto x = torch::arange(24, torch::kFloat32).reshape({4, 6}).sin() * (rank + 1);
      model(x).pow(2).mean().backward();
      std::lock_guard<std::mutex> lock(mutex);
      int k = 0;
      for (auto& p : net->parameters()) grads[with][rank * 4 + k++] = p.grad().clone();
    });
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << "gradient " << i;
  }
}

TEST(StopRequest, AgreeWithoutDdpIsOneCollective) {
  std::vector<int> agreed(kWorld, -1);
  ddp::test::run_ranks(kWorld, [&](int rank, ddp::ProcessGroupPtr pg) {
    ddp::StopRequest stop;
    const bool first = stop.agree(*pg);
    if (rank == 2) stop.request();
    const bool second = stop.agree(*pg);
    agreed[rank] = (first ? 10 : 0) + (second ? 1 : 0);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(agreed[r], 1) << "rank " << r;
}

TEST(StopRequest, AListenedSignalRequestsIt) {
  ddp::StopRequest stop(ddp::StopRequestOptions().signals({SIGUSR2}));
  EXPECT_FALSE(stop.requested());
  ASSERT_EQ(::raise(SIGUSR2), 0);  // handled: the process goes on
  EXPECT_TRUE(stop.requested());
  EXPECT_EQ(stop.signal(), SIGUSR2);
  // A later request object does not inherit an earlier signal.
  ddp::StopRequest later(ddp::StopRequestOptions().signals({SIGUSR2}));
  EXPECT_FALSE(later.requested());
}

TEST(StopRequest, AnUncatchableSignalIsAUsageError) {
  try {
    ddp::StopRequest stop(ddp::StopRequestOptions().signals({SIGKILL}));
    FAIL() << "SIGKILL accepted";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be caught"), std::string::npos) << e.what();
  }
}

}  // namespace
