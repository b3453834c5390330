#pragma once
// Ports for a test's servers that no outgoing connection can take first.
//
// A port found free by binding port 0 comes from Linux's ephemeral range (32768 and up by
// default), which is also where every process's outgoing connections get their local ports:
// between the test picking the port and the program under test binding it, a connection may
// take it, and the program then fails with "address already in use" (or, as a would-be store
// host, joins an absent store as a client). Ports below that range are handed out only on
// request, so a free one stays free.

#include <unistd.h>

#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::test {

// The first of `count` consecutive free TCP ports on 127.0.0.1 in 20000-32000, starting at an
// offset from the pid so concurrent tests rarely probe the same ports.
inline int free_ports_below_ephemeral_range(int count = 1) {
  for (int p = 20000 + ::getpid() % 10000 / count * count; p + count <= 32000; p += count) {
    try {
      for (int k = 0; k < count; ++k) net::listen_tcp("127.0.0.1", static_cast<uint16_t>(p + k), 1);
      return p;
    } catch (const NetworkError&) {
    }
  }
  throw NetworkError("no free run of TCP ports in 20000-32000 on 127.0.0.1");
}

}  // namespace ddp::test
