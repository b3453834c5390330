// static_graph: parameters whose gradient hook fires several times per backward, unused
// parameters fixed by the first iteration (no graph search), and the errors when the graph
// changes anyway.
#include <gtest/gtest.h>

#include <optional>

#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::DistributedDataParallel;
using ddp::DistributedDataParallelOptions;
using ddp::test::run_ranks;

// `shared` is applied twice in every forward: its hooks fire twice per backward.
struct SharedTwiceImpl : torch::nn::Module {
  SharedTwiceImpl()
      : shared(register_module("shared", torch::nn::Linear(6, 6))),
        head(register_module("head", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    return head(torch::tanh(shared(torch::tanh(shared(x)))));
  }
  torch::nn::Linear shared;
  torch::nn::Linear head;
};
TORCH_MODULE(SharedTwice);

// Activation checkpointing as torch.utils.checkpoint(use_reentrant=True) does it: forward runs
// a Linear without building a graph; backward runs it again with one and calls backward inside
// backward (a reentrant backward, in which the Linear's gradient hooks fire).
struct ReentrantCheckpoint : torch::autograd::Function<ReentrantCheckpoint> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               torch::nn::LinearImpl* segment) {
    ctx->saved_data["segment"] = reinterpret_cast<int64_t>(segment);
    ctx->save_for_backward({x});
    return segment->forward(x);  // grad mode is off inside a Function's forward
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* segment = reinterpret_cast<torch::nn::LinearImpl*>(ctx->saved_data["segment"].toInt());
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = segment->forward(x);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), torch::Tensor()};
  }
};

// The checkpointed layer is the last one: its hooks fire first, inside the reentrant backward,
// whose end comes before the other layers' gradients.
struct CheckpointedImpl : torch::nn::Module {
  CheckpointedImpl()
      : body(register_module("body", torch::nn::Linear(6, 6))),
        segment(register_module("segment", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    return ReentrantCheckpoint::apply(torch::tanh(body(x)), segment.get());
  }
  torch::nn::Linear body;
  torch::nn::Linear segment;
};
TORCH_MODULE(Checkpointed);

constexpr int kWorld = 2, kBatch = 3, kSteps = 4;

struct Data {
  std::vector<torch::Tensor> xs, ys;  // per step, the whole batch of kWorld * kBatch rows
};

Data make_data(int64_t features) {
  torch::manual_seed(21);
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.xs.push_back(torch::randn({kWorld * kBatch, features}));
    d.ys.push_back(torch::randn({kWorld * kBatch, 3}));
  }
  return d;
}

// kSteps of SGD with momentum on each whole batch: the single-process reference.
template <typename Net>
void train_reference(Net ref, const Data& data) {
  torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::mse_loss(ref->forward(data.xs[s]), data.ys[s]).backward();
    opt.step();
  }
}

// The same steps under DDP, rank r on its slice of each batch; returns the number of buckets.
template <typename Net>
size_t train_under_ddp(Net net, ddp::ProcessGroupPtr pg,
                       const DistributedDataParallelOptions& options, const Data& data, int r) {
  DistributedDataParallel model(net, pg, options);
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto x = data.xs[s].narrow(0, r * kBatch, kBatch);
    auto y = data.ys[s].narrow(0, r * kBatch, kBatch);
    torch::mse_loss(model(x), y).backward();
    model.step(opt);
  }
  return model.bucket_names().size();
}

// kWorld replicas of `initial` (each rank trains its own).
template <typename Net>
std::vector<Net> replicas_of(Net initial) {  // a module holder: a handle, not a copy
  std::vector<Net> nets(kWorld);
  for (auto& n : nets) ddp::test::copy_state(*initial, *n);
  return nets;
}

// Every rank's parameters equal the single-process reference's.
template <typename Net>
void expect_ranks_match(std::vector<Net> nets, Net ref) {  // handles, as above
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_LT(ddp::test::max_relative_error(*nets[r], *ref), 1e-5) << "rank " << r;
  }
}

TEST(StaticGraph, ParameterUsedTwiceTrainsLikeOneProcess) {
  torch::set_num_threads(1);
  const Data data = make_data(6);
  SharedTwice ref;
  SharedTwice initial;
  ddp::test::copy_state(*ref, *initial);
  train_reference(ref, data);
  // One parameter per bucket, so each bucket waits for its parameter's second firing; and
  // the same with the gradients living in the buckets.
  for (bool as_view : {false, true}) {
    SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "default");
    auto nets = replicas_of(initial);
    run_ranks(kWorld, [&](int r, ddp::ProcessGroupPtr pg) {
      const size_t buckets = train_under_ddp(nets[r], pg,
                                             DistributedDataParallelOptions()
                                                 .static_graph(true)
                                                 .bucket_cap_mb(1e-6)
                                                 .first_bucket_cap_mb(1e-6)
                                                 .gradient_as_bucket_view(as_view),
                                             data, r);
      EXPECT_EQ(buckets, 4u);
    });
    expect_ranks_match(nets, ref);
  }
}

TEST(StaticGraph, ReentrantBackwardTrainsLikeOneProcess) {
  torch::set_num_threads(1);
  const Data data = make_data(6);
  Checkpointed ref;
  Checkpointed initial;
  ddp::test::copy_state(*ref, *initial);
  train_reference(ref, data);
  auto nets = replicas_of(initial);
  run_ranks(kWorld, [&](int r, ddp::ProcessGroupPtr pg) {
    train_under_ddp(
        nets[r], pg,
        DistributedDataParallelOptions().static_graph(true).bucket_cap_mb(1e-6).first_bucket_cap_mb(
            1e-6),
        data, r);
  });
  expect_ranks_match(nets, ref);
}

// Gradient accumulation under static_graph: a micro-batch under no_sync() (hooks fire twice,
// nothing is counted or reduced), then a synchronized one, in every step including the first.
TEST(StaticGraph, NoSyncAccumulationWithASharedParameter) {
  torch::set_num_threads(1);
  const Data data = make_data(6);
  auto micro = [&](int s, int m) { return (s + m) % kSteps; };  // data index of micro-batch m
  SharedTwice ref;
  SharedTwice initial;
  ddp::test::copy_state(*ref, *initial);
  {
    torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      for (int m = 0; m < 2; ++m) {
        torch::mse_loss(ref->forward(data.xs[micro(s, m)]), data.ys[micro(s, m)]).backward();
      }
      opt.step();
    }
  }
  auto nets = replicas_of(initial);
  run_ranks(kWorld, [&](int r, ddp::ProcessGroupPtr pg) {
    DistributedDataParallel model(nets[r], pg, DistributedDataParallelOptions().static_graph(true));
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      for (int m = 0; m < 2; ++m) {
        std::optional<ddp::NoSyncGuard> guard;
        if (m == 0) guard.emplace(model.no_sync());
        auto x = data.xs[micro(s, m)].narrow(0, r * kBatch, kBatch);
        auto y = data.ys[micro(s, m)].narrow(0, r * kBatch, kBatch);
        torch::mse_loss(model(x), y).backward();
      }
      model.step(opt);
    }
  });
  expect_ranks_match(nets, ref);
}

// Branchy's b and never are unused in every iteration. With static_graph they are found from
// the first backward's hook counts: no forward searches the graph, yet training equals one
// process (unused gradients stay undefined); without it every forward searches.
TEST(StaticGraph, UnusedParametersAreFixedByTheFirstIterationWithoutGraphSearch) {
  torch::set_num_threads(1);
  const Data data = make_data(6);
  ddp::test::Branchy ref;
  ddp::test::Branchy initial;
  ddp::test::copy_state(*ref, *initial);
  const auto mask = torch::ones({kBatch});
  {
    torch::optim::Adam opt(ref->parameters(), 1e-2);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      torch::mse_loss(ref->forward(data.xs[s], false, mask), data.ys[s]).backward();
      opt.step();
    }
  }
  for (bool static_graph : {true, false}) {
    SCOPED_TRACE(static_graph ? "static_graph" : "dynamic graph");
    auto nets = replicas_of(initial);
    std::vector<int64_t> searches(kWorld, -1);
    run_ranks(kWorld, [&](int r, ddp::ProcessGroupPtr pg) {
      DistributedDataParallel model(
          nets[r], pg,
          DistributedDataParallelOptions().find_unused_parameters(true).static_graph(static_graph));
      torch::optim::Adam opt(model.parameters(), 1e-2);
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        auto x = data.xs[s].narrow(0, r * kBatch, kBatch);
        auto y = data.ys[s].narrow(0, r * kBatch, kBatch);
        torch::mse_loss(model(x, false, mask), y).backward();
        model.step(opt);
      }
      searches[r] = model.unused_parameter_searches();
    });
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(searches[r], static_graph ? 0 : kSteps) << "rank " << r;
      EXPECT_LT(ddp::test::max_relative_error(*nets[r], *ref), 1e-5) << "rank " << r;
      EXPECT_FALSE(nets[r]->b->weight.grad().defined()) << "rank " << r;
      EXPECT_FALSE(nets[r]->never->weight.grad().defined()) << "rank " << r;
    }
  }
}

// Runs two iterations of Branchy with static_graph, b used as `use_b` says per iteration;
// returns every rank's error message.
std::vector<std::string> change_graph(bool first, bool second) {
  std::vector<std::string> messages;
  auto errors = ddp::test::run_ranks_collect(kWorld, [&](int, ddp::ProcessGroupPtr pg) {
    ddp::test::Branchy net;
    DistributedDataParallel model(net, pg, DistributedDataParallelOptions().static_graph(true));
    torch::optim::SGD opt(model.parameters(), 0.1);
    for (bool use_b : {first, second}) {
      opt.zero_grad();
      model(torch::randn({2, 6}), use_b, torch::ones({2})).sum().backward();
      model.step(opt);
    }
  });
  for (const auto& e : errors) messages.push_back(ddp::test::message_of(e));
  return messages;
}

TEST(StaticGraph, AParameterThatAppearsLaterIsAnError) {
  for (const auto& message : change_graph(false, true)) {
    EXPECT_NE(message.find("DDP static_graph: parameter 'b."), std::string::npos) << message;
    EXPECT_NE(message.find("received a gradient in iteration 2"), std::string::npos) << message;
    EXPECT_NE(message.find("but none in the first iteration"), std::string::npos) << message;
  }
}

TEST(StaticGraph, AParameterThatDisappearsIsAnError) {
  for (const auto& message : change_graph(true, false)) {
    EXPECT_NE(message.find("DDP static_graph: 2 parameter(s) received fewer gradients in "
                           "iteration 2"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("'b.weight' (0 of 1)"), std::string::npos) << message;
  }
}

}  // namespace
