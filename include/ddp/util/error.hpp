#pragma once
// The error hierarchy of ddp. Every failure the library reports is one of these, and its
// message names everything involved (rank, peer, host:port, key, elapsed and limit) and the
// likely fix. The library never prints and exits; callers (apps) decide how to report.

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ddp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad flags, bad arguments, inconsistent options: the caller can fix it by changing input.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A blocking call ran past its limit.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A socket could not be opened, connected, read or written; a peer vanished.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// A peer sent bytes that do not follow the protocol (bad magic, version, size, field).
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The store refused or failed a request (authentication, server-side error).
class StoreError : public Error {
 public:
  using Error::Error;
};

// Ranks disagree on a collective (op, dtype, count, sequence) or a collective failed.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// A member of a process group was lost (its process died; ddprun --recovery step announced it
// through the store) while this rank ran or waited on a collective. The group is unusable
// afterwards: form the next generation (ddp::RecoverableGroup). lost_rank() is -1 when unknown;
// generation() is the membership generation that announced the loss.
class PeerLostError : public CollectiveError {
 public:
  PeerLostError(const std::string& what, int lost_rank, int64_t generation)
      : CollectiveError(what), lost_rank_(lost_rank), generation_(generation) {}
  int lost_rank() const { return lost_rank_; }
  int64_t generation() const { return generation_; }

 private:
  int lost_rank_;
  int64_t generation_;
};

// A backend lacks an optional operation: "backend X does not support Y".
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddp
