#pragma once
// Ports for a test's servers that no outgoing connection can take first.
//
// A port found free by binding port 0 comes from Linux's ephemeral range (32768 and up by
// default), which is also where every process's outgoing connections get their local ports:
// between the test picking the port and the program under test binding it, a connection may
// take it, and the program then fails with "address already in use" (or, as a would-be store
// host, joins an absent store as a client). Ports below that range are handed out only on
// request, so a free one stays free.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::test {

// Claims port `p` among this machine's test processes: an exclusive lock on
// /tmp/ddp-test-ports/<p>.lock, held (its descriptor left open on purpose) until this process
// exits. Two test processes probing at once both found the same port free before either's
// program bound it (adjacent pids started at the same port) and one program then joined the
// other's server: a claimed port is never handed to a second test process.
inline bool claim_port_for_this_process(int p) {
  ::mkdir("/tmp/ddp-test-ports", 01777);
  const std::string path = "/tmp/ddp-test-ports/" + std::to_string(p) + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return true;  // no lock to be had: the bind probe alone decides
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  return true;  // fd stays open: the claim lasts as long as this process
}

// The first of `count` consecutive free TCP ports on 127.0.0.1 in 20000-32000, claimed for
// this process (above), starting at an offset from the pid so concurrent tests rarely probe
// the same ports.
inline int free_ports_below_ephemeral_range(int count = 1) {
  for (int p = 20000 + ::getpid() % 10000 / count * count; p + count <= 32000; p += count) {
    bool claimed = true;
    for (int k = 0; k < count && claimed; ++k) claimed = claim_port_for_this_process(p + k);
    if (!claimed) continue;
    try {
      for (int k = 0; k < count; ++k) net::listen_tcp("127.0.0.1", static_cast<uint16_t>(p + k), 1);
      return p;
    } catch (const NetworkError&) {
    }
  }
  throw NetworkError("no free run of TCP ports in 20000-32000 on 127.0.0.1");
}

}  // namespace ddp::test
