#include "ddp/comm/recoverable_group.hpp"

#include <fmt/format.h>
#include <pthread.h>

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
  if (!may_host) o.connect_retry = std::min(timeout, kWatchStoreTimeout);
  return std::make_shared<TcpStore>(o);
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
  rank_ = options_.rank.value_or(world.rank);
  world_size_ = options_.world_size.value_or(world.world_size);
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw UsageError(fmt::format("RecoverableGroup: rank {} is out of range for world size {}",
                                 rank_, world_size_));
  }
  store_ = options_.store;
  watch_store_ = options_.watch_store;
  if (!store_) {
    store_ = store_client_from_env(rank_, /*may_host=*/true, options_.timeout);
    // Every generation's group gets a connection of its own: a failed group's flight recorder
    // may still hold its connection in a bounded wait (async_process_group.hpp), which must not
    // delay the next generation's rendezvous.
    const int rank = rank_;
    const auto timeout = options_.timeout;
    connect_ = [rank, timeout] { return store_client_from_env(rank, /*may_host=*/false, timeout); };
    if (!watch_store_) {
      watch_store_ = store_client_from_env(rank_, /*may_host=*/false, options_.timeout);
      watch_store_->set_timeout(std::min(options_.timeout, kWatchStoreTimeout));
    }
  }
  if (!watch_store_) watch_store_ = store_;

  // A restarted rank joins the generation its loss opened; at the start that is 0. Another
  // rank lost while this one forms it (two failures at once, on two nodes): the others have
  // moved on to a newer generation, so this one does too, as reform() does.
  int64_t g = recovery_notice::read_generation(*store_);
  for (;;) {
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
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::optional<int> RecoverableGroup::lost_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

PeerLostError RecoverableGroup::lost_error(int64_t generation, std::optional<int> lost) const {
  return PeerLostError(
      fmt::format("rank {} of {} was lost (membership generation {} announced by ddprun "
                  "--recovery step); the collectives of generation {} on rank {} are aborted: "
                  "re-form the group (RecoverableGroup::reform) and redo the step",
                  lost ? std::to_string(*lost) : std::string("?"), world_size_, generation,
                  generation - 1, rank_),
      lost.value_or(-1), generation);
}

void RecoverableGroup::watch_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (cv_.wait_for(lock, options_.watch_interval, [&] { return stop_; })) return;
    lock.unlock();
    int64_t g = 0;
    std::optional<int> lost;
    try {
      g = recovery_notice::read_generation(*watch_store_);
      if (g > announced_.load()) lost = recovery_notice::read_lost_rank(*watch_store_, g);
    } catch (const std::exception& e) {
      // The store is ddprun's (step mode) or rank 0's: when unreachable no notice can come; the
      // group's own timeout still bounds every collective. Said once per outage.
      if (!store_unreachable_) {
        log::get("ddp.comm")
            ->warn("RecoverableGroup: rank {} cannot read the membership generation: {}", rank_,
                   e.what());
      }
      store_unreachable_ = true;
      lock.lock();
      continue;
    }
    store_unreachable_ = false;
    lock.lock();
    if (g <= announced_.load()) continue;
    lost_ = lost;
    announced_.store(g, std::memory_order_release);
    // The group of an older generation gives up its collective in flight now.
    if (current_) current_->notify_peer_lost(lost_error(g, lost));
  }
}

ProcessGroupPtr RecoverableGroup::form(int64_t generation) {
  InitOptions init;
  init.backend = options_.backend;
  init.timeout = options_.timeout;
  init.rank = rank_;
  init.world_size = world_size_;
  init.store = connect_ ? connect_() : store_;
  init.group_name = fmt::format("{}/g{}", options_.group_name, generation);
  return init_process_group(init);
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
    if (announced_.load() > g) current_->notify_peer_lost(lost_error(announced_.load(), lost_));
    return group_;
  }
}

}  // namespace ddp
