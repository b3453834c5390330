#pragma once
// The launcher's signals as a readable file descriptor (signalfd), so the agent's single
// poll() loop sees child exits and user signals as events, with no handlers and no races.
//
// While a SignalChannel lives, SIGCHLD and the handled signals (--signals-to-handle; by
// default SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2) are blocked in the calling
// thread and queued on fd(); a signal left out of the list keeps its default action (SIGUSR1
// left out ends ddprun, and the workers with it, as it ends torchrun). SIGPIPE is ignored (a
// closed console must not kill the launcher), and the process is a child subreaper (orphaned
// descendants of workers are reparented to it, so it can reap and kill them). The destructor
// restores the previous mask and SIGPIPE disposition. Create it before starting any worker.

#include <signal.h>

#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

// --signals-to-handle's default: torchrun's SIGTERM,SIGINT,SIGHUP,SIGQUIT plus SIGUSR1 and
// SIGUSR2, which ddprun forwarded before the flag existed.
std::vector<int> default_handled_signals();
// The signals --signals-to-handle may name: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2.
const std::vector<int>& handleable_signals();
// "SIGTERM,SIGUSR1" (torchrun's spelling; "USR1" and lower case are accepted too) -> signal
// numbers, duplicates dropped. UsageError naming `source` (the flag or variable), the entry and
// the names allowed.
std::vector<int> parse_signal_list(const std::string& text, const std::string& source);

class SignalChannel {
 public:
  // `handled`: signals from handleable_signals(); SIGCHLD is always added.
  explicit SignalChannel(const std::vector<int>& handled = default_handled_signals());
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

// The handled signals the agent forwards and then stops on (exit 128+signo, or the workers'
// kRequeueExitStatus when every one of them exited with it: util/exit_status.hpp).
bool is_terminating_signal(int signo);
// The handled signals the agent forwards and keeps running (SIGUSR1, SIGUSR2): the trainer
// decides what they mean (a preemption notice: ddp::StopRequest).
bool is_forward_only_signal(int signo);

}  // namespace ddp::launcher
