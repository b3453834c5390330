#include "async_process_group.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>

#include <algorithm>
#include <sstream>

#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp::detail {

namespace {

std::string encode(const CallInfo& c) {
  return fmt::format("{} {} {} {} {} {} {}", static_cast<int>(c.kind), static_cast<int>(c.dtype),
                     static_cast<int>(c.op), c.has_op ? 1 : 0, c.root, c.count, c.seq);
}

CallInfo decode(const std::string& s) {
  std::istringstream in(s);
  int kind = 0, dtype = 0, op = 0, has_op = 0;
  CallInfo c;
  in >> kind >> dtype >> op >> has_op >> c.root >> c.count >> c.seq;
  if (!in) throw ProtocolError("malformed collective fingerprint '" + s + "' in the store");
  c.kind = static_cast<OpKind>(kind);
  c.dtype = static_cast<DataType>(dtype);
  c.op = static_cast<ReduceOp>(op);
  c.has_op = has_op != 0;
  return c;
}

}  // namespace

AsyncProcessGroup::AsyncProcessGroup(GroupConfig config)
    : ProcessGroup(config.rank, config.size, config.timeout), config_(std::move(config)) {
  if (config_.global_ranks.empty()) {
    for (int r = 0; r < config_.size; ++r) config_.global_ranks.push_back(r);
  }
  if (config_.flight_recorder_entries > 0) {
    FlightRecorderIdentity id;
    id.group = config_.prefix;
    id.backend = config_.backend.empty() ? "unknown" : config_.backend;
    id.rank = config_.rank;
    id.group_size = config_.size;
    id.global_ranks = config_.global_ranks;
    recorder_ = std::make_unique<FlightRecorder>(std::move(id), config_.flight_recorder_entries);
    if (config_.size > 1 && config_.store) {
      FlightRecorder::install_dump_signal_handler();
      watcher_ = std::thread([this] {
        ::pthread_setname_np(::pthread_self(), kWatcherThreadName);
        watcher_loop();
      });
    }
  }
  worker_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), kWorkerThreadName);
    worker_loop();
  });
}

AsyncProcessGroup::~AsyncProcessGroup() {
  shutdown();
}

void AsyncProcessGroup::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_ && !worker_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::string AsyncProcessGroup::dump_flight_record(const std::string& reason) {
  if (!recorder_ || dumped_.exchange(true)) return "";
  // No where(): the watcher may get here while a derived constructor still runs, and
  // backend_name() is virtual.
  const std::string who = fmt::format("rank {} of {} (backend {}, group {})", rank_, size_,
                                      recorder_->identity().backend, config_.prefix);
  std::string path;
  try {
    path = recorder_->dump_to_file(reason, config_.flight_recorder_dir);
    log::get("ddp.comm")->warn("flight recorder: {} wrote {} ({})", who, path, reason);
  } catch (const std::exception& e) {
    log::get("ddp.comm")
        ->error("flight recorder: {} could not write its record: {}", who, e.what());
  }
  return path;
}

void AsyncProcessGroup::on_failure(const CallInfo& call, const std::string& what) {
  if (!recorder_) return;
  const std::string reason = fmt::format("{} failed on rank {} of group {}: {}", call.describe(),
                                         rank_, config_.prefix, what);
  const std::string path = dump_flight_record(reason);
  if (config_.size <= 1 || !config_.store) return;
  // The store may be dead with the rank that hosted it, and a TcpStore reconnects for up to
  // its whole timeout: the store calls run on a detached thread that owns everything it
  // touches, and this rank waits for it at most kDumpAckTimeout (+1 s).
  struct Shared {
    std::mutex mutex;
    std::condition_variable cv;
    bool finished = false;
    std::string error;
    std::vector<int> missing;
  };
  auto shared = std::make_shared<Shared>();
  const auto limit = std::min<std::chrono::milliseconds>(kDumpAckTimeout, timeout_);
  std::thread([shared, store = config_.store, prefix = config_.prefix, rank = rank_, size = size_,
               reason, path, limit] {
    std::vector<std::string> acks;
    for (int r = 0; r < size; ++r)
      acks.push_back(fmt::format("{}flight_recorder/dumped/{}", prefix, r));
    std::string error;
    std::vector<int> missing;
    try {
      store->set(acks[rank], path.empty() ? "-" : path);
      store->set(prefix + "flight_recorder/dump", reason);
      store->wait(acks, limit);
    } catch (const std::exception& e) {
      error = e.what();
      try {
        for (int r = 0; r < size; ++r) {
          if (!store->check({acks[r]})) missing.push_back(r);
        }
      } catch (const std::exception&) {
      }
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->finished = true;
    shared->error = std::move(error);
    shared->missing = std::move(missing);
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  // A peer's loss announced meanwhile (notify_peer_lost: in-place recovery) ends the wait: the
  // dead rank will not ack, and the survivors should re-form rather than wait for it.
  const auto until = std::chrono::steady_clock::now() + limit + std::chrono::seconds(1);
  while (!shared->finished && !abort_.raised() && std::chrono::steady_clock::now() < until) {
    shared->cv.wait_for(lock, std::chrono::milliseconds(50));
  }
  if (abort_.raised()) return;
  if (!shared->finished) {
    log::get("ddp.comm")
        ->warn(
            "flight recorder: {}: the store did not answer within {} ms; the other ranks may not "
            "write their records",
            where(), (limit + std::chrono::seconds(1)).count());
  } else if (!shared->error.empty()) {
    log::get("ddp.comm")
        ->warn(
            "flight recorder: {}: ranks {} did not write their record within {} ms (dead, or "
            "unable to reach the store): {}",
            where(), shared->missing, limit.count(), shared->error);
  }
}

void AsyncProcessGroup::watcher_loop() {
  const std::string key = config_.prefix + "flight_recorder/dump";
  const uint64_t signals_seen = FlightRecorder::dump_signals_received();
  std::unique_lock<std::mutex> lock(watch_mutex_);
  for (;;) {
    if (watch_cv_.wait_for(lock, kWatchInterval, [&] { return watch_stop_; })) return;
    // Once this rank wrote its record there is nothing left to watch for; stopping also keeps
    // the watcher off a store that a failure may have cut.
    if (dumped_) return;
    lock.unlock();
    try {
      if (FlightRecorder::dump_signals_received() != signals_seen) {
        // The launcher asks (a rank died): this rank writes its record and passes the request
        // on through the store, so the group's ranks on other nodes write theirs too.
        const std::string why = "requested by the launcher (a rank of the job failed)";
        const std::string path = dump_flight_record(why);
        if (!config_.store->check({key})) config_.store->set(key, why);
        config_.store->set(fmt::format("{}flight_recorder/dumped/{}", config_.prefix, rank_),
                           path.empty() ? "-" : path);
        return;
      }
      if (config_.store->check({key})) {
        const std::string why = config_.store->get(key);
        const std::string path = dump_flight_record("requested by a peer: " + why);
        config_.store->set(fmt::format("{}flight_recorder/dumped/{}", config_.prefix, rank_),
                           path.empty() ? "-" : path);
        return;
      }
    } catch (const std::exception&) {
      return;  // the store is unreachable: no peer can ask for a dump through it any more
    }
    lock.lock();
  }
}

std::string AsyncProcessGroup::where() const {
  return fmt::format("rank {} of {} (backend {}, group {})", rank_, size_, backend_name(),
                     config_.prefix);
}

void AsyncProcessGroup::check_rank(int peer, const char* what) const {
  if (peer < 0 || peer >= size_) {
    throw UsageError(fmt::format("{} {} is out of range for a group of size {} (valid: 0..{})",
                                 what, peer, size_, size_ - 1));
  }
}

WorkPtr AsyncProcessGroup::submit(CallInfo call, std::function<void(const CallInfo&)> fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!call.is_p2p()) call.seq = ++next_seq_;  // under the lock: issue order = sequence order
  auto work = std::make_shared<FutureWork>(call.describe() + " on " + where());
  if (stop_) throw UsageError("process group used after it was shut down: " + where());
  uint64_t record_id = 0;
  if (recorder_) {
    CollectiveRecordInfo info;
    info.op = to_string(call.kind);
    info.dtype = call.dtype;
    info.has_reduce_op = call.has_op;
    info.reduce_op = call.op;
    info.root = call.root;
    info.count = call.count;
    info.seq = call.seq;
    record_id = recorder_->record(info);
  }
  Job job{call, record_id, std::move(fn), work};
  if (!running_ && queue_.empty() && call.bytes <= config_.inline_bytes) {
    running_ = true;
    lock.unlock();
    execute(job);
    lock.lock();
    running_ = false;
    // Wake the worker only when another thread queued a job meanwhile: a wake-up per inline
    // call lands the worker on this CPU and preempts the caller (with it, a 4 KB cpu
    // all-reduce's p99 was 24-37 us; without it, about 2 us).
    const bool queued = !queue_.empty();
    lock.unlock();
    if (queued) cv_.notify_one();
    return work;
  }
  queue_.push_back(std::move(job));
  lock.unlock();
  cv_.notify_one();  // the worker is the only thread that waits on cv_
  return work;
}

void AsyncProcessGroup::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return (!queue_.empty() && !running_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;  // stop_ and drained
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    execute(job);
    lock.lock();
    running_ = false;
  }
}

void AsyncProcessGroup::notify_peer_lost(const PeerLostError& cause) {
  if (abort_.raise(std::make_exception_ptr(cause))) end_running_operation();
}

void AsyncProcessGroup::execute(Job& job) {
  std::exception_ptr error;
  if (abort_.raised()) {
    // The typed error itself (not "group broken"): callers re-form on PeerLostError.
    if (recorder_) recorder_->finished(job.record_id, false, "not started: a peer was lost");
    job.work->finish(abort_.error());
    return;
  }
  {
    std::exception_ptr broken;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      broken = broken_;
    }
    if (broken) {
      try {
        std::rethrow_exception(broken);
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(CollectiveError(
            fmt::format("{} not started: the group is unusable after an earlier failure: {}",
                        job.call.describe(), e.what())));
        if (recorder_) recorder_->finished(job.record_id, false, "not started: group broken");
      }
      job.work->finish(error);
      return;
    }
  }
  if (recorder_) recorder_->started(job.record_id);
  std::string what;
  try {
    if (config_.debug_collectives && !job.call.is_p2p()) check_fingerprint(job.call);
    job.fn(job.call);
  } catch (const NotSupportedError& e) {
    error = std::current_exception();  // nothing was exchanged: the group stays usable
    if (recorder_) recorder_->finished(job.record_id, false, e.what());
  } catch (...) {
    error = std::current_exception();
    try {
      throw;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "unknown exception";
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      broken_ = error;
    }
    if (abort_.raised()) {
      // A wait gave up because of notify_peer_lost: expected, so no flight record.
      if (recorder_) recorder_->finished(job.record_id, false, what);
    } else if (recorder_) {
      recorder_->finished(job.record_id, false, what);
      on_failure(job.call, what);  // before finish(): the caller may exit on the error
    }
  }
  if (!error && recorder_) recorder_->finished(job.record_id, true);
  job.work->finish(error);
}

void AsyncProcessGroup::check_fingerprint(const CallInfo& call) {
  Store& store = *config_.store;
  const std::string base = fmt::format("{}fp/{}/", config_.prefix, call.seq);
  store.set(base + std::to_string(rank_), encode(call));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(base + std::to_string(r));
  try {
    store.wait(keys, timeout_);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    throw TimeoutError(fmt::format(
        "{} on {}: timed out after {} ms waiting for ranks {} to reach this collective ({} of "
        "{} arrived); check that every rank calls the same collectives in the same order",
        call.describe(), where(), timeout_.count(), missing, size_ - missing.size(), size_));
  }
  const std::vector<std::string> values = store.multi_get(keys);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const CallInfo other = decode(values[r]);
    if (!call.matches(other)) {
      throw CollectiveError(fmt::format(
          "collective mismatch in group {}: rank {} called {} but rank {} called {}; every rank "
          "must issue the same collectives in the same order with the same dtype, count, op "
          "and root",
          config_.prefix, rank_, call.describe(), r, other.describe()));
    }
  }
  // Every rank has read all fingerprints of seq-2 before publishing seq-1, which we have seen.
  if (call.seq > 2) {
    store.delete_key(fmt::format("{}fp/{}/{}", config_.prefix, call.seq - 2, rank_));
  }
}

WorkPtr AsyncProcessGroup::all_reduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  check_buffer(data, count, "data", "all_reduce");
  CallInfo c{OpKind::kAllReduce, dtype, op, true, -1, 0, count, 0, count * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_all_reduce(data, count, dtype, op, call); });
}

WorkPtr AsyncProcessGroup::broadcast(void* data, size_t count, DataType dtype, int root) {
  check_buffer(data, count, "data", "broadcast");
  check_rank(root, "broadcast: root");
  CallInfo c{OpKind::kBroadcast,         dtype, ReduceOp::kSum, false, root, 0, count, 0,
             count * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_broadcast(data, count, dtype, root, call); });
}

WorkPtr AsyncProcessGroup::reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root) {
  check_buffer(data, count, "data", "reduce");
  check_rank(root, "reduce: root");
  CallInfo c{OpKind::kReduce, dtype, op, true, root, 0, count, 0, count * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_reduce(data, count, dtype, op, root, call); });
}

WorkPtr AsyncProcessGroup::all_gather(const void* in, void* out, size_t count, DataType dtype) {
  check_buffer(in, count, "in", "all_gather");
  check_buffer(out, count, "out", "all_gather");
  CallInfo c{OpKind::kAllGather,         dtype, ReduceOp::kSum, false, -1, 0, count, 0,
             count * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_all_gather(in, out, count, dtype, call); });
}

WorkPtr AsyncProcessGroup::all_gather_v(const void* in, void* out,
                                        const std::vector<size_t>& counts, DataType dtype) {
  if (counts.size() != static_cast<size_t>(size_)) {
    throw UsageError(
        fmt::format("all_gather_v: counts has {} entries but the group has {} "
                    "ranks; pass one count per rank",
                    counts.size(), size_));
  }
  size_t total = 0;
  for (size_t n : counts) total += n;
  check_buffer(in, counts[rank_], "in", "all_gather_v");
  check_buffer(out, total, "out", "all_gather_v");
  CallInfo c{OpKind::kAllGatherV,        dtype, ReduceOp::kSum, false, -1, 0, counts[rank_], 0,
             total * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_all_gather_v(in, out, counts, dtype, call); });
}

WorkPtr AsyncProcessGroup::gather(const void* in, void* out, size_t count, DataType dtype,
                                  int root) {
  check_rank(root, "gather: root");
  check_buffer(in, count, "in", "gather");
  if (rank_ == root) check_buffer(out, count, "out", "gather");
  CallInfo c{OpKind::kGather, dtype, ReduceOp::kSum,
             false,           root,  0,
             count,           0,     count * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_gather(in, out, count, dtype, root, call); });
}

WorkPtr AsyncProcessGroup::scatter(const void* in, void* out, size_t count, DataType dtype,
                                   int root) {
  check_rank(root, "scatter: root");
  if (rank_ == root) check_buffer(in, count, "in", "scatter");
  check_buffer(out, count, "out", "scatter");
  CallInfo c{OpKind::kScatter,           dtype, ReduceOp::kSum, false, root, 0, count, 0,
             count * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_scatter(in, out, count, dtype, root, call); });
}

WorkPtr AsyncProcessGroup::reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                                          ReduceOp op) {
  check_buffer(in, count, "in", "reduce_scatter");
  check_buffer(out, count, "out", "reduce_scatter");
  CallInfo c{OpKind::kReduceScatter,
             dtype,
             op,
             true,
             -1,
             0,
             count,
             0,
             count * size_ * element_size(dtype)};
  return submit(c,
                [=](const CallInfo& call) { run_reduce_scatter(in, out, count, dtype, op, call); });
}

WorkPtr AsyncProcessGroup::all_to_all(const void* in, void* out, size_t count, DataType dtype) {
  check_buffer(in, count, "in", "all_to_all");
  check_buffer(out, count, "out", "all_to_all");
  CallInfo c{OpKind::kAllToAll,
             dtype,
             ReduceOp::kSum,
             false,
             -1,
             0,
             count,
             0,
             count * size_ * element_size(dtype)};
  return submit(c, [=](const CallInfo& call) { run_all_to_all(in, out, count, dtype, call); });
}

WorkPtr AsyncProcessGroup::barrier() {
  CallInfo c{};
  c.kind = OpKind::kBarrier;
  return submit(c, [=](const CallInfo& call) { run_barrier(call); });
}

void AsyncProcessGroup::check_buffer(const void* p, size_t count, const char* name,
                                     const char* op) {
  if (p == nullptr && count > 0) {
    throw UsageError(
        fmt::format("{}: {} is null but count is {}; pass a buffer of that many "
                    "elements",
                    op, name, count));
  }
}

void AsyncProcessGroup::validate_p2p(const void* data, size_t count, int peer, const char* op,
                                     const char* peer_name) const {
  check_rank(peer, fmt::format("{}: {}", op, peer_name).c_str());
  if (peer == rank_) {
    throw UsageError(fmt::format("{}: {} {} is this rank itself", op, peer_name, peer));
  }
  check_buffer(data, count, "data", op);
}

void AsyncProcessGroup::run_all_gather(const void* in, void* out, size_t count, DataType dtype,
                                       const CallInfo& call) {
  run_all_gather_v(in, out, std::vector<size_t>(size_, count), dtype, call);
}

ProcessGroupPtr AsyncProcessGroup::create_subgroup(const std::vector<int>& ranks) {
  if (ranks.empty()) throw UsageError("new_group: ranks is empty; pass at least one rank");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    throw UsageError(fmt::format("new_group: ranks {} contain a duplicate", ranks));
  }
  for (int r : ranks) check_rank(r, "new_group: rank");
  const uint64_t id = subgroups_created_++;
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  GroupConfig sub = config_;
  sub.prefix = fmt::format("{}sub{}/", config_.prefix, id);
  sub.rank = static_cast<int>(it - ranks.begin());
  sub.size = static_cast<int>(ranks.size());
  sub.global_ranks.clear();
  // sub shares the parent's backend and flight recorder settings (copied with config_).
  for (int r : ranks) sub.global_ranks.push_back(config_.global_ranks[r]);
  return make_same_backend(std::move(sub));
}

}  // namespace ddp::detail
