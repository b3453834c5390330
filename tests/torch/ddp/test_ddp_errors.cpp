// Error paths: the messages name the parameter, the ranks and the fix.
#include <gtest/gtest.h>

#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/util/error.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::DistributedDataParallel;
using ddp::DistributedDataParallelOptions;
using ddp::test::message_of;
using ddp::test::run_ranks_collect;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(DdpErrors, MismatchedShapesNameTheParameterAndTheRanks) {
  auto errors = run_ranks_collect(3, [](int r, ddp::ProcessGroupPtr pg) {
    torch::nn::Sequential net(torch::nn::Linear(5, 4), torch::nn::Linear(4, r == 2 ? 3 : 2));
    DistributedDataParallel model(net, pg);
  });
  for (int r = 0; r < 3; ++r) {
    const std::string msg = message_of(errors[r]);
    ASSERT_FALSE(msg.empty()) << "rank " << r << " accepted a mismatched model";
    EXPECT_TRUE(contains(msg, "1.weight")) << msg;
    EXPECT_TRUE(contains(msg, "[2, 4]")) << msg;
    EXPECT_TRUE(contains(msg, "[3, 4]")) << msg;
    EXPECT_TRUE(contains(msg, "rank 2")) << msg;
    EXPECT_TRUE(contains(msg, "same model")) << msg;
  }
}

TEST(DdpErrors, ExtraParameterOnOneRankIsNamed) {
  auto errors = run_ranks_collect(2, [](int r, ddp::ProcessGroupPtr pg) {
    torch::nn::Sequential net(torch::nn::Linear(5, 4));
    if (r == 1) net->push_back(torch::nn::Linear(4, 4));
    DistributedDataParallel model(net, pg);
  });
  for (int r = 0; r < 2; ++r) {
    const std::string msg = message_of(errors[r]);
    EXPECT_TRUE(contains(msg, "1.weight")) << msg;
    EXPECT_TRUE(contains(msg, "rank 1")) << msg;
  }
}

TEST(DdpErrors, MissingGradientNamesParametersAndSuggestsFindUnused) {
  auto errors = run_ranks_collect(2, [](int, ddp::ProcessGroupPtr pg) {
    ddp::test::Branchy net;
    DistributedDataParallel model(net, pg);
    auto x = torch::randn({2, 6});
    auto out = model(x, false, torch::ones({2}));
    out.sum().backward();
  });
  for (int r = 0; r < 2; ++r) {
    const std::string msg = message_of(errors[r]);
    ASSERT_FALSE(msg.empty()) << "rank " << r;
    EXPECT_TRUE(contains(msg, "'b.weight'")) << msg;
    EXPECT_TRUE(contains(msg, "'never.bias'")) << msg;
    EXPECT_TRUE(contains(msg, "find_unused_parameters(true)")) << msg;
  }
}

TEST(DdpErrors, TimelinePathNeedsRankPlaceholderWhenSeveralRanks) {
  auto errors = run_ranks_collect(2, [](int, ddp::ProcessGroupPtr pg) {
    torch::nn::Linear net(2, 2);
    DistributedDataParallel model(net, pg,
                                  DistributedDataParallelOptions().timeline_path("/tmp/t.json"));
  });
  for (auto& e : errors) EXPECT_TRUE(contains(message_of(e), "{rank}")) << message_of(e);
}

TEST(DdpErrors, NonPositiveBucketCapIsAUsageError) {
  auto errors = run_ranks_collect(1, [](int, ddp::ProcessGroupPtr pg) {
    torch::nn::Linear net(2, 2);
    DistributedDataParallel model(net, pg, DistributedDataParallelOptions().bucket_cap_mb(0));
  });
  EXPECT_TRUE(contains(message_of(errors[0]), "bucket_cap_mb")) << message_of(errors[0]);
}

TEST(DdpErrors, NullModuleOrGroupIsAUsageError) {
  EXPECT_THROW(DistributedDataParallel(std::shared_ptr<torch::nn::LinearImpl>(), nullptr),
               ddp::UsageError);
}

// One rank leaves the loop after one iteration (it ran out of data); the other's next
// all-reduce times out with the iteration and the cause, instead of hanging. Both bucket sizes:
// a small bucket reduces inline on the backward thread (bounded by the group's timeout), a
// large one on the communication thread (bounded by DDP's timeout).
TEST(DdpErrors, RankThatRanOutOfDataGetsTheUnevenIterationsHint) {
  for (int64_t width : {4, 200}) {  // 500 and 20,100 parameters: under and over the inline limit
    auto errors = run_ranks_collect(
        2,
        [&](int rank, ddp::ProcessGroupPtr pg) {
          torch::nn::Linear net(width, 100);
          DistributedDataParallel model(
              net, pg, DistributedDataParallelOptions().timeout(std::chrono::seconds(2)));
          torch::optim::SGD opt(net->parameters(), 0.1);
          for (int step = 0; step < (rank == 0 ? 3 : 1); ++step) {
            opt.zero_grad();
            model(torch::randn({2, width})).sum().backward();
            model.step(opt);
          }
        },
        std::chrono::seconds(4));
    const std::string msg = message_of(errors[0]);
    EXPECT_TRUE(contains(msg, "in iteration 2 did not finish on rank 0")) << width << ": " << msg;
    EXPECT_TRUE(contains(msg, "ranks run different numbers of iterations")) << msg;
    EXPECT_TRUE(contains(msg, "DistributedSampler")) << msg;
    EXPECT_FALSE(errors[1]) << message_of(errors[1]);
  }
}

}  // namespace
