#pragma once
// Waiting for a test's child process with a deadline (tests that re-execute their own binary
// as ranks).
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

namespace ddp::test {

// Exit code of `pid`, or -1 when it was killed at `deadline` (or died of a signal).
inline int wait_or_kill(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ddp::test
