#include "ddp/launcher/hang_watchdog.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "ddp/launcher/stacks.hpp"

namespace ddp::launcher {

std::optional<std::string> HangWatchdog::observe(const std::vector<int>& ranks,
                                                 const std::vector<RankProgress>& records,
                                                 Clock::time_point now, int64_t now_unix_us) {
  int64_t total = 0;
  for (const auto& r : records) total += r.completed;
  if (total != last_total_) {
    last_total_ = total;
    last_change_ = now;
    return std::nullopt;
  }
  const auto still = now - last_change_;
  if (still < timeout_) return std::nullopt;
  const int64_t limit_us = std::chrono::duration_cast<std::chrono::microseconds>(timeout_).count();
  // Ranks grouped by the collective they wait in (op and sequence number).
  std::map<std::pair<std::string, int64_t>, std::pair<std::vector<int>, int64_t>> waits;
  bool long_wait = false;
  std::vector<int> idle;
  std::map<int, const RankProgress*> by_rank;
  for (const auto& r : records) by_rank[r.global_rank] = &r;
  for (int rank : ranks) {
    auto it = by_rank.find(rank);
    if (it == by_rank.end() || it->second->open_since_us == 0) {
      idle.push_back(rank);
      continue;
    }
    const RankProgress& r = *it->second;
    auto& w = waits[{r.open_op, r.open_seq}];
    w.first.push_back(rank);
    const int64_t waited = now_unix_us - r.open_since_us;
    w.second = std::max(w.second, waited);
    if (waited >= limit_us) long_wait = true;
  }
  if (!long_wait) return std::nullopt;
  waiting_.clear();
  idle_ = idle;
  std::string text = fmt::format("no collective completed for {:.1f} s (--hang-timeout {:g})",
                                 std::chrono::duration<double>(still).count(),
                                 std::chrono::duration<double>(timeout_).count());
  std::string sep = ": ";
  for (const auto& [what, w] : waits) {
    waiting_.insert(waiting_.end(), w.first.begin(), w.first.end());
    text += fmt::format("{}{} {} in {} #{} since {:.1f} s", sep, rank_list_text(w.first),
                        w.first.size() == 1 ? "waits" : "wait", what.first, what.second,
                        w.second / 1e6);
    sep = "; ";
  }
  if (!idle.empty()) {
    // "(1 completed)", "(rank 1: 1 completed, rank 3: no progress record)"
    std::string counts;
    for (int rank : idle) {
      auto it = by_rank.find(rank);
      const std::string c = it == by_rank.end()
                                ? "no progress record"
                                : fmt::format("{} completed", it->second->completed);
      counts += (counts.empty() ? "" : ", ") +
                (idle.size() == 1 ? c : fmt::format("rank {}: {}", rank, c));
    }
    text += fmt::format("; {} {} in no collective ({})", rank_list_text(idle),
                        idle.size() == 1 ? "is" : "are", counts);
  }
  return text;
}

}  // namespace ddp::launcher
