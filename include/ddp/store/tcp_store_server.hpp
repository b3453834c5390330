#pragma once
// TcpStoreServer: the key-value server behind TcpStore (c10d's TCPStore master).
//
// One thread runs an epoll loop over non-blocking sockets with per-connection buffers; there
// is no thread per client, so thousands of clients cost only file descriptors (the
// constructor raises the RLIMIT_NOFILE soft limit to the hard limit). Blocking requests (get,
// wait, multi_get) park on the server until their keys are set or their own timeout passes;
// the loop sleeps in epoll_wait until the earliest such deadline.
//
// Robustness contract: a client that sends garbage, a bad version, an oversized or malformed
// frame, fails authentication, or vanishes mid-request or while waiting affects only its own
// connection, which is closed (after an error frame when one can be sent). Other clients are
// never blocked by it. Refused and malformed connections are logged (spdlog "ddp.store") with
// the peer address. Connections that never complete the handshake are bounded in number
// (max_handshakes, max_handshakes_per_address) and in time (handshake_timeout), so a flood of
// them cannot exhaust the server's descriptors or lock real clients out.
//
// Lifecycle: the constructor binds and listens (so port() is valid at once, also for port 0);
// start() serves on a background thread, or run() serves on the caller's thread; stop() is
// idempotent, thread-safe, and returns once the loop has exited and every socket is closed.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/protocol.hpp"

namespace ddp {

struct TcpStoreServerOptions {
  static constexpr uint16_t kDefaultPort = 29500;
  static constexpr int kDefaultBacklog = 8192;
  // A real client finishes the handshake in two round trips (milliseconds); 10 s leaves room
  // for a store host starved of CPU while an idle connection holds its slot (below) briefly.
  static constexpr std::chrono::milliseconds kDefaultHandshakeTimeout{std::chrono::seconds(10)};
  static constexpr size_t kDefaultMaxHandshakeFrameBytes = 4096;
  // Caps on connections still in the handshake (not yet authenticated), so that peers which
  // connect and never speak cannot exhaust the server's descriptors. 1024 in total keeps them
  // to a quarter of a common 4096 open-files limit; 64 per address lets every process of a
  // large node (agent and up to 63 local ranks) connect at the same moment, while no single
  // address can take more than 1/16 of the total.
  static constexpr size_t kDefaultMaxHandshakes = 1024;
  static constexpr size_t kDefaultMaxHandshakesPerAddress = 64;

  // Address to bind: "" or "0.0.0.0" = every IPv4 interface, "::" = every interface.
  std::string host;
  // 0 picks a free port (read it back with TcpStoreServer::port()).
  uint16_t port = kDefaultPort;
  // Shared secret clients must prove they know. nullopt: $DDP_STORE_TOKEN if set, else none.
  // An empty string disables auth even when the variable is set.
  std::optional<std::string> token;
  // Largest frame (header + payload) accepted from a client.
  size_t max_frame_bytes = store_protocol::kDefaultMaxFrameBytes;
  // Largest frame accepted before the handshake completes (hello and auth are tens of bytes):
  // an unauthenticated peer announcing a bigger one is closed at once, so it cannot make the
  // server buffer max_frame_bytes for the whole handshake window.
  size_t max_handshake_frame_bytes = kDefaultMaxHandshakeFrameBytes;
  int backlog = kDefaultBacklog;
  // A connection that has not finished the hello/auth handshake by then is closed, so idle
  // half-open connections cannot pile up.
  std::chrono::milliseconds handshake_timeout = kDefaultHandshakeTimeout;
  // Most connections in the handshake at once, in total and per peer IP address (at least 1
  // each; authenticated connections never count). A newcomer over a cap displaces the oldest
  // such connection (of its address, or of all) if that one has waited 1 s; otherwise a
  // newcomer over the address cap is closed at once (a real client retries), and at the total
  // cap new connections wait in the listen backlog until a slot frees. Each event is logged
  // (at most once a second) with the peer address and the cap. docs/store-protocol.md.
  size_t max_handshakes = kDefaultMaxHandshakes;
  size_t max_handshakes_per_address = kDefaultMaxHandshakesPerAddress;
  // A standby store (docs/store-protocol.md, "Standby stores"): it refuses clients until it is
  // promoted (a kPromote request: promote_first_standby), taking meanwhile the writes its
  // primary replicates to it (replicate_to on the primary).
  bool standby = false;
};

class TcpStoreServer {
 public:
  // Binds and listens. Throws NetworkError naming host:port when it cannot (e.g. port in use),
  // UsageError when a cap above is 0.
  explicit TcpStoreServer(TcpStoreServerOptions options = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Serves on a background thread. Throws UsageError if already serving.
  void start();
  // Serves on the calling thread until stop() is called from another thread.
  void run();
  // Stops serving, closes every connection, joins the background thread. Idempotent.
  void stop();

  uint16_t port() const { return port_; }

  // How long the standby may take to acknowledge one write before the primary goes on without
  // it: a write waits for it, so this bounds what losing the standby's host costs a client.
  static constexpr std::chrono::milliseconds kDefaultReplicaTimeout{1000};
  // Replicates to the first of `standbys` ("host:port") that takes the stream: it gets a copy
  // of the data, then every write, and a write is applied (and answered) here only once it has
  // it, so a promoted standby holds everything any client saw. When it fails, the next one
  // gets a fresh copy; with none left the server goes on alone (logging why). Thread-safe,
  // returns at once; replaces the standbys not tried yet.
  void replicate_to(std::vector<std::string> standbys,
                    std::chrono::milliseconds request_timeout = kDefaultReplicaTimeout);
  // Whether this is a standby not promoted yet.
  bool is_standby() const;
  // The standby replicated to now ("host:port"), "" when none.
  std::string replica() const;
  // Connections currently open (including ones still in the handshake).
  size_t num_connections() const;
  // Requests (wait, blocking get, multi_get) parked now until their keys arrive.
  size_t num_waiting() const;
  // Connections refused for failing authentication since start (including clients that hung
  // up during the auth handshake because this server's proof did not match their token).
  uint64_t num_auth_refusals() const;
  // Connections closed because they broke the protocol since start.
  uint64_t num_protocol_errors() const;

  class Loop;  // the epoll event loop (tcp_store_server.cpp)

 private:
  TcpStoreServerOptions options_;
  uint16_t port_ = 0;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::atomic<bool> running_{false};
};

}  // namespace ddp
