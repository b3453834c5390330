#include "progress_report.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/util/env.hpp"

namespace ddp::detail {
namespace {

class ProgressRegistry {
 public:
  void add(const FlightRecorder* recorder) {
    std::lock_guard<std::mutex> lock(mutex_);
    sources_.push_back(recorder);
    if (!started_) start();
  }

  void remove(const FlightRecorder* recorder) {
    std::lock_guard<std::mutex> lock(mutex_);
    sources_.erase(std::remove(sources_.begin(), sources_.end(), recorder), sources_.end());
  }

 private:
  // mutex_ held. Starts the writer when ddprun asked for progress records.
  void start() {
    started_ = true;
    dir_ = env::get_or("DDPRUN_PROGRESS_DIR", "");
    if (dir_.empty()) return;
    const std::string rank = env::get_or("RANK", "");
    if (rank.empty()) return;
    path_ = fmt::format("{}/progress.rank{}.ddp.json", dir_, rank);
    rank_ = std::atoi(rank.c_str());
    const double seconds = std::atof(env::get_or("DDPRUN_PROGRESS_INTERVAL_S", "1").c_str());
    interval_ = std::chrono::milliseconds(
        static_cast<int64_t>(1000 * (seconds > 0 ? std::min(seconds, 3600.0) : 1.0)));
    std::thread([this] {
      ::pthread_setname_np(::pthread_self(), "ddp-progress");
      loop();
    }).detach();
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait_for(lock, interval_);
      FlightRecorder::Progress total;
      for (const FlightRecorder* r : sources_) total.add(r->progress());
      lock.unlock();
      write(total);
      lock.lock();
    }
  }

  // Best effort: a folder that vanished (ddprun cleaning up at exit) must not end the worker.
  void write(const FlightRecorder::Progress& p) const {
    nlohmann::json j;
    j["rank"] = rank_;
    j["pid"] = static_cast<int64_t>(::getpid());
    j["completed"] = p.completed;
    j["enqueued"] = p.issued;
    j["open_op"] = p.open_op;
    j["open_seq"] = p.open_seq;
    j["open_since_us"] = p.open_since_us;
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << j.dump() << '\n';
      if (!out) return;
    }
    std::rename(tmp.c_str(), path_.c_str());
  }

  std::mutex mutex_;
  std::condition_variable wake_;  // never notified: the loop only sleeps on it
  std::vector<const FlightRecorder*> sources_;
  bool started_ = false;
  std::string dir_, path_;
  int rank_ = 0;
  std::chrono::milliseconds interval_{1000};
};

ProgressRegistry& registry() {
  static ProgressRegistry* r = new ProgressRegistry();  // never destroyed (header comment)
  return *r;
}

}  // namespace

void register_progress_source(const FlightRecorder* recorder) {
  registry().add(recorder);
}

void unregister_progress_source(const FlightRecorder* recorder) {
  registry().remove(recorder);
}

}  // namespace ddp::detail
