// State dicts, buffer broadcast, the timeline and the find_unused_parameters advice.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/straggler.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/remove_tree.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::DistributedDataParallel;
using ddp::DistributedDataParallelOptions;
using ddp::test::run_ranks;

torch::nn::Sequential make_bn_net() {
  return torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4),
                               torch::nn::Linear(4, 2));
}

std::vector<std::string> keys_of(const ddp::StateDict& d) {
  return d.keys();
}

TEST(DdpFeatures, StateDictHasTheModuleKeysAndSnapshotsInterchange) {
  auto net = make_bn_net();
  auto plain = make_bn_net();
  run_ranks(1, [&](int, ddp::ProcessGroupPtr pg) {
    DistributedDataParallel model(net, pg);
    // Train a little so the state differs from plain's.
    torch::optim::SGD opt(model.parameters(), 0.1);
    model(torch::randn({8, 4})).sum().backward();
    model.step(opt);

    auto keys = keys_of(model.state_dict());
    EXPECT_EQ(keys, keys_of(ddp::state_dict(*plain)));
    std::set<std::string> key_set(keys.begin(), keys.end());
    EXPECT_TRUE(key_set.count("1.running_mean")) << "buffers belong to the state dict";
    for (const auto& k : keys) EXPECT_NE(k.rfind("module.", 0), 0u) << k;

    // A snapshot of the wrapper's module loads into the bare module...
    std::stringstream stream;
    torch::serialize::OutputArchive out;
    model.module()->save(out);
    out.save_to(stream);
    torch::serialize::InputArchive in;
    in.load_from(stream);
    plain->load(in);
    for (const auto& item : model.state_dict()) {
      EXPECT_TRUE(torch::equal(item.value(), ddp::state_dict(*plain)[item.key()])) << item.key();
    }
    // ...and a state dict of the bare module loads into the wrapper.
    auto other = make_bn_net();
    ddp::load_state_dict(*other, model.state_dict());
    model.load_state_dict(ddp::state_dict(*other));
    EXPECT_EQ(model.named_parameters().keys(), plain->named_parameters().keys());
    EXPECT_EQ(model.named_buffers().keys(), plain->named_buffers().keys());
  });
}

TEST(DdpFeatures, ConstructionBroadcastsRankZerosParametersAndBuffers) {
  std::vector<torch::nn::Sequential> nets;
  for (int r = 0; r < 3; ++r) {
    nets.push_back(make_bn_net());
    torch::NoGradGuard no_grad;
    for (auto& b : nets.back()->buffers()) b.fill_(static_cast<double>(r + 1));
  }
  run_ranks(3, [&](int r, ddp::ProcessGroupPtr pg) { DistributedDataParallel model(nets[r], pg); });
  auto reference = ddp::state_dict(*nets[0]);
  for (int r = 1; r < 3; ++r) {
    for (const auto& item : ddp::state_dict(*nets[r])) {
      EXPECT_TRUE(torch::equal(item.value(), reference[item.key()]))
          << "rank " << r << " " << item.key();
    }
  }
  EXPECT_EQ(nets[2][1]->as<torch::nn::BatchNorm1d>()->running_mean[0].item<float>(), 1.0f);
}

TEST(DdpFeatures, TimelineHasForwardBackwardBucketsAndStep) {
  auto dir =
      std::filesystem::temp_directory_path() / ("ddp_timeline_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string pattern = (dir / "timeline_rank{rank}.json").string();
  run_ranks(2, [&](int, ddp::ProcessGroupPtr pg) {
    ddp::test::Cnn net;
    DistributedDataParallel model(net, pg, DistributedDataParallelOptions().timeline_path(pattern));
    torch::optim::Adam opt(model.parameters(), 1e-3);
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      torch::nll_loss(model(torch::randn({2, 1, 28, 28})), torch::tensor({1, 2})).backward();
      model.step(opt);
    }
  });  // written when the wrappers are destroyed
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("timeline_rank" + std::to_string(r) + ".json"));
    ASSERT_TRUE(in) << "rank " << r << " wrote no timeline";
    auto doc = nlohmann::json::parse(in);
    std::map<std::string, int> counts;
    for (const auto& e : doc.at("traceEvents")) {
      if (e.at("ph") == "X") {
        counts[e.at("name").get<std::string>()]++;
        EXPECT_GE(e.at("dur").get<int64_t>(), 0);
        EXPECT_EQ(e.at("pid"), r);
      }
    }
    EXPECT_EQ(counts["forward"], 2);
    EXPECT_EQ(counts["backward"], 2);
    EXPECT_EQ(counts["optimizer.step"], 2);
    EXPECT_EQ(counts["allreduce bucket 0"], 2);
    EXPECT_EQ(counts["allreduce bucket 1"], 2);
  }
  ddp::remove_tree(dir);
}

// Every collective DDP issues carries a flight recorder tag naming what it is for, so a hang
// report says "all_reduce #13 (DDP bucket 1, iteration 2)".
TEST(DdpFeatures, FlightRecorderTagsNameTheBucketAndIteration) {
  std::vector<std::set<std::string>> tags(2);
  run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    ASSERT_NE(pg->flight_recorder(), nullptr) << "the recorder is on by default";
    ddp::test::Cnn net;
    DistributedDataParallel model(net, pg);
    torch::optim::SGD opt(model.parameters(), 0.1);
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      torch::nll_loss(model(torch::randn({2, 1, 28, 28})), torch::tensor({1, 2})).backward();
      model.step(opt);
    }
    pg->all_reduce(nullptr, 0, ddp::DataType::kFloat32, ddp::ReduceOp::kSum)->wait(pg->timeout());
    const auto doc = nlohmann::json::parse(pg->flight_recorder()->dump_json("test"));
    for (const auto& e : doc["entries"]) tags[rank].insert(e.value("tag", ""));
  });
  for (int r = 0; r < 2; ++r) {
    for (const char* want :
         {"DDP construction", "DDP bucket 0, iteration 1", "DDP bucket order, iteration 1",
          "DDP bucket 0, iteration 2", "DDP bucket 1, iteration 2", ""}) {
      EXPECT_EQ(tags[r].count(want), 1u) << "rank " << r << " lacks tag '" << want << "'";
    }
  }
}

// What the "ddp.ddp" logger printed while `fn` ran.
std::string ddp_log_during(const std::function<void()>& fn) {
  auto logger = ddp::log::get("ddp.ddp");
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  logger->sinks().push_back(sink);
  fn();
  auto& sinks = logger->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  return captured.str();
}

TEST(DdpStraggler, FindStragglerNamesTheRankThatWaitedLeast) {
  // Rank 2 waited 10 ms over the window, the others 60 and 70 ms; steps of 100 ms: 55%.
  auto f = ddp::find_straggler({0.06, 0.07, 0.01}, {0.1, 0.1, 0.1}, 0.2);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 2);
  EXPECT_NEAR(f->cost_s, 0.055, 1e-9);
  EXPECT_NEAR(f->fraction, 0.55, 1e-9);
  EXPECT_FALSE(ddp::find_straggler({0.03, 0.02}, {0.1, 0.1}, 0.2)) << "10% is under 20%";
  EXPECT_FALSE(ddp::find_straggler({0.5}, {1.0}, 0.2)) << "one rank waits for nobody";
  f->first_iteration = 101;
  f->last_iteration = 200;
  EXPECT_EQ(ddp::describe(*f).rfind("DDP straggler: rank 2 made the other ranks wait 55% of "
                                    "each step over iterations 101-200 (0.6 ms of 1.0 ms per step",
                                    0),
            0u)
      << ddp::describe(*f);
}

// Rank 1 sleeps before every backward: rank 0 waits for it in the bucket all-reduces. With a
// window of 4 iterations rank 0 logs it once (iterations 2-5; the first has no step before it),
// and the timeline marks the waits.
TEST(DdpStraggler, SlowRankIsLoggedByRankZeroAndTheTimelineMarksTheWaits) {
  auto dir =
      std::filesystem::temp_directory_path() / ("ddp_straggler_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string pattern = (dir / "timeline_rank{rank}.json").string();
  ::setenv("DDP_STRAGGLER_WINDOW", "4", 1);
  const std::string log = ddp_log_during([&] {
    run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
      torch::nn::Linear net(8, 4);
      DistributedDataParallel model(net, pg,
                                    DistributedDataParallelOptions().timeline_path(pattern));
      torch::optim::SGD opt(model.parameters(), 0.1);
      for (int step = 0; step < 5; ++step) {
        opt.zero_grad();
        auto loss = model(torch::randn({2, 8})).sum();
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(60));
        loss.backward();
        model.step(opt);
      }
    });
  });
  ::unsetenv("DDP_STRAGGLER_WINDOW");
  EXPECT_NE(log.find("DDP straggler: rank 1 made the other ranks wait "), std::string::npos) << log;
  EXPECT_NE(log.find("over iterations 2-5"), std::string::npos) << log;
  std::ifstream in(dir / "timeline_rank0.json");
  ASSERT_TRUE(in);
  int waits = 0;
  const auto doc = nlohmann::json::parse(in);
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("name") == "wait for peers") ++waits;
  }
  EXPECT_GE(waits, 5) << "one wait span per iteration at least";
  ddp::remove_tree(dir);
}

// Three synchronized iterations with find_unused_parameters on: of a Linear layer (every
// parameter used), or of Branchy (its `never` layer is never used).
void train_with_find_unused(bool all_used) {
  run_ranks(2, [&](int, ddp::ProcessGroupPtr pg) {
    auto options = DistributedDataParallelOptions().find_unused_parameters(true);
    torch::nn::Linear linear(6, 3);
    ddp::test::Branchy branchy;
    std::optional<DistributedDataParallel<torch::nn::LinearImpl>> used(std::nullopt);
    std::optional<DistributedDataParallel<ddp::test::BranchyImpl>> partly(std::nullopt);
    if (all_used) {
      used.emplace(linear, pg, options);
    } else {
      partly.emplace(branchy, pg, options);
    }
    torch::optim::SGD opt(all_used ? linear->parameters() : branchy->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      auto x = torch::randn({2, 6});
      auto out = all_used ? (*used)(x) : (*partly)(x, true, torch::ones({2}));
      out.sum().backward();
      all_used ? used->step(opt) : partly->step(opt);
    }
  });
}

TEST(DdpFeatures, FindUnusedParametersWithNothingUnusedIsPointedOutOnce) {
  const std::string all_used = ddp_log_during([] { train_with_find_unused(true); });
  const std::string advice = "find_unused_parameters is on, but every parameter received";
  const size_t first = all_used.find(advice);
  EXPECT_NE(first, std::string::npos) << all_used;
  EXPECT_EQ(all_used.find(advice, first + 1), std::string::npos) << "warned more than once";

  const std::string some_unused = ddp_log_during([] { train_with_find_unused(false); });
  EXPECT_EQ(some_unused.find(advice), std::string::npos) << some_unused;
}

}  // namespace

// no_sync() is decided at forward time, as in PyTorch: what counts is whether the forward ran
// under the guard, not the backward. Gradients are compared with each rank's local gradient
// (same weights, its own batch) and with the average over the two ranks.
TEST(DdpNoSync, DecidedAtForwardTimeNotAtBackward) {
  torch::set_num_threads(1);
  torch::manual_seed(5);
  torch::nn::Linear base(6, 3);
  const std::vector<torch::Tensor> xs = {torch::randn({4, 6}), torch::randn({4, 6})};
  std::vector<torch::Tensor> local(2);
  for (int r = 0; r < 2; ++r) {
    torch::nn::Linear copy(6, 3);
    ddp::test::copy_state(*base, *copy);
    copy(xs[r]).pow(2).sum().backward();
    local[r] = copy->weight.grad().clone();
  }
  const torch::Tensor average = (local[0] + local[1]) / 2;
  ASSERT_FALSE(torch::allclose(local[0], average)) << "the ranks' batches must differ";

  enum Case {
    kForwardUnderGuard,
    kBackwardUnderGuard,
    kAccumulateThenSync,
    kDirectUnderGuard,
    kDirectBackwardUnderGuard,
    kCases
  };
  std::vector<std::vector<torch::Tensor>> got(kCases, std::vector<torch::Tensor>(2));
  run_ranks(2, [&](int r, ddp::ProcessGroupPtr pg) {
    torch::nn::Linear net(6, 3);
    ddp::test::copy_state(*base, *net);
    DistributedDataParallel model(net, pg);
    auto loss_of = [&](const torch::Tensor& out) { return out.pow(2).sum(); };
    torch::Tensor loss;
    // Forward under the guard, backward after it ended: stays local.
    {
      auto guard = model.no_sync();
      loss = loss_of(model(xs[r]));
    }
    loss.backward();
    got[kForwardUnderGuard][r] = net->weight.grad().clone();
    // Forward outside, backward under a guard: averaged.
    net->zero_grad();
    loss = loss_of(model(xs[r]));
    {
      auto guard = model.no_sync();
      loss.backward();
    }
    got[kBackwardUnderGuard][r] = net->weight.grad().clone();
    // Accumulation: a local backward, then a synchronized one averages both.
    net->zero_grad();
    {
      auto guard = model.no_sync();
      loss = loss_of(model(xs[r]));
    }
    loss.backward();
    loss_of(model(xs[r])).backward();
    got[kAccumulateThenSync][r] = net->weight.grad().clone();
    // module()->forward bypasses the wrapper: no decision is recorded, so the guard's state
    // when backward starts decides (documented).
    net->zero_grad();
    {
      auto guard = model.no_sync();
      loss = loss_of(model.module()->forward(xs[r]));
    }
    loss.backward();
    got[kDirectUnderGuard][r] = net->weight.grad().clone();
    net->zero_grad();
    loss = loss_of(model.module()->forward(xs[r]));
    {
      auto guard = model.no_sync();
      loss.backward();
    }
    got[kDirectBackwardUnderGuard][r] = net->weight.grad().clone();
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(torch::allclose(got[kForwardUnderGuard][r], local[r], 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(got[kBackwardUnderGuard][r], average, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(got[kAccumulateThenSync][r], 2 * average, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(got[kDirectUnderGuard][r], average, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(got[kDirectBackwardUnderGuard][r], local[r], 1e-5, 1e-6));
  }
}
