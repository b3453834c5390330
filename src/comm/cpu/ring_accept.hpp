#pragma once
// accept_ring_peer: the accepting half of the leaders' ring setup (internal header).
//
// A leader's ring port is reachable by anything on the network, so the first connection to
// arrive is not necessarily its predecessor. This keeps accepting until one connection sends
// a valid hello (ring_auth.hpp) and refuses every other one: each is logged with its peer
// address and the reason (warn, logger "ddp.comm") and closed. Hellos are read from all
// pending connections at once in one poll loop, never from one at a time, so a stray that
// connects and stays silent costs a slot, not the setup's time; a pending connection gets
// kHelloTimeout to complete its hello, and at most kMaxPending wait at once (a new one evicts
// the oldest).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/util/socket.hpp"

namespace ddp::detail {

// The predecessor sends its hello right after connecting, so it arrives about one round trip
// after the connection; the limit is generous because it only bounds how long a silent stray
// holds a slot and a descriptor, while refusing a slow predecessor would break the ring.
inline constexpr std::chrono::milliseconds kHelloTimeout{10000};
inline constexpr size_t kMaxPending = 16;

// What a caller needs to know about the connections it did not get, for its timeout message.
struct RingRefusals {
  int count = 0;
  std::string last;  // "ADDRESS: reason" of the latest refusal
};

// The first connection on the listening socket `listener_fd` (non-blocking) whose hello
// proves it is ring rank `from` connecting to ring rank `to` under `secret_hex`; the hello's
// bytes are consumed, nothing after them. Returns an invalid Socket when `deadline` passes
// first; refusals are counted in `refusals`. `where` prefixes the log lines. Throws
// NetworkError only when the listening socket itself fails.
net::Socket accept_ring_peer(int listener_fd, const std::string& secret_hex, uint32_t from,
                             uint32_t to, net::Deadline deadline, const std::string& where,
                             RingRefusals& refusals);

}  // namespace ddp::detail
