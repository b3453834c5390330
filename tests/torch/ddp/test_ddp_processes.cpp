// DDP across real processes: this binary re-executes itself as ranks ("--worker") with
// torchrun's environment; the ranks meet through init_process_group's env:// TcpStore on a
// port found by binding port 0. The test process trains the one-process reference and compares.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/torch/ddp.hpp"
#include "ddp/util/socket.hpp"
#include "models.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
constexpr int kBatch = 2, kSteps = 3;

// The same data in every process: generated from a fixed seed.
void make_data(int world, std::vector<torch::Tensor>& xs, std::vector<torch::Tensor>& ys) {
  torch::manual_seed(0);
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(torch::randn({world * kBatch, 1, 28, 28}));
    ys.push_back(torch::randint(0, 10, {world * kBatch}, torch::kLong));
  }
}

// One rank: trains its shard and saves the final parameters to <dir>/rank<r>.pt. With
// `mismatch`, the last rank builds a different model (the test expects every rank to fail).
int worker_main(const std::string& dir, bool mismatch) {
  torch::set_num_threads(1);
  ddp::InitOptions opts;
  opts.timeout = std::chrono::seconds(60);
  auto pg = ddp::init_process_group(opts);
  const int rank = pg->rank(), world = pg->size();
  std::vector<torch::Tensor> xs, ys;
  make_data(world, xs, ys);
  if (mismatch) {
    torch::nn::Linear net(4, rank == world - 1 ? 3 : 2);
    ddp::DistributedDataParallel model(net, pg);
    return 0;
  }
  torch::manual_seed(100 + rank);  // different starting points: DDP broadcasts rank 0's
  ddp::test::Cnn net;
  ddp::DistributedDataParallel model(net, pg);
  torch::optim::Adam opt(model.parameters(), 1e-3);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    auto out = model(xs[s].narrow(0, rank * kBatch, kBatch));
    torch::nll_loss(out, ys[s].narrow(0, rank * kBatch, kBatch)).backward();
    model.step(opt);
  }
  torch::save(net, (fs::path(dir) / ("rank" + std::to_string(rank) + ".pt")).string());
  return 0;
}

struct Exit {
  int code = -1;  // -1: killed after the deadline
};

// Runs `world` workers and waits (at most 120 s, then kills them).
std::vector<Exit> run_workers(int world, const std::string& dir, bool mismatch) {
  auto listener = ddp::net::listen_tcp("127.0.0.1", 0, 1);
  const int port = ddp::net::local_port(listener.fd());
  listener.close();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    for (std::string kv :
         {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
          "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port)}) {
      env.push_back(kv);
    }
    // Keep only the last definition of each variable (ours, over any inherited one).
    std::vector<std::string> unique;
    for (size_t i = 0; i < env.size(); ++i) {
      const std::string name = env[i].substr(0, env[i].find('=') + 1);
      bool overridden = false;
      for (size_t j = i + 1; j < env.size(); ++j) {
        if (env[j].rfind(name, 0) == 0) overridden = true;
      }
      if (!overridden) unique.push_back(env[i]);
    }
    std::vector<char*> envp;
    for (auto& s : unique) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = {"test_ddp_processes", "--worker", dir,
                                     mismatch ? "mismatch" : "train"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()), 0);
    pids.push_back(pid);
  }
  std::vector<Exit> exits(world);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int r = 0; r < world; ++r) {
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    exits[r].code = (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  }
  return exits;
}

fs::path temp_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

TEST(DdpProcesses, TwoProcessesMatchOneProcessWithTheWholeBatch) {
  torch::set_num_threads(1);
  const int world = 2;
  auto dir = temp_dir("ddp_processes");
  auto exits = run_workers(world, dir.string(), false);
  for (int r = 0; r < world; ++r) ASSERT_EQ(exits[r].code, 0) << "rank " << r;

  std::vector<torch::Tensor> xs, ys;
  make_data(world, xs, ys);
  torch::manual_seed(100);  // rank 0's initial parameters
  ddp::test::Cnn ref;
  torch::optim::Adam opt(ref->parameters(), 1e-3);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    torch::nll_loss(ref->forward(xs[s]), ys[s]).backward();
    opt.step();
  }
  for (int r = 0; r < world; ++r) {
    ddp::test::Cnn trained;
    torch::load(trained, (dir / ("rank" + std::to_string(r) + ".pt")).string());
    EXPECT_LT(ddp::test::max_relative_error(*trained, *ref), 1e-5) << "rank " << r;
  }
  fs::remove_all(dir);
}

TEST(DdpProcesses, MismatchedModelFailsEveryRank) {
  auto dir = temp_dir("ddp_mismatch");
  auto exits = run_workers(2, dir.string(), true);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(exits[r].code, 1) << "rank " << r;
  fs::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--worker") {
    try {
      return worker_main(argv[2], std::string(argv[3]) == "mismatch");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "worker: %s\n", e.what());
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
