#pragma once
// Straggler detection: which rank makes the others wait in DDP's gradient all-reduces, and
// how much of the step that costs.
//
// Each rank adds up, per synchronized iteration, how long it is blocked on its bucket
// all-reduces (a bucket reduced inline while a peer has not launched it yet, and finishing the
// buckets at the end of backward): its wait for its peers. A rank that reaches the all-reduces
// late (slow data, a slower node, a larger batch) waits least, since the collectives complete
// as soon as it joins; the others wait for it. Every `window` synchronized iterations the ranks
// exchange their sums (one all-reduce of 2 doubles per rank, tagged "DDP straggler statistics"
// in the flight recorder): the rank that waited least is the straggler, and the time it cost
// is the others' mean wait minus its own. When that exceeds `threshold` of the mean step time
// (the wall time between two synchronized iterations), rank 0 logs one `ddp.ddp` warning:
//
//   DDP straggler: rank 1 made the other ranks wait 42% of each step over iterations 101-200
//   (51.3 ms of 122.0 ms per step on average) ...
//
// DDP_STRAGGLER_WINDOW sets `window` (default 100 iterations; 0 turns the check off).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp {

struct StragglerFinding {
  int rank = 0;         // the rank the others waited for
  double cost_s = 0;    // the others' mean wait minus its own, over the window
  double step_s = 0;    // mean step time over the window, summed over its iterations
  double fraction = 0;  // cost_s / step_s
  int64_t first_iteration = 0, last_iteration = 0;
};

// The analysis of one window: wait_s[r] and step_s[r] are rank r's sums. nullopt when fewer
// than 2 ranks or the cost stays at or under `threshold` of the step.
std::optional<StragglerFinding> find_straggler(const std::vector<double>& wait_s,
                                               const std::vector<double>& step_s, double threshold);

// The warning rank 0 logs.
std::string describe(const StragglerFinding& finding);

class StragglerMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kThreshold = 0.2;
  static constexpr int64_t kDefaultWindow = 100;

  // DDP_STRAGGLER_WINDOW, else kDefaultWindow; a negative value is a UsageError naming it.
  static int64_t window_from_env();

  StragglerMonitor(int64_t window, double threshold = kThreshold)
      : window_(window), threshold_(threshold) {}

  bool enabled() const { return window_ > 0; }

  // Time this rank was blocked on its peers in the current iteration.
  void add_wait(Clock::duration d) { wait_ += d; }

  // The end of synchronized iteration `iteration` (every rank calls it for the same ones).
  // Every window-th counted iteration it exchanges the sums over `pg` (the caller provides
  // the all-reduce of a world-sized vector of doubles, in place, so the torch layer can place
  // it on the group's device) and returns the finding, logged on rank 0.
  template <class AllReduceDoubles>
  std::optional<StragglerFinding> end_iteration(const ProcessGroup& pg, int64_t iteration,
                                                AllReduceDoubles&& all_reduce) {
    if (!enabled() || pg.size() < 2) return std::nullopt;
    const Clock::time_point now = Clock::now();
    if (!started_) {  // the first iteration has no step before it to measure
      started_ = true;
      last_end_ = now;
      wait_ = {};
      first_ = iteration + 1;
      return std::nullopt;
    }
    window_wait_ += wait_;
    window_step_ += now - last_end_;
    wait_ = {};
    last_end_ = now;
    if (++counted_ < window_) return std::nullopt;
    std::vector<double> sums(2 * static_cast<size_t>(pg.size()), 0.0);
    sums[2 * pg.rank()] = std::chrono::duration<double>(window_wait_).count();
    sums[2 * pg.rank() + 1] = std::chrono::duration<double>(window_step_).count();
    all_reduce(sums);
    std::vector<double> wait(pg.size()), step(pg.size());
    for (int r = 0; r < pg.size(); ++r) {
      wait[r] = sums[2 * r];
      step[r] = sums[2 * r + 1];
    }
    auto finding = find_straggler(wait, step, threshold_);
    if (finding) {
      finding->first_iteration = first_;
      finding->last_iteration = iteration;
    }
    log_finding(pg, finding);
    counted_ = 0;
    window_wait_ = window_step_ = {};
    first_ = iteration + 1;
    return finding;
  }

 private:
  void log_finding(const ProcessGroup& pg, const std::optional<StragglerFinding>& finding) const;

  int64_t window_;
  double threshold_;
  bool started_ = false;
  Clock::time_point last_end_;
  Clock::duration wait_{}, window_wait_{}, window_step_{};
  int64_t counted_ = 0;
  int64_t first_ = 0;
};

}  // namespace ddp
