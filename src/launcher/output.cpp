#include "ddp/launcher/output.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

bool write_fully(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        // A non-blocking console that is full: wait for room, but not forever.
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 1000) <= 0) return false;
        continue;
      }
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

StreamForwarder::StreamForwarder(StreamRoute route) : route_(std::move(route)) {
  if (!route_.log_path.empty()) {
    const int mode = route_.append ? O_APPEND : O_TRUNC;
    // Never through a link left under the name (issue 49, finding 1).
    int fd =
        ::open(route_.log_path.c_str(), O_WRONLY | O_CREAT | mode | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw Error(
          fmt::format("cannot create log file {}: {}", route_.log_path, std::strerror(errno)));
    }
    log_.reset(fd);
  }
}

void StreamForwarder::feed(const char* data, size_t size) {
  if (log_.valid()) write_fully(log_.get(), data, size);
  if (route_.console_fd < 0 && route_.tail_lines == 0) return;
  pending_.append(data, size);
  emit_lines(false);
}

void StreamForwarder::finish() {
  emit_lines(true);
}

void StreamForwarder::remember(const std::string& line) {
  if (route_.tail_lines == 0) return;
  tail_.push_back(line);
  while (tail_.size() > route_.tail_lines) tail_.pop_front();
}

void StreamForwarder::emit_lines(bool flush_partial) {
  // All complete lines of this chunk go to the console in one write.
  std::string console, filtered;
  size_t start = 0;
  for (;;) {
    size_t nl = pending_.find('\n', start);
    size_t end;
    if (nl != std::string::npos) {
      end = nl;
    } else if (pending_.size() - start >= kMaxLine || (flush_partial && start < pending_.size())) {
      end = std::min(pending_.size(), start + kMaxLine);
    } else {
      break;
    }
    std::string line = pending_.substr(start, end - start);
    if (route_.console_fd >= 0) {
      console += route_.prefix;
      console += line;
      console += '\n';
      if (route_.filtered_fd >= 0 &&
          std::any_of(route_.filters.begin(), route_.filters.end(),
                      [&](const std::string& f) { return line.find(f) != std::string::npos; })) {
        filtered += route_.prefix;
        filtered += line;
        filtered += '\n';
      }
    }
    remember(line);
    start = nl != std::string::npos && end == nl ? nl + 1 : end;
  }
  pending_.erase(0, start);
  if (!console.empty()) write_fully(route_.console_fd, console.data(), console.size());
  if (!filtered.empty()) write_fully(route_.filtered_fd, filtered.data(), filtered.size());
}

}  // namespace ddp::launcher
