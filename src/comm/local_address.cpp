#include "local_address.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddp/util/error.hpp"

namespace ddp::detail {

std::string ipv4_of_interface(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw NetworkError(fmt::format("cannot list network interfaces for DDP_GLOO_IFNAME={}: {}",
                                   ifname, std::strerror(errno)));
  }
  std::string found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || ifname != a->ifa_name) {
      continue;
    }
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof(buf));
    found = buf;
    break;
  }
  ::freeifaddrs(list);
  if (found.empty()) {
    throw NetworkError(fmt::format(
        "DDP_GLOO_IFNAME={}: no interface of that name with an IPv4 address; set it to the "
        "interface that reaches the other hosts (see `ip addr`)",
        ifname));
  }
  return found;
}

std::string ipv4_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) {
    throw NetworkError(fmt::format(
        "cannot resolve MASTER_ADDR={} to choose the local address; set DDP_GLOO_IFNAME to an "
        "interface name instead",
        host));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (!ok) {
    throw NetworkError(fmt::format(
        "no route to MASTER_ADDR={}; set DDP_GLOO_IFNAME to the interface that reaches the "
        "other hosts",
        host));
  }
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
  return buf;
}

}  // namespace ddp::detail
