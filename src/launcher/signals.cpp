#include "ddp/launcher/signals.hpp"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

constexpr int kHandled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

}  // namespace

bool is_terminating_signal(int signo) {
  return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
}

bool is_forward_only_signal(int signo) {
  return signo == SIGUSR1 || signo == SIGUSR2;
}

SignalChannel::SignalChannel() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandled) sigaddset(&set, s);
  if (::sigprocmask(SIG_BLOCK, &set, &saved_mask_) != 0) {
    throw Error(fmt::format("cannot block signals: {}", std::strerror(errno)));
  }
  int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    ::sigprocmask(SIG_SETMASK, &saved_mask_, nullptr);
    throw Error(fmt::format("cannot create a signalfd: {}", std::strerror(err)));
  }
  fd_.reset(fd);
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old = {};
  ::sigaction(SIGPIPE, &ignore, &old);
  had_sigpipe_ignored_ = old.sa_handler == SIG_IGN;
  // Orphaned descendants of workers become our children, so none escapes reaping.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

SignalChannel::~SignalChannel() {
  fd_.reset();
  if (!had_sigpipe_ignored_) ::signal(SIGPIPE, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &saved_mask_, nullptr);
}

std::vector<int> SignalChannel::drain() {
  std::vector<int> signals;
  signalfd_siginfo info[16];
  for (;;) {
    ssize_t n = ::read(fd_.get(), info, sizeof(info));
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // EAGAIN: nothing more queued
    }
    if (n == 0) break;
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(signalfd_siginfo); ++i) {
      signals.push_back(static_cast<int>(info[i].ssi_signo));
    }
  }
  return signals;
}

}  // namespace ddp::launcher
