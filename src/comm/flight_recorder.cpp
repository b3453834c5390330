#include "ddp/comm/flight_recorder.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp/util/dump_signal.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "progress_report.hpp"

namespace ddp {

namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void copy_tag(char (&dst)[FlightRecorder::kTagBytes], std::string_view src) {
  const size_t n = std::min(src.size(), FlightRecorder::kTagBytes - 1);
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

std::string sanitize(const std::string& group) {
  std::string out;
  for (char c : group) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    out += ok ? c : '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "group" : out;
}

std::atomic<uint64_t> g_dump_signals{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

void on_dump_signal(int) {
  g_dump_signals.fetch_add(1, std::memory_order_relaxed);
}

// ScopedThreadTag's tag; empty: the group's tag applies.
thread_local char t_thread_tag[FlightRecorder::kTagBytes] = {};

}  // namespace

void FlightRecorder::install_dump_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int sig = flight_recorder_dump_signal();
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) return;
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_handler = on_dump_signal;
    sa.sa_flags = SA_RESTART;  // interrupted system calls resume: the program never sees EINTR
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  });
}

uint64_t FlightRecorder::dump_signals_received() {
  return g_dump_signals.load(std::memory_order_relaxed);
}

FlightRecorder::ScopedThreadTag::ScopedThreadTag(std::string_view tag) {
  std::memcpy(saved_, t_thread_tag, kTagBytes);
  copy_tag(t_thread_tag, tag);
}

FlightRecorder::ScopedThreadTag::~ScopedThreadTag() {
  std::memcpy(t_thread_tag, saved_, kTagBytes);
}

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kQueued:
      return "queued";
    case CollectiveState::kStarted:
      return "started";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
  }
  return "unknown";
}

size_t FlightRecorder::entries_from_env() {
  const auto v = env::get_int("DDP_FLIGHT_RECORDER_ENTRIES");
  if (!v) return kDefaultEntries;
  if (*v < 0 || *v > (int64_t{1} << 24)) {
    throw UsageError(fmt::format(
        "DDP_FLIGHT_RECORDER_ENTRIES={}: expected a number of entries from 0 (off) to {}", *v,
        int64_t{1} << 24));
  }
  return static_cast<size_t>(*v);
}

std::string FlightRecorder::dir_from_env() {
  return env::get_or("DDP_FLIGHT_RECORDER_DIR", "");
}

FlightRecorder::FlightRecorder(FlightRecorderIdentity identity, size_t capacity)
    : identity_(std::move(identity)), capacity_(capacity), ring_(capacity) {
  if (capacity_ > 0) detail::register_progress_source(this);
}

FlightRecorder::~FlightRecorder() {
  if (capacity_ > 0) detail::unregister_progress_source(this);
}

void FlightRecorder::set_tag(std::string_view tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  copy_tag(tag_, tag);
}

FlightRecorder::Entry* FlightRecorder::slot(uint64_t id) {
  Entry& e = ring_[id % capacity_];
  return e.id == id + 1 ? &e : nullptr;
}

uint64_t FlightRecorder::record(const CollectiveRecordInfo& info) {
  if (capacity_ == 0) return 0;
  const int64_t t = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  Entry& e = ring_[id % capacity_];
  e.id = id + 1;
  e.info = info;
  e.state = CollectiveState::kQueued;
  e.queued_us = t;
  e.started_us = 0;
  e.ended_us = 0;
  std::memcpy(e.tag, t_thread_tag[0] ? t_thread_tag : tag_, kTagBytes);
  e.error.clear();  // keeps its capacity: no allocation on the success path
  return id;
}

void FlightRecorder::started(uint64_t id) {
  if (capacity_ == 0) return;
  const int64_t t = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = slot(id)) {
    e->state = CollectiveState::kStarted;
    e->started_us = t;
  }
}

void FlightRecorder::finished(uint64_t id, bool ok, std::string_view error) {
  if (capacity_ == 0) return;
  const int64_t t = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  if (ok) ++completed_;
  if (Entry* e = slot(id)) {
    e->state = ok ? CollectiveState::kCompleted : CollectiveState::kFailed;
    e->ended_us = t;
    if (!ok) e->error.assign(error);
  }
}

FlightRecorder::Progress FlightRecorder::progress() const {
  Progress p;
  std::lock_guard<std::mutex> lock(mutex_);
  p.issued = next_id_;
  p.completed = completed_;
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 0;
  for (uint64_t id = first; id < next_id_; ++id) {
    const Entry& e = ring_[id % capacity_];
    if (e.id != id + 1) continue;
    if (e.state == CollectiveState::kQueued || e.state == CollectiveState::kStarted) {
      p.open_op = identity_.backend + ":" + e.info.op;
      p.open_seq = e.info.seq;
      p.open_since_us = e.queued_us;
      break;  // ids grow with time: the first open one is the oldest
    }
  }
  return p;
}

void FlightRecorder::Progress::add(const Progress& other) {
  issued += other.issued;
  completed += other.completed;
  if (other.open_since_us != 0 && (open_since_us == 0 || other.open_since_us < open_since_us)) {
    open_op = other.open_op;
    open_seq = other.open_seq;
    open_since_us = other.open_since_us;
  }
}

std::string FlightRecorder::dump_json(std::string_view reason) const {
  using nlohmann::json;
  json doc;
  doc["format"] = "ddp-flight-recorder";
  doc["version"] = 1;
  doc["group"] = identity_.group;
  doc["backend"] = identity_.backend;
  doc["rank"] = identity_.rank;
  doc["group_size"] = identity_.group_size;
  doc["global_ranks"] = identity_.global_ranks;
  doc["global_rank"] = identity_.rank < static_cast<int>(identity_.global_ranks.size())
                           ? identity_.global_ranks[identity_.rank]
                           : identity_.rank;
  doc["pid"] = static_cast<int64_t>(::getpid());
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  doc["host"] = host;
  doc["reason"] = std::string(reason);
  doc["dumped_at_us"] = now_us();
  doc["capacity"] = capacity_;
  json entries = json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  doc["recorded"] = next_id_;
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 0;
  for (uint64_t id = first; id < next_id_; ++id) {
    const Entry& e = ring_[id % capacity_];
    json j;
    j["seq"] = e.info.seq;
    j["op"] = e.info.op;
    j["dtype"] = to_string(e.info.dtype);
    j["count"] = e.info.count;
    if (e.info.has_reduce_op) j["reduce_op"] = to_string(e.info.reduce_op);
    if (e.info.root >= 0) j["root"] = e.info.root;
    j["state"] = to_string(e.state);
    j["queued_us"] = e.queued_us;
    if (e.started_us) j["started_us"] = e.started_us;
    if (e.ended_us) j["ended_us"] = e.ended_us;
    if (e.tag[0]) j["tag"] = std::string(e.tag);
    if (!e.error.empty()) j["error"] = e.error;
    entries.push_back(std::move(j));
  }
  doc["entries"] = std::move(entries);
  return doc.dump(1);
}

std::string FlightRecorder::dump_to_file(std::string_view reason, const std::string& dir) const {
  std::string target = dir;
  if (target.empty()) {
    std::string tmpl = env::get_or("TMPDIR", "/tmp") + "/ddp-flight-recorder-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw Error(fmt::format("flight recorder: cannot create a directory from {}: {}", tmpl,
                              std::strerror(errno)));
    }
    target = tmpl;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(target, ec);  // a failure shows when writing below
  }
  const int global_rank = identity_.rank < static_cast<int>(identity_.global_ranks.size())
                              ? identity_.global_ranks[identity_.rank]
                              : identity_.rank;
  const std::string path = fmt::format("{}/flight_recorder.{}.rank{}.json", target,
                                       sanitize(identity_.group), global_rank);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << dump_json(reason) << '\n';
    if (!out) {
      throw Error(
          fmt::format("flight recorder: cannot write {} (set DDP_FLIGHT_RECORDER_DIR to "
                      "a writable directory)",
                      tmp));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw Error(fmt::format("flight recorder: cannot rename {} to {}: {}", tmp, path,
                            std::strerror(errno)));
  }
  return path;
}

}  // namespace ddp
