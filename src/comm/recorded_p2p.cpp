#include "recorded_p2p.hpp"

#include <atomic>
#include <exception>
#include <utility>

#include "ddp/util/error.hpp"

namespace ddp::detail {

namespace {

class RecordedP2PWork : public Work {
 public:
  RecordedP2PWork(FlightRecorder* recorder, uint64_t record, WorkPtr inner)
      : recorder_(recorder), record_(record), inner_(std::move(inner)) {}

  void wait(std::chrono::milliseconds timeout) override {
    try {
      inner_->wait(timeout);
    } catch (const TimeoutError&) {
      throw;  // still open: the record keeps saying so
    } catch (const std::exception& e) {
      report(false, e.what());
      throw;
    }
    report(true, {});
  }

  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    report(true, {});
    return true;
  }

 private:
  void report(bool ok, std::string_view error) {
    if (!reported_.exchange(true)) recorder_->finished(record_, ok, error);
  }

  FlightRecorder* recorder_;  // the group's; the group outlives its Works' use
  uint64_t record_;
  WorkPtr inner_;
  std::atomic<bool> reported_{false};
};

}  // namespace

uint64_t record_p2p(FlightRecorder* recorder, const char* op, DataType dtype, uint64_t count,
                    int peer) {
  if (!recorder) return 0;
  return recorder->record(CollectiveRecordInfo::of(op, dtype, count, std::nullopt, peer));
}

void record_p2p_start(FlightRecorder* recorder, uint64_t record) {
  if (recorder) recorder->started(record);
}

void record_p2p_finished(FlightRecorder* recorder, uint64_t record,
                         const std::exception_ptr& error) {
  if (!recorder) return;
  if (!error) return recorder->finished(record, true);
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    recorder->finished(record, false, e.what());
  } catch (...) {
    recorder->finished(record, false, "unknown error");
  }
}

uint64_t record_p2p_started(FlightRecorder* recorder, const char* op, DataType dtype,
                            uint64_t count, int peer) {
  const uint64_t id = record_p2p(recorder, op, dtype, count, peer);
  record_p2p_start(recorder, id);
  return id;
}

WorkPtr record_p2p_completion(FlightRecorder* recorder, uint64_t record, WorkPtr inner) {
  if (!recorder) return inner;
  return std::make_shared<RecordedP2PWork>(recorder, record, std::move(inner));
}

}  // namespace ddp::detail
