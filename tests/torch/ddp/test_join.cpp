// ddp::Join on uneven inputs (rank 0: 9 batches, rank 1: 6), checked against PyTorch's own
// torch.distributed.algorithms.Join on the same model, data and optimizer: Debian's
// DDP_TEST_PYTHON (the .venv's interpreter) runs the reference (2 processes, gloo) at test time;
// nothing is checked in.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../data/python_helper.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/join.hpp"
#include "ddp/torch/nn/sync_batch_norm.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/util/error.hpp"
#include "rank_threads.hpp"

namespace {

using ddp::DistributedDataParallel;
using ddp::Join;
using ddp::JoinOptions;

constexpr int kBatches[2] = {9, 6};

// The same model, initial values and batches as the Python script below builds. `rich` adds
// a BatchNorm (buffers broadcast every forward) and a layer forward never uses.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool rich = false)
      : fc1(register_module("fc1", torch::nn::Linear(4, 6))),
        fc2(register_module("fc2", torch::nn::Linear(6, 2))) {
    if (rich) {
      bn = register_module("bn", torch::nn::BatchNorm1d(6));
      never = register_module("never", torch::nn::Linear(2, 2));
    }
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) {
      p.copy_((torch::arange(p.numel(), torch::kFloat32) * 0.7 + k * 1.3)
                  .sin()
                  .mul(0.5)
                  .reshape(p.sizes()));
      ++k;
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = fc1(x);
    if (bn) x = bn(x);
    return fc2(torch::tanh(x));
  }
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear never{nullptr};
};
TORCH_MODULE(Net);

std::pair<torch::Tensor, torch::Tensor> batch(int rank, int i) {
  auto x =
      (torch::arange(32, torch::kFloat32) * 0.31 + (10 * rank + i * 0.17)).sin().reshape({8, 4});
  auto y =
      (torch::arange(16, torch::kFloat32) * 0.23 + (3 * rank + i * 0.11)).cos().reshape({8, 2});
  return {x, y};
}

// Prints {"ddp": [...], "ddp_active": [...], "zero": [...], "ddp_rich": [...]}: rank 0's final
// parameters and buffers, each flattened, after training under Join with SGD
// (divide_by_initial_world_size true, false), with ZeroRedundancyOptimizer(Adam), and with SGD
// on the rich model (find_unused_parameters, gradient_as_bucket_view). Exits non-zero when the
// ranks end with different models.
const char* kReference = R"PY(
import json, os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

class Net(torch.nn.Module):
    def __init__(self, rich=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 2)
        self.bn = torch.nn.BatchNorm1d(6) if rich else None
        self.never = torch.nn.Linear(2, 2) if rich else None
        with torch.no_grad():
            for k, p in enumerate(self.parameters()):
                p.copy_((torch.arange(p.numel(), dtype=torch.float32) * 0.7 + k * 1.3)
                        .sin().mul(0.5).reshape(p.shape))
    def forward(self, x):
        x = self.fc1(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.fc2(torch.tanh(x))

def batch(r, i):
    x = (torch.arange(32, dtype=torch.float32) * 0.31 + (10 * r + i * 0.17)).sin().reshape(8, 4)
    y = (torch.arange(16, dtype=torch.float32) * 0.23 + (3 * r + i * 0.11)).cos().reshape(8, 2)
    return x, y

def train(rank, scenario):
    net = Net(rich=(scenario == "ddp_rich"))
    if scenario == "ddp_rich":
        model = DDP(net, find_unused_parameters=True, gradient_as_bucket_view=True)
    else:
        model = DDP(net)
    if scenario == "ddp_active_fp16":
        model.register_comm_hook(None, fp16_compress_hook)
    if scenario == "zero":
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=0.01)
        joinables = [model, opt]
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        joinables = [model]
    with Join(joinables, divide_by_initial_world_size=not scenario.startswith("ddp_active")):
        for i in range([9, 6][rank]):
            x, y = batch(rank, i)
            if scenario == "ddp_no_sync" and i % 2 == 0:
                with model.no_sync():  # accumulate; the next (odd) iteration averages both
                    torch.nn.functional.mse_loss(model(x), y).backward()
                continue
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return [t.detach().reshape(-1).tolist() for t in list(net.parameters()) + list(net.buffers())]

def worker(rank, path, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2)
    result = {s: train(rank, s) for s in ("ddp", "ddp_active", "ddp_active_fp16", "zero",
                                          "ddp_rich", "ddp_no_sync")}
    with open(out + str(rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(os.path.join(d, "store"), os.path.join(d, "out")),
                           nprocs=2, start_method="fork")
        results = [json.load(open(os.path.join(d, "out" + str(r)))) for r in range(2)]
    if results[0] != results[1]:
        sys.exit("ranks ended with different parameters")
    print(json.dumps(results[0]))
)PY";

// The reference, computed once per test binary. `skip`: why Python cannot run it (the test
// skips); `failure`: why the reference run failed (the test fails).
const nlohmann::json& reference(std::string* skip, std::string* failure) {
  static const std::string why = ddp::test::python_torch_unavailable();
  static std::string failed;
  static const nlohmann::json ref = []() -> nlohmann::json {
    if (!why.empty()) return nlohmann::json();
    auto r = ddp::test::run_python(kReference);
    if (r.status != 0) {
      failed = "the PyTorch reference script failed (status " + std::to_string(r.status) +
               "; its stderr is above)";
      return nlohmann::json();
    }
    return nlohmann::json::parse(r.out);
  }();
  *skip = why;
  *failure = failed;
  return ref;
}

// max over parameters of ||got - want|| / ||want||.
double relative_error(const std::vector<torch::Tensor>& got, const nlohmann::json& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t k = 0; k < got.size() && k < want.size(); ++k) {
    auto ref = torch::tensor(want[k].get<std::vector<double>>(), torch::kFloat64);
    auto mine = got[k].detach().reshape({-1}).to(torch::kFloat64);
    worst = std::max(worst, ((mine - ref).norm() / (ref.norm() + 1e-30)).item<double>());
  }
  return worst;
}

enum class Variant { kSgd, kFp16Hook, kZero, kRich, kNoSync };

// Trains under Join on 2 rank threads: SGD, ZeRO-Adam, SGD on the rich model with
// find_unused_parameters and gradient_as_bucket_view, or SGD with every even iteration's
// backward under no_sync; per rank, the final parameters and buffers.
std::vector<std::vector<torch::Tensor>> train_joined(JoinOptions options, Variant variant) {
  std::vector<std::vector<torch::Tensor>> out(2);
  const bool zero = variant == Variant::kZero;
  ddp::test::run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    Net net(variant == Variant::kRich);
    auto ddp_options = ddp::DistributedDataParallelOptions();
    if (variant == Variant::kRich) {
      ddp_options.find_unused_parameters(true).gradient_as_bucket_view(true);
    }
    if (variant == Variant::kFp16Hook) ddp_options.comm_hook(ddp::fp16_compress_hook());
    DistributedDataParallel model(net, pg, ddp_options);
    auto step = [&](torch::optim::Optimizer& opt, std::vector<ddp::Joinable*> joinables) {
      Join joined(joinables, options);
      for (int i = 0; i < kBatches[rank]; ++i) {
        auto [x, y] = batch(rank, i);
        if (variant == Variant::kNoSync && i % 2 == 0) {
          auto no_sync = model.no_sync();  // accumulate; the next iteration averages both
          torch::mse_loss(model(x), y).backward();
          continue;
        }
        torch::mse_loss(model(x), y).backward();
        opt.step();
        opt.zero_grad();
      }
    };
    if (zero) {
      ddp::ZeroRedundancyOptimizer<torch::optim::Adam> opt(model.parameters(),
                                                           torch::optim::AdamOptions(0.01), pg);
      step(opt, {&model, &opt});
    } else {
      torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      step(opt, {&model});
    }
    for (auto& p : net->parameters()) out[rank].push_back(p.detach().clone());
    for (auto& b : net->buffers()) out[rank].push_back(b.detach().clone());
  });
  return out;
}

// Rank 0's final model against PyTorch's. (The ranks' models are not compared with each
// other: Join's final hook copies one rank's parameters to all, so they agree by construction.)
void expect_matches_pytorch(const std::vector<std::vector<torch::Tensor>>& ranks,
                            const char* scenario, double tolerance = 1e-5) {
  std::string skip, failure;
  const auto& ref = reference(&skip, &failure);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_TRUE(failure.empty()) << failure;
  const double err = relative_error(ranks[0], ref[scenario]);
  EXPECT_LT(err, tolerance) << scenario << ": relative error against PyTorch's Join";
}

// One test for the five scenarios: the PyTorch reference (one Python run, several seconds on
// a loaded machine) is then computed once per ctest invocation.
TEST(Join, UnevenInputsMatchPyTorchForDdpAndZero) {
  {
    SCOPED_TRACE("DDP + SGD, divide_by_initial_world_size (default)");
    expect_matches_pytorch(train_joined(JoinOptions(), Variant::kSgd), "ddp");
  }
  {
    SCOPED_TRACE("DDP + SGD, divide_by_initial_world_size(false)");
    auto active = train_joined(JoinOptions().divide_by_initial_world_size(false), Variant::kSgd);
    auto initial = train_joined(JoinOptions(), Variant::kSgd);
    // The option matters on these inputs (else the comparison would prove nothing).
    EXPECT_FALSE(torch::allclose(active[0][0], initial[0][0]));
    expect_matches_pytorch(active, "ddp_active");
  }
  {
    // With a comm hook, divide_by_initial_world_size(false) leaves the hook's average alone
    // (PyTorch rescales only its built-in all-reduce). fp16 rounding: a looser tolerance, still
    // far below the factor 2 a rescaled hook output would make after rank 1 joins.
    SCOPED_TRACE("DDP + SGD + fp16 compression hook, divide_by_initial_world_size(false)");
    expect_matches_pytorch(
        train_joined(JoinOptions().divide_by_initial_world_size(false), Variant::kFp16Hook),
        "ddp_active_fp16", 1e-3);
  }
  {
    SCOPED_TRACE("DDP + ZeroRedundancyOptimizer(Adam)");
    expect_matches_pytorch(train_joined(JoinOptions(), Variant::kZero), "zero");
  }
  {
    SCOPED_TRACE("DDP + SGD, BatchNorm buffers, find_unused_parameters, gradient_as_bucket_view");
    expect_matches_pytorch(train_joined(JoinOptions(), Variant::kRich), "ddp_rich");
  }
  {
    // Rank 0's iterations 6 and 8 run under no_sync: the joined rank must not shadow a backward.
    SCOPED_TRACE("DDP + SGD, every other iteration under no_sync");
    expect_matches_pytorch(train_joined(JoinOptions(), Variant::kNoSync), "ddp_no_sync");
  }
}

TEST(Join, ThrowOnEarlyTerminationStopsEveryRank) {
  auto errors = ddp::test::run_ranks_collect(
      2,
      [&](int rank, ddp::ProcessGroupPtr pg) {
        Net net;
        DistributedDataParallel model(net, pg);
        torch::optim::SGD opt(model.parameters(), 0.1);
        Join joined({&model}, JoinOptions().throw_on_early_termination(true));
        for (int i = 0; i < kBatches[rank]; ++i) {
          opt.zero_grad();
          auto [x, y] = batch(rank, i);
          torch::mse_loss(model(x), y).backward();
          opt.step();
        }
      },
      std::chrono::seconds(20));
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[rank]) << "rank " << rank << " should have thrown";
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const ddp::CollectiveError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("throw_on_early_termination"), std::string::npos) << what;
      EXPECT_NE(what.find(rank == 0 ? "ran out of inputs" : "rank 1 ran out of inputs"),
                std::string::npos)
          << what;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": expected a CollectiveError, got: " << e.what();
    }
  }
}

TEST(Join, RejectsJoinablesOfDifferentGroups) {
  ddp::test::run_ranks(1, [&](int, ddp::ProcessGroupPtr pg) {
    Net a, b;
    DistributedDataParallel first(a, pg);
    ddp::test::run_ranks(1, [&](int, ddp::ProcessGroupPtr other) {
      DistributedDataParallel second(b, other);
      EXPECT_THROW(Join({&first, &second}), ddp::UsageError);
    });
    EXPECT_THROW(Join(std::vector<ddp::Joinable*>{}), ddp::UsageError);
  });
}

// A Joinable of the user's own (join.hpp's contract): each training iteration announces itself
// and all-reduces a 1; a joined rank's hook shadows that all-reduce with a 0. Rank 0 trains 5
// iterations, rank 1 trains 3: rank 0 sees 2 ranks training in the first 3 and 1 in the last
// 2, rank 1's hook runs twice, and only rank 0 is the last joiner.
class CountingJoinable : public ddp::Joinable {
 public:
  explicit CountingJoinable(ddp::ProcessGroupPtr pg) : pg_(std::move(pg)) {}
  int iteration() {
    ddp::Join::notify_join_context(*this);
    return all_reduce_int(1);
  }
  int all_reduce_int(int v) {
    int value = v;
    pg_->all_reduce(&value, 1, ddp::DataType::kInt32, ddp::ReduceOp::kSum)->wait(pg_->timeout());
    return value;
  }
  std::unique_ptr<ddp::JoinHook> join_hook(const JoinOptions&) override {
    struct Hook : ddp::JoinHook {
      explicit Hook(CountingJoinable& j) : j_(j) {}
      void main_hook() override {
        ++j_.shadowed;
        j_.all_reduce_int(0);
      }
      void post_hook(bool is_last_joiner) override { j_.last_joiner = is_last_joiner; }
      CountingJoinable& j_;
    };
    return std::make_unique<Hook>(*this);
  }
  ddp::ProcessGroup& join_process_group() const override { return *pg_; }

  int shadowed = 0;
  bool last_joiner = false;

 private:
  ddp::ProcessGroupPtr pg_;
};

TEST(Join, CustomJoinableIsShadowedByTheJoinedRank) {
  std::vector<std::vector<int>> seen(2);
  std::vector<int> shadowed(2);
  std::vector<int> last(2);  // not vector<bool>: the rank threads write neighbouring bits
  ddp::test::run_ranks(2, [&](int rank, ddp::ProcessGroupPtr pg) {
    CountingJoinable counter(pg);
    {
      Join joined({&counter});
      for (int i = 0; i < (rank == 0 ? 5 : 3); ++i) seen[rank].push_back(counter.iteration());
    }
    shadowed[rank] = counter.shadowed;
    last[rank] = counter.last_joiner;
  });
  EXPECT_EQ(seen[0], (std::vector<int>{2, 2, 2, 1, 1}));
  EXPECT_EQ(seen[1], (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(shadowed[0], 0);
  EXPECT_EQ(shadowed[1], 2);
  EXPECT_TRUE(last[0]);
  EXPECT_FALSE(last[1]);
}

// SyncBatchNorm under Join is refused on every rank, naming the module (the joined rank once
// skipped its statistics all-reduce, read stale bytes and hung).
TEST(Join, RefusesSyncBatchNormNamingTheModule) {
  auto errors = ddp::test::run_ranks_collect(2, [&](int, ddp::ProcessGroupPtr pg) {
    torch::nn::Sequential net(torch::nn::Linear(4, 6), ddp::SyncBatchNorm1d(6),
                              torch::nn::Linear(6, 2));
    DistributedDataParallel model(net.ptr(), pg);
    Join joined({&model});
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& error : errors) {
    ASSERT_TRUE(error) << "Join accepted a model with a SyncBatchNorm";
    try {
      std::rethrow_exception(error);
    } catch (const ddp::UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("module '1' is a SyncBatchNorm"), std::string::npos) << what;
      EXPECT_NE(what.find("Join does not support"), std::string::npos) << what;
    }
  }
}

}  // namespace
