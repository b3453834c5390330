#pragma once
// Which local IPv4 address peers on other hosts reach this rank at (internal header). Shared by
// the Gloo transport and the cpu backend's leaders' TCP ring, so both listen on the same
// interface: DDP_GLOO_IFNAME's address when set, else the address whose route reaches
// MASTER_ADDR, else 127.0.0.1 (one host). IPv4 only, as Gloo's TCP device.

#include <string>

namespace ddp::detail {

// The IPv4 address of interface `ifname`; NetworkError naming it when it has none.
std::string ipv4_of_interface(const std::string& ifname);

// The local address whose route reaches `host` (a UDP connect, which sends nothing);
// NetworkError when `host` does not resolve or has no route.
std::string ipv4_towards(const std::string& host);

}  // namespace ddp::detail
