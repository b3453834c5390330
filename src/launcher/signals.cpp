#include "ddp/launcher/signals.hpp"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "ddp/launcher/process.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

std::vector<int> default_handled_signals() {
  return {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
}

const std::vector<int>& handleable_signals() {
  static const std::vector<int> all = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  return all;
}

std::vector<int> parse_signal_list(const std::string& text, const std::string& source) {
  auto allowed = [] {
    std::string names;
    for (int s : handleable_signals()) names += (names.empty() ? "" : ", ") + signal_name(s);
    return names;
  };
  std::vector<int> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    std::string entry = text.substr(start, comma == std::string::npos ? comma : comma - start);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    std::string upper = entry;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (upper.rfind("SIG", 0) != 0) upper = "SIG" + upper;
    int found = 0;
    for (int s : handleable_signals()) {
      if (signal_name(s) == upper) found = s;
    }
    if (found == 0) {
      throw UsageError(fmt::format(
          "{} '{}': '{}' is not a signal ddprun can handle; use a comma-separated list of {} "
          "(SIGKILL and SIGSTOP cannot be caught; SIGCHLD is always handled)",
          source, text, entry, allowed()));
    }
    if (std::find(out.begin(), out.end(), found) == out.end()) out.push_back(found);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool is_terminating_signal(int signo) {
  return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
}

bool is_forward_only_signal(int signo) {
  return signo == SIGUSR1 || signo == SIGUSR2;
}

SignalChannel::SignalChannel(const std::vector<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : handled) sigaddset(&set, s);
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
