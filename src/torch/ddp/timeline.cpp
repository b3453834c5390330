#include "ddp/torch/ddp/timeline.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp/util/error.hpp"

namespace ddp {

Timeline::Timeline(int rank)
    : rank_(rank),
      steady_anchor_(Clock::now()),
      wall_anchor_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()) {}

void Timeline::add_span(std::string name, Track track, Clock::time_point begin,
                        Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back(Span{std::move(name), track, begin, end});
}

Timeline::Scope::Scope(Timeline* timeline, std::string name, Track track)
    : timeline_(timeline), name_(std::move(name)), track_(track) {
  if (timeline_) begin_ = Clock::now();
}

Timeline::Scope::~Scope() {
  if (timeline_) timeline_->add_span(std::move(name_), track_, begin_, Clock::now());
}

size_t Timeline::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_.size();
}

std::string Timeline::to_json() const {
  using nlohmann::json;
  auto micros = [&](Clock::time_point t) {
    return wall_anchor_us_ +
           std::chrono::duration_cast<std::chrono::microseconds>(t - steady_anchor_).count();
  };
  json events = json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", fmt::format("rank {}", rank_)}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", static_cast<int>(Track::kCompute)},
                    {"args", {{"name", "compute"}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", static_cast<int>(Track::kComm)},
                    {"args", {{"name", "communication"}}}});
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Span& s : spans_) {
    events.push_back({{"name", s.name},
                      {"cat", s.track == Track::kComm ? "comm" : "compute"},
                      {"ph", "X"},
                      {"pid", rank_},
                      {"tid", static_cast<int>(s.track)},
                      {"ts", micros(s.begin)},
                      {"dur", micros(s.end) - micros(s.begin)}});
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

void Timeline::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) {
      throw UsageError(fmt::format(
          "cannot write the DDP timeline to '{}': the directory is missing or not writable; "
          "choose another timeline_path",
          path));
    }
    out << to_json();
    if (!out.flush()) throw UsageError(fmt::format("writing the DDP timeline '{}' failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw UsageError(fmt::format("cannot rename '{}' to '{}' for the DDP timeline", tmp, path));
  }
}

}  // namespace ddp
