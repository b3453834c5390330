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
#include "ring_accept.hpp"
#include "ring_auth.hpp"

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
                 const std::string& host, const AbortSignal* abort)
    : rank_(rank),
      size_(size),
      abort_(abort),
      timeout_(timeout),
      group_ranks_(std::move(group_ranks)),
      where_(std::move(where)) {
  if (size_ == 1) return;
  const auto deadline = deadline_after(timeout_);
  // Room in the accept queue for strays beside the predecessor (ring_accept.hpp).
  net::Socket listener = net::listen_tcp(host, 0, static_cast<int>(kMaxPending));
  const uint16_t port = net::local_port(listener.fd());
  // The secret before the address: a predecessor that sees the address finds the secret too.
  const std::string secret = ring_auth::make_secret_hex();
  const std::string secret_key = fmt::format("{}secret/{}", prefix, rank_);
  store.set(secret_key, secret);
  store.set(fmt::format("{}addr/{}", prefix, rank_), fmt::format("{} {}", host, port));

  const int next = (rank_ + 1) % size_;
  const int prev = (rank_ + size_ - 1) % size_;
  const std::string next_key = fmt::format("{}addr/{}", prefix, next);
  const std::string next_secret_key = fmt::format("{}secret/{}", prefix, next);
  store.wait({next_key, next_secret_key}, timeout_);
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
  const std::string hello = ring_auth::hello(
      store.get(next_secret_key), static_cast<uint32_t>(rank_), static_cast<uint32_t>(next));
  next_ = net::connect_tcp(next_host, next_port, deadline);
  net::write_all(next_.fd(), hello.data(), hello.size(), deadline, next_name_);

  // Accept the previous rank (it connects to us the same way), refusing every connection that
  // cannot prove it is that rank.
  RingRefusals refusals;
  prev_ = accept_ring_peer(listener.fd(), secret, static_cast<uint32_t>(prev),
                           static_cast<uint32_t>(rank_), deadline, where_, refusals);
  if (!prev_.valid()) {
    throw TimeoutError(fmt::format(
        "{}: rank {} did not connect to this rank's ring port {} within {} ms (is it alive, "
        "and can it reach {}?){}",
        where_, group_ranks_[prev], port, timeout_.count(), host,
        refusals.count == 0
            ? std::string()
            : fmt::format("; refused {} other connection(s) to that port, the last from {}",
                          refusals.count, refusals.last)));
  }
  // Nobody else needs the secret once the predecessor proved it has it.
  store.delete_key(secret_key);
  net::set_nodelay(prev_.fd());
  prev_name_ = fmt::format("rank {} at {}", group_ranks_[prev], net::peer_address(prev_.fd()));
}

template <typename OnRecv>
void TcpRing::exchange(const char* out, size_t out_len, char* in, size_t in_len,
                       const CallInfo& call, OnRecv&& on_recv) {
  const auto deadline = deadline_after(timeout_);
  size_t sent = 0, got = 0;
  while (sent < out_len || got < in_len) {
    // Optimistic non-blocking calls first; poll only when neither side could move.
    bool moved = false;
    if (sent < out_len) {
      const ssize_t n = ::send(next_.fd(), out + sent, out_len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        bytes_sent_ += static_cast<uint64_t>(n);
        moved = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw NetworkError(fmt::format("{} on {}: sending to {} failed: {}; the peer probably died",
                                       call.describe(), where_, next_name_, std::strerror(errno)));
      }
    }
    if (got < in_len) {
      const ssize_t n =
          ::recv(prev_.fd(), in + got, std::min(in_len - got, kRecvBytes), MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<size_t>(n);
        moved = true;
        on_recv(got);
      } else if (n == 0) {
        throw NetworkError(fmt::format(
            "{} on {}: {} closed the connection after {} of {} bytes; the peer probably died",
            call.describe(), where_, prev_name_, got, in_len));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        throw NetworkError(fmt::format("{} on {}: receiving from {} failed: {}", call.describe(),
                                       where_, prev_name_, std::strerror(errno)));
      }
    }
    if (moved) continue;
    pollfd fds[2];
    int nf = 0;
    if (sent < out_len) fds[nf++] = {next_.fd(), POLLOUT, 0};
    if (got < in_len) fds[nf++] = {prev_.fd(), POLLIN, 0};
    const int left = net::millis_until(deadline);
    const int slice = abort_ ? std::min(left, static_cast<int>(kAbortPoll.count())) : left;
    const int rc = ::poll(fds, nf, slice);
    if (rc == 0 && abort_ && abort_->raised()) abort_->rethrow();
    if (rc == 0 && slice < left) continue;
    if (rc == 0) {
      throw TimeoutError(fmt::format(
          "{} on {}: timed out after {} ms in the leaders' ring ({} of {} bytes sent to {}, {} "
          "of {} received from {}); a peer host is stuck or slow",
          call.describe(), where_, timeout_.count(), sent, out_len, next_name_, got, in_len,
          prev_name_));
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
  // Reduce-scatter: at step s send block r-s, receive block r-s-1 and reduce it as it arrives.
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = mod(rank_ - s), recv_block = mod(rank_ - s - 1);
    char* dst = at(recv_block);
    const size_t in_len = bytes_of(recv_block);
    size_t reduced = 0;
    exchange(at(send_block), bytes_of(send_block), tmp_.data(), in_len, call, [&](size_t got) {
      const size_t ready = got / es * es;
      if (ready - reduced < kReduceGrain && ready != in_len) return;
      const void* srcs[2] = {dst + reduced, tmp_.data() + reduced};
      reduce_buffers(dtype, op, dst + reduced, srcs, 2, (ready - reduced) / es, 0);
      reduced = ready;
    });
  }
  // All-gather: at step s send block r+1-s (complete), receive block r-s in place.
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = mod(rank_ + 1 - s), recv_block = mod(rank_ - s);
    exchange(at(send_block), bytes_of(send_block), at(recv_block), bytes_of(recv_block), call,
             [](size_t) {});
  }
}

}  // namespace ddp::detail
