#pragma once
// EtcdStore: the Store interface (ddp/store/store.hpp) on an etcd cluster, through etcd's v3
// JSON gateway (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn, /v3/watch, /v3/lease/*) over
// libcurl, so the rendezvous protocol runs on etcd unchanged (docs/rendezvous.md, "The etcd
// backends"). etcd 3.4 or later.
//
// How each operation maps onto etcd:
//   set, multi_set     put (a txn of puts; more than 64 keys: a txn per 64, up to 8 at once)
//   get, multi_get     range (more than 64 keys: as multi_set's); an absent key is watched from
//                      the oldest revision read, so a put between the read and the watch is not
//                      missed
//   wait, check        the same, without reading values; wait_interruptibly (InterruptibleWait)
//                      ends the watch at once when interrupted, and a wait whose watch ran
//                      to its deadline ends without reading again
//   compare_set        a read, then (only when the compare holds) a txn: compare value (absent:
//                      create_revision 0), put, else range. A compare that fails costs etcd a
//                      read, not a raft proposal (10,000 agents creating the same key)
//   add                one key per counter, "<marker><base>:<base_version>": the counter is the
//                      base plus the puts since (the key's version), so an increment of 1 is
//                      one txn that only raises the version (no compare on the counter: no
//                      retries, O(1) work for etcd however many clients add); other deltas,
//                      and a key set() wrote an integer to, compare-and-set a new base. Each
//                      increment writes a ticket key with it, so a txn sent again after a lost
//                      reply counts once (src/rendezvous/etcd/etcd_counter.hpp). get() reads a
//                      counter as its decimal value
//   delete_key         deleterange;  num_keys: a count-only range over the prefix
//   keep_alive         (KeptAliveKeys, the membership watcher's heartbeat) a put attached to a
//                      lease of this client's, granted at the first call; later calls renew
//                      it (/v3/lease/keepalive: no raft proposal, unlike a put)
// Every key lives under `prefix`. With a lease key, every key written is attached to one lease
// that all clients of the same lease key share and renew (etcd_lease in src/), except keys
// under `unleased_prefixes` and the key kept alive.
//
// Every request is bounded (read_timeout; connect_timeout for unreachable members, which are
// left for the next member of `endpoints`, as are members that accepted a read and did not
// answer in time); every wait by its own limit, and each watch within it by watch_attempt. Failures
// are the library's errors with the cause and the fix: NetworkError (no member reachable),
// StoreError (TLS refused, etcd refused), ProtocolError (the endpoint is not etcd), TimeoutError.
// Not thread-safe (like TcpStore): one object per thread, or a caller that serialises use.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/store/kept_alive_keys.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wait_interrupter.hpp"

namespace ddp::rdzv {

struct EtcdStoreOptions {
  std::vector<Endpoint> endpoints;  // the cluster's members (client URLs), tried in turn
  bool https = false;
  std::optional<std::string> cacert;  // PEM CA that signed etcd's certificate
  std::optional<std::string> cert;    // this client's certificate (PEM)
  std::optional<std::string> key;     // its private key (PEM)
  std::string prefix = "/ddprun/";
  Millis connect_timeout = RendezvousConf::kDefaultConnectTimeout;
  Millis read_timeout = RendezvousConf::kDefaultReadTimeout;
  // Key (under prefix) of the shared lease; nullopt: keys are permanent.
  std::optional<std::string> lease_key;
  Millis lease_ttl = RendezvousConf::kDefaultKeyTtl;
  std::vector<std::string> unleased_prefixes;
  // The local address connections leave from (nullopt: the kernel's choice). The load bench
  // gives each simulated node its own loopback address, as real nodes have their own.
  std::optional<std::string> local_address;
  // Longest single watch of a wait: then the keys are read again and watched anew, so a member
  // that died silently (stopped, cut off without a reset) costs this long, not the whole wait.
  // Each waiting agent costs etcd a read and a new watch per attempt: 10,000 agents waiting for
  // their round cost 2,000 requests/s at 10 s, which starved node 0's assembly (bench/rendezvous/
  // README.md); a member cut off with a reset, or killed, is left at once either way.
  Millis watch_attempt{30000};
};

class EtcdStore : public Store, public InterruptibleWait, public KeptAliveKeys {
 public:
  // Reads one key, so an unreachable cluster, refused TLS or an endpoint that is not etcd
  // fail here, with their message.
  explicit EtcdStore(EtcdStoreOptions options);
  ~EtcdStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  WaitOutcome wait_interruptibly(const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout,
                                 WaitInterrupter& interrupter) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  void keep_alive(const std::string& key, const std::string& value,
                  std::chrono::milliseconds ttl) override;
  std::vector<std::optional<std::string>> read_now(const std::vector<std::string>& keys) override;

  // The cluster's revision now (one read): it grows by one with every write, so two readings
  // count the writes between them (tests, benchmarks).
  int64_t revision();

  // "etcd at host:port, host:port (prefix /ddprun/)", for messages.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The store options of a rendezvous on etcd: the endpoints and TLS files of --rdzv-endpoint
// and --rdzv-conf, and one lease per run id (the run's keys outlive its last agent by
// key_ttl), the endpoint's registry of run ids excepted.
EtcdStoreOptions etcd_store_options(const RendezvousOptions& options);

}  // namespace ddp::rdzv
