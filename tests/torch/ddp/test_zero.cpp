// ZeroRedundancyOptimizer at 2 ranks (threads): the same parameters as an unsharded optimizer
// after a few steps, about half the optimizer state per rank, and the snapshot round trip
// (ZeRO -> consolidated full state -> unsharded optimizer, and a full state back into ZeRO).
#include <gtest/gtest.h>

#include <sstream>

#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/optim/fused_adam.hpp"
#include "ddp/torch/optim/optimizer_state_bytes.hpp"
#include "ddp/torch/optim/optimizer_state_key.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/util/error.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::ZeroRedundancyOptimizer;

constexpr int kSteps = 5;

// Parameter sizes 1024, 512, 512, 32, 32, 16: PyTorch's partition gives 2 ranks 1072 and 1056
// elements.
torch::nn::Sequential make_mlp() {
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                            torch::nn::Tanh(), torch::nn::Linear(32, 16));
  // From a formula, not the global RNG: rank threads build their models concurrently.
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : net->parameters()) {
    p.copy_((torch::arange(p.numel(), torch::kFloat32) * 0.53 + k++).sin().mul(0.3).view_as(p));
  }
  return net;
}

std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step) {
  auto x = (torch::arange(8 * 16, torch::kFloat32) * 0.37 + (rank * 5 + step * 0.3))
               .sin()
               .reshape({8, 16});
  auto y = (torch::arange(8 * 16, torch::kFloat32) * 0.21 + (rank * 2 + step * 0.7))
               .cos()
               .reshape({8, 16});
  return {x, y};
}

// The gradient DDP averages at 2 ranks, computed locally: the mean of both ranks' losses.
void reference_backward(torch::nn::Sequential& net, int step) {
  torch::Tensor loss;
  for (int r = 0; r < 2; ++r) {
    auto [x, y] = batch(r, step);
    auto l = torch::mse_loss(net->forward(x), y) / 2;
    loss = r == 0 ? l : loss + l;
  }
  loss.backward();
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    const double err = ((a[k] - b[k]).norm() / b[k].norm()).item<double>();
    EXPECT_LT(err, 1e-5) << what << ": parameter " << k;
  }
}

// One step of DDP + ZeRO on this rank's batch and, beside it, of the unsharded optimizer on
// the gradient DDP averages.
template <typename Model>
void step_both(int rank, int step, Model& model, torch::optim::Optimizer& zero,
               torch::nn::Sequential& ref, torch::optim::Optimizer& plain) {
  zero.zero_grad();
  auto [x, y] = batch(rank, step);
  torch::mse_loss(model(x), y).backward();
  zero.step();
  plain.zero_grad();
  reference_backward(ref, step);
  plain.step();
}

// Trains with DDP + ZeRO<Opt> and, beside it on each rank, an unsharded Opt on the averaged
// gradient; returns per rank {ZeRO's state bytes, the unsharded one's}.
template <typename Opt>
std::vector<std::pair<size_t, size_t>> train_against_unsharded(
    const typename ZeroRedundancyOptimizer<Opt>::Options& options) {
  std::vector<std::pair<size_t, size_t>> bytes(2);
  ddp::test::run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    auto net = make_mlp();
    auto ref = make_mlp();
    ddp::DistributedDataParallel model(net, pg);
    ZeroRedundancyOptimizer<Opt> zero(model.parameters(), options, pg);
    Opt plain(ref->parameters(), options);
    for (int step = 0; step < kSteps; ++step) step_both(rank, step, model, zero, ref, plain);
    expect_close(net->parameters(), ref->parameters(), "rank " + std::to_string(rank));
    bytes[rank] = {zero.local_state_bytes(), ddp::optimizer_state_bytes(plain)};
  });
  return bytes;
}

TEST(ZeroRedundancyOptimizer, AdamMatchesUnshardedAdamWithHalfTheState) {
  auto bytes = train_against_unsharded<torch::optim::Adam>(torch::optim::AdamOptions(0.01));
  for (int rank = 0; rank < 2; ++rank) {
    const auto [sharded, full] = bytes[rank];
    std::cout << "rank " << rank << ": ZeRO Adam state " << sharded << " bytes, unsharded " << full
              << " bytes (" << static_cast<double>(sharded) / full << "x)\n";
    EXPECT_GT(sharded, 0u);
    EXPECT_LT(static_cast<double>(sharded), 0.6 * full);
  }
  EXPECT_EQ(bytes[0].first + bytes[1].first, bytes[0].second) << "the shards cover the state";
}

TEST(ZeroRedundancyOptimizer, SgdAdamWAndFusedAdamMatchUnsharded) {
  auto sgd =
      train_against_unsharded<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_LT(static_cast<double>(sgd[0].first), 0.6 * sgd[0].second);
  train_against_unsharded<torch::optim::AdamW>(torch::optim::AdamWOptions(0.01));
  train_against_unsharded<ddp::FusedAdam>(torch::optim::AdamOptions(0.01));
}

std::string archive_bytes(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_bytes(torch::optim::Optimizer& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.load(archive);
}

void expect_same_adam_state(torch::optim::Optimizer& a, const std::vector<torch::Tensor>& pa,
                            torch::optim::Optimizer& b, const std::vector<torch::Tensor>& pb) {
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t k = 0; k < pa.size(); ++k) {
    auto key = [](const torch::Tensor& p) { return ddp::optimizer_state_key(p); };
    ASSERT_TRUE(a.state().count(key(pa[k]))) << "parameter " << k;
    ASSERT_TRUE(b.state().count(key(pb[k]))) << "parameter " << k;
    auto& sa = static_cast<torch::optim::AdamParamState&>(*a.state()[key(pa[k])]);
    auto& sb = static_cast<torch::optim::AdamParamState&>(*b.state()[key(pb[k])]);
    EXPECT_EQ(sa.step(), sb.step());
    EXPECT_TRUE(torch::allclose(sa.exp_avg(), sb.exp_avg(), 1e-5, 1e-7)) << "parameter " << k;
    EXPECT_TRUE(torch::allclose(sa.exp_avg_sq(), sb.exp_avg_sq(), 1e-5, 1e-9)) << k;
  }
}

TEST(ZeroRedundancyOptimizer, ConsolidatedStateLoadsIntoUnshardedAdamAndBack) {
  ddp::test::run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    auto net = make_mlp();
    auto ref = make_mlp();
    ddp::DistributedDataParallel model(net, pg);
    ZeroRedundancyOptimizer<torch::optim::Adam> zero(model.parameters(),
                                                     torch::optim::AdamOptions(0.01), pg);
    torch::optim::Adam plain(ref->parameters(), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 3; ++step) {
      step_both(rank, step, model, zero, ref, plain);
    }
    EXPECT_THROW(archive_bytes(zero), ddp::UsageError) << "not consolidated yet";
    zero.consolidate_state_dict(/*to_rank=*/1);
    if (rank == 0) {
      EXPECT_THROW(archive_bytes(zero), ddp::UsageError) << "rank 1 holds it";
    }

    // ZeRO -> full state on rank 1 -> an unsharded Adam with the reference's state.
    if (rank == 1) {
      auto copy = make_mlp();
      torch::optim::Adam unsharded(copy->parameters(), torch::optim::AdamOptions(0.01));
      load_bytes(unsharded, archive_bytes(zero));
      expect_same_adam_state(unsharded, copy->parameters(), plain, ref->parameters());
    }

    // A full (unsharded) state back into a fresh ZeRO on every rank, then one more step of
    // each: the same parameters.
    ZeroRedundancyOptimizer<torch::optim::Adam> restored(model.parameters(),
                                                         torch::optim::AdamOptions(0.01), pg);
    load_bytes(restored, archive_bytes(plain));
    EXPECT_EQ(ddp::optimizer_state_bytes(restored.local_optimizer()), zero.local_state_bytes());
    restored.zero_grad();
    auto [x, y] = batch(rank, 3);
    torch::mse_loss(model(x), y).backward();
    restored.step();
    plain.zero_grad();
    reference_backward(ref, 3);
    plain.step();
    expect_close(net->parameters(), ref->parameters(), "after loading the full state");
  });
}

// 3 ranks, 2 parameters: rank 2 owns nothing (an empty local optimizer and an empty part of
// the all-gather) and still ends with the updated parameters.
TEST(ZeroRedundancyOptimizer, RankWithoutParametersTakesPart) {
  ddp::test::run_ranks(3, [&](int rank, ddp::ProcessGroupPtr pg) {
    auto make = [] {
      return std::vector<torch::Tensor>{torch::linspace(-1, 1, 6).requires_grad_(true),
                                        torch::linspace(0, 1, 4).requires_grad_(true)};
    };
    auto params = make();
    auto ref = make();
    ZeroRedundancyOptimizer<torch::optim::Adam> zero(params, torch::optim::AdamOptions(0.1), pg);
    torch::optim::Adam plain(ref, torch::optim::AdamOptions(0.1));
    EXPECT_EQ(zero.shards()[2][0].size(), 0u);
    for (int step = 0; step < 3; ++step) {
      for (size_t k = 0; k < params.size(); ++k) {
        params[k].mutable_grad() = torch::cos(params[k].detach() * (step + 1));
        ref[k].mutable_grad() = torch::cos(ref[k].detach() * (step + 1));
      }
      zero.step();
      plain.step();
    }
    expect_close(params, ref, "rank " + std::to_string(rank));
    if (rank == 2) {
      EXPECT_EQ(zero.local_state_bytes(), 0u);
    }
  });
}

// add_param_group after some steps (fine-tuning unfreezes a layer): the new group is
// partitioned at the next step and trained, the first group's shards and state carry on;
// the result equals an unsharded optimizer given the same group at the same time. (Before,
// step() read past the local optimizer's groups.)
TEST(ZeroRedundancyOptimizer, AddParamGroupIsPartitionedAndTrained) {
  ddp::test::run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    auto net = make_mlp();
    auto ref = make_mlp();
    ddp::DistributedDataParallel model(net, pg);
    auto first_layers = [](torch::nn::Sequential& n) {
      std::vector<torch::Tensor> p = n[0]->parameters();
      for (auto& q : n[2]->parameters()) p.push_back(q);
      return p;
    };
    const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
    ZeroRedundancyOptimizer<torch::optim::SGD> zero(first_layers(net), options, pg);
    torch::optim::SGD plain(first_layers(ref), options);
    const auto last_before = net[4]->parameters()[0].detach().clone();
    for (int step = 0; step < kSteps; ++step) {
      if (step == 2) {
        zero.add_param_group(torch::optim::OptimizerParamGroup(
            net[4]->parameters(), std::make_unique<torch::optim::SGDOptions>(0.05)));
        plain.add_param_group(torch::optim::OptimizerParamGroup(
            ref[4]->parameters(), std::make_unique<torch::optim::SGDOptions>(0.05)));
      }
      step_both(rank, step, model, zero, ref, plain);
    }
    // The added layer trained, and every rank owns some of the new group's parameters or none.
    EXPECT_FALSE(torch::equal(net[4]->parameters()[0], last_before)) << "rank " << rank;
    ASSERT_EQ(zero.shards()[0].size(), 2u);
    EXPECT_EQ(zero.local_optimizer().param_groups().size(), 2u);
    expect_close(net->parameters(), ref->parameters(), "rank " + std::to_string(rank));
  });
}

// RMSprop and Adagrad (documented as supported) shard and step like their unsharded selves.
TEST(ZeroRedundancyOptimizer, RmspropAndAdagradMatchUnsharded) {
  train_against_unsharded<torch::optim::RMSprop>(torch::optim::RMSpropOptions(0.01));
  train_against_unsharded<torch::optim::Adagrad>(torch::optim::AdagradOptions(0.05));
}

// Two parameter groups with their own learning rates, and a learning-rate change made through
// param_groups() between steps (a scheduler's way): both reach the shards as they reach an
// unsharded optimizer.
TEST(ZeroRedundancyOptimizer, GroupsAndLearningRateChangesReachTheShards) {
  ddp::test::run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    auto net = make_mlp();
    auto ref = make_mlp();
    ddp::DistributedDataParallel model(net, pg);
    auto groups = [](torch::nn::Sequential& n) {
      std::vector<torch::Tensor> first = n[0]->parameters(), rest;
      for (int layer : {2, 4}) {
        for (auto& q : n[layer]->parameters()) rest.push_back(q);
      }
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(first, std::make_unique<torch::optim::AdamOptions>(0.02));
      g.emplace_back(rest, std::make_unique<torch::optim::AdamOptions>(0.005));
      return g;
    };
    const auto defaults = torch::optim::AdamOptions(0.01);
    ZeroRedundancyOptimizer<torch::optim::Adam> zero(groups(net), defaults, pg);
    torch::optim::Adam plain(groups(ref), defaults);
    for (int step = 0; step < kSteps; ++step) {
      if (step == 2) {
        for (torch::optim::Optimizer* o : {static_cast<torch::optim::Optimizer*>(&zero),
                                           static_cast<torch::optim::Optimizer*>(&plain)}) {
          static_cast<torch::optim::AdamOptions&>(o->param_groups()[1].options()).lr(0.05);
        }
      }
      step_both(rank, step, model, zero, ref, plain);
    }
    expect_close(net->parameters(), ref->parameters(), "rank " + std::to_string(rank));
    // The change mattered: without it the second group would have moved less.
    EXPECT_DOUBLE_EQ(
        static_cast<torch::optim::AdamOptions&>(zero.local_optimizer().param_groups()[1].options())
            .lr(),
        0.05);
  });
}

TEST(ZeroRedundancyOptimizer, RejectsMixedDtypes) {
  ddp::test::run_ranks(1, [&](int, ddp::ProcessGroupPtr pg) {
    auto a = torch::zeros({3}, torch::requires_grad());
    auto b = torch::zeros({3}, torch::dtype(torch::kFloat64).requires_grad(true));
    EXPECT_THROW(
        ZeroRedundancyOptimizer<torch::optim::SGD>({a, b}, torch::optim::SGDOptions(0.1), pg),
        ddp::UsageError);
  });
}

}  // namespace
