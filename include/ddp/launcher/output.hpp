#pragma once
// Forwarding one worker stream (stdout or stderr) read from its pipe.
//
// Bytes go unchanged to the log file (when one is set). Complete lines go to the console fd
// (when set), each line prefixed (e.g. "[default0]:" when tee'd), written whole so lines of
// different workers never interleave mid-line. A partial last line is emitted by finish();
// a line longer than kMaxLine is emitted in pieces. The last `tail_lines` lines are kept for
// the failure report.

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

struct StreamRoute {
  int console_fd = -1;    // -1: not shown on the console
  std::string prefix;     // prepended to every console line
  std::string log_path;   // empty: no log file; otherwise created (truncated)
  size_t tail_lines = 0;  // how many last lines to keep
  bool append = false;    // append to log_path instead (a worker restarted in place)
  // --duplicate-*-filters: a console line (with its prefix) that contains any of `filters` is
  // also written to `filtered_fd` (the attempt's filtered_{stdout,stderr}.log, shared by the
  // workers: each line is one write). -1 or no filters: none.
  int filtered_fd = -1;
  std::vector<std::string> filters;
};

class StreamForwarder {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  // Opens the log file; throws ddp::Error naming the path when it cannot.
  explicit StreamForwarder(StreamRoute route);

  void feed(const char* data, size_t size);
  void finish();

  // Oldest first.
  const std::deque<std::string>& tail() const { return tail_; }

 private:
  void emit_lines(bool flush_partial);
  void remember(const std::string& line);

  StreamRoute route_;
  UniqueFd log_;
  std::string pending_;
  std::deque<std::string> tail_;
};

// Writes all bytes, retrying on EINTR/EAGAIN; gives up silently on other errors (a closed
// console must not stop the launcher). Returns false when it gave up.
bool write_fully(int fd, const char* data, size_t size);

}  // namespace ddp::launcher
