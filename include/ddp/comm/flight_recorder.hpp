#pragma once
// FlightRecorder: a ring of one rank's last N collectives in one process group, dumped as JSON
// when a collective times out or fails so `ddprun trace` can tell which rank is behind, which
// called a different collective, and which died (docs/comm.md, "Flight recorder").
//
// Contract:
// - Capacity is fixed at construction (DDP_FLIGHT_RECORDER_ENTRIES, default 2000; 0 turns
//   recording off and every call is a no-op). The ring is allocated once; recording never
//   allocates (the caller tag is a fixed-size, truncated copy), so the cost per collective is
//   a few uncontended mutex sections and clock reads (well under 1 us).
// - record() returns an id; started()/finished() with an id that the ring has already
//   overwritten are ignored.
// - Thread-safe: the issuing thread, the group's worker thread and a dump may run at once.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/types.hpp"

namespace ddp {

enum class CollectiveState : uint8_t { kQueued, kStarted, kCompleted, kFailed };
const char* to_string(CollectiveState state);

// What the group knows about a collective when it is issued.
struct CollectiveRecordInfo {
  const char* op = "";  // static string: "all_reduce", "broadcast", ...
  DataType dtype = DataType::kUInt8;
  bool has_reduce_op = false;
  ReduceOp reduce_op = ReduceOp::kSum;
  int root = -1;  // root, or peer for send/recv; -1 when none
  uint64_t count = 0;
  uint64_t seq = 0;  // the group's collective sequence number

  // The record of a collective `op` (a static string) on `count` elements; `reduce` for the
  // reducing ones, `root` for rooted ones. seq is left for the group to set.
  static CollectiveRecordInfo of(const char* op, DataType dtype, uint64_t count,
                                 std::optional<ReduceOp> reduce = std::nullopt, int root = -1) {
    CollectiveRecordInfo info;
    info.op = op;
    info.dtype = dtype;
    info.count = count;
    info.has_reduce_op = reduce.has_value();
    if (reduce) info.reduce_op = *reduce;
    info.root = root;
    return info;
  }
};

// Identity written at the top of a dump.
struct FlightRecorderIdentity {
  std::string group;              // store prefix of the group, e.g. "default_pg/0/"
  std::string backend;            // "cpu", "gloo", ...
  int rank = 0;                   // rank in the group
  int group_size = 1;             // ranks in the group
  std::vector<int> global_ranks;  // the group's ranks as ranks of the default group
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultEntries = 2000;
  static constexpr size_t kTagBytes = 48;  // caller tags longer than this are truncated

  // DDP_FLIGHT_RECORDER_ENTRIES, else kDefaultEntries; a negative or non-numeric value is a
  // UsageError naming the variable.
  static size_t entries_from_env();
  // DDP_FLIGHT_RECORDER_DIR, else "" (dump_to_file then picks a temporary directory).
  static std::string dir_from_env();

  // The launcher's requests for a dump (flight_recorder_dump_signal(), ddp/util/dump_signal.hpp).
  // install_dump_signal_handler() installs the handler once per process, only over the
  // default disposition (a program's own handler stays); dump_signals_received() counts the
  // requests so far (a group's watcher dumps when it changes). Async-signal-safe counter.
  static void install_dump_signal_handler();
  static uint64_t dump_signals_received();

  FlightRecorder(FlightRecorderIdentity identity, size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  const FlightRecorderIdentity& identity() const { return identity_; }

  // The caller tag recorded with every later record() (DDP: "bucket=3 iter=120"); "" clears.
  void set_tag(std::string_view tag);

  // Tags every collective this thread issues, on any group, while the object lives; it wins
  // over the group's set_tag. Nested scopes restore the outer tag. DDP's Reducer wraps each
  // bucket launch in one ("DDP bucket 2, iteration 7"): a thread-local tag cannot leak onto a
  // collective another thread issues on the same group meanwhile. Allocation-free.
  class ScopedThreadTag {
   public:
    explicit ScopedThreadTag(std::string_view tag);
    ~ScopedThreadTag();
    ScopedThreadTag(const ScopedThreadTag&) = delete;
    ScopedThreadTag& operator=(const ScopedThreadTag&) = delete;

   private:
    char saved_[kTagBytes];
  };

  uint64_t record(const CollectiveRecordInfo& info);
  void started(uint64_t id);
  // error is copied only on failure.
  void finished(uint64_t id, bool ok, std::string_view error = {});

  // The whole record as one JSON object (format in docs/comm.md); `reason` says why it was
  // written.
  std::string dump_json(std::string_view reason) const;
  // Writes dump_json to DIR/flight_recorder.<group>.rank<global rank>.json (atomic rename;
  // DIR = `dir`, created if missing, else a fresh directory under $TMPDIR) and returns the path.
  // Throws Error naming the path when it cannot be written.
  std::string dump_to_file(std::string_view reason, const std::string& dir) const;

  // Live progress, for ddprun's hang watchdog (src/comm/progress_report.hpp writes it when
  // ddprun asks): operations issued and completed since the recorder was created, and the
  // oldest one still open in the ring.
  struct Progress {
    uint64_t issued = 0;
    uint64_t completed = 0;
    std::string open_op;  // "<backend>:<op>", "" when none is open
    uint64_t open_seq = 0;
    int64_t open_since_us = 0;  // when it was issued (Unix microseconds); 0 when none
    // Sums counts; keeps the older open operation.
    void add(const Progress& other);
  };
  Progress progress() const;

 private:
  struct Entry {
    uint64_t id = 0;  // record id + 1; 0 = empty slot
    CollectiveRecordInfo info;
    CollectiveState state = CollectiveState::kQueued;
    int64_t queued_us = 0, started_us = 0, ended_us = 0;  // Unix time, microseconds
    char tag[kTagBytes] = {};
    std::string error;
  };
  Entry* slot(uint64_t id);  // nullptr when overwritten; mutex_ held

  FlightRecorderIdentity identity_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  uint64_t next_id_ = 0;
  uint64_t completed_ = 0;
  char tag_[kTagBytes] = {};
};

}  // namespace ddp
