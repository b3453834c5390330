#pragma once
// Training progress for rank 0: on a terminal a single redrawn bar with steps, samples/s and
// ETA; elsewhere (a log file, a launcher's pipe) plain lines at every `plain_every_percent`.
//
//   epoch 1 [########............] 750/1875  40%  1623 samples/s  ETA 0:41  loss 0.4127
//
// samples/s counts all ranks (samples_per_step is the global batch). Lines printed through
// print_line() appear above the bar without tearing it. Disabled instances print nothing, so
// every rank can own one and only rank 0 enables it.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace ddp {

struct ProgressOptions {
  static constexpr int kPlainEveryPercent = 10;
  static constexpr std::chrono::milliseconds kRedrawInterval{100};

  ProgressOptions& enabled(bool v) {
    enabled_ = v;
    return *this;
  }
  ProgressOptions& out(std::FILE* v) {
    out_ = v;
    return *this;
  }
  // Overrides isatty(fileno(out)).
  ProgressOptions& terminal(bool v) {
    terminal_ = v;
    return *this;
  }
  ProgressOptions& plain_every_percent(int v) {
    plain_every_percent_ = v;
    return *this;
  }

  bool enabled_ = true;
  std::FILE* out_ = stdout;
  std::optional<bool> terminal_;
  int plain_every_percent_ = kPlainEveryPercent;
};

class Progress {
 public:
  Progress(std::string label, int64_t total_steps, int64_t samples_per_step,
           ProgressOptions options = ProgressOptions());
  ~Progress();  // finish()

  // Records that `steps_done` steps (of total_steps) are complete.
  void update(int64_t steps_done, std::optional<double> loss = std::nullopt);
  // A log line (newline added) that does not tear the bar.
  void print_line(const std::string& line);
  // Ends the bar's line (terminal) or prints the final plain line; idempotent.
  void finish();

  bool terminal() const { return terminal_; }
  double samples_per_second() const;

 private:
  std::string render(bool bar) const;
  void draw();

  std::string label_;
  int64_t total_;
  int64_t samples_per_step_;
  ProgressOptions options_;
  bool terminal_ = false;
  int64_t done_ = 0;
  std::optional<double> loss_;
  int last_percent_printed_ = 0;
  bool finished_ = false;
  bool bar_visible_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace ddp
