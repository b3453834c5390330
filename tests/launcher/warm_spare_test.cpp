// The warm spare (warm_spare.hpp) against the real python/ddp/warm_spare.py: a spare started by
// WarmSpare::start becomes the program its orders name. torch and ddp are stand-ins here (empty
// packages on the spare's PYTHONPATH, beside a copy of warm_spare.py), so these tests need
// python3 but not torch; the recovery tests run the spare with the real ones.
#include "ddp/launcher/warm_spare.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_test_support.hpp"
#include "ddp/launcher/command.hpp"

namespace ddp::launcher {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// Everything `fd` gives until end of file (at most 30 s).
std::string read_until_eof(int fd) {
  std::string text;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    }
  }
  return text;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class WarmSpareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("PATH");
    try {
      python_ =
          resolve_executable("python3", [&](const std::string& k) -> std::optional<std::string> {
            if (k == "PATH" && path != nullptr) return std::string(path);
            return std::nullopt;
          });
    } catch (const std::exception&) {
      GTEST_SKIP() << "no python3 on PATH: the warm spare is a Python program";
    }
    dir_ = fs::temp_directory_path() / ("ddp_warm_spare_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    // Stand-ins for what the spare imports, and the real spare as ddp.warm_spare.
    for (const char* f : {"torch/__init__.py", "torch/distributed.py", "torch/nn/__init__.py",
                          "torch/nn/parallel.py", "ddp/__init__.py"}) {
      write_file(dir_ / "lib" / f, "");
    }
    // An import that starts a thread (in the idle class, as the spare is then).
    write_file(dir_ / "lib" / "torch" / "_dynamo.py",
               "import threading, time\n"
               "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n");
    fs::copy_file(fs::path(DDP_PYTHON_SOURCE_DIR) / "ddp" / "warm_spare.py",
                  dir_ / "lib" / "ddp" / "warm_spare.py");
    // The program the spare becomes: what it sees of its start.
    const std::string report =
        "import os, sys\n"
        "print('argv', sys.argv[1:])\n"
        "print('name', __name__)\n"
        "print('rank', os.environ.get('RANK'), 'fd', os.environ.get('DDP_WARM_SPARE_FD'))\n"
        "print('odd', os.environb.get(b'ODD'))\n"
        "print('torch_before', 'torch' in sys.modules)\n"
        "print('cpus', sorted(os.sched_getaffinity(0)))\n"
        "print('idle_threads', sum(os.sched_getscheduler(int(t)) == os.SCHED_IDLE\n"
        "                          for t in os.listdir('/proc/self/task')))\n";
    write_file(dir_ / "prog" / "train.py", report + "print('path0', sys.path[0])\n");
    write_file(dir_ / "lib" / "trainmod.py", report + "print('path0', sys.path[0])\n");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // idle: in the idle class, as ddprun starts it where it can leave that class again.
  WarmSpare start_spare(bool idle = false) {
    SpawnOptions so;
    so.idle_class = idle;
    so.argv = warm_spare_command({python_, "-u", (dir_ / "prog" / "train.py").string()});
    so.env = {"PATH=/usr/bin:/bin", "PYTHONPATH=" + (dir_ / "lib").string()};
    return WarmSpare::start(std::move(so));
  }

  // Orders for a worker that runs `argv` as rank 3 on CPU 0, with a variable holding '='
  // and a byte that is not UTF-8.
  SpawnOptions orders(std::vector<std::string> argv) {
    SpawnOptions w;
    w.argv = std::move(argv);
    w.env = {"PATH=/usr/bin:/bin", "PYTHONPATH=" + (dir_ / "lib").string(), "RANK=3",
             std::string("ODD=a=b\xff")};
    w.cpu_affinity = {0};
    return w;
  }

  // What a rank run by a spare printed, and how it ended.
  struct Ran {
    std::string out, err;
    int code = -1;
  };
  // Hands `spare` the orders to run `argv` and waits for the rank it becomes to end.
  Ran run_as_rank(WarmSpare& spare, std::vector<std::string> argv) {
    std::string why;
    std::optional<SpawnedProcess> p = spare.take(orders(std::move(argv)), why);
    if (!p) {
      ADD_FAILURE() << "the spare could not be taken: " << why;
      return {};
    }
    Ran ran;
    ran.out = read_until_eof(p->stdout_read.get());
    ran.err = read_until_eof(p->stderr_read.get());
    ran.code = wait_exit_code(p->pid);
    return ran;
  }

  std::string python_;
  fs::path dir_;
};

TEST(WarmSpareCommand, OnlyForPythonProgramsDdprunStartsItself) {
  EXPECT_EQ(warm_spare_command({"/v/bin/python3", "-u", "train.py", "--lr", "1"}),
            (std::vector<std::string>{"/v/bin/python3", "-u", "-m", "ddp.warm_spare"}));
  EXPECT_FALSE(warm_spare_command({"/v/bin/python3", "-u", "-m", "pkg.train"}).empty());
  EXPECT_FALSE(warm_spare_command({"/v/bin/python3", "-u", "-c", "import runpy", "t.py"}).empty());
  // --no-python: whatever PROGRAM is, even an interpreter given by hand.
  EXPECT_TRUE(warm_spare_command({"/v/bin/python3", "train.py"}).empty());
  EXPECT_TRUE(warm_spare_command({"/build/mnist", "-u", "x"}).empty());
  EXPECT_TRUE(warm_spare_command({"/usr/bin/env", "-u", "X", "python3"}).empty());
}

TEST(WarmSpareFlag, AutoByDefaultOffOnRequestAndNothingElse) {
  EXPECT_TRUE(test::parse({"--recovery", "step", "t.py"}).warm_spare);
  EXPECT_FALSE(test::parse({"--warm-spare", "off", "t.py"}).warm_spare);
  EXPECT_FALSE(test::parse({"t.py"}, {{"PET_WARM_SPARE", "off"}}).warm_spare);
  EXPECT_NE(test::usage_error({"--warm-spare", "yes", "t.py"})
                .find("--warm-spare yes: expected "
                      "auto or off"),
            std::string::npos);
}

TEST_F(WarmSpareTest, TheSpareBecomesTheScriptWithItsArgvEnvironmentAndCpus) {
  WarmSpare spare = start_spare();
  // It says when its imports are done.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!spare.warm() && std::chrono::steady_clock::now() < until) ::usleep(10000);
  ASSERT_TRUE(spare.warm());
  const Ran ran =
      run_as_rank(spare, {python_, "-u", (dir_ / "prog" / "train.py").string(), "--lr", "0.1"});
  const std::string& out = ran.out;
  EXPECT_EQ(ran.code, 0) << out << ran.err;
  EXPECT_NE(out.find("argv ['--lr', '0.1']"), std::string::npos) << out << ran.err;
  EXPECT_NE(out.find("name __main__"), std::string::npos) << out;
  // Its rank arrived with the orders; the socket's descriptor is not left in its environment.
  EXPECT_NE(out.find("rank 3 fd None"), std::string::npos) << out;
  EXPECT_NE(out.find("odd b'a=b\\xff'"), std::string::npos) << out;
  EXPECT_NE(out.find("torch_before True"), std::string::npos) << out;
  EXPECT_NE(out.find("cpus [0]"), std::string::npos) << out;
  EXPECT_NE(out.find("path0 " + (dir_ / "prog").string()), std::string::npos) << out;
}

// ddprun starts the spare in the idle class. Taken before its imports ended (on a busy node it
// may not get the CPU to end them), it runs at normal priority from then on, every thread of it
// (the stand-in torch._dynamo starts one during the imports).
TEST_F(WarmSpareTest, AnIdleSpareTakenAtOnceRunsItsRankAtNormalPriority) {
  if (!can_leave_idle_class()) {
    GTEST_SKIP() << "this user cannot leave the idle scheduling class (not root, RLIMIT_NICE "
                    "below 20): ddprun starts no spare in it";
  }
  WarmSpare spare = start_spare(/*idle=*/true);
  const Ran ran = run_as_rank(spare, {python_, "-u", (dir_ / "prog" / "train.py").string()});
  EXPECT_EQ(ran.code, 0) << ran.out << ran.err;
  EXPECT_NE(ran.out.find("idle_threads 0"), std::string::npos) << ran.out << ran.err;
}

TEST_F(WarmSpareTest, TheSpareRunsAModuleAndRunPathsCommand) {
  WarmSpare module_spare = start_spare();
  const Ran module = run_as_rank(module_spare, {python_, "-u", "-m", "trainmod", "x"});
  EXPECT_EQ(module.code, 0) << module.out << module.err;
  EXPECT_NE(module.out.find("argv ['x']"), std::string::npos) << module.out;
  EXPECT_NE(module.out.find("name __main__"), std::string::npos) << module.out;
  // As `python -m` puts it: the working directory (the spare's own imports skipped it).
  EXPECT_NE(module.out.find("path0 " + fs::current_path().string() + "\n"), std::string::npos)
      << module.out;
  // --run-path's command (command.cpp): -c code that runs PROGRAM with runpy.run_path.
  WarmSpare run_path_spare = start_spare();
  const Ran run_path = run_as_rank(
      run_path_spare, {python_, "-u", "-c",
                       "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
                       "run_name='__main__')",
                       (dir_ / "prog" / "train.py").string(), "y"});
  EXPECT_EQ(run_path.code, 0) << run_path.out << run_path.err;
  EXPECT_NE(run_path.out.find("argv ['y']"), std::string::npos) << run_path.out;
}

// ddprun may take a spare just as it writes its "ready" byte, and close its end with that byte
// unread: the spare then reads ECONNRESET after its orders instead of end of file, and must run
// them all the same.
TEST_F(WarmSpareTest, ItsOrdersRunWhenItsReadyByteWasNeverRead) {
  const fs::path marker = dir_ / "imported";
  write_file(dir_ / "lib" / "torch" / "_dynamo.py",
             "open(" + ::testing::PrintToString(marker.string()) + ", 'w').close()\n");
  WarmSpare spare = start_spare();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(marker) && std::chrono::steady_clock::now() < until) ::usleep(10000);
  ::usleep(300000);  // its last import is done: the byte follows at once
  const Ran ran = run_as_rank(spare, {python_, "-u", (dir_ / "prog" / "train.py").string(), "z"});
  EXPECT_EQ(ran.code, 0) << ran.out << ran.err;
  EXPECT_NE(ran.out.find("argv ['z']"), std::string::npos) << ran.out << ran.err;
}

TEST_F(WarmSpareTest, TheScriptsExitCodeIsTheProcesses) {
  write_file(dir_ / "prog" / "fail.py", "import sys\nsys.exit(7)\n");
  WarmSpare spare = start_spare();
  EXPECT_EQ(run_as_rank(spare, {python_, "-u", (dir_ / "prog" / "fail.py").string()}).code, 7);
}

TEST_F(WarmSpareTest, ASpareThatCannotImportSaysWhyAndCannotBeTaken) {
  write_file(dir_ / "lib" / "torch" / "__init__.py", "raise ImportError('no torch here')\n");
  WarmSpare spare = start_spare();
  int status = 0;
  ASSERT_EQ(::waitpid(spare.pid(), &status, 0), spare.pid());
  EXPECT_EQ(spare.exit_reason(status), "exit code 1: ImportError: no torch here");
  std::string why;
  EXPECT_FALSE(spare.take(orders({python_, "-u", "x.py"}), why).has_value());
  EXPECT_NE(why.find("could not be reached"), std::string::npos) << why;
}

TEST_F(WarmSpareTest, ASpareNeverGivenOrdersEndsQuietlyWhenItsSocketCloses) {
  std::optional<WarmSpare> spare = start_spare();
  const pid_t pid = spare->pid();
  {
    // Dropping the agent's end (ddprun exiting) is end of file for the spare: exit 0.
    WarmSpare gone = std::move(*spare);
    spare.reset();
  }
  EXPECT_EQ(wait_exit_code(pid), 0);
}

}  // namespace
}  // namespace ddp::launcher
