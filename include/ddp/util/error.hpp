#pragma once
// The error hierarchy of ddp. Every failure the library reports is one of these, and its
// message names everything involved (rank, peer, host:port, key, elapsed and limit) and the
// likely fix. The library never prints and exits; callers (apps) decide how to report.

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

// A backend lacks an optional operation: "backend X does not support Y".
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

}  // namespace ddp
