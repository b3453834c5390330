#include "tcp_ring.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../local_address.hpp"
#include "../reduce_kernels.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::detail {

namespace {

// Received bytes are reduced in grains of at least this much (fewer, longer kernel calls),
// and one recv() takes at most kRecvBytes so the reduction starts while the rest arrives.
constexpr size_t kReduceGrain = 64 << 10;
constexpr size_t kRecvBytes = 256 << 10;

}  // namespace

std::string advertised_host_address() {
  if (auto ifname = env::get("DDP_GLOO_IFNAME"); ifname && !ifname->empty()) {
    return ipv4_of_interface(*ifname);
  }
  if (auto master = env::get("MASTER_ADDR"); master && !master->empty()) {
    return ipv4_towards(*master);
  }
  return "127.0.0.1";
}

TcpRing::TcpRing(Store& store, const std::string& prefix, int rank, int size,
                 std::chrono::milliseconds timeout, std::vector<int> group_ranks, std::string where,
                 const std::string& host)
    : rank_(rank),
      size_(size),
      timeout_(timeout),
      group_ranks_(std::move(group_ranks)),
      where_(std::move(where)) {
  if (size_ == 1) return;
  const auto deadline = deadline_after(timeout_);
  net::Socket listener = net::listen_tcp(host, 0, 4);
  const uint16_t port = net::local_port(listener.fd());
  store.set(fmt::format("{}addr/{}", prefix, rank_), fmt::format("{} {}", host, port));

  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  const std::string next_key = fmt::format("{}addr/{}", prefix, next);
  store.wait({next_key}, timeout_);
  const std::string addr = store.get(next_key);
  const auto space = addr.rfind(' ');
  if (space == std::string::npos) {
    throw ProtocolError(fmt::format("{}: malformed ring address '{}' of rank {} in the store",
                                    where_, addr, group_ranks_[next]));
  }
  const std::string next_host = addr.substr(0, space);
  const auto next_port = static_cast<uint16_t>(std::stoul(addr.substr(space + 1)));
  next_name_ =
      fmt::format("rank {} at {}", group_ranks_[next], net::format_endpoint(next_host, next_port));
  next_ = net::connect_tcp(next_host, next_port, deadline);
  const int64_t hello = rank_;
  net::write_all(next_.fd(), &hello, sizeof(hello), deadline, next_name_);

  // Accept the previous rank (it connects to us the same way).
  for (;;) {
    pollfd p{listener.fd(), POLLIN, 0};
    const int rc = ::poll(&p, 1, net::millis_until(deadline));
    if (rc == 0) {
      throw TimeoutError(fmt::format(
          "{}: rank {} did not connect to this rank's ring port {} within {} ms (is it alive, "
          "and can it reach {}?)",
          where_, group_ranks_[prev], port, timeout_.count(), host));
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) throw NetworkError(fmt::format("{}: poll: {}", where_, std::strerror(errno)));
    const int fd = ::accept(listener.fd(), nullptr, nullptr);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      throw NetworkError(fmt::format("{}: accept: {}", where_, std::strerror(errno)));
    }
    prev_ = net::Socket(fd);
    break;
  }
  net::set_nonblocking(prev_.fd());
  net::set_nodelay(prev_.fd());
  prev_name_ = fmt::format("rank {} at {}", group_ranks_[prev], net::peer_address(prev_.fd()));
  int64_t who = -1;
  net::read_exact(prev_.fd(), &who, sizeof(who), deadline, prev_name_);
  if (who != prev) {
    throw ProtocolError(fmt::format(
        "{}: expected ring rank {} to connect but rank {} did; do all ranks use the same "
        "group?",
        where_, prev, who));
  }
}

void TcpRing::stream(const std::vector<RingStep>& steps, DataType dtype, ReduceOp op,
                     const CallInfo& call) {
  const size_t es = element_size(dtype);
  const size_t total = steps.size();
  const auto deadline = deadline_after(timeout_);
  size_t so = 0, xo = 0;            // out: step and bytes of it sent
  size_t si = 0, xi = 0, done = 0;  // in: step, bytes of it received, bytes of it complete
  // Out step s sends the block that in step s-1 completes (reduced, or received in place), so
  // it may send as far as that step got; out step 0 sends this rank's own data.
  auto sendable = [&]() -> size_t {
    if (so == 0 || so - 1 < si) return steps[so].out_len;
    return so - 1 == si ? done : 0;
  };
  for (;;) {
    while (so < total && xo == steps[so].out_len) ++so, xo = 0;
    while (si < total && done == steps[si].in_len) ++si, xi = done = 0;
    if (so == total && si == total) return;
    bool moved = false;
    const size_t limit = so < total ? sendable() : 0;
    if (xo < limit) {
      const ssize_t n =
          ::send(next_.fd(), steps[so].out + xo, limit - xo, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        xo += static_cast<size_t>(n);
        bytes_sent_ += static_cast<uint64_t>(n);
        moved = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw NetworkError(fmt::format("{} on {}: sending to {} failed: {}; the peer probably died",
                                       call.describe(), where_, next_name_, std::strerror(errno)));
      }
    }
    if (si < total) {
      const RingStep& step = steps[si];
      char* into = step.reduce ? tmp_.data() : step.in;
      const ssize_t n =
          ::recv(prev_.fd(), into + xi, std::min(step.in_len - xi, kRecvBytes), MSG_DONTWAIT);
      if (n > 0) {
        xi += static_cast<size_t>(n);
        moved = true;
        if (!step.reduce) {
          done = xi;
        } else {
          // Reduce whole elements in grains, and the rest once the step's block is complete.
          const size_t ready = xi / es * es;
          if (ready - done >= kReduceGrain || ready == step.in_len) {
            const void* srcs[2] = {step.in + done, tmp_.data() + done};
            reduce_buffers(dtype, op, step.in + done, srcs, 2, (ready - done) / es, 0);
            done = ready;
          }
        }
      } else if (n == 0) {
        throw NetworkError(fmt::format(
            "{} on {}: {} closed the connection in step {} of {} of the leaders' ring; the peer "
            "probably died",
            call.describe(), where_, prev_name_, si + 1, total));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw NetworkError(fmt::format("{} on {}: receiving from {} failed: {}", call.describe(),
                                       where_, prev_name_, std::strerror(errno)));
      }
    }
    if (moved) continue;
    pollfd fds[2];
    int nf = 0;
    if (xo < limit) fds[nf++] = {next_.fd(), POLLOUT, 0};
    if (si < total) fds[nf++] = {prev_.fd(), POLLIN, 0};
    const int rc = ::poll(fds, nf, net::millis_until(deadline));
    if (rc == 0) {
      throw TimeoutError(fmt::format(
          "{} on {}: timed out after {} ms in the leaders' ring (sending step {} of {} to {}, "
          "receiving step {} of {} from {}); a peer host is stuck or slow",
          call.describe(), where_, timeout_.count(), std::min(so + 1, total), total, next_name_,
          std::min(si + 1, total), total, prev_name_));
    }
    if (rc < 0 && errno != EINTR) {
      throw NetworkError(
          fmt::format("{} on {}: poll: {}", call.describe(), where_, std::strerror(errno)));
    }
  }
}

void TcpRing::all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                         const CallInfo& call) {
  if (size_ == 1 || count == 0) return;
  if (op == ReduceOp::kAvg) {
    throw UsageError(fmt::format("{} on {}: internal error: the leaders' ring does not average",
                                 call.describe(), where_));
  }
  // Half types travel as they are (the point of a compression hook is half the bytes on the
  // wire); each reduce-scatter step adds in float32 and rounds once to the wire type, so n
  // leaders round n-1 times, as Gloo's and NCCL's rings do.
  ring_all_reduce(static_cast<char*>(data), count, dtype, op, call);
}

void TcpRing::ring_all_reduce(char* d, size_t count, DataType dtype, ReduceOp op,
                              const CallInfo& call) {
  const size_t es = element_size(dtype);
  const int n = size_;
  auto start = [&](int block) { return count * static_cast<size_t>(block) / n; };
  auto bytes_of = [&](int block) { return (start(block + 1) - start(block)) * es; };
  auto at = [&](int block) { return d + start(block) * es; };
  auto mod = [&](int v) { return ((v % n) + n) % n; };
  tmp_.resize(bytes_of(n - 1) + es);  // the last block is the largest
  steps_.clear();
  // Reduce-scatter: at step s send block r-s, receive block r-s-1 and reduce it.
  for (int s = 0; s < n - 1; ++s) {
    const int out = mod(rank_ - s), in = mod(rank_ - s - 1);
    steps_.push_back({at(out), bytes_of(out), at(in), bytes_of(in), true});
  }
  // All-gather: at step s send block r+1-s (complete), receive block r-s in place.
  for (int s = 0; s < n - 1; ++s) {
    const int out = mod(rank_ + 1 - s), in = mod(rank_ - s);
    steps_.push_back({at(out), bytes_of(out), at(in), bytes_of(in), false});
  }
  stream(steps_, dtype, op, call);
}

}  // namespace ddp::detail
