#include "ring_accept.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "ring_auth.hpp"

namespace ddp::detail {

namespace {

// A connection that has not completed its hello yet.
struct Pending {
  net::Socket socket;
  std::string peer;  // ip:port, for the log
  std::string received;
  net::Deadline accepted_at;
  net::Deadline hello_deadline;
};

}  // namespace

net::Socket accept_ring_peer(int listener_fd, const std::string& secret_hex, uint32_t from,
                             uint32_t to, net::Deadline deadline, const std::string& where,
                             RingRefusals& refusals) {
  std::deque<Pending> pending;  // oldest first
  auto refuse = [&](const Pending& p, const std::string& why) {
    ++refusals.count;
    refusals.last = fmt::format("{}: {}", p.peer, why);
    log::get("ddp.comm")
        ->warn("{}: refused a connection to the leaders' ring from {} (expected ring rank {}): {}",
               where, p.peer, from, why);
  };
  std::vector<pollfd> fds;
  for (;;) {
    const auto now = net::Clock::now();
    while (!pending.empty() && pending.front().hello_deadline <= now) {
      // Hello deadlines only grow along the deque (each is min(accept time + limit, deadline)).
      const Pending& p = pending.front();
      refuse(p,
             fmt::format(
                 "sent {} of the {} bytes of the ring hello in {} ms (limit {} ms, or the end "
                 "of the setup)",
                 p.received.size(), ring_auth::kHelloBytes,
                 std::chrono::duration_cast<std::chrono::milliseconds>(now - p.accepted_at).count(),
                 kHelloTimeout.count()));
      pending.pop_front();
    }
    if (now >= deadline) return {};

    fds.clear();
    fds.push_back({listener_fd, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    const auto wake =
        pending.empty() ? deadline : std::min(deadline, pending.front().hello_deadline);
    const int rc = ::poll(fds.data(), fds.size(), net::millis_until(wake));
    if (rc < 0 && errno != EINTR) {
      throw NetworkError(fmt::format("{}: poll on the ring port: {}", where, std::strerror(errno)));
    }
    if (rc <= 0) continue;

    // Read what the pending connections sent, at most the rest of their hello.
    std::vector<bool> done(pending.size(), false);
    for (size_t i = 0; i < pending.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      char buf[ring_auth::kHelloBytes];
      const ssize_t n =
          ::recv(p.socket.fd(), buf, ring_auth::kHelloBytes - p.received.size(), MSG_DONTWAIT);
      if (n > 0) {
        p.received.append(buf, static_cast<size_t>(n));
        if (p.received.size() < ring_auth::kHelloBytes) continue;
        const std::string why = ring_auth::check_hello(p.received, secret_hex, from, to);
        if (why.empty()) {
          net::Socket peer = std::move(p.socket);
          for (const Pending& other : pending) {
            if (other.socket.valid()) {
              refuse(other, fmt::format("had sent {} of the {} bytes of its hello when ring rank "
                                        "{} proved itself",
                                        other.received.size(), ring_auth::kHelloBytes, from));
            }
          }
          return peer;  // the others close as `pending` goes
        }
        refuse(p, why);
      } else if (n == 0) {
        refuse(p, fmt::format("closed the connection after {} of the {} bytes of the ring hello",
                              p.received.size(), ring_auth::kHelloBytes));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        continue;
      } else {
        refuse(p, fmt::format("receiving its hello failed: {}", std::strerror(errno)));
      }
      done[i] = true;
    }
    for (size_t i = pending.size(); i-- > 0;) {
      if (done[i]) pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }

    // Then take one new connection (a burst is drained over the next rounds of the loop).
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listener_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      // The peer may reset before we accept it (ECONNABORTED).
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
      throw NetworkError(fmt::format(
          "{}: accept on the ring port: {}{}", where, std::strerror(err),
          err == EMFILE || err == ENFILE ? " (out of file descriptors: raise `ulimit -n`)" : ""));
    }
    net::Socket socket(fd);
    if (pending.size() == kMaxPending) {
      refuse(pending.front(), fmt::format("more than {} connections were waiting to complete "
                                          "their hello; dropped the oldest",
                                          kMaxPending));
      pending.pop_front();
    }
    const std::string peer = net::peer_address(fd);
    const auto accepted_at = net::Clock::now();
    pending.push_back({std::move(socket),
                       peer,
                       {},
                       accepted_at,
                       std::min(accepted_at + kHelloTimeout, deadline)});
  }
}

}  // namespace ddp::detail
