#include "ddp/util/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>

#include "ddp/util/error.hpp"

namespace ddp::net {

namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

// getaddrinfo results, freed on scope exit.
struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : AI_ADDRCONFIG;
  const char* node = host.empty() ? nullptr : host.c_str();
  if (passive && (host.empty() || host == "0.0.0.0")) {
    hints.ai_family = AF_INET;
    node = nullptr;
  }
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(node, service.c_str(), &hints, &result);
  if (rc != 0) {
    throw NetworkError(
        fmt::format("cannot resolve host '{}' ({}): check the host name or use an "
                    "IP address",
                    host, gai_strerror(rc)));
  }
  return AddrInfoPtr(result);
}

std::string sockaddr_text(const sockaddr* addr) {
  char ip[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    port = ntohs(in->sin_port);
  } else if (addr->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    port = ntohs(in6->sin6_port);
  } else {
    return "?";
  }
  return format_endpoint(ip, port);
}

// Waits for `events` on fd until deadline. Returns false on timeout.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    int rc = ::poll(&pfd, 1, millis_until(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw NetworkError(fmt::format("poll failed: {}", errno_text(errno)));
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::string format_endpoint(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::pair<std::string, uint16_t> parse_endpoint(const std::string& text) {
  const auto colon = text.rfind(':');
  std::string host = colon == std::string::npos ? "" : text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  long port = 0;
  const std::string digits = colon == std::string::npos ? "" : text.substr(colon + 1);
  bool ok = !host.empty() && !digits.empty() && digits.size() <= 5 &&
            digits.find_first_not_of("0123456789") == std::string::npos;
  if (ok) port = std::stol(digits);
  if (!ok || port < 1 || port > 65535) {
    throw UsageError(
        fmt::format("'{}' is not an endpoint: expected HOST:PORT (port 1..65535, "
                    "IPv6 addresses in brackets)",
                    text));
  }
  return {host, static_cast<uint16_t>(port)};
}

std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return sockaddr_text(reinterpret_cast<sockaddr*>(&addr));
}

uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw NetworkError(fmt::format("getsockname failed: {}", errno_text(errno)));
  }
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

namespace {

// The lowest port of the kernel's ephemeral range (ip_local_port_range), where outgoing
// connections and binds to port 0 get their ports; Linux's default when unreadable.
int ephemeral_low() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (range >> low >> high && low > 0) return low;
  return 32768;
}

}  // namespace

uint16_t free_tcp_port(const std::string& host) {
  // Below the ephemeral range, no outgoing connection can take the port before the server
  // binds it (under load one did: "address already in use" for a --standalone job's rank 0).
  // Ports 10000-19999, apart from the 20000-31999 that this project's tests pick for their own
  // servers (tests/support/free_port_range.hpp).
  constexpr int kLow = 10000;
  const int high = std::min(ephemeral_low(), 20000);
  if (high - kLow >= 1000) {
    std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> pick(kLow, high - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(random);
      try {
        listen_tcp(host, static_cast<uint16_t>(port), 1);
        return static_cast<uint16_t>(port);
      } catch (const NetworkError&) {
        // taken: another one
      }
    }
  }
  Socket s = listen_tcp(host, 0, 1);
  return local_port(s.fd());
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw NetworkError(fmt::format("cannot make socket non-blocking: {}", errno_text(errno)));
  }
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void detect_dead_peer(int fd, std::chrono::milliseconds within) {
  const unsigned user_timeout = static_cast<unsigned>(std::max<int64_t>(within.count(), 1000));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  // Keepalive: first probe after a third of the time idle, then two more a third apart.
  const int one = 1;
  const int third = static_cast<int>(std::max<int64_t>(user_timeout / 3000, 1));
  const int probes = 2;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &third, sizeof(third));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &third, sizeof(third));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

Socket listen_tcp(const std::string& host, uint16_t port, int backlog) {
  std::string endpoint = format_endpoint(host.empty() ? "0.0.0.0" : host, port);
  AddrInfoPtr infos = resolve(host, port, /*passive=*/true);
  std::string last_error = "no usable address";
  for (addrinfo* ai = infos.get(); ai != nullptr; ai = ai->ai_next) {
    Socket sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock.valid()) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      int zero = 0;  // dual stack: "::" also accepts IPv4 clients
      setsockopt(sock.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (::bind(sock.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      int err = errno;
      if (err == EADDRINUSE) {
        throw NetworkError(fmt::format(
            "cannot listen on {}: address already in use; another process (an earlier run?) "
            "holds the port: choose another port (e.g. --master-port) or stop that process",
            endpoint));
      }
      last_error = errno_text(err);
      continue;
    }
    if (::listen(sock.fd(), backlog) != 0) {
      last_error = errno_text(errno);
      continue;
    }
    set_nonblocking(sock.fd());
    return sock;
  }
  throw NetworkError(fmt::format("cannot listen on {}: {}", endpoint, last_error));
}

Socket connect_tcp(const std::string& host, uint16_t port, Deadline deadline) {
  std::string endpoint = format_endpoint(host, port);
  AddrInfoPtr infos = resolve(host, port, /*passive=*/false);
  std::string last_error = "no usable address";
  for (addrinfo* ai = infos.get(); ai != nullptr; ai = ai->ai_next) {
    Socket sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock.valid()) {
      last_error = errno_text(errno);
      continue;
    }
    set_nonblocking(sock.fd());
    int rc = ::connect(sock.fd(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last_error = errno_text(errno);
      continue;
    }
    if (rc != 0) {
      if (!wait_for(sock.fd(), POLLOUT, deadline)) {
        throw TimeoutError(fmt::format("connecting to {} timed out", endpoint));
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last_error = errno_text(err);
        continue;
      }
    }
    set_nodelay(sock.fd());
    return sock;
  }
  throw NetworkError(fmt::format("cannot connect to {}: {}", endpoint, last_error));
}

void write_all(int fd, const void* data, size_t size, Deadline deadline, const std::string& peer) {
  auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (n > 0) {
      bytes += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline)) {
        throw TimeoutError(fmt::format("sending to {} timed out", peer));
      }
      continue;
    }
    throw NetworkError(fmt::format("sending to {} failed: {}", peer, errno_text(errno)));
  }
}

void read_exact(int fd, void* data, size_t size, Deadline deadline, const std::string& peer) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, bytes, size, 0);
    if (n > 0) {
      bytes += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw NetworkError(fmt::format("connection closed by peer {}", peer));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) {
        throw TimeoutError(fmt::format("receiving from {} timed out", peer));
      }
      continue;
    }
    throw NetworkError(fmt::format("receiving from {} failed: {}", peer, errno_text(errno)));
  }
}

uint64_t raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

int millis_until(Deadline deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  // Round up so a wait never returns just before the deadline and spins.
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
  int64_t ms = (us + 999) / 1000;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace ddp::net
