#include "ddp/comm/recoverable_group.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "ddp/comm/init.hpp"
#include "ddp/comm/world_info.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp {

namespace {

constexpr const char* kWatcherThreadName = "ddp-recovery";

// Under ddprun --recovery step the launcher hosts the job's store (it must outlive any rank).
bool agent_hosts_store() {
  return env::get("DDP_RECOVERY").value_or("") == "step";
}

// The watcher's calls are bounded by this, so a store gone at the job's end (rank 0's, under
// plain ddprun) delays the destructor's join by at most that long.
constexpr std::chrono::milliseconds kWatchStoreTimeout{2000};

std::shared_ptr<Store> store_client_from_env(int rank, bool may_host,
                                             std::chrono::milliseconds timeout) {
  const auto addr = env::get("MASTER_ADDR");
  const auto port = env::get_int("MASTER_PORT");
  if (!addr || addr->empty() || !port || *port <= 0 || *port > 65535) {
    throw UsageError(fmt::format(
        "RecoverableGroup: no store given and MASTER_ADDR/MASTER_PORT are not set to a host and "
        "a TCP port (rank {}); launch with 'ddprun --recovery step' or pass "
        "RecoverableGroupOptions.store",
        rank));
  }
  TcpStoreOptions o;
  o.host = *addr;
  o.port = static_cast<uint16_t>(*port);
  o.timeout = timeout;
  o.is_server = may_host && rank == 0 && !agent_hosts_store();
  // ddprun's store outlives its host's loss on a promoted standby (docs/recovery.md).
  if (agent_hosts_store()) o.standbys = standbys_from_env();
  if (!may_host) o.connect_retry = std::min(timeout, kWatchStoreTimeout);
  return std::make_shared<TcpStore>(o);
}

// "rank 2", "ranks 0 and 2", "ranks 0, 2 and 3".
std::string ranks_text(const std::vector<int>& slots) {
  if (slots.size() == 1) return fmt::format("rank {}", slots.front());
  const std::vector<int> head(slots.begin(), slots.end() - 1);
  return fmt::format("ranks {} and {}", fmt::join(head, ", "), slots.back());
}

// The launch's world size: `given`, else $DDP_RECOVERY_LAUNCH_WORLD_SIZE, else this process's.
int launch_world_size_from(std::optional<int> given, int process_world_size) {
  if (given) {
    if (*given < 1 || *given > process_world_size) {
      throw UsageError(
          fmt::format("RecoverableGroupOptions: launch_world_size {} must be in 1..world_size ({})",
                      *given, process_world_size));
    }
    return *given;
  }
  const char* text = std::getenv(recovery_notice::kLaunchWorldSizeEnvVar);
  if (text == nullptr || *text == '\0') return process_world_size;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > process_world_size) {
    throw UsageError(
        fmt::format("{}='{}' is not a world size in 1..WORLD_SIZE ({}); it is set "
                    "by ddprun --recovery step",
                    recovery_notice::kLaunchWorldSizeEnvVar, text, process_world_size));
  }
  return static_cast<int>(value);
}

}  // namespace

RecoverableGroup::RecoverableGroup(RecoverableGroupOptions options) : options_(std::move(options)) {
  if (options_.timeout.count() <= 0 || options_.watch_interval.count() <= 0) {
    throw UsageError(fmt::format(
        "RecoverableGroupOptions: timeout ({} ms) and watch_interval ({} ms) must be positive",
        options_.timeout.count(), options_.watch_interval.count()));
  }
  WorldInfo world;
  if (!options_.rank || !options_.world_size) world = detect_world_info();
  slot_ = options_.rank.value_or(world.rank);
  const int process_world_size = options_.world_size.value_or(world.world_size);
  initial_world_size_ = launch_world_size_from(options_.launch_world_size, process_world_size);
  if (process_world_size < 1 || slot_ < 0 || slot_ >= process_world_size) {
    throw UsageError(fmt::format("RecoverableGroup: rank {} is out of range for world size {}",
                                 slot_, process_world_size));
  }
  rank_ = slot_;
  world_size_ = process_world_size;
  store_ = options_.store;
  watch_store_ = options_.watch_store;
  if (!store_) {
    store_ = store_client_from_env(slot_, /*may_host=*/true, options_.timeout);
    // Every generation's group gets a connection of its own: a failed group's flight recorder
    // may still hold its connection in a bounded wait (async_process_group.hpp), which must not
    // delay the next generation's rendezvous.
    const int slot = slot_;
    const auto timeout = options_.timeout;
    connect_ = [slot, timeout] { return store_client_from_env(slot, /*may_host=*/false, timeout); };
    if (!watch_store_) {
      watch_store_ = store_client_from_env(slot_, /*may_host=*/false, options_.timeout);
      watch_store_->set_timeout(std::min(options_.timeout, kWatchStoreTimeout));
    }
  }
  if (!watch_store_) watch_store_ = store_;
  // Without ddprun --recovery step (and no store given) the generation never changes: nobody
  // waits for a finished rank, and rank 0's store may be gone when the others finish.
  records_finish_ = agent_hosts_store() || options_.store != nullptr;
  // This process forms a group in its slot again: an earlier group's finish no longer holds.
  if (records_finish_) recovery_notice::clear_finished(*store_, slot_);

  // A restarted rank joins the generation its loss opened; at the start that is 0. Another
  // rank lost while this one forms it (two failures at once, on two nodes): the others have
  // moved on to a newer generation, so this one does too, as reform() does.
  int64_t g = recovery_notice::read_generation(*store_);
  // --recovery shrink: the others went on without this slot's lost process; this replacement,
  // now running, claims the slot back (they make room at the generation it opens), here or,
  // deferred, once the program is ready to be healed (claim_return()).
  if (g > 0 && recovery_notice::awaits_return(*store_, slot_, g)) {
    if (options_.defer_return) {
      returning_ = true;
      group_ = form_alone(g);
    } else {
      g = recovery_notice::publish_rank_back(*store_, slot_);
    }
  }
  while (!returning_) {
    try {
      group_ = form(g);
      break;
    } catch (const TimeoutError&) {
      const int64_t newer = recovery_notice::read_generation(*store_);
      if (newer <= g) throw;
      g = newer;
    }
  }
  announced_ = g;
  generation_ = g;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = group_;
  }
  watcher_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), kWatcherThreadName);
    watch_loop();
  });
}

RecoverableGroup::~RecoverableGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_interrupter_.interrupt();
  cv_.notify_all();
  announced_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  // Unwinding: this process is failing, and ddprun may restart its slot (that restart's record
  // would make the finish stale anyway); the others keep waiting for it as before.
  if (!records_finish_ || std::uncaught_exceptions() > 0) return;
  try {
    recovery_notice::publish_finished(*watch_store_, slot_, generation_);
  } catch (const std::exception& e) {
    log::get("ddp.comm")
        ->warn("RecoverableGroup: rank {} cannot record in the job's store that it finished: {}",
               slot_, e.what());
  }
}

std::optional<int> RecoverableGroup::lost_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_.first;
}

std::string RecoverableGroup::loss_description() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_.description;
}

RecoverableGroup::Loss RecoverableGroup::read_loss(Store& store, int64_t generation) const {
  Loss loss;
  const auto kind = recovery_notice::read_record_kind(store, generation);
  if (kind == recovery_notice::RecordKind::kRankLeft) {
    loss.first = recovery_notice::read_lost_rank(store, generation);
    loss.description = fmt::format(
        "rank {} of {} was lost; the others go on without it until its replacement is back "
        "(ddprun --recovery shrink)",
        loss.first.value_or(-1), initial_world_size_);
    return loss;
  }
  if (kind == recovery_notice::RecordKind::kRankBack) {
    // Not a loss: the replacement of a rank lost under --recovery shrink came back.
    loss.description = fmt::format(
        "rank {} of {} is back (its replacement joins and is healed from a live peer; ddprun "
        "--recovery shrink)",
        recovery_notice::read_lost_rank(store, generation).value_or(-1), initial_world_size_);
    return loss;
  }
  const std::vector<int> removed = recovery_notice::read_removed_slots(store, generation);
  if (!removed.empty()) {
    loss.first = removed.front();
    loss.description = fmt::format("rank{} {} of {} {} lost with their node",
                                   removed.size() == 1 ? "" : "s", fmt::join(removed, ","),
                                   initial_world_size_, removed.size() == 1 ? "was" : "were");
    return loss;
  }
  const std::vector<int> joined = recovery_notice::read_joined_slots(store, generation);
  if (!joined.empty()) {
    // Not a loss: the membership grows. The step in flight is redone with the new ranks.
    const bool grew = joined.front() >= initial_world_size_;
    const std::string who =
        fmt::format("rank{} {}", joined.size() == 1 ? "" : "s", fmt::join(joined, ","));
    loss.description =
        grew ? fmt::format("{} joined the job with a node that grew it past its launch size of {}",
                           who, initial_world_size_)
             : fmt::format("{} of {} came back with a node that joined the job", who,
                           initial_world_size_);
    return loss;
  }
  loss.first = recovery_notice::read_lost_rank(store, generation);
  loss.description =
      fmt::format("rank {} of {} was lost", loss.first ? std::to_string(*loss.first) : "?",
                  initial_world_size_);
  return loss;
}

PeerLostError RecoverableGroup::lost_error(int64_t generation, const Loss& loss) const {
  return PeerLostError(
      fmt::format("{} (membership generation {} announced by ddprun --recovery step); the "
                  "collectives of generation {} on rank {} are aborted: re-form the group "
                  "(RecoverableGroup::reform) and redo the step",
                  loss.description.empty() ? "a rank was lost" : loss.description, generation,
                  generation - 1, rank()),
      loss.first.value_or(-1), generation);
}

RecoverableGroup::NextRecord RecoverableGroup::await_next_record(
    std::unique_lock<std::mutex>& lock) {
  const int64_t next = announced_.load() + 1;
  if (watch_store_ == store_) {
    // A store shared with the training thread: a blocking wait would hold up its calls.
    if (cv_.wait_for(lock, options_.watch_interval, [&] { return stop_; })) {
      return NextRecord::kStop;
    }
    lock.unlock();
    return NextRecord::kMaySet;  // read the counter
  }
  lock.unlock();
  // The watcher's own connection: the wait ends one round trip after ddprun claims the record,
  // or at the destructor's interrupt (a TcpStore's; other stores' at the interval).
  switch (recovery_notice::wait_for_record(*watch_store_, next, options_.watch_interval,
                                           &stop_interrupter_)) {
    case WaitOutcome::kSet:
      return NextRecord::kSet;
    case WaitOutcome::kInterrupted:
      return NextRecord::kStop;
    case WaitOutcome::kTimedOut:
      break;
  }
  lock.lock();
  const bool stopping = stop_;
  lock.unlock();
  return stopping ? NextRecord::kStop : NextRecord::kNotSet;
}

void RecoverableGroup::watch_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stop_) return;
    int64_t g = 0;
    Loss lost;
    try {
      const NextRecord next = await_next_record(lock);
      if (next == NextRecord::kStop) return;
      if (next != NextRecord::kNotSet) g = recovery_notice::read_generation(*watch_store_);
      if (next == NextRecord::kSet && g <= announced_.load()) {
        // The record is claimed before the counter is raised: its writer raises it next.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        g = recovery_notice::read_generation(*watch_store_);
      }
      if (g > announced_.load()) lost = read_loss(*watch_store_, g);
    } catch (const std::exception& e) {
      // The store is ddprun's (step mode) or rank 0's: when unreachable no notice can come; the
      // group's own timeout still bounds every collective. Said once per outage.
      if (!store_unreachable_) {
        log::get("ddp.comm")
            ->warn("RecoverableGroup: rank {} cannot read the membership generation: {}", rank(),
                   e.what());
      }
      store_unreachable_ = true;
      lock.lock();
      if (cv_.wait_for(lock, options_.watch_interval, [&] { return stop_; })) return;
      continue;
    }
    store_unreachable_ = false;
    lock.lock();
    if (g <= announced_.load()) continue;
    lost_ = lost;
    announced_.store(g, std::memory_order_release);
    announced_cv_.notify_all();
    // The group of an older generation gives up its collective in flight now.
    if (current_) current_->notify_peer_lost(lost_error(g, lost));
  }
}

ProcessGroupPtr RecoverableGroup::form_alone(int64_t generation) {
  rank_ = 0;
  world_size_ = 1;
  if (options_.membership_only) return nullptr;
  InitOptions init;
  init.backend = options_.backend;
  init.timeout = options_.timeout;
  init.rank = 0;
  init.world_size = 1;
  init.store = connect_ ? connect_() : store_;
  // Keys of this slot's incarnation only: a later replacement of the slot starts at a later
  // generation.
  init.group_name = fmt::format("{}/g{}/alone{}", options_.group_name, generation, slot_);
  return init_process_group(init);
}

const ProcessGroupPtr& RecoverableGroup::claim_return() {
  if (!returning_) return group_;
  returning_ = false;
  // The slot may have been taken out meanwhile (its node declared lost): then reform() finds
  // it in no generation and throws RemovedFromJobError.
  if (recovery_notice::awaits_return(*store_, slot_, recovery_notice::read_generation(*store_))) {
    recovery_notice::publish_rank_back(*store_, slot_);
  }
  return reform();
}

ProcessGroupPtr RecoverableGroup::form(int64_t generation) {
  const std::vector<int> slots =
      generation > 0 ? recovery_notice::members(*store_, generation, initial_world_size_)
                     : std::vector<int>();
  int rank = slot_, world_size = initial_world_size_;
  if (generation > 0) {
    const auto at = std::find(slots.begin(), slots.end(), slot_);
    // A node that joined later may have this slot now: its new process, not this one.
    const bool removed = first_generation_ && recovery_notice::removed_between(
                                                  *store_, slot_, *first_generation_, generation);
    if (at == slots.end() || removed) {
      throw RemovedFromJobError(fmt::format(
          "rank {} (launched as rank {}) is no longer a member of the job: ddprun declared its "
          "node lost at membership generation {} or before (it missed its heartbeats, e.g. a "
          "network split) and the others went on without it{}; this worker must exit",
          rank_.load(), slot_, generation,
          at == slots.end() ? "" : ", then a node that joined took its ranks"));
    }
    rank = static_cast<int>(at - slots.begin());
    world_size = static_cast<int>(slots.size());
  }
  if (generation > 0) {
    await_members(generation, slots);
  } else {
    if (slot_ >= initial_world_size_) {
      throw UsageError(fmt::format(
          "RecoverableGroup: rank {} is past the launch's world size ({}) but no node added it "
          "to the job (no 'join:' record in the job's store); it is started by ddprun "
          "--recovery step only after its node joined",
          slot_, initial_world_size_));
    }
    std::vector<int> all(static_cast<size_t>(initial_world_size_));
    for (int i = 0; i < initial_world_size_; ++i) all[static_cast<size_t>(i)] = i;
    await_members(generation, all);
  }
  ProcessGroupPtr group;
  if (!options_.membership_only) {
    InitOptions init;
    init.backend = options_.backend;
    init.timeout = options_.timeout;
    init.rank = rank;
    init.world_size = world_size;
    init.store = connect_ ? connect_() : store_;
    init.group_name = fmt::format("{}/g{}", options_.group_name, generation);
    // A member lost while the group forms (after await_members): the others move on to the
    // newer generation at the watcher's announcement, as await_members does, instead of waiting
    // out the timeout in the backend's own rendezvous (nccl's; the host backends' is short).
    init.interrupt = [this, generation] {
      const int64_t newest = announced_.load(std::memory_order_acquire);
      if (newest > generation) {
        throw TimeoutError(fmt::format(
            "RecoverableGroup: membership generation {} of '{}' was superseded by generation {} "
            "while rank {} (launched as rank {}) made its group",
            generation, options_.group_name, newest, rank_.load(), slot_));
      }
    };
    group = init_process_group(init);
  }
  rank_ = rank;
  world_size_ = world_size;
  if (!first_generation_) first_generation_ = generation;
  return group;
}

bool RecoverableGroup::wait_announced_after(int64_t generation,
                                            std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return announced_cv_.wait_for(lock, timeout, [&] {
    return stop_ || announced_.load(std::memory_order_acquire) > generation;
  }) && announced_.load() > generation;
}

void RecoverableGroup::await_members(int64_t generation, const std::vector<int>& slots) {
  // Keys of this group name and generation only: a group formed again in the same processes
  // (same name, same generation) finds them set and goes straight to its rendezvous.
  const std::string base = fmt::format("{}/g{}/present/", options_.group_name, generation);
  std::vector<std::string> keys;
  keys.reserve(slots.size());
  for (int s : slots) keys.push_back(base + std::to_string(s));
  store_->set(base + std::to_string(slot_), "1");
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      store_->wait(keys, std::clamp(left, std::chrono::milliseconds(1), options_.watch_interval));
      return;
    } catch (const TimeoutError&) {
    }
    const bool late = Clock::now() >= deadline;
    // Another rank was lost while this generation formed (two failures at once, on two nodes):
    // its members move on to the newer one, so waiting here would last the whole timeout.
    // The caller (the constructor, reform()) catches this and forms the newest.
    const int64_t newest = recovery_notice::read_generation(*store_);
    if (newest > generation) {
      throw TimeoutError(fmt::format(
          "RecoverableGroup: membership generation {} of '{}' was superseded by generation {} "
          "while rank {} (launched as rank {}) formed it",
          generation, options_.group_name, newest, rank_.load(), slot_));
    }
    // One round trip a poll while nobody finished (every normal re-forming).
    if (!late && recovery_notice::read_finish_count(*store_) == 0) continue;
    std::vector<int> missing;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!store_->check({keys[i]})) missing.push_back(slots[i]);
    }
    if (missing.empty()) return;
    const std::vector<int> finished = recovery_notice::finished_slots(*store_, missing);
    if (!finished.empty()) throw finished_error(generation, finished);
    if (!late) continue;
    throw TimeoutError(fmt::format(
        "RecoverableGroup: rank {} (launched as rank {}) waited {} ms for membership generation "
        "{} of '{}', but {} never joined it ({} of {} did); start every rank with the same world "
        "size and store",
        rank_.load(), slot_,
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(),
        generation, options_.group_name, ranks_text(missing), slots.size() - missing.size(),
        slots.size()));
  }
}

PeersFinishedError RecoverableGroup::finished_error(int64_t generation,
                                                    const std::vector<int>& finished) const {
  const bool one = finished.size() == 1;
  const std::string who = fmt::format(
      "{} already finished (closed {} group without an error, or exited 0, after {} "
      "last step)",
      ranks_text(finished), one ? "its" : "their", one ? "its" : "their");
  // A replacement forms the generation its own loss opened first (nothing formed yet).
  const bool replacement = !first_generation_ && generation > 0 &&
                           recovery_notice::read_lost_rank(*store_, generation) == slot_;
  if (replacement) {
    return PeersFinishedError(
        fmt::format(
            "rank {} of {} cannot rejoin the job: {} before this replacement could join "
            "membership generation {}, so no live peer is left to heal it from (ddprun "
            "--recovery step). The job's training completed on the other ranks, but rank {}'s "
            "previous process died after its last step, while they were finishing: its "
            "end-of-run work is lost, and the job fails for that",
            slot_, initial_world_size_, who, generation, slot_),
        finished);
  }
  return PeersFinishedError(
      fmt::format("rank {} of {} cannot form membership generation {}: {} and will never join "
                  "it, so the job cannot go on in place (ddprun --recovery step); every rank "
                  "must run the same number of steps",
                  slot_, initial_world_size_, generation, who),
      finished);
}

const ProcessGroupPtr& RecoverableGroup::reform() {
  for (;;) {
    const int64_t g = std::max(recovery_notice::read_generation(*store_), announced_.load());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (current_) current_->notify_peer_lost(lost_error(g, lost_));
      current_.reset();
    }
    // Destroying the old group drains its queue, which fails at once after the abort.
    group_.reset();
    try {
      group_ = form(g);
    } catch (const TimeoutError&) {
      // Another rank was lost while this generation formed: its members moved on.
      if (recovery_notice::read_generation(*store_) > g) continue;
      throw;
    }
    generation_ = g;
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = group_;
    if (announced_.load() < g) announced_.store(g);
    if (announced_.load() > g && current_) {
      current_->notify_peer_lost(lost_error(announced_.load(), lost_));
    }
    return group_;
  }
}

}  // namespace ddp
