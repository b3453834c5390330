// SyncBatchNorm: N ranks with batches B_r each compute what one BatchNorm computes on the
// concatenated batch (outputs, input gradients, summed weight/bias gradients, running stats),
// in float64 and float32, for 1d/2d/3d, uneven batches and momentum unset; eval and world 1
// are plain BatchNorm without communication; convert_sync_batchnorm and DDP's group hand-over.
#include <gtest/gtest.h>

#include <numeric>

#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/nn/sync_batch_norm.hpp"
#include "ddp/util/error.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::test::run_ranks;

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / (b.norm().item<double>() + 1e-30);
}

struct Case {
  std::vector<int64_t> batches;  // per rank
  std::vector<int64_t> tail;     // (C, spatial...)
  torch::nn::BatchNormOptions options{3};
  torch::Dtype dtype = torch::kDouble;
  double tol = 1e-10;
  int steps = 3;
};

// One reference layer `Bn` on the whole batch against world = batches.size() ranks of `Sync`.
template <class Sync, class Bn>
void check_equivalence(const Case& c) {
  torch::set_num_threads(1);
  const int world = static_cast<int>(c.batches.size());
  const int64_t total = std::accumulate(c.batches.begin(), c.batches.end(), int64_t{0});
  std::vector<int64_t> shape{total};
  shape.insert(shape.end(), c.tail.begin(), c.tail.end());
  torch::manual_seed(7);
  std::vector<torch::Tensor> xs, gs;
  for (int s = 0; s < c.steps; ++s) {
    xs.push_back((torch::randn(shape, torch::kDouble) * 2 + 0.5).to(c.dtype));
    gs.push_back(torch::randn(shape, torch::kDouble).to(c.dtype));
  }
  Bn ref(c.options);
  ref->to(c.dtype);
  if (c.options.affine()) {
    torch::NoGradGuard no_grad;
    ref->weight.uniform_(0.5, 1.5);
    ref->bias.uniform_(-0.5, 0.5);
  }
  std::vector<Sync> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back(c.options);
    ranks.back()->to(c.dtype);
    ddp::test::copy_state(*ref, *ranks.back());
  }
  // Reference results per step.
  std::vector<torch::Tensor> ys, dxs, dws, dbs, rms, rvs;
  for (int s = 0; s < c.steps; ++s) {
    auto x = xs[s].clone().requires_grad_();
    auto y = ref(x);
    (y * gs[s]).sum().backward();
    ys.push_back(y.detach());
    dxs.push_back(x.grad());
    if (c.options.affine()) {
      dws.push_back(ref->weight.grad().clone());
      dbs.push_back(ref->bias.grad().clone());
      ref->weight.mutable_grad().zero_();
      ref->bias.mutable_grad().zero_();
    }
    if (c.options.track_running_stats()) {
      rms.push_back(ref->running_mean.clone());
      rvs.push_back(ref->running_var.clone());
    }
  }
  run_ranks(world, [&](int r, ddp::ProcessGroupPtr pg) {
    auto& layer = ranks[r];
    layer->set_process_group(pg);
    const int64_t offset = std::accumulate(c.batches.begin(), c.batches.begin() + r, int64_t{0});
    const int64_t B = c.batches[r];
    for (int s = 0; s < c.steps; ++s) {
      auto x = xs[s].narrow(0, offset, B).clone().requires_grad_();
      auto y = layer(x);
      (y * gs[s].narrow(0, offset, B)).sum().backward();
      if (B > 0) {
        EXPECT_LT(rel(y, ys[s].narrow(0, offset, B)), c.tol) << "output, rank " << r;
        EXPECT_LT(rel(x.grad(), dxs[s].narrow(0, offset, B)), c.tol) << "input grad, rank " << r;
      }
      if (c.options.affine()) {
        // Local gradients: their sum over ranks is the whole batch's (DDP averages them).
        for (auto* p : {&layer->weight, &layer->bias}) {
          auto g = p->grad().clone();
          ddp::all_reduce(*pg, g)->wait(pg->timeout());
          EXPECT_LT(rel(g, (p == &layer->weight ? dws : dbs)[s]), c.tol)
              << (p == &layer->weight ? "weight" : "bias") << " grad, rank " << r;
          p->mutable_grad().zero_();
        }
      }
      if (c.options.track_running_stats()) {
        EXPECT_LT(rel(layer->running_mean, rms[s]), c.tol) << "running_mean, rank " << r;
        EXPECT_LT(rel(layer->running_var, rvs[s]), c.tol) << "running_var, rank " << r;
        EXPECT_EQ(layer->num_batches_tracked.template item<int64_t>(), s + 1);
      }
    }
  });
}

TEST(SyncBatchNorm, Matches2dOverConcatenatedBatchWorld2And3) {
  check_equivalence<ddp::SyncBatchNorm2d, torch::nn::BatchNorm2d>({{4, 4}, {3, 5, 5}});
  check_equivalence<ddp::SyncBatchNorm2d, torch::nn::BatchNorm2d>({{4, 4, 4}, {3, 5, 5}});
}

TEST(SyncBatchNorm, Matches2dFloat32) {
  Case c{{4, 4}, {3, 6, 6}};
  c.dtype = torch::kFloat32;
  c.tol = 1e-5;
  check_equivalence<ddp::SyncBatchNorm2d, torch::nn::BatchNorm2d>(c);
}

TEST(SyncBatchNorm, UnevenBatchesAndAnEmptyRank) {
  check_equivalence<ddp::SyncBatchNorm2d, torch::nn::BatchNorm2d>({{3, 1, 6}, {3, 4, 4}});
  check_equivalence<ddp::SyncBatchNorm2d, torch::nn::BatchNorm2d>({{2, 0, 5}, {3, 4, 4}});
}

TEST(SyncBatchNorm, Matches1dAnd3dMomentumUnsetAndNoAffine) {
  Case flat{{3, 5}, {4}};
  flat.options = torch::nn::BatchNormOptions(4).momentum(c10::nullopt);
  check_equivalence<ddp::SyncBatchNorm1d, torch::nn::BatchNorm1d>(flat);
  Case seq{{2, 3, 2}, {4, 7}};
  seq.options = torch::nn::BatchNormOptions(4).affine(false);
  check_equivalence<ddp::SyncBatchNorm1d, torch::nn::BatchNorm1d>(seq);
  Case vol{{2, 2}, {2, 3, 4, 4}};
  vol.options = torch::nn::BatchNormOptions(2).momentum(0.3);
  check_equivalence<ddp::SyncBatchNorm3d, torch::nn::BatchNorm3d>(vol);
}

TEST(SyncBatchNorm, NoGroupOrWorld1IsBatchNormBitForBit) {
  torch::manual_seed(3);
  auto x = torch::randn({6, 3, 4, 4});
  torch::nn::BatchNorm2d ref(3);
  ddp::SyncBatchNorm2d alone(3);
  ddp::SyncBatchNorm2d one(3);
  run_ranks(1, [&](int, ddp::ProcessGroupPtr pg) { one->set_process_group(pg); });
  for (bool training : {true, false}) {
    for (auto* m : std::vector<torch::nn::Module*>{ref.get(), alone.get(), one.get()}) {
      m->train(training);
    }
    auto y = ref(x);
    EXPECT_TRUE(torch::equal(alone(x), y));
    EXPECT_TRUE(torch::equal(one(x), y));
    EXPECT_TRUE(torch::equal(alone->running_var, ref->running_var));
    EXPECT_TRUE(torch::equal(one->running_mean, ref->running_mean));
  }
}

TEST(SyncBatchNorm, EvalUsesRunningStatsWithoutCommunication) {
  torch::set_num_threads(1);
  torch::manual_seed(4);
  auto x = torch::randn({4, 3, 5, 5});
  // Only rank 0 runs forward: any collective would time out waiting for rank 1.
  auto errors = ddp::test::run_ranks_collect(
      2,
      [&](int r, ddp::ProcessGroupPtr pg) {
        if (r != 0) return;
        torch::nn::BatchNorm2d ref(3);
        ddp::SyncBatchNorm2d layer(3);
        {
          torch::NoGradGuard no_grad;
          ref->running_mean.uniform_(-1, 1);
          ref->running_var.uniform_(0.5, 2);
        }
        ddp::test::copy_state(*ref, *layer);
        layer->set_process_group(pg);
        ref->eval();
        layer->eval();
        EXPECT_TRUE(torch::equal(layer(x), ref(x)));
      },
      std::chrono::seconds(5));
  for (auto& e : errors) EXPECT_FALSE(e) << ddp::test::message_of(e);
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksIsAnErrorOnEveryRank) {
  auto errors = ddp::test::run_ranks_collect(2, [&](int r, ddp::ProcessGroupPtr pg) {
    ddp::SyncBatchNorm1d layer(3);
    layer->set_process_group(pg);
    layer(torch::randn({r == 0 ? 1 : 0, 3}));  // one value per channel in all
  });
  for (auto& e : errors) {
    EXPECT_NE(ddp::test::message_of(e).find("expected more than 1 value per channel"),
              std::string::npos)
        << ddp::test::message_of(e);
  }
}

struct Holder : torch::nn::Module {
  Holder()
      : features(register_module(
            "features", torch::nn::Sequential(torch::nn::Conv2d(1, 4, 3), torch::nn::BatchNorm2d(4),
                                              torch::nn::ReLU(), torch::nn::Flatten()))),
        list(register_module("list",
                             torch::nn::ModuleList(torch::nn::BatchNorm1d(4), torch::nn::ReLU()))),
        dict(register_module(
            "dict", torch::nn::ModuleDict(
                        std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
                            {"vol", torch::nn::BatchNorm3d(2).ptr()}}))),
        member(register_module("member", torch::nn::BatchNorm2d(4))) {}
  torch::nn::Sequential features;
  torch::nn::ModuleList list;
  torch::nn::ModuleDict dict;
  torch::nn::BatchNorm2d member;  // cannot be swapped from outside
};

TEST(SyncBatchNorm, ConvertReplacesBatchNormInContainers) {
  torch::manual_seed(5);
  auto net = std::make_shared<Holder>();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.uniform_(-1, 1);
    for (auto& b : net->named_buffers()) {
      if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 2);
    }
  }
  auto before = net->named_parameters();
  auto before_buffers = net->named_buffers();
  auto x = torch::randn({3, 1, 6, 6});
  auto y_before = net->features->forward(x);

  EXPECT_EQ(ddp::convert_sync_batchnorm(*net), 3);
  EXPECT_TRUE(std::dynamic_pointer_cast<ddp::SyncBatchNorm2dImpl>(net->features->ptr(1)));
  EXPECT_TRUE(std::dynamic_pointer_cast<ddp::SyncBatchNorm1dImpl>(net->list[0]));
  EXPECT_TRUE(std::dynamic_pointer_cast<ddp::SyncBatchNorm3dImpl>(net->dict["vol"]));
  EXPECT_TRUE(std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(net->member.ptr()));
  // Same names, copied values; the Sequential runs the new layer.
  auto after = net->named_parameters();
  ASSERT_EQ(after.size(), before.size());
  for (auto& item : before)
    EXPECT_TRUE(torch::equal(after[item.key()], item.value())) << item.key();
  auto after_buffers = net->named_buffers();
  ASSERT_EQ(after_buffers.size(), before_buffers.size());
  for (auto& item : before_buffers) {
    EXPECT_TRUE(torch::equal(after_buffers[item.key()], item.value())) << item.key();
  }
  EXPECT_FALSE(after["features.1.weight"].is_same(before["features.1.weight"]));
  EXPECT_TRUE(torch::equal(net->features->forward(x), y_before));
  // Second call: nothing left that a container holds.
  EXPECT_EQ(ddp::convert_sync_batchnorm(*net), 0);
  torch::nn::BatchNorm2d bare(4);
  EXPECT_THROW(ddp::convert_sync_batchnorm(*bare), ddp::UsageError);
}

struct SyncNet : torch::nn::Module {
  SyncNet()
      : a(register_module("a", ddp::SyncBatchNorm2d(2))),
        b(register_module("b", ddp::SyncBatchNorm2d(2))) {}
  torch::Tensor forward(torch::Tensor x) { return b(a(x)); }
  ddp::SyncBatchNorm2d a;
  ddp::SyncBatchNorm2d b;
};

TEST(SyncBatchNorm, DistributedDataParallelHandsOverItsGroup) {
  run_ranks(2, [&](int, ddp::ProcessGroupPtr pg) {
    auto net = std::make_shared<SyncNet>();
    net->b->set_process_group(nullptr);  // explicit: DDP leaves it alone
    ddp::DistributedDataParallel model(net, pg);
    EXPECT_EQ(net->a->process_group(), pg);
    EXPECT_EQ(net->b->process_group(), nullptr);
  });
}

// A converted CNN under DDP trains like BatchNorm on the whole batch in one process.
TEST(SyncBatchNorm, DdpTrainingMatchesOneProcessWithTheWholeBatch) {
  torch::set_num_threads(1);
  for (int world : {2, 3}) {
    const int B = 3, steps = 3;
    auto make = [] {
      return torch::nn::Sequential(torch::nn::Conv2d(1, 4, 3), torch::nn::BatchNorm2d(4),
                                   torch::nn::ReLU(), torch::nn::Flatten(),
                                   torch::nn::Linear(4 * 4 * 4, 3));
    };
    torch::manual_seed(6);
    std::vector<torch::Tensor> xs, ys;
    for (int s = 0; s < steps; ++s) {
      xs.push_back(torch::randn({world * B, 1, 6, 6}, torch::kDouble));
      ys.push_back(torch::randn({world * B, 3}, torch::kDouble));
    }
    auto ref = make();
    ref->to(torch::kDouble);
    std::vector<torch::nn::Sequential> models;
    for (int r = 0; r < world; ++r) {
      models.push_back(make());
      models.back()->to(torch::kDouble);
      ddp::test::copy_state(*ref, *models.back());
      EXPECT_EQ(ddp::convert_sync_batchnorm(*models.back()), 1);
    }
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      ref_opt.zero_grad();
      torch::mse_loss(ref->forward(xs[s]), ys[s]).backward();
      ref_opt.step();
    }
    run_ranks(world, [&](int r, ddp::ProcessGroupPtr pg) {
      ddp::DistributedDataParallel model(models[r], pg);
      torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        torch::mse_loss(model(xs[s].narrow(0, r * B, B)), ys[s].narrow(0, r * B, B)).backward();
        model.step(opt);
      }
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_LT(ddp::test::max_relative_error(*models[r], *ref), 1e-10)
          << "world " << world << " rank " << r;
      auto bn = std::dynamic_pointer_cast<ddp::SyncBatchNorm2dImpl>(models[r]->ptr(1));
      auto ref_bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(ref->ptr(1));
      EXPECT_LT(rel(bn->running_mean, ref_bn->running_mean), 1e-10);
      EXPECT_LT(rel(bn->running_var, ref_bn->running_var), 1e-10);
    }
  }
}

// convert_sync_batchnorm(module, group): every converted layer synchronizes over that group,
// and DistributedDataParallel over another group keeps it (it fills in only an unset group).
TEST(SyncBatchNorm, ConvertWithAnExplicitGroupKeepsIt) {
  ddp::test::run_ranks(1, [&](int, ddp::ProcessGroupPtr ddp_group) {
    ddp::test::run_ranks(1, [&](int, ddp::ProcessGroupPtr bn_group) {
      torch::nn::Sequential net(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3),
                                torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
      EXPECT_EQ(ddp::convert_sync_batchnorm(*net, bn_group), 2);
      ddp::DistributedDataParallel model(net.ptr(), ddp_group);
      int converted = 0;
      for (const auto& m : net->modules(false)) {
        if (auto* bn = dynamic_cast<ddp::SyncBatchNormBase*>(m.get())) {
          EXPECT_EQ(bn->process_group(), bn_group);
          ++converted;
        }
      }
      EXPECT_EQ(converted, 2);
    });
  });
}

}  // namespace
