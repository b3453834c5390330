#pragma once
// What this machine's network looks like from the inside: its interfaces, how a host name
// resolves (with a time limit), and which local address and interface the kernel would use
// to reach a given address. Used by the doctor; usable by the launcher to explain choices.

#include <chrono>
#include <string>
#include <vector>

namespace ddp::cluster {

struct NetInterface {
  std::string name;
  bool up = false;
  bool loopback = false;
  std::vector<std::string> addresses;  // numeric IPv4 and IPv6 addresses
};

// Every interface (getifaddrs), in the kernel's order, addresses merged per name.
std::vector<NetInterface> list_interfaces();

// The numeric addresses `host` resolves to, in getaddrinfo's order, duplicates removed.
// Bounded by `timeout` (asynchronous getaddrinfo_a): TimeoutError past it, NetworkError
// naming the host and resolver message when it does not resolve.
std::vector<std::string> resolve_host(const std::string& host, std::chrono::milliseconds timeout);

// Whether a numeric address is a loopback address (127.0.0.0/8, ::1).
bool is_loopback_address(const std::string& address);

struct RouteInfo {
  std::string local_address;  // the source address the kernel picks
  std::string interface;      // the interface holding that address ("" if none matches)
};

// The kernel's route choice for `address` (numeric): connects a UDP socket, which sends
// nothing, and reads its local address. NetworkError when there is no route.
RouteInfo route_to(const std::string& address);

}  // namespace ddp::cluster
