#include "launcher_fixture.hpp"
#include "ddp/util/remove_tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace ddp::launcher::testing {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void nap() {
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file(entry.path().string() + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

std::vector<pid_t> marked_processes(const std::string& marker) {
  std::vector<pid_t> out;
  std::string needle = "DDPRUN_TEST_MARKER=" + marker;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string env = read_file(entry.path().string() + "/environ");
    if (env.find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool file_exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

std::vector<std::string> sorted(std::vector<std::string> lines) {
  std::sort(lines.begin(), lines.end());
  return lines;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(needle) != std::string::npos) out.push_back(line);
  }
  return out;
}

std::string LauncherTest::worker() {
  return DDP_TEST_WORKER;
}
std::string LauncherTest::ddprun() {
  return DDPRUN_BIN;
}

void LauncherTest::SetUp() {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  std::string pattern = std::filesystem::temp_directory_path().string() + "/ddprun-test-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  dir_ = pattern;
  std::random_device rd;
  marker_ = std::to_string(rd()) + std::to_string(rd());
}

void LauncherTest::TearDown() {
  expect_no_survivors();
  std::error_code ec;
  ddp::remove_tree(dir_, ec);
}

pid_t LauncherTest::start(const std::vector<std::string>& args, const EnvPairs& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    if (key == "OMP_NUM_THREADS" || key.rfind("PET_", 0) == 0 ||
        key.rfind("TORCHELASTIC_", 0) == 0 || key.rfind("DDPRUN_", 0) == 0) {
      continue;
    }
    bool overridden = false;
    for (const auto& kv : extra) overridden |= kv.first == key;
    if (!overridden) env.push_back(entry);
  }
  env.push_back("DDPRUN_TEST_MARKER=" + marker_);
  bool grace_given = false;
  for (const auto& kv : extra) grace_given |= kv.first == "DDPRUN_TERM_GRACE_S";
  if (!grace_given) env.push_back("DDPRUN_TERM_GRACE_S=2");
  for (const auto& kv : extra) env.push_back(kv.first + "=" + kv.second);

  std::vector<std::string> argv_s = {ddprun()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  ++runs_;
  out_path_ = dir_ + "/ddprun." + std::to_string(runs_) + ".out";
  err_path_ = dir_ + "/ddprun." + std::to_string(runs_) + ".err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << "cannot start " << argv[0] << ": " << std::strerror(rc);
  outputs_[pid] = {out_path_, err_path_};
  return pid;
}

RunResult LauncherTest::wait(pid_t pid, double timeout_s) {
  RunResult r;
  auto deadline = after(timeout_s);
  int status = 0;
  for (;;) {
    pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0) {
      ADD_FAILURE() << "waitpid(" << pid << "): " << std::strerror(errno);
      return r;
    }
    if (Clock::now() > deadline) {
      ADD_FAILURE() << "ddprun did not exit within " << timeout_s << " s; killing it";
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    nap();
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  const auto files = outputs_.find(pid);
  r.out = read_file(files != outputs_.end() ? files->second.first : out_path_);
  r.err = read_file(files != outputs_.end() ? files->second.second : err_path_);
  return r;
}

std::string LauncherTest::current_err() const {
  return read_file(err_path_);
}

bool LauncherTest::wait_for_file(const std::string& path, double timeout_s) {
  auto deadline = after(timeout_s);
  while (!file_exists(path)) {
    if (Clock::now() > deadline) return false;
    nap();
  }
  return true;
}

bool LauncherTest::still_running(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == 0;
}

void LauncherTest::expect_no_survivors(double timeout_s) {
  auto deadline = after(timeout_s);
  for (;;) {
    int status = 0;
    pid_t got = ::waitpid(-1, &status, WNOHANG);
    if (got > 0) continue;  // reaped a dying descendant; look again
    bool no_children = got < 0 && errno == ECHILD;
    std::vector<pid_t> marked = marked_processes(marker_);
    if (no_children && marked.empty()) return;
    if (Clock::now() > deadline) {
      std::string left;
      for (pid_t p : children_of(::getpid())) {
        left += " child:" + std::to_string(p);
        ::kill(p, SIGKILL);
      }
      for (pid_t p : marked) {
        left += " marked:" + std::to_string(p);
        ::kill(p, SIGKILL);
      }
      ADD_FAILURE() << "processes survived ddprun:" << left;
      while (::waitpid(-1, &status, 0) > 0) {
      }
      return;
    }
    nap();
  }
}

}  // namespace ddp::launcher::testing
