#include "connection_sockets.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

namespace ddp::detail {

namespace {

// Same IP address and port (IPv4 or IPv6).
bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

// A connected IP socket's local and peer addresses; nullopt for anything else.
std::optional<std::pair<sockaddr_storage, sockaddr_storage>> endpoints(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return std::nullopt;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return std::nullopt;
  len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return std::nullopt;
  return std::make_pair(local, peer);
}

// How one connection's socket is recognised (connection_sockets.hpp).
struct Wanted {
  sockaddr_storage own_listening;   // this rank's listening address for the pair
  sockaddr_storage peer_listening;  // the peer's listening address for it
};

std::optional<sockaddr_storage> tcp_sockaddr(const gloo::transport::Address& address) {
  const auto* tcp = dynamic_cast<const gloo::transport::tcp::Address*>(&address);
  if (tcp == nullptr) return std::nullopt;
  return tcp->getSockaddr();
}

// Rank `peer`'s listening address for its pair with `rank`, from what `peer` published.
std::optional<sockaddr_storage> published_address(const std::vector<char>& bytes, int rank,
                                                  int peer, int size) {
  const size_t entries = static_cast<size_t>(size - 1);
  if (bytes.empty() || bytes.size() % entries != 0) return std::nullopt;
  const size_t width = bytes.size() / entries;
  const size_t slot = static_cast<size_t>(rank < peer ? rank : rank - 1);
  const std::vector<char> mine(bytes.begin() + slot * width, bytes.begin() + (slot + 1) * width);
  try {
    return gloo::transport::tcp::Address(mine).getSockaddr();
  } catch (const std::exception&) {
    return std::nullopt;  // not a TCP address of this Gloo's layout
  }
}

}  // namespace

GlooConnectionSockets GlooConnectionSockets::find(gloo::Context& context, int rank, int size,
                                                  const std::vector<std::vector<char>>& published) {
  std::vector<Wanted> wanted;
  for (int r = 0; r < size; ++r) {
    if (r == rank || r >= static_cast<int>(published.size())) continue;
    auto& pair = context.getPair(r);
    if (!pair) continue;
    const auto own = tcp_sockaddr(pair->address());
    const auto theirs = published_address(published[r], rank, r, size);
    if (own && theirs) wanted.push_back({*own, *theirs});
  }
  GlooConnectionSockets found;
  if (wanted.empty()) return found;
  // Each connection's candidates; one found twice is ambiguous and left out.
  std::vector<std::vector<Socket>> candidates(wanted.size());
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return found;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    const auto ends = endpoints(static_cast<int>(fd));
    if (!ends) continue;
    for (size_t i = 0; i < wanted.size(); ++i) {
      if (same_endpoint(ends->first, wanted[i].own_listening) ||
          same_endpoint(ends->second, wanted[i].peer_listening)) {
        candidates[i].push_back({static_cast<int>(fd), ends->first, ends->second});
      }
    }
  }
  ::closedir(dir);
  for (const auto& c : candidates) {
    if (c.size() == 1) found.sockets_.push_back(c.front());
  }
  return found;
}

void GlooConnectionSockets::shut_down_all() const noexcept {
  for (const Socket& s : sockets_) {
    // The duplicate pins the socket the number names now; it is shut down only if it is still
    // the connection found (Gloo may have closed it, and the number may name another socket).
    const int dup = ::fcntl(s.fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) continue;
    const auto ends = endpoints(dup);
    if (ends && same_endpoint(ends->first, s.local) && same_endpoint(ends->second, s.peer)) {
      ::shutdown(dup, SHUT_RDWR);
    }
    ::close(dup);
  }
}

}  // namespace ddp::detail
