// A training worker for the in-place recovery tests (recovery_test.py): a small MLP with dropout
// on synthetic data that is a pure function of the step, trained with ddp::StepManager.
//
//   recovery_worker --steps N --out DIR
//
// The global batch is the launch world's (one share of 32 a launch rank); after a lost node the
// live ranks split it; a node that grew the job adds a share per rank (one share a rank while
// there are more ranks than the launch's). DDP_TEST_DROPOUT=P sets the dropout (default 0.2).
// DDP_TEST_DEVICE=D (default cpu; e.g. cuda:0, which all ranks may share): the model lives on D
// (the cpu backend stages CUDA buckets through the host); each batch is built on the CPU as
// always, then moved to D, so dropout draws from D's generator (StepManager rewinds and heals the
// module's CUDA generator too). The parameters are written from a CPU copy.
//
// Fault injection (this program only, not the library): DDP_TEST_KILL_AT_STEP=S,
// DDP_TEST_KILL_RANK=R and DDP_TEST_KILL_PHASE=forward|backward|between make rank R of the
// first incarnation (TORCHELASTIC_RESTART_COUNT=0) SIGKILL itself at step S: before the forward,
// between forward and backward, or after the step committed. S and R may be comma-separated
// lists of the same length (several failures, one per pair). DDP_TEST_KILL_NODE_AT_STEP=S: the
// worker SIGKILLs its agent (and so its node's other workers) and itself after step S.
// DDP_TEST_OPTIMIZER=sgd: SGD with momentum instead of Adam (see run()); zero_adam / zero_sgd:
// the same sharded by ddp::ZeroRedundancyOptimizer. DDP_TEST_KILL_PHASE=optimizer (with ZeRO):
// the rank dies inside the optimizer step, after stepping its shard and before the parameter
// all-gather.
// DDP_TEST_QUICK_EXIT=1: after its outputs the worker ends with _Exit(0), skipping every
// destructor (its group records no finish: ddprun's agent must, seeing it exit 0).
// DDP_TEST_STEP_SLEEP_MS=T: sleep T ms after each committed step (a job that runs long enough
// for a node to join it). DDP_TEST_REJOIN_AFTER_SHRUNK=1 (--recovery shrink): a replacement
// waits, after its StepManager started and before attach(), until another rank committed a
// step without it (at a world size below the launch's), so the survivors' going on is seen
// whatever the load; it fails after 60 s (the others waited for it before it attached).
//
// At the end each rank writes DIR/rank<R>.params (every parameter's bytes, in order) and
// DIR/rank<R>.json (rank and world size at the end, committed steps, attempts dropped,
// re-forms, generation, restart count); every committed step is appended to DIR/rank<R>.commits
// as "<pid> <step> <world size>". R is the launch rank (the slot), which a lost node does not
// change; DDP_TEST_KILL_RANK names slots too.
#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <ddp/ddp.hpp>

namespace {

// Called after each inner step of the ZeRO test optimizers (below): the optimizer-phase kill.
std::function<void()> after_inner_step;

// An optimizer that calls after_inner_step once it stepped (ZeRO's shard and replica
// optimizers are of this type, so the hook runs inside ZeroRedundancyOptimizer::step()).
template <typename Base>
struct Hooked : Base {
  using Base::Base;
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    auto loss = Base::step(std::move(closure));
    if (after_inner_step) after_inner_step();
    return loss;
  }
};

struct Net : torch::nn::Module {
  explicit Net(double dropout) : dropout(dropout) {
    fc1 = register_module("fc1", torch::nn::Linear(16, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1->forward(x));
    h = torch::dropout(h, dropout, is_training());
    h = torch::relu(fc2->forward(h));
    return fc3->forward(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  double dropout;
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = text.find(',', at);
    out.push_back(std::stoll(text.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// Launch rank `share`'s part of step `step`'s global batch: the same on every incarnation.
std::pair<torch::Tensor, torch::Tensor> share_of(int64_t step, int share) {
  torch::Generator g = at::detail::createCPUGenerator(static_cast<uint64_t>(step * 1000 + share));
  auto x = torch::randn({32, 16}, g);
  auto y = torch::randint(0, 4, {32}, g);
  return {x, y};
}

// This rank's batch of step `step`: the global batch stays the launch world's (one share per
// launch rank); the live ranks split its shares (rank r of `world` takes the shares s with
// s % world == r), so after a lost node the survivors also train on the lost ranks' shares and
// the step's average gradient is the one a run without the loss computes.
std::pair<torch::Tensor, torch::Tensor> batch_for(int64_t step, int rank, int world,
                                                  int launch_world) {
  std::vector<torch::Tensor> xs, ys;
  for (int share = rank; share < launch_world; share += world) {
    auto [x, y] = share_of(step, share);
    xs.push_back(x);
    ys.push_back(y);
  }
  return {torch::cat(xs), torch::cat(ys)};
}

// DDP_TEST_REJOIN_AFTER_SHRUNK (above): how many steps the other slots committed at a world size
// below the launch's, read from DIR/rank<R>.commits.
int64_t shrunk_commits(const std::string& out) {
  const int slot = std::stoi(env_or("RANK", "0"));
  const int world = std::stoi(env_or("WORLD_SIZE", "1"));
  int64_t count = 0;
  for (int r = 0; r < world; ++r) {
    if (r == slot) continue;
    std::ifstream commits(fmt::format("{}/rank{}.commits", out, r));
    long pid = 0, step = 0, size = 0;
    while (commits >> pid >> step >> size) count += size < world ? 1 : 0;
  }
  return count;
}

// Waits until the others committed more than `seen` steps without this slot; throws after 60 s.
void wait_for_a_shrunk_commit(const std::string& out, int64_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (shrunk_commits(out) <= seen) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error(
          "DDP_TEST_REJOIN_AFTER_SHRUNK: for 60 s after this replacement's StepManager started "
          "no other rank committed a step without it: they waited for it before it attached");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int run(int64_t steps, const std::string& out) {
  const bool rejoin_after_shrunk = env_or("DDP_TEST_REJOIN_AFTER_SHRUNK", "0") == "1" &&
                                   env_or("TORCHELASTIC_RESTART_COUNT", "0") != "0";
  ddp::StepManagerOptions options;
  options.group.timeout = std::chrono::seconds(60);
  options.group.backend = env_or("DDP_TEST_BACKEND", "cpu");
  ddp::StepManager manager(options);
  const int64_t shrunk_before = rejoin_after_shrunk ? shrunk_commits(out) : 0;
  // The launch rank names this process's files and its kill orders; the step's data follows the
  // current rank, which shrinks when a node is lost.
  const int slot = manager.slot();

  const int launch_world = manager.launch_world_size();
  torch::manual_seed(0);
  auto net = std::make_shared<Net>(std::stod(env_or("DDP_TEST_DROPOUT", "0.2")));
  // Initialized on the CPU (the same values whatever the device), then moved before wrapping.
  const torch::Device device(env_or("DDP_TEST_DEVICE", "cpu"));
  net->to(device);
  ddp::DistributedDataParallel model(net, manager.process_group(),
                                     ddp::DistributedDataParallelOptions().init_sync(false));
  // DDP_TEST_OPTIMIZER=sgd: SGD with momentum instead of Adam. Adam divides by the gradients'
  // magnitude, so on near-zero gradients it turns float rounding (the survivors add the shares
  // in another order) into whole-step differences; SGD keeps a run that changed its world size
  // within rounding of one that did not, over any number of steps.
  std::unique_ptr<torch::optim::Optimizer> optimizer_holder;
  const std::string optimizer_name = env_or("DDP_TEST_OPTIMIZER", "adam");
  if (optimizer_name == "sgd") {
    optimizer_holder = std::make_unique<torch::optim::SGD>(
        model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  } else if (optimizer_name == "zero_sgd") {
    optimizer_holder = std::make_unique<ddp::ZeroRedundancyOptimizer<Hooked<torch::optim::SGD>>>(
        model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9), manager.process_group());
  } else if (optimizer_name == "zero_adam") {
    optimizer_holder = std::make_unique<ddp::ZeroRedundancyOptimizer<Hooked<torch::optim::Adam>>>(
        model.parameters(), torch::optim::AdamOptions(1e-2), manager.process_group());
  } else {
    optimizer_holder =
        std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(1e-2));
  }
  torch::optim::Optimizer& optimizer = *optimizer_holder;
  // DDP_TEST_KILL_IN_HEAL=1: the first replacement (restart count 1) dies after it joined the
  // new generation, while the survivors wait in the healing collectives.
  if (env_or("DDP_TEST_KILL_IN_HEAL", "0") == "1" &&
      env_or("TORCHELASTIC_RESTART_COUNT", "0") == "1") {
    ::kill(::getpid(), SIGKILL);
  }
  // A replacement under --recovery shrink claims its slot back in attach(): until then the
  // others train on without it.
  if (rejoin_after_shrunk) wait_for_a_shrunk_commit(out, shrunk_before);
  manager.attach(model, optimizer);

  const bool first_life = env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0";
  const std::vector<int64_t> kill_steps = int_list(env_or("DDP_TEST_KILL_AT_STEP", ""));
  const std::vector<int64_t> kill_ranks = int_list(env_or("DDP_TEST_KILL_RANK", ""));
  const std::string kill_phase = env_or("DDP_TEST_KILL_PHASE", "backward");
  // DDP_TEST_KILL_NODE_AT_STEP=S: after committing step S this worker SIGKILLs its agent and
  // itself: the whole node is lost (set it for one node's agent only).
  const int64_t kill_node_at = std::stoll(env_or("DDP_TEST_KILL_NODE_AT_STEP", "-1"));
  auto maybe_die = [&](const char* phase) {
    if (!first_life || kill_phase != phase) return;
    for (size_t i = 0; i < kill_steps.size() && i < kill_ranks.size(); ++i) {
      if (slot == kill_ranks[i] && manager.step() == kill_steps[i]) ::kill(::getpid(), SIGKILL);
    }
  };

  after_inner_step = [&] { maybe_die("optimizer"); };
  const std::chrono::milliseconds step_sleep(std::stoll(env_or("DDP_TEST_STEP_SLEEP_MS", "0")));
  std::ofstream commits(fmt::format("{}/rank{}.commits", out, slot), std::ios::app);
  while (manager.step() < steps) {
    manager.run_step([&] {
      maybe_die("forward");
      // The step being run: a redo after healing may run a later one.
      const auto [x, y] = batch_for(manager.step(), manager.rank(), manager.world_size(),
                                    std::max(launch_world, manager.world_size()));
      auto loss = torch::cross_entropy_loss(model(x.to(device)), y.to(device));
      maybe_die("backward");
      loss.backward();
      return loss;
    });
    commits << ::getpid() << " " << manager.step() << " " << manager.world_size() << "\n"
            << std::flush;
    maybe_die("between");
    if (step_sleep.count() > 0) std::this_thread::sleep_for(step_sleep);
    if (manager.step() == kill_node_at) {
      ::kill(::getppid(), SIGKILL);  // the agent: its other workers die with it (PDEATHSIG)
      ::kill(::getpid(), SIGKILL);
    }
  }

  std::ofstream params(fmt::format("{}/rank{}.params", out, slot), std::ios::binary);
  for (const auto& p : model.parameters()) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    params.write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
  std::ofstream(fmt::format("{}/rank{}.json", out, slot)) << fmt::format(
      "{{\"rank\":{},\"slot\":{},\"world_size\":{},\"step\":{},\"dropped\":{},"
      "\"recoveries\":{},\"generation\":{},\"restart_count\":{}}}\n",
      manager.rank(), slot, manager.world_size(), manager.step(), manager.steps_dropped(),
      manager.recoveries(), manager.generation(), env_or("TORCHELASTIC_RESTART_COUNT", "0"));
  if (env_or("DDP_TEST_QUICK_EXIT", "0") == "1") {
    params.close();
    commits.close();
    std::_Exit(0);  // the json's temporary stream was flushed and closed above
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 20;
  std::string out = ".";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") {
      steps = std::stoll(argv[i + 1]);
    } else if (flag == "--out") {
      out = argv[i + 1];
    } else {
      std::cerr << "recovery_worker: unknown flag " << flag << "; use --steps N --out DIR\n";
      return 2;
    }
  }
  try {
    return run(steps, out);
  } catch (const std::exception& e) {
    std::cerr << "recovery_worker: " << e.what() << "\n";
    return 1;
  }
}
