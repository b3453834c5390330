#pragma once
// Timeline: per-rank spans (forward, backward, each bucket's all-reduce, optimizer step)
// written as Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev).
//
// One Timeline belongs to one rank. Thread-safe: spans may be added from the training thread
// and from autograd threads. Timestamps are wall-clock microseconds (system_clock), so the
// files of several processes on one machine line up when loaded together. Track (tid) 0
// holds compute spans, track 1 communication spans.

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Track : int { kCompute = 0, kComm = 1 };

  explicit Timeline(int rank);

  int rank() const { return rank_; }

  // Records a finished span [begin, end).
  void add_span(std::string name, Track track, Clock::time_point begin, Clock::time_point end);

  // Records the span from construction to destruction of the returned object.
  class Scope {
   public:
    Scope(Timeline* timeline, std::string name, Track track);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* timeline_;  // null: disabled, records nothing
    std::string name_;
    Track track_;
    Clock::time_point begin_;
  };

  size_t size() const;

  // The Chrome trace document: {"traceEvents": [...], "displayTimeUnit": "ms"}.
  std::string to_json() const;

  // Writes to_json() to path (atomically: a temporary beside it, then rename). Throws
  // UsageError naming the path when it cannot be written.
  void write(const std::string& path) const;

 private:
  struct Span {
    std::string name;
    Track track;
    Clock::time_point begin;
    Clock::time_point end;
  };

  int rank_;
  // Maps steady_clock to wall-clock microseconds since the epoch.
  Clock::time_point steady_anchor_;
  int64_t wall_anchor_us_;
  mutable std::mutex mutex_;
  std::vector<Span> spans_;
};

}  // namespace ddp
