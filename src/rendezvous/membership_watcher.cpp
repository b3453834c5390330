#include "ddp/rendezvous/membership_watcher.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <future>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/socket.hpp"
#include "keys.hpp"
#include "node_info.hpp"
#include "round_growth.hpp"
#include "store_wait.hpp"

namespace ddp::rdzv {

namespace {
using Clock = std::chrono::steady_clock;
constexpr Millis kFirstWaitSlice{5};
constexpr Millis kMaxWaitSlice{500};
}  // namespace

MembershipWatcher::MembershipWatcher(const RendezvousOptions& options, const RoundInfo& round,
                                     std::shared_ptr<Store> store, OnChange on_change,
                                     OnPeerLost on_peer_lost, OnStoreLost on_store_lost)
    : options_(options),
      round_(round),
      store_(std::move(store)),
      on_change_(std::move(on_change)),
      on_peer_lost_(std::move(on_peer_lost)),
      on_store_lost_(std::move(on_store_lost)) {
  if (!store_) throw UsageError("MembershipWatcher: no store given");
  kept_alive_ = dynamic_cast<KeptAliveKeys*>(store_.get());
  if (round_.node_rank < 0 || round_.node_rank >= round_.num_nodes) {
    throw UsageError(fmt::format("MembershipWatcher: node rank {} outside a round of {} nodes",
                                 round_.node_rank, round_.num_nodes));
  }
  formed_ = std::clamp(round_.formed_nodes, 1, round_.num_nodes);
  extent_ = formed_;
  for (int i = 0; i < formed_; ++i) ring_.push_back(i);
  // Only --recovery step rounds grow while they run (Rendezvous::grow_round).
  may_grow_ = on_peer_lost_ != nullptr && is_elastic(options_.backend);
  if (round_.node_rank >= formed_) ring_.push_back(round_.node_rank);
  thread_ = std::thread([this] { run(); });
}

MembershipWatcher::~MembershipWatcher() {
  stop();
}

void MembershipWatcher::stop() {
  stop_ = true;
  interrupter_.interrupt();
  if (thread_.joinable()) thread_.join();
}

void MembershipWatcher::request_end(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!end_requested_) end_requested_ = reason;
  }
  interrupter_.interrupt();
}

std::optional<std::string> MembershipWatcher::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

std::exception_ptr MembershipWatcher::store_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_error_;
}

void MembershipWatcher::report(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason_ = reason;
  }
  stop_ = true;
  if (on_change_) on_change_(reason);
}

int MembershipWatcher::next_in_ring(int slot) const {
  const auto after = std::upper_bound(ring_.begin(), ring_.end(), slot);
  return after == ring_.end() ? ring_.front() : *after;
}

int MembershipWatcher::ring_distance(int slot) const {
  const auto position = [&](int s) {
    return static_cast<int>(std::lower_bound(ring_.begin(), ring_.end(), s) - ring_.begin());
  };
  const int n = static_cast<int>(ring_.size());
  return (position(slot) - position(round_.node_rank) + n) % n;
}

void MembershipWatcher::watch_closer(int slot) {
  if (target_ < 0 || ring_distance(slot) < ring_distance(target_)) {
    target_ = slot;
    target_value_.clear();
    target_changed_at_ = Clock::now();
  }
}

void MembershipWatcher::follow_growth() {
  keys::Round k(options_.run_id, round_.generation);
  const int extent = read_extent(*store_, k, formed_);
  for (int i = extent_; i < extent; ++i) {
    if (i != round_.node_rank) growing_.insert(i);
  }
  extent_ = std::max(extent_, extent);
  for (auto it = growing_.begin(); it != growing_.end();) {
    const int slot = *it;
    if (!is_grown_member(*store_, k, slot)) {
      ++it;  // a join slot that did not grow the round, or one still growing it
      continue;
    }
    it = growing_.erase(it);
    ring_.insert(std::upper_bound(ring_.begin(), ring_.end(), slot), slot);
    watch_closer(slot);
  }
}

void MembershipWatcher::follow_taken_back_slots() {
  keys::Round k(options_.run_id, round_.generation);
  for (auto it = passed_lost_.begin(); it != passed_lost_.end();) {
    const int slot = *it;
    if (!store_->check({k.took(slot)})) {
      ++it;
      continue;
    }
    it = passed_lost_.erase(it);
    if (taken_.erase(slot) > 0) --lost_peers_;
    watch_closer(slot);
  }
}

void MembershipWatcher::check_peers() {
  keys::Round k(options_.run_id, round_.generation);
  const int me = round_.node_rank;
  if (!passed_lost_.empty()) follow_taken_back_slots();
  auto now = Clock::now();
  // Advance past finished peers: they no longer heartbeat, and are not dead.
  for (size_t step = 0; step + 1 < ring_.size(); ++step) {
    if (target_ < 0) {
      target_ = next_in_ring(me);
      target_value_.clear();
      target_changed_at_ = now;
    }
    // On a store that keeps heartbeats alive (etcd) the key vanishes with a dead peer's lease.
    std::optional<std::string> read =
        kept_alive_ ? kept_alive_->read_now({k.hb(target_)}).front() : store_->get(k.hb(target_));
    if (!read && taken_.count(target_) == 0) {
      peer_gone(target_,
                fmt::format("{} missed {} heartbeats (its liveness key expired with its lease of "
                            "{} s, heartbeat {:.1f} s): its agent died or lost the network",
                            describe_slot(target_), kMissedHeartbeats,
                            (liveness_ttl().count() + 999) / 1000,
                            options_.conf.heartbeat.count() / 1000.0));
      return;
    }
    const std::string value = read.value_or(keys::kLost);
    // A slot taken as lost stays lost, even if a process of it still writes its heartbeat (a
    // split that healed): its ranks are out of the job.
    if (value == keys::kDone || value == keys::kLost || taken_.count(target_) > 0) {
      if (value != keys::kDone) passed_lost_.insert(target_);
      target_ = next_in_ring(target_);
      target_value_.clear();
      target_changed_at_ = now;
      if (target_ == me) {
        target_ = -1;
        break;
      }
      continue;
    }
    auto describe = [&] { return describe_slot(target_); };
    if (value == keys::kLeft) {
      // A node that leaves ends the round itself (Rendezvous::mark_left); this is the same.
      std::string reason = fmt::format("{} left the job", describe());
      report(store_->compare_set(k.changed(), "", reason));
      return;
    }
    // A heartbeat kept alive by a lease does not change while its peer lives.
    if (value != target_value_ || value == keys::kAlive) {
      target_value_ = value;
      target_changed_at_ = now;
    } else if (now - target_changed_at_ > options_.conf.heartbeat * kMissedHeartbeats) {
      auto silent = std::chrono::duration_cast<Millis>(now - target_changed_at_);
      peer_gone(target_, fmt::format("{} missed {} heartbeats (silent for {:.1f} s, heartbeat "
                                     "{:.1f} s): its agent died or lost the network",
                                     describe(), kMissedHeartbeats, silent.count() / 1000.0,
                                     options_.conf.heartbeat.count() / 1000.0));
    }
    return;
  }
}

std::string MembershipWatcher::describe_slot(int slot) {
  keys::Round k(options_.run_id, round_.generation);
  std::string who = fmt::format("node rank {}", slot);
  try {
    JoinedNode node = decode_node_info(store_->get(k.node(slot)), slot, k.node(slot));
    who += fmt::format(" ({}, {})", node.host, node.addr);
  } catch (const Error&) {
  }
  return who;
}

Millis MembershipWatcher::liveness_ttl() const {
  return options_.conf.heartbeat * kMissedHeartbeats;
}

LostPeer MembershipWatcher::describe_lost(int slot, const std::string& why) {
  keys::Round k(options_.run_id, round_.generation);
  LostPeer peer;
  peer.node_rank = slot;
  peer.why = why;
  peer.first_rank = static_cast<int>(std::stoll(store_->get(k.rank(slot))));
  peer.num_ranks = decode_node_info(store_->get(k.node(slot)), slot, k.node(slot)).local_world_size;
  return peer;
}

void MembershipWatcher::peer_gone(int slot, const std::string& why) {
  keys::Round k(options_.run_id, round_.generation);
  // The round must keep its minimum: with fewer nodes it ends, and the next round waits for
  // nodes as at the start. The count of losses taken is the round's (several watchers may
  // each take one at the same time).
  bool above_min = false;
  if (on_peer_lost_) {
    const int64_t lost = store_->add(k.lost(), 1);
    above_min = live_nodes(*store_, k, formed_, lost) >= options_.nodes.min;
  }
  if (above_min) {
    LostPeer peer;
    bool described = false;
    try {
      peer = describe_lost(slot, why);
      described = peer.num_ranks > 0;
    } catch (const std::exception&) {
      // A round's rank keys hold decimals the rendezvous wrote: a store error ends the round.
    }
    if (described && take_loss_beating(peer)) {
      // A node that took this slot's place before is gone as well: the next may take it.
      store_->delete_key(k.took(slot));
      store_->set(k.hb(slot), keys::kLost);
      taken_.insert(slot);
      passed_lost_.insert(slot);
      ++lost_peers_;
      target_ = next_in_ring(slot);
      target_value_.clear();
      target_changed_at_ = Clock::now();
      if (target_ == round_.node_rank) target_ = -1;
      return;
    }
  }
  report(store_->compare_set(k.changed(), "", why));
}

void MembershipWatcher::beat() {
  keys::Round k(options_.run_id, round_.generation);
  if (kept_alive_) {
    kept_alive_->keep_alive(k.hb(round_.node_rank), keys::kAlive, liveness_ttl());
  } else {
    store_->set(k.hb(round_.node_rank), std::to_string(++beats_));
  }
}

// The handler of a lost peer may take seconds (StepRecovery::on_node_lost promotes the job
// store's standby and records the loss there, each call bounded but slow on a loaded machine).
// This node must not fall silent meanwhile: the peer watching it took it for lost as well, and
// the round ended (3 agents x 2 Python ranks under ctest -j4, recovery.python_step_lost_store_host,
// 2026-11-30: the handler of node 0's loss held node 2's heartbeats for over 6 s). A thread of
// its own beats on store_ every heartbeat until the handler returns; the watcher's thread makes
// no call on store_ meanwhile (it is in the handler), and the handler uses stores of its own.
bool MembershipWatcher::take_loss_beating(const LostPeer& peer) {
  std::promise<void> handled;
  std::thread beater([this, done = handled.get_future()] {
    while (done.wait_for(options_.conf.heartbeat) == std::future_status::timeout) {
      try {
        beat();
      } catch (const std::exception&) {
        return;  // the store failed: the watcher's own next call on it finds that out
      }
    }
  });
  auto stop_beating = [&] {
    handled.set_value();
    beater.join();
  };
  bool taken = false;
  try {
    taken = on_peer_lost_(peer);
  } catch (...) {
    stop_beating();
    throw;
  }
  stop_beating();
  return taken;
}

void MembershipWatcher::run() {
  auto next_beat = Clock::now();
  for (;;) {
    try {
      watch(next_beat);
      return;
    } catch (const Error& e) {
      if (stop_) return;
      // --recovery step: the store moved to a promoted standby with the round on it.
      std::shared_ptr<Store> moved;
      if (on_store_lost_) {
        try {
          moved = on_store_lost_(e);
        } catch (const Error&) {
        }
      }
      if (moved) {
        store_ = std::move(moved);
        kept_alive_ = dynamic_cast<KeptAliveKeys*>(store_.get());
        // Every peer's heartbeat is judged afresh on the new store.
        target_changed_at_ = Clock::now();
        next_beat = Clock::now();
        continue;
      }
      // The store is gone (its host died) or broke the protocol: the round cannot go on.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        store_error_ = std::current_exception();
      }
      report(fmt::format("lost the rendezvous store at {}: {}",
                         net::format_endpoint(options_.endpoint.host, options_.endpoint.port),
                         e.what()));
      return;
    }
  }
}

void MembershipWatcher::watch(Clock::time_point& next_beat) {
  keys::Round k(options_.run_id, round_.generation);
  // A store whose waits can be interrupted (the TCP store, etcd) is waited on until the next
  // heartbeat in one request: stop() and request_end() interrupt it. Otherwise in slices that
  // start short and double up to kMaxWaitSlice: stop() waits for the current slice, so a watcher
  // stopped soon after it started (workers that exit at once) stops at once, and a long round costs
  // a few store calls per second.
  auto* interruptible = dynamic_cast<InterruptibleWait*>(store_.get());
  Millis slice = std::min(options_.conf.heartbeat, kFirstWaitSlice);
  const Millis max_slice = std::min(options_.conf.heartbeat, kMaxWaitSlice);
  for (;;) {
    // Cleared before stop_ and end_requested_ are read: an interrupt after the reads ends
    // the wait below, one before them is seen by them.
    interrupter_.clear();
    if (stop_) return;
    auto now = Clock::now();
    if (now >= next_beat) {
      beat();
      next_beat = deadline_after(options_.conf.heartbeat, now);
      if (may_grow_) follow_growth();
      if (ring_.size() > 1) check_peers();
      if (stop_) return;
      // A node this watcher took as lost in place (--recovery step) frees a place too (a
      // node that can take it, or grow the round, does so without counting itself as waiting).
      const int live_here = static_cast<int>(ring_.size()) - lost_peers_;
      if (is_elastic(options_.backend) && live_here < options_.nodes.max) {
        int64_t waiting = store_->add(k.pending(), 0);
        const int64_t live = waiting > 0 && may_grow_ ? live_nodes(*store_, k, formed_) : live_here;
        if (waiting > 0 && live < options_.nodes.max) {
          report(store_->compare_set(
              k.changed(), "",
              fmt::format("{} node{} waiting to join (round {} has {} of at most {} nodes)",
                          waiting, waiting == 1 ? " is" : "s are", round_.generation, live,
                          options_.nodes.max)));
          return;
        }
      }
    }
    std::optional<std::string> end;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      end = end_requested_;
    }
    if (end) {
      report(store_->compare_set(k.changed(), "", *end));
      return;
    }
    bool changed = false;
    if (interruptible != nullptr) {
      changed = interruptible->wait_interruptibly({k.changed()}, remaining(next_beat),
                                                  interrupter_) == WaitOutcome::kSet;
    } else {
      Millis wait = std::min(slice, remaining(next_beat));
      slice = std::min(slice * 2, max_slice);
      changed = wait_for_keys(*store_, {k.changed()}, wait);
    }
    if (changed) {
      report(store_->get(k.changed()));
      return;
    }
  }
}

}  // namespace ddp::rdzv
