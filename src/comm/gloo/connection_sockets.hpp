#pragma once
// GlooConnectionSockets: the sockets of one Gloo context's connections, so that they can be
// shut down from outside Gloo (internal header).
//
// Gloo has no abort: a call in flight waits for its peers until the call's timeout, and
// Pair::close() from another thread does not wake it (close takes the socket off Gloo's event
// loop, so no error ever reaches the waiting buffers). shutdown(2) on the connection's socket
// does: this process's Gloo thread reads end-of-file and fails every wait on that connection
// ("Connection closed by peer"), and so does the peer's. Gloo does not hand out its sockets, so
// they are found among this process's descriptors by their addresses: a connection's socket is
// the one bound to this rank's listening address for the pair (this rank accepted) or the one
// connected to the peer's listening address for it (this rank connected), the addresses
// connectFullMesh exchanged through the store. Each is remembered with its local and peer
// address, which no other connection can share while it is open.

#include <sys/socket.h>

#include <vector>

namespace gloo {
class Context;
}

namespace ddp::detail {

class GlooConnectionSockets {
 public:
  GlooConnectionSockets() = default;

  // After `context` connected its full mesh. `published[r]`: what rank r stored in the
  // rendezvous (its pairs' listening addresses, gloo::transport::tcp::Address bytes, in rank
  // order without r); empty for this rank. A connection whose socket is not found (a transport
  // other than TCP, or the exchange's layout changed) is left out: ending it waits for Gloo.
  static GlooConnectionSockets find(gloo::Context& context, int rank, int size,
                                    const std::vector<std::vector<char>>& published);

  size_t count() const { return sockets_.size(); }

  // Shuts each connection still open down in both directions. Thread-safe; never throws. A
  // descriptor that Gloo closed meanwhile, even if its number now names another socket, is
  // left alone (the socket's addresses are checked on a duplicate of the descriptor).
  void shut_down_all() const noexcept;

 private:
  struct Socket {
    int fd;
    sockaddr_storage local;
    sockaddr_storage peer;
  };
  std::vector<Socket> sockets_;
};

}  // namespace ddp::detail
