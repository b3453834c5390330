#pragma once
// The epoll event loop of TcpStoreServer (private to src/store).
//
// Invariants:
// - Only the loop thread touches connections, the key-value map and the waiter index;
//   other threads only call request_stop() and read the atomic counters.
// - A connection handles one request at a time: while it has a parked waiter or unsent reply
//   bytes, further requests stay buffered (backpressure), so one client's reply buffer holds
//   at most one reply.
// - Connections are destroyed only between events (state kDead, then reaped), so a handler
//   never touches a freed connection.
// - Every parked waiter is indexed under each key it still misses and has a timer; it leaves
//   the index when it completes, times out, or its connection dies.
// - A connection holds a handshake slot (handshaking_ and handshaking_by_address_) from accept
//   until it is authenticated or dies, so at most options_.max_handshakes (per address:
//   max_handshakes_per_address) unauthenticated connections are open at once.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddp/store/protocol.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/socket.hpp"
#include "replicator.hpp"

namespace spdlog {
class logger;
}

namespace ddp {

class TcpStoreServer::Loop {
 public:
  Loop(const TcpStoreServerOptions& options, net::Socket listener, std::string token);
  ~Loop();

  // Serves until request_stop(); closes every connection before returning.
  void run();
  // Thread-safe; wakes the loop through an eventfd.
  void request_stop();

  bool auth_required() const { return !token_.empty(); }
  // Replication (TcpStoreServer::replicate_to). Thread-safe.
  void replicate_to(std::vector<std::string> standbys, std::chrono::milliseconds request_timeout);
  bool is_standby() const { return standby_.load(); }
  std::string replica() const;
  size_t num_connections() const { return num_connections_.load(); }
  uint64_t num_auth_refusals() const { return auth_refusals_.load(); }
  size_t num_waiting() const { return num_waiting_.load(); }
  uint64_t num_protocol_errors() const { return protocol_errors_.load(); }

 private:
  using Op = store_protocol::Op;
  using Frame = store_protocol::Frame;

  enum class State { kHello, kAuth, kReady, kClosing, kDead };

  // Age at which a connection still in the handshake gives way to a newcomer over a cap. A
  // live client is through in milliseconds, so one this old is presumed idle; younger ones are
  // kept, so a burst of real clients is not closed before the server has read their hellos.
  static constexpr std::chrono::milliseconds kEvictableAfter{1000};

  struct Waiter {
    bool active = false;
    Op op = Op::kWait;
    uint32_t request_id = 0;
    std::vector<std::string> keys;
    // How many of `keys` (with repeats) were absent when it was last registered: each set of
    // one of them counts it down, so a set costs O(1) a waiter, not a rescan of its keys
    // (a wait on K keys then a multi_set of them was O(K^2) on the loop thread).
    size_t missing = 0;
    net::Clock::time_point start;
    uint64_t seq = 0;
  };

  struct Connection {
    uint64_t id = 0;
    net::Socket sock;
    std::string peer;     // ip:port, for messages
    std::string address;  // ip alone: the unit of the per-address handshake cap
    net::Clock::time_point accepted_at;
    bool in_handshake = false;  // holds a handshake slot
    State state = State::kHello;
    std::string nonce;
    std::string in;
    size_t in_off = 0;
    std::string out;
    size_t out_off = 0;
    bool want_write = false;
    Waiter waiter;
    uint64_t timer_seq = 0;  // handshake or linger timer
    std::string role;        // hello's (protocol.hpp): a client's, a replication stream's, ...
    std::string client_id;   // hello's " id=": its writes are answered once (applied_)
    bool awaiting_replica = false;  // its write waits for the standby's acknowledgement
  };

  // A write waiting for the standby (replicator_) before it is applied and answered.
  struct PendingWrite {
    uint64_t seq = 0;
    uint64_t conn_id = 0;
    std::string client_id;
    Frame frame;
  };
  // The reply a write got, kept per client id so that the same write sent again after a
  // fail-over gets it instead of being applied twice.
  struct Applied {
    uint32_t request_id = 0;
    Op reply_op = Op::kOk;
    std::vector<std::string> fields;
  };

  struct Timer {
    net::Clock::time_point at;
    uint64_t conn_id;
    uint64_t seq;
    bool operator>(const Timer& other) const { return at > other.at; }
  };

  // Events.
  void accept_all();
  // Handshake slots. admit() makes room for a new connection under both caps by closing the
  // oldest handshake that may give way (see TcpStoreServerOptions::max_handshakes), or returns
  // false when its address is full and the newcomer must be closed instead.
  bool admit(Connection& conn);
  Connection* oldest_evictable(const std::set<uint64_t>& ids);
  void release_handshake_slot(Connection& conn);
  // Authenticated (or no auth needed): the connection becomes kReady and frees its slot.
  void handshake_done(Connection& conn);
  void pause_listener(net::Clock::time_point until);
  void resume_listener();
  // Warns at most once a second; the next message counts the ones left out meanwhile.
  void log_cap(const std::string& message);
  void on_readable(Connection& conn);
  void on_writable(Connection& conn);
  void expire_timers();
  int next_timeout_ms();
  void run_runnable();
  void reap_dead();

  // Requests.
  void process(Connection& conn);
  // While a wait is parked, its client may send kCancelWait (the one request read then): the
  // wait answers kTimeout at once. Anything else stays buffered until the wait's reply.
  void take_cancel(Connection& conn);
  void handle(Connection& conn, Frame& frame);
  void handle_handshake(Connection& conn, Frame& frame);
  void handle_request(Connection& conn, Frame& frame);
  void park(Connection& conn, Op op, uint32_t request_id, std::vector<std::string> keys,
            int64_t timeout_ms);
  // Largest frame the connection may send now: small until the handshake completes.
  size_t frame_limit(const Connection& conn) const;
  bool all_present(const std::vector<std::string>& keys) const;
  void complete_waiter(Connection& conn);
  void time_out_waiter(Connection& conn);
  void unregister_waiter(Connection& conn);
  void register_waiter(Connection& conn);
  void notify(const std::string& key);
  void set_key(const std::string& key, std::string value);

  // Writes and replication (server_replication.cpp).
  void handle_write(Connection& conn, Frame& frame);
  // Throws BadRequest when a write's fields are malformed (before it is queued or applied).
  static void validate_write(const Frame& frame);
  // Applies a valid write and returns its reply, kept under client_id when there is one.
  Applied apply_write(const std::string& client_id, Frame& frame);
  void handle_replicate(Connection& conn, Frame& frame);
  void promote(std::vector<std::string> next_standbys);
  void attach_next_replica();
  // Applies the writes the standby acknowledged (all of them once it failed), answering them.
  void take_replica_progress();
  void post(std::function<void()> task);
  void run_posted();
  void wake();

  // Output and teardown.
  void reply(Connection& conn, Op op, uint32_t request_id, std::vector<std::string> fields);
  void flush(Connection& conn);
  void update_interest(Connection& conn);
  // Sends an error frame (kind, message), stops reading requests, closes after a short linger.
  void close_with_error(Connection& conn, uint32_t request_id, const char* kind,
                        const std::string& message);
  void kill(Connection& conn);
  void add_timer(Connection& conn, net::Clock::time_point at, uint64_t& seq_slot);
  Connection* find(uint64_t id);

  TcpStoreServerOptions options_;
  net::Socket listener_;
  std::string token_;
  std::shared_ptr<spdlog::logger> logger_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stop_requested_{false};
  bool listener_paused_ = false;
  bool paused_for_cap_ = false;  // resumes as soon as a handshake slot frees
  net::Clock::time_point listener_resume_at_;
  net::Clock::time_point cap_logged_at_;
  uint64_t cap_logs_left_out_ = 0;

  uint64_t next_id_ = 2;  // 0: listener, 1: wake eventfd
  uint64_t next_seq_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  std::vector<uint64_t> dead_;
  std::vector<uint64_t> runnable_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;  // key -> connection ids
  // Connections holding a handshake slot, oldest first (ids grow in accept order).
  std::set<uint64_t> handshaking_;
  std::unordered_map<std::string, std::set<uint64_t>> handshaking_by_address_;

  // Replication (docs/store-protocol.md "Standby stores").
  std::atomic<bool> standby_{false};
  // A standby without a token: the address of the first replication stream (its primary's);
  // streams from any other address are refused (issue 49, finding 8). Loop thread only.
  std::string replica_address_;
  std::unique_ptr<Replicator> replicator_;
  std::vector<std::string> replica_candidates_;  // the standbys after replicator_'s
  std::chrono::milliseconds replica_timeout_{TcpStoreServer::kDefaultReplicaTimeout};
  std::deque<PendingWrite> pending_writes_;
  std::unordered_map<std::string, Applied> applied_;  // client id -> its last write's reply
  mutable std::mutex replica_mutex_;
  std::string replica_endpoint_;
  std::mutex posted_mutex_;
  std::vector<std::function<void()>> posted_;  // tasks other threads hand the loop

  std::atomic<size_t> num_connections_{0};
  std::atomic<size_t> num_waiting_{0};  // requests parked until their keys arrive
  std::atomic<uint64_t> auth_refusals_{0};
  std::atomic<uint64_t> protocol_errors_{0};
};

}  // namespace ddp
