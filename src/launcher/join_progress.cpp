#include "ddp/launcher/join_progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// Whole seconds from 10 s on ("600 s"), else one decimal without a trailing ".0" ("2.5 s", "4 s").
std::string seconds_text(rdzv::Millis d) {
  const double s = static_cast<double>(d.count()) / 1000.0;
  if (s >= 10) return fmt::format("{:.0f} s", s);
  std::string text = fmt::format("{:.1f}", s);
  if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) text.resize(text.size() - 2);
  return text + " s";
}

std::string nodes_text(const rdzv::NodeRange& nodes) {
  if (nodes.min == nodes.max) return fmt::format("{} node{}", nodes.max, nodes.max == 1 ? "" : "s");
  return fmt::format("{} to {} nodes", nodes.min, nodes.max);
}

std::string store_text(const JoinWait& w) {
  if (rdzv::uses_etcd(w.backend)) return w.endpoint;  // "etcd at ... (prefix ...)"
  const std::string rank = w.node_rank >= 0 ? fmt::format("node rank {}", w.node_rank) : "";
  if (w.serves_store) {
    return fmt::format("{}, served by this node{}", w.endpoint,
                       rank.empty() ? "" : " (" + rank + ")");
  }
  return fmt::format("{}, served by the ddprun at that address{}", w.endpoint,
                     rank.empty() ? "" : " (this is " + rank + ")");
}

std::string limit_text(const JoinWait& w) {
  return fmt::format("giving up after {} (--rdzv-conf join_timeout=SECONDS)",
                     seconds_text(w.limit));
}

std::string missing_text(const std::vector<int>& missing) {
  constexpr size_t kListed = 8;
  if (missing.empty()) return "";
  std::vector<int> shown(missing.begin(), missing.begin() + std::min(missing.size(), kListed));
  std::string more =
      missing.size() > kListed ? fmt::format(" and {} more", missing.size() - kListed) : "";
  return fmt::format(" (missing: node rank{} {}{})", missing.size() == 1 ? "" : "s",
                     fmt::join(shown, ", "), more);
}

}  // namespace

std::string format_join_start(const JoinWait& w, rdzv::Millis interval) {
  return fmt::format(
      "waiting for the other nodes of {} run '{}' ({}): the rendezvous store is {}; {}; a "
      "progress line every {}",
      rdzv::to_string(w.backend), w.run_id, nodes_text(w.nodes), store_text(w), limit_text(w),
      seconds_text(interval));
}

std::string format_join_progress(const JoinWait& w, rdzv::Millis waited,
                                 const std::optional<JoinCount>& count,
                                 const std::string& uncounted) {
  std::string arrived;
  if (count) {
    arrived = fmt::format(": {} of {} nodes arrived{}", count->arrived, count->expected,
                          missing_text(count->missing));
  } else {
    arrived =
        fmt::format(" ({}{})", nodes_text(w.nodes), uncounted.empty() ? "" : "; " + uncounted);
  }
  return fmt::format(
      "still waiting for the other nodes of {} run '{}'{} at the rendezvous store {}; waited {}, "
      "{}",
      rdzv::to_string(w.backend), w.run_id, arrived, store_text(w), seconds_text(waited),
      limit_text(w));
}

std::optional<JoinCount> count_static_arrivals(std::shared_ptr<Store> store,
                                               const rdzv::RendezvousOptions& options,
                                               int64_t generation) {
  // A second Rendezvous object on this connection only reads (diagnose); the agent's own
  // object and connection are busy in next_round() on another thread.
  rdzv::Rendezvous reader(options, std::move(store));
  const rdzv::TimeoutDiagnosis d = reader.diagnose(generation, "nodes to join", rdzv::Millis(0));
  const auto& missing = d.missing_ranks;
  if (std::find(missing.begin(), missing.end(), options.node_rank) != missing.end()) {
    return std::nullopt;
  }
  JoinCount c;
  c.arrived = d.joined_count;
  c.expected = options.nodes.max;
  c.missing = missing;
  return c;
}

struct JoinProgress::State {
  JoinWait wait;
  rdzv::Millis interval;
  Counter counter;
  std::function<void(const std::string&)> notice;

  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;  // guarded by mutex; once set, no line is written
  std::thread thread;

  void run() {
    const auto start = Clock::now();
    auto next = start + interval;
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_until(lock, next, [this] { return stop; })) {
      lock.unlock();
      std::optional<JoinCount> count;
      std::string uncounted = counter.uncounted;
      if (counter.count) {
        try {
          count = counter.count();
        } catch (const std::exception& e) {
          uncounted = fmt::format("could not count them: {}", e.what());
        }
      }
      lock.lock();
      if (stop) break;  // the wait ended during the count; the line would be stale
      const auto now = Clock::now();
      notice(format_join_progress(wait, std::chrono::duration_cast<rdzv::Millis>(now - start),
                                  count, uncounted));
      // A count slower than the interval delays the next line rather than bunching them.
      next += interval;
      if (next <= now) next = now + interval;
    }
  }
};

JoinProgress::JoinProgress(JoinWait wait, rdzv::Millis interval, Counter counter,
                           std::function<void(const std::string&)> notice)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.wait = std::move(wait);
  // At least 10 ms, so a tiny interval cannot turn the reporter into a busy loop.
  s.interval = std::max(interval, rdzv::Millis(10));
  s.counter = std::move(counter);
  s.notice = std::move(notice);
  s.notice(format_join_start(s.wait, s.interval));
  s.thread = std::thread([&s] { s.run(); });
}

JoinProgress::~JoinProgress() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
}

}  // namespace ddp::launcher
