#pragma once
// Watches one round from a background thread while this node's workers run, and reports
// once, with a reason, when the round must end:
//   - another agent ended it (a worker failed there, it left, the run was shut down);
//   - the peer this node watches missed kMissedHeartbeats heartbeats (it died or lost the
//     network; unless on_peer_lost takes the loss: --recovery step) or marked itself "left";
//   - nodes are waiting to join (c10d, while the round is below MAX nodes, counting the nodes
//     this watcher took as lost: a node that replaces a lost one ends the round, and the
//     worker group restarts with it).
// It also writes this node's heartbeat every `heartbeat` period: a counter, or on a store that
// keeps keys alive (KeptAliveKeys: etcd) a renewal of the lease its heartbeat key is attached
// to, kMissedHeartbeats periods long (no write per period); such a peer is gone once its key
// vanished with its lease.
//
// Watching is a ring: the node in slot i watches the next slot that has not finished, so
// each agent makes O(1) store calls per period whatever the number of nodes, and every death
// is seen by some survivor. When a watcher sees a change it records the reason in the
// round's "changed" key (the first reason wins), which wakes every other watcher at once
// (they block on that key between heartbeats).
//
// Between heartbeats the watcher waits on "changed". On a store whose waits can be interrupted
// (InterruptibleWait: the TCP store and etcd) it waits until its next heartbeat in one wait,
// and stop() and request_end() interrupt it: an idle agent sends the store a few requests per
// heartbeat (measured: bench/rendezvous/README.md). On other stores it waits in slices of 5 ms
// doubling to 500 ms, and stopping takes at most one slice. Either way the
// watcher holds its Store while it waits: give it a connection of its own, or one its owner
// leaves alone while watching (ddprun's agent shares its own: it makes no store call between
// starting and stopping the watcher; it ends the round through request_end meanwhile).
// on_change runs on the watcher thread, exactly once; it must not block for long (e.g. write
// to a pipe the agent polls).

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/store/kept_alive_keys.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wait_interrupter.hpp"

namespace ddp::rdzv {

// A peer node this watcher found dead or gone, and its workers' global ranks.
struct LostPeer {
  int node_rank = 0;
  int first_rank = 0;  // the node's ranks are first_rank .. first_rank + num_ranks - 1
  int num_ranks = 0;
  std::string why;  // "node rank 1 (host, addr) missed 3 heartbeats (...)"
};

class MembershipWatcher {
 public:
  using OnChange = std::function<void(const std::string& reason)>;
  // In-place recovery of a lost node (ddprun --recovery step): called on the watcher thread
  // when the watched peer missed its heartbeats, while the round keeps at least
  // options.nodes.min nodes (counting every loss taken in the round). Returns true when the
  // survivors go on without that node: the watcher then marks its slot "lost" (every ring
  // skips it, nobody waits for it at the end, and this watcher ignores its heartbeats should
  // they resume) and watches the next peer, and the round does not end. false (or no handler):
  // the round ends, as always. This node's heartbeats go on meanwhile from a thread of the
  // watcher's, on the watcher's store: the handler must not use that store. A peer that left
  // (interrupted) ends the round itself.
  using OnPeerLost = std::function<bool(const LostPeer&)>;
  // The store failed (its host died, say): returns the store to go on with in the same round
  // (a promoted standby holding a copy of it: --recovery step), or nullptr to end the watch as
  // always (store_error(), and the round ends). Runs on the watcher thread.
  using OnStoreLost = std::function<std::shared_ptr<Store>(const Error&)>;

  // Starts watching `round` (this node is round.node_rank). Throws UsageError on a bad round.
  MembershipWatcher(const RendezvousOptions& options, const RoundInfo& round,
                    std::shared_ptr<Store> store, OnChange on_change,
                    OnPeerLost on_peer_lost = nullptr, OnStoreLost on_store_lost = nullptr);
  ~MembershipWatcher();
  MembershipWatcher(const MembershipWatcher&) = delete;
  MembershipWatcher& operator=(const MembershipWatcher&) = delete;

  // Stops the thread (idempotent). Heartbeats stop with it.
  void stop();
  // Asks the watcher to end the round with `reason` (Rendezvous::request_new_round on the
  // watcher's own thread, which owns the store while watching: the owner cannot make that
  // call itself then). Done at once (an interruptible store), else before the watcher's next
  // wait slice (within 500 ms); the watcher
  // then reports the round's reason (the first any node gave) as a change. Thread-safe.
  void request_end(const std::string& reason);
  // The reason reported, if any.
  std::optional<std::string> reason() const;
  // The store's error that ended the watch (the store's host died, or it broke the
  // protocol), for the owner to tell a lost store from a protocol error; null if none.
  std::exception_ptr store_error() const;

 private:
  void run();
  // One watch over store_ until a change, stop() or a store error (thrown).
  void watch(std::chrono::steady_clock::time_point& next_beat);
  // One heartbeat of this node on store_: its lease renewed (etcd), else its counter raised.
  void beat();
  // on_peer_lost_(peer), with this node's heartbeats going on from a thread of their own.
  bool take_loss_beating(const LostPeer& peer);
  void report(const std::string& reason);
  void check_peers();
  // Lost slots another node took back (Rendezvous::take_lost_slot) are watched again.
  void follow_taken_back_slots();
  // Nodes that grew the round (Rendezvous::grow_round) join the ring (round_growth.hpp).
  void follow_growth();
  // The ring: the round's member slots in order, wrapping around.
  int next_in_ring(int slot) const;
  int ring_distance(int slot) const;  // from this node, along the ring
  // Watches `slot` from now on if it comes before the current target on the ring.
  void watch_closer(int slot);
  // The peer in `slot` is gone: hands it to on_peer_lost_ (true: the round goes on without
  // it) or ends the round with `why`.
  void peer_gone(int slot, const std::string& why);
  LostPeer describe_lost(int slot, const std::string& why);
  // "node rank 1 (host, addr)", for messages.
  std::string describe_slot(int slot);
  // The lease of a heartbeat kept alive: kMissedHeartbeats heartbeats (etcd counts whole
  // seconds: the store rounds it up).
  Millis liveness_ttl() const;

  RendezvousOptions options_;
  RoundInfo round_;
  std::shared_ptr<Store> store_;
  KeptAliveKeys* kept_alive_ = nullptr;  // store_ as one, when it keeps keys alive
  OnChange on_change_;
  OnPeerLost on_peer_lost_;
  OnStoreLost on_store_lost_;
  int formed_ = 1;             // the slots the round formed with: 0 .. formed_ - 1
  std::vector<int> ring_;      // the round's member slots, ascending (grown ones included)
  int extent_ = 1;             // the round's extent last read (round_growth.hpp)
  std::set<int> growing_;      // join slots below it not (yet) members
  bool may_grow_ = false;      // --recovery step in an elastic round: nodes may grow it
  int lost_peers_ = 0;         // slots this watcher marked "lost" (and not taken back)
  std::set<int> taken_;        // which
  std::set<int> passed_lost_;  // slots seen "lost" (by any watcher): a node may take one back
  int64_t beats_ = 0;          // this node's heartbeat counter (stores without leases)
  std::atomic<bool> stop_{false};
  WaitInterrupter interrupter_;  // ends the watcher's wait on stop() and request_end()
  mutable std::mutex mutex_;
  std::optional<std::string> reason_;
  std::optional<std::string> end_requested_;  // request_end's, until the watcher sends it
  std::exception_ptr store_error_;
  std::thread thread_;

  // Ring-watch state: the slot watched and when its heartbeat last changed.
  int target_ = -1;
  std::string target_value_;
  std::chrono::steady_clock::time_point target_changed_at_;
};

}  // namespace ddp::rdzv
