#pragma once
// A fixture that runs the built ddprun binary as a real process and checks what it leaves
// behind. The test process makes itself a child subreaper, so every descendant of ddprun
// that outlives it is reparented here: "no survivors" means waitpid(-1) reports ECHILD, which
// also catches zombies. Processes are additionally found by a marker in their environment.

#include <gtest/gtest.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddp::launcher::testing {

using EnvPairs = std::vector<std::pair<std::string, std::string>>;

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
};

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Starts ddprun with args; stdout/stderr go to files in dir(). `extra` is added to (and
  // overrides) a clean copy of this process's environment.
  pid_t start(const std::vector<std::string>& args, const EnvPairs& extra = {});
  // Waits (bounded) for ddprun to exit; a hang is a test failure and the process is killed.
  // The result holds what that ddprun (started here) wrote.
  RunResult wait(pid_t pid, double timeout_s = 60);
  RunResult run(const std::vector<std::string>& args, const EnvPairs& extra = {},
                double timeout_s = 60) {
    return wait(start(args, extra), timeout_s);
  }

  // What the last started ddprun has written to stderr so far, and the file it writes it to.
  std::string current_err() const;
  const std::string& current_err_path() const { return err_path_; }
  const std::string& current_out_path() const { return out_path_; }
  // Bounded wait for a file to appear.
  bool wait_for_file(const std::string& path, double timeout_s = 30);
  // True while pid has not exited (does not reap).
  bool still_running(pid_t pid);
  // Asserts that no descendant and no process carrying this test's marker remains, waiting
  // (bounded) for dying ones; leftovers are killed and reported.
  void expect_no_survivors(double timeout_s = 10);

  const std::string& dir() const { return dir_; }
  const std::string& marker() const { return marker_; }
  static std::string worker();  // the test_worker binary
  static std::string ddprun();

 private:
  std::string dir_;
  std::string marker_;
  int runs_ = 0;
  std::string out_path_, err_path_;  // the last started ddprun's stdout and stderr files
  std::map<pid_t, std::pair<std::string, std::string>> outputs_;  // every one's, by pid
};

std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
// Lines of text that contain needle.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle);

// The lines in ascending order (for output of concurrent workers, which interleave freely).
std::vector<std::string> sorted(std::vector<std::string> lines);

}  // namespace ddp::launcher::testing
