#pragma once
// TCP socket helpers shared by the store, the rendezvous and the launcher.
//
// Contracts:
// - Every call that can block takes a deadline (steady_clock) and throws ddp::TimeoutError
//   when it passes; failures are ddp::NetworkError. Messages name the peer as host:port.
// - Sockets are never left blocking forever: reads and writes use poll() on the remaining
//   time, and writes use MSG_NOSIGNAL so a vanished peer is an error, not a SIGPIPE.
// - IPv4 and IPv6 both work; host names are resolved with getaddrinfo.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace ddp::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Owns a file descriptor; closes it on destruction. Movable, not copyable.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void close();

 private:
  int fd_ = -1;
};

// "host:port", with brackets around IPv6 literals ("[::1]:29500").
std::string format_endpoint(const std::string& host, uint16_t port);

// The inverse of format_endpoint: "host:port" or "[v6]:port". Throws UsageError naming `text`
// when it has no port or the port is not in 1..65535.
std::pair<std::string, uint16_t> parse_endpoint(const std::string& text);

// The remote address of a connected socket as "ip:port" ("?" if unknown).
std::string peer_address(int fd);

// The local port a bound socket got (useful after binding port 0).
uint16_t local_port(int fd);

// Binds and listens on host:port. An empty host or "0.0.0.0" means every IPv4 interface,
// "::" every interface (dual stack). Port 0 picks a free port; read it with local_port().
// The socket is non-blocking with SO_REUSEADDR. Throws NetworkError naming host:port and the
// likely fix (e.g. "address already in use: choose another port").
Socket listen_tcp(const std::string& host, uint16_t port, int backlog);

// A TCP port that was free on `host` (as for listen_tcp) a moment ago: bound, released. For a
// server that another process starts next. Picked at random in 10000-19999, below the
// kernel's ephemeral range, so no outgoing connection can take it in between (only a process
// that binds it on purpose); where that range starts lower, a port-0 bind's. A server that can
// should still bind port 0 itself. Throws NetworkError.
uint16_t free_tcp_port(const std::string& host);

// One attempt to connect to host:port, bounded by deadline. The returned socket is
// blocking-mode-agnostic (non-blocking; use read_exact/write_all) with TCP_NODELAY set.
// Throws NetworkError (refused, unreachable, unresolvable) or TimeoutError.
Socket connect_tcp(const std::string& host, uint16_t port, Deadline deadline);

// Writes all of [data, data+size) before deadline. `peer` is used in error messages.
void write_all(int fd, const void* data, size_t size, Deadline deadline, const std::string& peer);

// Reads exactly size bytes before deadline. A peer that closes first is a NetworkError
// ("connection closed by peer").
void read_exact(int fd, void* data, size_t size, Deadline deadline, const std::string& peer);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// Makes the kernel end a connection whose peer stopped answering at the TCP level (a host cut
// off or powered off, not one that is only slow: its kernel still acknowledges) within about
// `within`: sent data unacknowledged that long (TCP_USER_TIMEOUT), or an idle connection
// whose keepalive probes go unanswered. The next read or write then fails with ETIMEDOUT.
void detect_dead_peer(int fd, std::chrono::milliseconds within);

// Raises the soft RLIMIT_NOFILE to the hard limit (servers holding thousands of clients).
// Returns the resulting soft limit. Never lowers it; failures leave it unchanged.
uint64_t raise_fd_limit();

// Milliseconds from now until deadline, clamped to [0, INT_MAX] (poll/epoll arguments).
int millis_until(Deadline deadline);

}  // namespace ddp::net
