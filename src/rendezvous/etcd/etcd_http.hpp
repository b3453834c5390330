#pragma once
// The HTTP side of ddp's etcd client: JSON requests to etcd's v3 gateway over libcurl, with
// TLS, a bound on every request, and failover between the members of an etcd cluster.
// Internal to src/rendezvous/etcd.
//
// Contract of call() and watch():
//   - A member that cannot be reached (refused, unresolvable, connect timed out, connection
//     dropped mid-request) or that answers "unavailable" (no leader, leader changed, stopping)
//     is left for the next member of the list; passes over the list repeat with a short
//     backoff for `retry_for` (connect_timeout) from the first such failure, then a
//     NetworkError names every member and its last error, and the fix.
//   - A member that answers "etcdserver: too many requests" (etcd's back-pressure: its apply
//     loop is far behind its commits; it refuses before proposing, so nothing was applied) or
//     with etcd's own request timeout ("request timed out", "context deadline exceeded": alive,
//     but raft committed nothing in time) makes the whole call a slow cluster's: from then on it
//     is retried the same way, any request, but for read_timeout and with pauses growing to 2 s,
//     spread at random, whatever the later answers; then a StoreError (too many requests) or a
//     NetworkError (only etcd's timeouts: overloaded, or without quorum) says so.
//   - A member that accepted an idempotent request (a read, a lease renewal, a watch) but did
//     not answer within its timeout is left for the next member too: it may be stopped
//     (SIGSTOP), swapping or cut off without a reset, and only another member can answer.
//     TCP keepalive is on, so a connection whose peer vanished breaks instead of hanging.
//   - Everything else is final at once, with one message naming the cause and the fix: a TLS
//     failure (StoreError: etcd's certificate not verified by cacert, this node's certificate
//     refused, TLS against plain HTTP or the reverse, unreadable TLS files), a reply that is
//     not etcd's JSON API (ProtocolError), etcd refusing the request (StoreError; a lost lease
//     is LeaseNotFoundError), a member that accepted a request that is not idempotent (a write)
//     but did not answer within read_timeout (TimeoutError: etcd may have applied it).
// A request is therefore sent again after a failure that may have happened after etcd applied
// it: callers make their requests idempotent (EtcdStore's add() does so with a marker key).
// Not thread-safe: one object per thread (it owns its curl handles and connections).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/store/wait_interrupter.hpp"
#include "ddp/util/error.hpp"
#include "etcd_json.hpp"

namespace ddp::rdzv::etcd {

// etcd refused a request naming a lease it no longer has (the lease expired).
class LeaseNotFoundError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct HttpOptions {
  std::vector<Endpoint> endpoints;
  bool https = false;
  std::optional<std::string> cacert;
  std::optional<std::string> cert;
  std::optional<std::string> key;
  // How long unreachable or leaderless members are retried before giving up.
  Millis retry_for{5000};
  // Bound of one request (connecting included); a watch is bounded by its own limit.
  Millis read_timeout{60000};
  // The local address connections leave from (nullopt: the kernel's choice).
  std::optional<std::string> local_address;
};

// "http://host:port" or "https://[v6]:port".
std::string base_url(const Endpoint& endpoint, bool https);

// What one attempt at a member ended with, for classify().
struct Attempt {
  int curl_code = 0;       // CURLcode
  std::string curl_error;  // curl's error buffer (or curl_easy_strerror)
  long http_status = 0;
  std::string body;
  bool connected = false;    // the TCP (and TLS) connection was established
  bool interrupted = false;  // a watch's WaitInterrupter ended it (no failure)
};

// How an attempt failed: retry on another member, or final (the exception to throw).
struct Failure {
  bool retry = false;
  std::string reason;              // for the retry summary: "connection refused"
  std::exception_ptr final_error;  // set when !retry
};
// Pure: the classification described in the contract above. `member` is "host:port",
// `request` "POST /v3/kv/put"; `idempotent`: the request may be sent again to another member
// after it timed out there. Not called for an HTTP 200 of a completed request.
Failure classify(const Attempt& attempt, const std::string& member, const std::string& request,
                 const HttpOptions& options, bool idempotent = false);

// How one call() is sent.
struct CallOptions {
  // Sending it twice does no harm (a read, a lease renewal): a member that accepted it and
  // did not answer in time is left for the next one. Reads (/v3/kv/range) always are.
  bool idempotent = false;
  // Bound of one attempt at a member; nullopt: HttpOptions::read_timeout.
  std::optional<Millis> timeout;
};

class EtcdHttp {
 public:
  explicit EtcdHttp(HttpOptions options);
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  // POSTs body to path (e.g. "/v3/kv/range") and returns etcd's JSON reply.
  Json call(const std::string& path, const Json& body, const CallOptions& how = {});

  // Opens a watch (body: watch_create) and passes each message to on_message until it
  // returns true (then true) or `limit` passes (then false). A stream that breaks is opened
  // again on the next member with the same body, so the watch must name its start revision.
  // A stream that stays silent ends at `limit` like an unset key: callers keep `limit` short
  // (EtcdStore: watch_attempt) and read again, so a member that died silently is found.
  // With an `interrupter`, the watch also ends (kInterrupted) as soon as it is interrupted:
  // the stream is then driven by a curl multi handle that interrupt() wakes.
  enum class WatchEnd { kMessage, kLimit, kInterrupted };
  WatchEnd watch(const Json& body, Millis limit,
                 const std::function<bool(const WatchMessage&)>& on_message,
                 WaitInterrupter* interrupter = nullptr);

  // "host:port, host:port" of every member, for messages.
  std::string members() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::rdzv::etcd
