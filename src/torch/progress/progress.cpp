#include "ddp/torch/progress/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace ddp {

namespace {

std::string clock_string(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

}  // namespace

Progress::Progress(std::string label, int64_t total_steps, int64_t samples_per_step,
                   ProgressOptions options)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total_steps, 0)),
      samples_per_step_(samples_per_step),
      options_(options),
      start_(std::chrono::steady_clock::now()) {
  terminal_ = options_.terminal_.value_or(options_.out_ && ::isatty(::fileno(options_.out_)));
  if (options_.plain_every_percent_ < 1) options_.plain_every_percent_ = 1;
}

Progress::~Progress() {
  finish();
}

double Progress::samples_per_second() const {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return secs > 0 ? static_cast<double>(done_ * samples_per_step_) / secs : 0.0;
}

std::string Progress::render(bool bar) const {
  const int percent = total_ ? static_cast<int>(100 * done_ / total_) : 100;
  const double rate = samples_per_second();
  const double steps_per_s = rate / std::max<int64_t>(samples_per_step_, 1);
  const std::string eta =
      steps_per_s > 0 ? clock_string(static_cast<double>(total_ - done_) / steps_per_s) : "?";
  std::string s = label_;
  if (bar) {
    constexpr int kWidth = 20;
    const int filled = total_ ? static_cast<int>(kWidth * done_ / total_) : kWidth;
    s += " [" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "]";
  }
  s += fmt::format(" {}/{} {:3d}%  {:.0f} samples/s  ETA {}", done_, total_, percent, rate, eta);
  if (loss_) s += fmt::format("  loss {:.4f}", *loss_);
  return s;
}

void Progress::draw() {
  std::fprintf(options_.out_, "\r\033[K%s", render(true).c_str());
  std::fflush(options_.out_);
  bar_visible_ = true;
  last_draw_ = std::chrono::steady_clock::now();
}

void Progress::update(int64_t steps_done, std::optional<double> loss) {
  if (!options_.enabled_ || finished_) return;
  done_ = std::min(steps_done, total_);
  if (loss) loss_ = loss;
  if (terminal_) {
    if (done_ == total_ ||
        std::chrono::steady_clock::now() - last_draw_ >= options_.kRedrawInterval) {
      draw();
    }
    return;
  }
  const int percent = total_ ? static_cast<int>(100 * done_ / total_) : 100;
  const int step = options_.plain_every_percent_;
  if (percent / step > last_percent_printed_ / step && percent < 100) {
    last_percent_printed_ = percent;
    std::fprintf(options_.out_, "%s\n", render(false).c_str());
    std::fflush(options_.out_);
  }
}

void Progress::print_line(const std::string& line) {
  if (!options_.enabled_) return;
  if (terminal_ && bar_visible_) std::fprintf(options_.out_, "\r\033[K");
  std::fprintf(options_.out_, "%s\n", line.c_str());
  if (terminal_ && bar_visible_ && !finished_) {
    draw();
  } else {
    std::fflush(options_.out_);
  }
}

void Progress::finish() {
  if (!options_.enabled_ || finished_) return;
  if (terminal_) {
    draw();
    std::fprintf(options_.out_, "\n");
  } else {
    std::fprintf(options_.out_, "%s\n", render(false).c_str());
  }
  std::fflush(options_.out_);
  finished_ = true;
}

}  // namespace ddp
