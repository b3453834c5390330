#pragma once
// The launcher's signals as a readable file descriptor (signalfd), so the agent's single
// poll() loop sees child exits and user signals as events, with no handlers and no races.
//
// While a SignalChannel lives, SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
// are blocked in the calling thread and queued on fd(), SIGPIPE is ignored (a closed console
// must not kill the launcher), and the process is a child subreaper (orphaned descendants of
// workers are reparented to it, so it can reap and kill them). The destructor restores the
// previous mask and SIGPIPE disposition. Create it before starting any worker.

#include <signal.h>

#include <vector>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

class SignalChannel {
 public:
  SignalChannel();
  ~SignalChannel();
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;

  int fd() const { return fd_.get(); }

  // Every queued signal number, in arrival order; empty when none is pending. Never blocks.
  std::vector<int> drain();

 private:
  UniqueFd fd_;
  sigset_t saved_mask_;
  bool had_sigpipe_ignored_ = false;
};

// The signals the agent forwards and then stops on (exit 128+signo).
bool is_terminating_signal(int signo);
// The signals the agent forwards and keeps running (SIGUSR1, SIGUSR2).
bool is_forward_only_signal(int signo);

}  // namespace ddp::launcher
