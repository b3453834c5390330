// ZeroRedundancyOptimizer checkpoints: each rank writes its own shard of the optimizer state
// (no gather), and a checkpoint saved by 4 ranks loads on 2 and on 3, where the parameters'
// new owners read their state: the state and the next step equal an unsharded Adam's.
#include <gtest/gtest.h>

#include <mutex>

#include "../ddp/rank_threads.hpp"
#include "checkpoint_test_util.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"

namespace ddp {
namespace {

using test::make_model;
using test::set_grads;
using test::TempDir;

constexpr int kStepsBeforeSave = 3;

// An unsharded Adam on one model: what every shard must match.
struct Reference {
  torch::nn::Sequential model = make_model(0.2);
  torch::optim::Adam adam{model->parameters(), torch::optim::AdamOptions(0.05)};

  void step(int s) {
    set_grads(*model, s);
    adam.step();
  }
  const torch::optim::AdamParamState& state(size_t i) {
    return static_cast<const torch::optim::AdamParamState&>(
        *adam.state().at(model->parameters()[i].unsafeGetTensorImpl()));
  }
};

void save_with_zero(const std::string& dir, int world) {
  test::run_ranks(world, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.2);
    ZeroRedundancyOptimizer<torch::optim::Adam> zero(model->parameters(),
                                                     torch::optim::AdamOptions(0.05), pg);
    for (int s = 0; s < kStepsBeforeSave; ++s) {
      set_grads(*model, s);
      zero.step();
    }
    Checkpointer ckpt(CheckpointOptions(dir), pg);
    ckpt.save({kStepsBeforeSave, 0, kStepsBeforeSave}, *model, &zero);
    ckpt.wait();
  });
}

void load_and_compare(const std::string& dir, int world) {
  Reference ref;
  for (int s = 0; s < kStepsBeforeSave; ++s) ref.step(s);
  std::mutex mu;
  size_t states_held = 0;
  std::vector<torch::Tensor> after_next_step;
  test::run_ranks(world, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(9.0);
    ZeroRedundancyOptimizer<torch::optim::Adam> zero(model->parameters(),
                                                     torch::optim::AdamOptions(0.7), pg);
    Checkpointer ckpt(CheckpointOptions(dir), pg);
    auto r = ckpt.load_newest(*model, &zero);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->progress.step, kStepsBeforeSave);
    auto params = model->parameters();
    auto& local = zero.local_optimizer();
    {
      std::lock_guard<std::mutex> lock(mu);
      states_held += local.state().size();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i], ref.model->parameters()[i])) << "parameter " << i;
      auto it = local.state().find(params[i].unsafeGetTensorImpl());
      if (it == local.state().end()) continue;  // another rank's shard
      const auto& got = static_cast<const torch::optim::AdamParamState&>(*it->second);
      EXPECT_EQ(got.step(), ref.state(i).step());
      EXPECT_TRUE(torch::equal(got.exp_avg(), ref.state(i).exp_avg())) << "parameter " << i;
      EXPECT_TRUE(torch::equal(got.exp_avg_sq(), ref.state(i).exp_avg_sq())) << "parameter " << i;
    }
    set_grads(*model, kStepsBeforeSave);
    zero.step();  // the learning rate came back too (0.05, not 0.7)
    std::lock_guard<std::mutex> lock(mu);
    if (after_next_step.empty()) {
      for (auto& p : params) after_next_step.push_back(p.detach().clone());
    }
  });
  EXPECT_EQ(states_held, ref.model->parameters().size())
      << "every parameter's state is held by exactly one rank";
  ref.step(kStepsBeforeSave);
  for (size_t i = 0; i < after_next_step.size(); ++i) {
    EXPECT_TRUE(torch::equal(after_next_step[i], ref.model->parameters()[i])) << "parameter " << i;
  }
}

TEST(CheckpointReshard, ZeroSavedByFourRanksLoadsOnTwo) {
  TempDir dir;
  save_with_zero(dir.path(), 4);
  load_and_compare(dir.path(), 2);
}

TEST(CheckpointReshard, ZeroSavedByFourRanksLoadsOnThree) {
  TempDir dir;
  save_with_zero(dir.path(), 4);
  load_and_compare(dir.path(), 3);
}

TEST(CheckpointReshard, EachRankWritesItsOwnShardOfTheOptimizerState) {
  TempDir dir;
  save_with_zero(dir.path(), 4);
  const auto list = Checkpointer::list(dir.path());
  ASSERT_EQ(list.size(), 1u);
  // Four shard files, and none of them holds all the optimizer state: no gather happened.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(list[0].second)) {
    if (e.path().extension() == ".distcp") ++files;
  }
  EXPECT_EQ(files, 4);
}

}  // namespace
}  // namespace ddp
