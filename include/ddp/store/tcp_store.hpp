#pragma once
// TcpStore: the Store client that talks to a TcpStoreServer over TCP (c10d's TCPStore).
//
// Contracts:
// - Construction connects, retrying with backoff until options.timeout (the server may start
//   later than its clients), or, for refused attempts, until options.connect_retry. Running
//   out of time throws TimeoutError naming host:port and the last failure ("connection
//   refused", "receiving ... timed out").
// - Every call is bounded: blocking ones (get, wait, multi_get) by their timeout, enforced by
//   the server and backed by a client-side deadline; the rest by timeout() too. A timeout
//   throws TimeoutError naming host:port, the missing keys, the elapsed time and the limit.
// - Thread-safe: calls on one TcpStore are serialised by a mutex (one connection per object;
//   create several objects for parallel requests).
// - After a network failure or a client-side timeout the connection is dropped; the next call
//   reconnects. A failed call is never retried behind the caller's back (add is not
//   idempotent), except with options.standbys (below).
// - Standby stores (options.standbys, docs/store-protocol.md "Standby stores"): a call whose
//   connection breaks (the store's host died) reconnects to whichever of host:port and the
//   standbys serves clients (a standby refuses them until it is promoted) and is sent again
//   under its request id, within the call's limit; the store then answers a write it already
//   applied with the reply it got, so an add or compare_set is applied once. A call that got no
//   reply within its limit is not retried, but the next call tries the next endpoint first. A
//   host that vanished without closing its sockets (a cut link) is noticed at the TCP level
//   within about 3 s (TCP_USER_TIMEOUT and keepalive), which counts as a broken connection.
// - Auth: when the server has a token, the client must have the same one (options.token or
//   $DDP_STORE_TOKEN); otherwise construction throws StoreError saying so. A client holding a
//   token also makes the server prove it knows the token, and refuses (StoreError) a server
//   that answers without auth or cannot prove it (docs/store-protocol.md).
// - A timeout of std::chrono::milliseconds::max() means no limit (clamped to a year).
//
// With options.is_server the object also hosts a TcpStoreServer in this process (rank 0's
// role in init_process_group); port 0 then picks a free port, readable with port().

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/store/protocol.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/wait_interrupter.hpp"
#include "ddp/util/socket.hpp"

namespace ddp {

class TcpStoreServer;

struct TcpStoreOptions {
  static constexpr const char* kDefaultHost = "127.0.0.1";
  static constexpr uint16_t kDefaultPort = 29500;

  std::string host = kDefaultHost;
  uint16_t port = kDefaultPort;
  // Bounds connecting and every call (Store::timeout()).
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // Unset: connection attempts are retried until `timeout`. Set: attempts that fail before
  // reaching the server (refused, unreachable) are retried only this long, while an attempt
  // that reached it may still take until `timeout` for the handshake, so a busy or
  // CPU-starved server that answers late is not mistaken for an absent one.
  std::optional<std::chrono::milliseconds> connect_retry;
  // Shared secret. nullopt: $DDP_STORE_TOKEN if set, else none. "" disables auth explicitly.
  std::optional<std::string> token;
  // Host a TcpStoreServer in this process, listening on port (bind address: every interface).
  bool is_server = false;
  size_t max_frame_bytes = store_protocol::kDefaultMaxFrameBytes;
  // The store's standbys ("host:port", in the order they take over). Empty: no fail-over.
  std::vector<std::string> standbys;
  // The role hello announces (protocol.hpp): a client's, or within ddp_store a primary's
  // replication stream or an admin's (promote_first_standby).
  std::string role = store_protocol::kClientRole;
};

// The variable in which ddprun gives its workers the job store's standbys ("host:port,..."):
// ddprun --recovery step keeps the store on more than one node (docs/recovery.md).
inline constexpr const char* kStandbysEnvVar = "DDP_STORE_STANDBYS";

// "host:port,host:port,..." as a list (empty entries skipped); UsageError naming `source` and
// the text when an entry is not HOST:PORT.
std::vector<std::string> split_endpoints(const std::string& text, const std::string& source);

// The standbys $DDP_STORE_STANDBYS names (empty when unset). UsageError naming the variable
// when an entry is not HOST:PORT.
std::vector<std::string> standbys_from_env();

// Promotes the first of `standbys` ("host:port") that answers within `per_attempt` (a store
// already promoted counts), telling it to replicate to the ones after it; returns its
// endpoint. NetworkError naming each one's failure when none answers.
std::string promote_first_standby(const std::vector<std::string>& standbys,
                                  const std::optional<std::string>& token,
                                  std::chrono::milliseconds per_attempt);

class TcpStore : public Store, public InterruptibleWait {
 public:
  using Op = store_protocol::Op;
  using Frame = store_protocol::Frame;

  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  // get with an explicit limit instead of timeout().
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // A wait that `interrupter` ends early (within 100 ms: the client looks at it while it
  // waits): the client sends cancel_wait and the server answers the wait at once
  // (docs/store-protocol.md), so the connection stays usable.
  WaitOutcome wait_interruptibly(const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout,
                                 WaitInterrupter& interrupter) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  // One round trip; throws like any other call when the server is unreachable.
  void ping();
  // With standbys: the store now serves at `endpoint` (one of host:port and the standbys: a
  // standby this process promoted). Drops the connection, so the next call connects there
  // first instead of waiting for a host that may answer nothing. UsageError for another one.
  void prefer_endpoint(const std::string& endpoint);
  // Promotes the standby this admin connection (options.role kAdminRole) reached: it serves
  // clients from now on and replicates to the first of `next_standbys` that answers.
  void promote(const std::vector<std::string>& next_standbys);
  // On a replication connection (options.role kReplicaRole): applies one write on the standby,
  // recorded under (client_id, request_id) of the client that sent it; returns the reply's
  // fields. StoreError when the standby refuses it (it was promoted: the stream is over).
  std::vector<std::string> replicate(const std::string& client_id, uint32_t request_id, Op op,
                                     std::vector<std::string> fields);

  const std::string& host() const { return options_.host; }
  // The server's port (the bound one when is_server with port 0).
  uint16_t port() const { return options_.port; }
  // "host:port".
  std::string endpoint() const;
  // The hosted server, or nullptr when !is_server.
  TcpStoreServer* server() { return server_.get(); }

 private:
  // Sends a request and returns the kOk reply's fields. `limit` is the server-side wait (for
  // blocking ops); the client gives up at limit + a grace period. Throws TimeoutError when
  // the server answers kTimeout, naming `keys_waited`.
  std::vector<std::string> call(Op op, std::vector<std::string> fields,
                                std::chrono::milliseconds limit,
                                const std::vector<std::string>& keys_waited);
  // Connects and runs the handshake. Called with mutex_ held. With standbys, tries each
  // endpoint in turn (from the last one that served) until one serves clients.
  void connect_locked(net::Deadline deadline);
  void connect_one_locked(net::Deadline deadline);
  // Whether a failed exchange may be sent again on a new connection (standbys, time left).
  bool may_fail_over(net::Deadline deadline) const;
  void skip_silent_endpoint_locked();
  void handshake_locked(net::Deadline deadline);
  Frame exchange_locked(const Frame& request, net::Deadline deadline);
  // Sends a wait and reads its reply, cancelling it once `interrupter` fires.
  Frame wait_reply_locked(const Frame& request, net::Deadline deadline,
                          WaitInterrupter& interrupter, bool& cancelled,
                          net::Clock::time_point start, std::chrono::milliseconds timeout,
                          const std::vector<std::string>& keys);
  // Sends `request` under the next request id (returned) / reads the reply to `request_id`.
  // `reuse_id`: the id of the request this one sends again after a fail-over.
  uint32_t send_locked(Frame request, net::Deadline deadline, uint32_t reuse_id = 0);
  Frame read_reply_locked(uint32_t request_id, net::Deadline deadline);
  [[noreturn]] void throw_reply_error(const Frame& reply, Op op);

  TcpStoreOptions options_;
  std::string token_;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mutex_;
  net::Socket sock_;
  // Never reset on reconnecting: a standby tells a re-sent write from a new one by its id.
  uint32_t next_request_id_ = 1;
  // With standbys: host:port first, then the standbys; the one in use is options_.host:port.
  std::vector<std::pair<std::string, uint16_t>> endpoints_;
  size_t current_endpoint_ = 0;
  std::string client_id_;  // sent in hello with standbys: " id=<hex>"
};

}  // namespace ddp
