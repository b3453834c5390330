// TcpStore's connection: choosing the endpoint (the store, or the standby that was promoted),
// connecting with retries, the hello/auth handshake, and the errors a server's refusal becomes.
#include "ddp/store/tcp_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/store/auth.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "elapsed.hpp"

namespace ddp {

namespace {

using Ms = std::chrono::milliseconds;

constexpr Ms kFirstBackoff{10};
constexpr Ms kMaxBackoff{1000};
// With standbys: how long one connection attempt to one endpoint may take before the next
// endpoint is tried (a store host that vanished answers nothing).
constexpr Ms kFailoverAttempt{1000};
// With standbys: a connection whose host stops acknowledging at the TCP level (cut off, not
// merely slow) fails within this (net::detect_dead_peer), so the call goes on with a standby
// instead of waiting out its limit.
constexpr Ms kDeadPeerLimit{3000};

// A standby not promoted refused this client at hello: another endpoint (or this one, later)
// may serve. Kept apart so that a timeout's message names it rather than a later attempt's.
class StandbyRefusal : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

}  // namespace

void TcpStore::connect_locked(net::Deadline deadline) {
  if (endpoints_.size() <= 1) {
    connect_one_locked(deadline);
    return;
  }
  // One attempt per endpoint and round, starting with the one that served last: the primary
  // while it lives, else the standby that was promoted (the others refuse clients).
  const auto start = net::Clock::now();
  Ms backoff = kFirstBackoff;
  std::vector<std::string> errors(endpoints_.size());
  for (;;) {
    for (size_t k = 0; k < endpoints_.size(); ++k) {
      const size_t i = (current_endpoint_ + k) % endpoints_.size();
      options_.host = endpoints_[i].first;
      options_.port = endpoints_[i].second;
      try {
        sock_ = net::connect_tcp(options_.host, options_.port,
                                 std::min(deadline, deadline_after(kFailoverAttempt)));
        net::detect_dead_peer(sock_.fd(), kDeadPeerLimit);
        handshake_locked(std::min(deadline, deadline_after(kFailoverAttempt)));
        current_endpoint_ = i;
        return;
      } catch (const NetworkError& e) {
        errors[i] = e.what();
      } catch (const TimeoutError& e) {
        errors[i] = e.what();
      }
      sock_.close();
      if (net::Clock::now() >= deadline) break;
    }
    const auto now = net::Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<net::Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  std::string tried;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    tried +=
        fmt::format("; {}: {}", net::format_endpoint(endpoints_[i].first, endpoints_[i].second),
                    errors[i].empty() ? "not tried" : errors[i]);
  }
  throw TimeoutError(fmt::format(
      "store: neither the store nor one of its standbys served clients within {} ms{}. The "
      "store's host is gone and no standby was promoted (the agent that saw the loss promotes "
      "one), or every one is gone",
      elapsed_since(start).count(), tried));
}

void TcpStore::connect_one_locked(net::Deadline deadline) {
  auto start = net::Clock::now();
  // Attempts that never reach the server are retried until retry_until; one that connected
  // may spend until `deadline` waiting for the hello reply.
  const net::Deadline retry_until =
      options_.connect_retry ? std::min(deadline, deadline_after(*options_.connect_retry, start))
                             : deadline;
  Ms backoff = kFirstBackoff;
  std::string last_error;
  std::string refused_as_standby;
  for (;;) {
    try {
      sock_ = net::connect_tcp(options_.host, options_.port, retry_until);
      handshake_locked(deadline);
      return;
    } catch (const StandbyRefusal& e) {
      sock_.close();
      refused_as_standby = last_error = e.what();
    } catch (const NetworkError& e) {
      // Refused, reset, unresolvable: the server may not be up yet; retry until the deadline.
      sock_.close();
      last_error = e.what();
    } catch (const TimeoutError& e) {
      sock_.close();
      last_error = e.what();
    } catch (...) {
      // Refused auth, a server that cannot prove the token, a protocol error: never keep a
      // connection whose handshake did not complete.
      sock_.close();
      throw;
    }
    auto now = net::Clock::now();
    if (now >= retry_until) break;
    std::this_thread::sleep_for(std::min<net::Clock::duration>(backoff, retry_until - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  const std::string limits =
      options_.connect_retry
          ? fmt::format("limit {} ms, of which at most {} ms retrying refused connections",
                        options_.timeout.count(),
                        std::min(*options_.connect_retry, options_.timeout).count())
          : fmt::format("limit {} ms", options_.timeout.count());
  throw TimeoutError(fmt::format(
      "store at {}: could not connect within {} ms ({}); last error: {}. Check that the store "
      "server is running and that host and port (MASTER_ADDR/MASTER_PORT) point at it",
      endpoint(), elapsed_since(start).count(), limits,
      refused_as_standby.empty() || refused_as_standby == last_error
          ? last_error
          : last_error + " (before that: " + refused_as_standby + ")"));
}

void TcpStore::handshake_locked(net::Deadline deadline) {
  Frame hello;
  hello.op = Op::kHello;
  hello.fields = {client_id_.empty() ? options_.role : options_.role + " id=" + client_id_};
  // With a token we also authenticate the server: it must answer our nonce with its proof.
  std::string client_nonce;
  if (!token_.empty()) {
    client_nonce = store_auth::make_nonce();
    hello.fields.push_back(client_nonce);
  }
  Frame reply = exchange_locked(hello, deadline);
  if (reply.op == Op::kOk) {
    if (token_.empty()) return;  // neither side uses auth
    sock_.close();
    throw StoreError(fmt::format(
        "store at {} answered without authentication although this client holds an auth "
        "token; refusing to use it. Another process (not the job's store) may have taken port "
        "{} first, or the store server was started without the token: give the server the "
        "same token (TcpStoreOptions::token or the {} environment variable), or find what "
        "listens on the port (ss -ltnp 'sport = :{}')",
        endpoint(), options_.port, store_auth::kTokenEnvVar, options_.port));
  }
  if (reply.op == Op::kError) throw_reply_error(reply, Op::kHello);
  if (reply.op != Op::kChallenge || reply.fields.empty() || reply.fields.size() > 2) {
    throw ProtocolError(fmt::format("store at {}: unexpected {} reply to hello", endpoint(),
                                    store_protocol::op_name(reply.op)));
  }
  if (!token_.empty()) {
    bool proven =
        reply.fields.size() == 2 &&
        store_auth::proofs_equal(store_auth::server_proof(token_, client_nonce, reply.fields[0]),
                                 reply.fields[1]);
    if (!proven) {
      sock_.close();
      throw StoreError(fmt::format(
          "store at {} could not prove it knows this client's auth token ({}); refusing to "
          "use it. Either the server has another token (token mismatch: pass the same token "
          "as the server, TcpStoreOptions::token or the {} environment variable), or another "
          "process that is not the job's store took port {}",
          endpoint(), reply.fields.size() == 2 ? "its proof does not match" : "it sent no proof",
          store_auth::kTokenEnvVar, options_.port));
    }
  }
  Frame auth;
  auth.op = Op::kAuth;
  // An empty answer tells the server we have no token, so it can log the refusal.
  auth.fields = {token_.empty() ? std::string() : store_auth::proof(token_, reply.fields[0])};
  reply = exchange_locked(auth, deadline);
  if (reply.op == Op::kOk) return;
  if (reply.op == Op::kError) throw_reply_error(reply, Op::kAuth);
  throw ProtocolError(fmt::format("store at {}: unexpected {} reply to auth", endpoint(),
                                  store_protocol::op_name(reply.op)));
}

void TcpStore::throw_reply_error(const Frame& reply, Op op) {
  std::string kind = reply.fields.size() == 2 ? reply.fields[0] : store_protocol::kErrorProtocol;
  std::string message = reply.fields.size() == 2 ? reply.fields[1] : "malformed error reply";
  if (kind == store_protocol::kErrorAuth) {
    sock_.close();
    std::string what = token_.empty()
                           ? fmt::format(
                                 "store at {} requires an auth token and this client has "
                                 "none",
                                 endpoint())
                           : fmt::format(
                                 "store at {} rejected this client's auth token (token "
                                 "mismatch)",
                                 endpoint());
    throw StoreError(fmt::format(
        "{}; pass the same token as the server (TcpStoreOptions::token or the {} environment "
        "variable). Server said: {}",
        what, store_auth::kTokenEnvVar, message));
  }
  if (kind == store_protocol::kErrorStandby) {
    sock_.close();  // a standby not promoted: another endpoint may serve (connect_locked)
    throw StandbyRefusal(fmt::format("store at {} is a standby: {}", endpoint(), message));
  }
  if (kind == store_protocol::kErrorUsage) {
    throw UsageError(
        fmt::format("store at {}: {}: {}", endpoint(), store_protocol::op_name(op), message));
  }
  if (kind == store_protocol::kErrorStore) {
    throw StoreError(fmt::format("store at {}: {}", endpoint(), message));
  }
  sock_.close();  // the server closes the connection after a protocol error
  throw ProtocolError(
      fmt::format("store at {} rejected {}: {}", endpoint(), store_protocol::op_name(op), message));
}

void TcpStore::skip_silent_endpoint_locked() {
  // A host that answered nothing may be gone without a reset (a cut link): the next connection
  // tries the next endpoint first. A live primary loses nothing: standbys refuse at once.
  if (endpoints_.size() > 1) current_endpoint_ = (current_endpoint_ + 1) % endpoints_.size();
}

}  // namespace ddp
