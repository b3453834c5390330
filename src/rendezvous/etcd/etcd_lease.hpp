#pragma once
// One etcd lease shared by every client that names the same lease key, kept alive by each of
// them: the keys attached to it outlive the last client by `ttl` and are then deleted by etcd.
// The rendezvous gives each run such a lease, so a run's keys disappear once its agents are
// gone (a later job with the same --rdzv-id then starts afresh), while no single agent's death
// takes shared keys (the join counter, the generation) with it. Internal to src/rendezvous/etcd.
//
// The lease's id is stored at the lease key, itself attached to the lease. Acquiring: read the
// key; if it names a live lease, use it; else grant a lease and create the key with a
// compare-and-set (the loser revokes its lease and uses the winner's). A background thread
// renews the lease every ttl/3 on a connection of its own, without holding the lock that id()
// takes, so a slow renewal never delays a write. Each renewal attempt at a member is bounded by
// min(read_timeout, ttl/3) independently of read_timeout (a member that does not answer is left
// for the next one), and a failed renewal is retried after a second: with the defaults
// (read_timeout 60 s, key_ttl 30 s) a stalled member cannot make the lease expire while a
// renewal waits on it. A renewal that finds the lease gone (every client was stopped or cut off
// for ttl) forgets it, and the next id() acquires a new one. Thread-safe.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "etcd_http.hpp"

namespace ddp::rdzv::etcd {

// Renews lease `id`; returns its time to live left in seconds (0 or less: expired). Sent again
// to another member after a timeout; each attempt is bounded by `timeout` (nullopt:
// read_timeout). Throws LeaseNotFoundError for a lease etcd no longer knows.
int64_t renew_lease(EtcdHttp& http, int64_t id, std::optional<Millis> timeout = std::nullopt);
// Grants a lease of `ttl` (whole seconds, rounded up, at least 1) and returns its id; `context`
// names it in errors.
int64_t grant_lease(EtcdHttp& http, Millis ttl, const std::string& context);

class SharedLease {
 public:
  // `lease_key` is the full etcd key. Contacts etcd only at the first id().
  SharedLease(HttpOptions http, std::string lease_key, Millis ttl);
  ~SharedLease();
  SharedLease(const SharedLease&) = delete;
  SharedLease& operator=(const SharedLease&) = delete;

  // The live lease (acquired on first use); throws like EtcdHttp::call.
  int64_t id();
  // A request naming `lease` was refused with "lease not found": forget it (if still current).
  void lost(int64_t lease);

 private:
  int64_t acquire_locked();
  void keep_alive();

  EtcdHttp http_;        // acquiring (under mutex_)
  EtcdHttp renew_http_;  // the renewal thread's own
  const std::string key_;
  const Millis ttl_;
  const Millis read_timeout_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  int64_t id_ = 0;
  std::thread thread_;
};

}  // namespace ddp::rdzv::etcd
