#pragma once
// KeptAliveKeys: a store capability for liveness keys that cost no write per heartbeat.
//
// A heartbeat written as a counter is one write per period and node; on etcd every write is a
// raft proposal with an fsync, and those writes are what limit the number of agents one etcd
// carries (bench/rendezvous/README.md: 4,000 idle agents overflowed etcd's apply queue). A store
// that implements this interface keeps a key alive for its writer instead: the key is attached
// to a lease of that writer's, which the writer renews every period (etcd renews a lease on its
// leader, without a raft proposal), and the store deletes the key once its writer stopped
// renewing for the lease's time to live. The rendezvous' membership watcher heartbeats through
// it when its store offers it, and takes a peer whose key vanished as one that missed its
// heartbeats (docs/rendezvous.md, "The etcd backends").

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

class KeptAliveKeys {
 public:
  virtual ~KeptAliveKeys() = default;

  // The first call writes key = value attached to a new lease of this client's with time to
  // live `ttl` (whole seconds, rounded up; the store may raise it to its minimum); every later
  // call only renews that lease (one request, no write). One client keeps one key alive, and
  // keeps passing the same key. A lease found expired (this client could not renew it for
  // `ttl`: the store deleted the key, and peers may have taken this node as lost) is replaced:
  // the key is written again on a new lease, with a warning. Throws the store's errors.
  virtual void keep_alive(const std::string& key, const std::string& value,
                          std::chrono::milliseconds ttl) = 0;

  // The values of `keys` as they are now (nullopt: absent), in one request, without waiting.
  virtual std::vector<std::optional<std::string>> read_now(
      const std::vector<std::string>& keys) = 0;
};

}  // namespace ddp
