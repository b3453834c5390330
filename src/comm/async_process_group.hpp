#pragma once
// AsyncProcessGroup: turns a backend's blocking collectives into the asynchronous ProcessGroup
// interface (internal header).
//
// - One worker thread per group runs queued operations in issue order. A small operation
//   (<= inline_bytes) issued while nothing is queued runs directly in the caller's thread and
//   returns a completed Work: a thread hand-off would cost more than the collective itself.
// - Arguments are validated when the call is issued (UsageError, thrown synchronously).
// - With debug_collectives, every collective first exchanges a fingerprint (sequence number,
//   op, dtype, count, root) through the store; a mismatch raises CollectiveError naming both
//   calls, a rank that never arrives raises TimeoutError naming it.
// - After an operation fails the group is broken: the peers' state is unknown, so every later
//   operation fails at once with the original error rather than hanging.
// - Flight recorder (config.flight_recorder_entries > 0): every collective is recorded as
//   queued, started, completed or failed. When one fails, this rank writes its record and
//   sets the store key `<prefix>flight_recorder/dump`; a watcher thread on every rank polls
//   that key (every kWatchInterval, a cheap check) and writes its record too, then acks under
//   `<prefix>flight_recorder/dumped/<rank>`. The failing rank waits (bounded) for the acks
//   before reporting its error, so the others dump before the launcher stops them.
//
// Derived classes implement the run_* methods and must call shutdown() first thing in their
// destructor (the worker thread calls their virtuals).

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "abort_signal.hpp"
#include "call_info.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/store/store.hpp"
#include "future_work.hpp"

namespace ddp::detail {

struct GroupConfig {
  std::shared_ptr<Store> store;  // shared by all ranks of the group
  std::string prefix;            // store key prefix unique to this group, ends with '/'
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout = ProcessGroup::kDefaultTimeout;
  bool debug_collectives = false;
  size_t inline_bytes = 0;
  std::vector<int> global_ranks;  // this group's ranks as ranks of the default group
  std::string backend;            // name written in flight recorder dumps
  // Flight recorder ring size (0: off) and dump directory ("" : a temporary directory).
  // init_process_group fills them from DDP_FLIGHT_RECORDER_ENTRIES / _DIR.
  size_t flight_recorder_entries = 0;
  std::string flight_recorder_dir;
};

class AsyncProcessGroup : public ProcessGroup {
 public:
  explicit AsyncProcessGroup(GroupConfig config);
  ~AsyncProcessGroup() override;

  WorkPtr all_reduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  WorkPtr broadcast(void* data, size_t count, DataType dtype, int root) override;
  WorkPtr reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root) override;
  WorkPtr all_gather(const void* in, void* out, size_t count, DataType dtype) override;
  WorkPtr all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                       DataType dtype) override;
  WorkPtr gather(const void* in, void* out, size_t count, DataType dtype, int root) override;
  WorkPtr scatter(const void* in, void* out, size_t count, DataType dtype, int root) override;
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                         ReduceOp op) override;
  WorkPtr all_to_all(const void* in, void* out, size_t count, DataType dtype) override;
  WorkPtr barrier() override;
  // send/recv stay abstract: each backend posts them outside the collective queue, so a recv
  // can wait for its send without blocking the collectives behind it.

  // Creates the sub-group of `ranks` (ranks of this group). Every rank of this group must call
  // it, in the same order relative to other new_group calls; non-members get nullptr.
  ProcessGroupPtr create_subgroup(const std::vector<int>& ranks);

  const GroupConfig& config() const { return config_; }

  FlightRecorder* flight_recorder() override { return recorder_.get(); }

  // In-place recovery: raises abort_signal(); queued and later operations fail with `cause`
  // at once, the running one when its backend's wait next polls the signal (cpu: shared
  // memory waits and the leaders' ring, at least every 100 ms) or when
  // end_running_operation() ends it (Gloo's calls). No flight record is written for it (an
  // expected event, and the store round trips of a dump would delay the survivors).
  void notify_peer_lost(const PeerLostError& cause) override;

  // Writes this rank's flight record (once per group; later calls return "") and logs the
  // path. Returns the path, or "" when nothing was written.
  std::string dump_flight_record(const std::string& reason);

  // Thread names (ps -L, top -H, gdb) of the worker and the flight recorder's watcher.
  static constexpr const char* kWorkerThreadName = "ddp-pg-worker";
  static constexpr const char* kWatcherThreadName = "ddp-pg-watcher";

  static constexpr std::chrono::milliseconds kWatchInterval{200};
  static constexpr std::chrono::milliseconds kDumpAckTimeout{3000};

 protected:
  // Blocking implementations, called on the worker thread (or inline), one at a time.
  virtual void run_all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                              const CallInfo& call) = 0;
  virtual void run_broadcast(void* data, size_t count, DataType dtype, int root,
                             const CallInfo& call) = 0;
  virtual void run_reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root,
                          const CallInfo& call) = 0;
  virtual void run_all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                                DataType dtype, const CallInfo& call) = 0;
  virtual void run_all_gather(const void* in, void* out, size_t count, DataType dtype,
                              const CallInfo& call);
  virtual void run_gather(const void* in, void* out, size_t count, DataType dtype, int root,
                          const CallInfo& call) = 0;
  virtual void run_scatter(const void* in, void* out, size_t count, DataType dtype, int root,
                           const CallInfo& call) = 0;
  virtual void run_reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                                  ReduceOp op, const CallInfo& call) = 0;
  virtual void run_all_to_all(const void* in, void* out, size_t count, DataType dtype,
                              const CallInfo& call) = 0;
  virtual void run_barrier(const CallInfo& call) = 0;

  // Builds a group of the same backend for a sub-group configuration.
  virtual ProcessGroupPtr make_same_backend(GroupConfig config) = 0;

  // Called once by notify_peer_lost, after abort_signal() is raised, on the notifying thread
  // (the worker may be inside an operation meanwhile): a backend whose blocking waits do not
  // poll the signal ends them here, making them fail now; they then throw the abort's error.
  virtual void end_running_operation() noexcept {}

  // Throws UsageError for a bad peer (out of range or this rank) or a null buffer.
  // UsageError "<op>: <name> is null but count is N; ..." for a null buffer of N > 0 elements.
  static void check_buffer(const void* p, size_t count, const char* name, const char* op);
  void validate_p2p(const void* data, size_t count, int peer, const char* op,
                    const char* peer_name) const;

  // Stops the worker after the queued operations finished. Idempotent.
  void shutdown();

  // "rank 1 of 4 (backend cpu, group default_pg/0/)"
  std::string where() const;

  // Raised by notify_peer_lost; backends pass it to their blocking waits.
  const AbortSignal& abort_signal() const { return abort_; }

  GroupConfig config_;

 private:
  struct Job {
    CallInfo call;
    uint64_t record_id;
    std::function<void(const CallInfo&)> fn;
    std::shared_ptr<FutureWork> work;
  };

  WorkPtr submit(CallInfo call, std::function<void(const CallInfo&)> fn);
  void execute(Job& job);
  void check_fingerprint(const CallInfo& call);
  void worker_loop();
  void check_rank(int peer, const char* what) const;
  void on_failure(const CallInfo& call, const std::string& what);
  void watcher_loop();

  uint64_t next_seq_ = 0;
  uint64_t subgroups_created_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool running_ = false;  // a job is executing (worker or inline)
  bool stop_ = false;
  std::exception_ptr broken_;
  std::thread worker_;

  AbortSignal abort_;
  std::unique_ptr<FlightRecorder> recorder_;
  std::atomic<bool> dumped_{false};
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread watcher_;
};

}  // namespace ddp::detail
