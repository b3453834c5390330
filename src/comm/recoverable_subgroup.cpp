#include "ddp/comm/recoverable_subgroup.hpp"

#include <fmt/format.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/store/prefix_store.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

// How often the aborting thread looks whether the subgroup is ending (between waits on the
// parent's announcements, which wake it at once).
constexpr std::chrono::milliseconds kAborterPoll{200};
// How often a member waiting for the others to arrive at a generation looks again.
constexpr std::chrono::milliseconds kArrivalPoll{20};

PeerLostError lost_error(const RecoverableGroup& parent, const std::string& name) {
  const int64_t g = parent.announced_generation();
  const std::string what = parent.loss_description();
  return PeerLostError(
      fmt::format("{} (membership generation {} announced by ddprun --recovery step); the "
                  "collectives of group '{}' of generation {} are aborted: redo the step once "
                  "the default group re-formed (the group follows it at its next operation)",
                  what.empty() ? "a rank was lost" : what, g, name, g - 1),
      parent.lost_rank().value_or(-1), g);
}

}  // namespace

RecoverableSubgroup::RecoverableSubgroup(std::shared_ptr<RecoverableGroup> parent,
                                         RecoverableSubgroupOptions options)
    : parent_(std::move(parent)), options_(std::move(options)) {
  if (!parent_ || !parent_->store()) {
    throw UsageError(
        "RecoverableSubgroup needs a RecoverableGroup with the job's store (ddprun --recovery "
        "step)");
  }
  if (options_.name.empty() || options_.size < 1 || options_.rank < 0 ||
      options_.rank >= options_.size) {
    throw UsageError(fmt::format("RecoverableSubgroup: bad options (name '{}', rank {} of {})",
                                 options_.name, options_.rank, options_.size));
  }
  parent_world_size_ = parent_->world_size();
  aborter_ = std::thread([this] { abort_on_announcements(); });
}

RecoverableSubgroup::~RecoverableSubgroup() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  aborter_.join();
}

int64_t RecoverableSubgroup::generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

ProcessGroupPtr RecoverableSubgroup::group(const std::function<void()>& before_reform) {
  if (parent_->stale()) throw lost_error(*parent_, options_.name);
  bool formed_before = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (parent_->generation() == generation_) return group_;
    formed_before = generation_ >= 0;
  }
  // Before taking form_mutex_: the operations it lets end may be issued by another thread
  // (a future's callback on the `ddp` backend's completer) that may be about to come here.
  if (before_reform && formed_before) before_reform();
  std::lock_guard<std::mutex> forming(form_mutex_);
  if (parent_->stale()) throw lost_error(*parent_, options_.name);
  const int64_t current = parent_->generation();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current == generation_) return group_;  // another thread formed it meanwhile
  }
  if (!options_.whole_job && parent_->world_size() != parent_world_size_) {
    throw UsageError(fmt::format(
        "group '{}' cannot follow the job into membership generation {}: the job's ranks changed "
        "({} -> {} ranks: a node was lost or joined), so members of this group may be gone; make "
        "the group again from the ranks of the new generation, or use the default group only",
        options_.name, current, parent_world_size_, parent_->world_size()));
  }
  ProcessGroupPtr next = form(current);
  ProcessGroupPtr old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    old = std::exchange(group_, next);
    generation_ = current;
  }
  changed_.notify_all();
  old.reset();  // the aborted generation's group, outside the lock
  return next;
}

void RecoverableSubgroup::await_members(int64_t generation, int rank, int size) const {
  // Keys of this generation only. A member that died before arriving never sets its key: the
  // wait ends at the parent's next announcement instead (init_process_group's own wait knows no
  // notice and would last the whole timeout).
  Store& store = *parent_->store();
  const std::string base = fmt::format("{}/g{}/present/", options_.name, generation);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
  store.set(keys[rank], "1");
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  for (;;) {
    if (store.check(keys)) return;
    if (parent_->announced_generation() > generation) throw lost_error(*parent_, options_.name);
    if (std::chrono::steady_clock::now() >= deadline) {
      int arrived = 0;
      for (const auto& key : keys) arrived += store.check({key}) ? 1 : 0;
      throw TimeoutError(fmt::format(
          "group '{}' of membership generation {}: {} of its {} members arrived within {} ms "
          "(each arrives at its first operation on the group in that generation); every member "
          "must make the group (new_group) and use it",
          options_.name, generation, arrived, size, options_.timeout.count()));
    }
    std::this_thread::sleep_for(kArrivalPoll);
  }
}

ProcessGroupPtr RecoverableSubgroup::form(int64_t generation) const {
  // group() may run on a thread other than the one that re-forms the parent (the `ddp` Python
  // backend's completer). The parent stores its rank and size before its generation, so if it
  // still says `generation` after they were read, they are that generation's; if not, this one
  // is stale already.
  const int rank = options_.whole_job ? parent_->rank() : options_.rank;
  const int size = options_.whole_job ? parent_->world_size() : options_.size;
  if (parent_->generation() != generation || parent_->stale()) {
    throw lost_error(*parent_, options_.name);
  }
  await_members(generation, rank, size);
  InitOptions o;
  o.backend = options_.backend;
  o.timeout = options_.timeout;
  o.rank = rank;
  o.world_size = size;
  o.device = options_.device;
  // Its own key space per generation: the replacement and the survivors meet there.
  o.store = std::make_shared<PrefixStore>(fmt::format("{}/g{}", options_.name, generation),
                                          parent_->store());
  o.group_name = options_.name;
  // A member lost while the group forms ends the making at the parent's announcement, as it
  // ends await_members.
  o.interrupt = [this, generation] {
    if (parent_->announced_generation() > generation) throw lost_error(*parent_, options_.name);
  };
  return init_process_group(o);
}

void RecoverableSubgroup::abort_on_announcements() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const int64_t formed = generation_;
    lock.unlock();
    const bool announced = parent_->wait_announced_after(formed, kAborterPoll);
    lock.lock();
    if (stopping_ || !announced || generation_ != formed) continue;
    if (group_) {
      try {
        group_->notify_peer_lost(lost_error(*parent_, options_.name));
      } catch (const std::exception&) {
        // A backend without an abort: its collectives end by the peer's closed sockets or the
        // group timeout instead.
      }
    }
    // Once per generation: until the training thread formed the next one, or the end.
    changed_.wait(lock, [&] { return stopping_ || generation_ != formed; });
  }
}

}  // namespace ddp
