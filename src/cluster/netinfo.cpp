#include "ddp/cluster/netinfo.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::cluster {

namespace {

std::string numeric_address(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = "";
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

}  // namespace

std::vector<NetInterface> list_interfaces() {
  ifaddrs* head = nullptr;
  if (getifaddrs(&head) != 0) {
    throw NetworkError(fmt::format("getifaddrs failed: {}", std::strerror(errno)));
  }
  std::vector<NetInterface> out;
  for (ifaddrs* ifa = head; ifa != nullptr; ifa = ifa->ifa_next) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const NetInterface& i) { return i.name == ifa->ifa_name; });
    if (it == out.end()) {
      out.push_back(NetInterface{ifa->ifa_name, false, false, {}});
      it = out.end() - 1;
    }
    it->up = it->up || (ifa->ifa_flags & IFF_UP) != 0;
    it->loopback = it->loopback || (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    if (ifa->ifa_addr != nullptr &&
        (ifa->ifa_addr->sa_family == AF_INET || ifa->ifa_addr->sa_family == AF_INET6)) {
      it->addresses.push_back(numeric_address(ifa->ifa_addr));
    }
  }
  freeifaddrs(head);
  return out;
}

std::vector<std::string> resolve_host(const std::string& host, std::chrono::milliseconds timeout) {
  // The request lives on the heap: if it cannot be cancelled in time, glibc still owns it and
  // it must outlive this call (a deliberate, bounded leak per timed-out lookup).
  struct Request {
    gaicb cb{};
    addrinfo hints{};
    std::string name;
  };
  auto* req = new Request;
  req->name = host;
  req->hints.ai_family = AF_UNSPEC;
  req->hints.ai_socktype = SOCK_STREAM;
  req->cb.ar_name = req->name.c_str();
  req->cb.ar_request = &req->hints;
  gaicb* list[1] = {&req->cb};
  int rc = getaddrinfo_a(GAI_NOWAIT, list, 1, nullptr);
  if (rc != 0) {
    delete req;
    throw NetworkError(fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc)));
  }
  auto deadline = deadline_after(timeout);
  while ((rc = gai_error(&req->cb)) == EAI_INPROGRESS) {
    int left = net::millis_until(deadline);
    if (left <= 0) break;
    timespec ts{left / 1000, (left % 1000) * 1000000L};
    gai_suspend(list, 1, &ts);  // returns early on completion or a signal
  }
  if (rc == EAI_INPROGRESS) {
    if (gai_cancel(&req->cb) == EAI_CANCELED) delete req;
    throw TimeoutError(fmt::format(
        "resolving '{}' took longer than {} ms: the DNS server is slow or unreachable; use an "
        "IP address or fix /etc/resolv.conf",
        host, timeout.count()));
  }
  if (rc != 0) {
    delete req;
    throw NetworkError(fmt::format(
        "cannot resolve '{}' ({}): check the host name, /etc/hosts and DNS, or use an IP "
        "address",
        host, gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* ai = req->cb.ar_result; ai != nullptr; ai = ai->ai_next) {
    std::string text = numeric_address(ai->ai_addr);
    if (!text.empty() && std::find(out.begin(), out.end(), text) == out.end()) {
      out.push_back(text);
    }
  }
  freeaddrinfo(req->cb.ar_result);
  delete req;
  return out;
}

bool is_loopback_address(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

RouteInfo route_to(const std::string& address) {
  sockaddr_storage target{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&target);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&target);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(9);  // any port: connect() on UDP only selects a route
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(9);
    len = sizeof(sockaddr_in6);
  } else {
    throw UsageError(fmt::format("route_to needs a numeric address, got '{}'", address));
  }
  net::Socket sock(::socket(target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) {
    throw NetworkError(fmt::format("cannot open a UDP socket: {}", std::strerror(errno)));
  }
  if (::connect(sock.fd(), reinterpret_cast<sockaddr*>(&target), len) != 0) {
    throw NetworkError(fmt::format("no route to {}: {}; check the routing table (ip route)",
                                   address, std::strerror(errno)));
  }
  sockaddr_storage local{};
  socklen_t local_len = sizeof(local);
  if (getsockname(sock.fd(), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
    throw NetworkError(fmt::format("getsockname failed: {}", std::strerror(errno)));
  }
  RouteInfo info;
  info.local_address = numeric_address(reinterpret_cast<sockaddr*>(&local));
  for (const auto& itf : list_interfaces()) {
    if (std::find(itf.addresses.begin(), itf.addresses.end(), info.local_address) !=
        itf.addresses.end()) {
      info.interface = itf.name;
      break;
    }
  }
  return info;
}

}  // namespace ddp::cluster
