// Separate processes (fork + exec of comm_worker) joining through the env:// TcpStore hosted
// by rank 0, for the cpu and gloo backends; a rank that exits early makes the others fail with
// a timeout naming it; no shared-memory names are left behind.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/free_port_range.hpp"
#include "ddp/util/socket.hpp"

namespace {

struct Result {
  int exit_code;
  std::string stderr_text;
};

// Runs `world` workers; kills them all if they take longer than 120 s (a hang is a failure).
std::vector<Result> run_workers(int world, const std::string& backend,
                                const std::vector<std::string>& extra = {},
                                std::vector<pid_t>* pids_out = nullptr) {
  const int port = ddp::test::free_ports_below_ephemeral_range();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < world; ++r) {
    logs.push_back(::testing::TempDir() + "comm_worker_" + std::to_string(::getpid()) + "_" +
                   std::to_string(r) + ".log");
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 2);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<std::string> args{COMM_WORKER_PATH, backend};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  if (pids_out) *pids_out = pids;
  std::vector<Result> results(world, Result{-1, ""});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (results[r].exit_code != -1) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (results[r].exit_code == -1) ::kill(pids[r], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream f(logs[r]);
    std::stringstream ss;
    ss << f.rdbuf();
    results[r].stderr_text = ss.str();
    ::unlink(logs[r].c_str());
  }
  return results;
}

std::vector<std::string> shm_names_of(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return found;
  while (dirent* e = ::readdir(d)) {
    for (pid_t p : pids) {
      if (std::string(e->d_name).rfind("ddp-" + std::to_string(p) + "-", 0) == 0) {
        found.push_back(e->d_name);
      }
    }
  }
  ::closedir(d);
  return found;
}

class MultiProcess : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(MultiProcess, CollectivesMatchReferences) {
  const auto& [backend, world] = GetParam();
  std::vector<pid_t> pids;
  const auto results = run_workers(world, backend, {}, &pids);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].stderr_text;
  }
  EXPECT_EQ(shm_names_of(pids), std::vector<std::string>{}) << "shared memory left behind";
}

INSTANTIATE_TEST_SUITE_P(Workers, MultiProcess,
                         ::testing::Combine(::testing::Values("cpu", "gloo"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "procs";
                         });

TEST(MultiProcessFailure, RankThatExitsIsNamedInTheOthersTimeout) {
  const auto results = run_workers(3, "cpu", {"--exit-rank", "1"});
  EXPECT_EQ(results[1].exit_code, 0);
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].stderr_text;
    EXPECT_NE(results[r].stderr_text.find("all_reduce(float32, count=1, sum) #1"),
              std::string::npos)
        << results[r].stderr_text;
    EXPECT_NE(results[r].stderr_text.find("waiting for ranks [1]"), std::string::npos)
        << results[r].stderr_text;
  }
}

}  // namespace
