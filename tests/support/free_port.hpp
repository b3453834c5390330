#pragma once
// free_port(): a loopback TCP port that was free a moment ago (bound to port 0, then closed),
// or -1 when none could be had. For tests that start servers in other processes.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ddp::test {

inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  return ok ? ntohs(a.sin_port) : -1;
}

}  // namespace ddp::test
