// How a failed attempt at an etcd member is classified (classify, etcd_http.hpp) and the error
// a call gives up with (give_up, etcd_failure.hpp).
#include "etcd_failure.hpp"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>

#include "ddp/util/socket.hpp"

namespace ddp::rdzv::etcd {

namespace {

using Clock = std::chrono::steady_clock;
// Part of the reason of a "context deadline exceeded" answer (etcd's own request timeout).
const std::string kEtcdTimeoutRanOut = "etcdserver: its request timeout ran out";

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

std::string tls_files(const HttpOptions& o) {
  std::vector<std::string> parts;
  if (o.cacert) parts.push_back("cacert=" + *o.cacert);
  if (o.cert) parts.push_back("cert=" + *o.cert);
  if (o.key) parts.push_back("key=" + *o.key);
  return parts.empty() ? std::string("no TLS files given")
                       : fmt::format("{}", fmt::join(parts, ", "));
}

template <class E>
Failure final_failure(const std::string& message) {
  Failure f;
  f.final_error = std::make_exception_ptr(E(message));
  return f;
}

Failure retry_failure(std::string reason) {
  Failure f;
  f.retry = true;
  f.reason = std::move(reason);
  return f;
}

// TLS failures, by what curl (OpenSSL) says; nullopt when the attempt is not one.
std::optional<Failure> tls_failure(const Attempt& a, const std::string& member,
                                   const HttpOptions& o) {
  const std::string& e = a.curl_error;
  const bool ssl_code =
      a.curl_code == CURLE_SSL_CONNECT_ERROR || a.curl_code == CURLE_PEER_FAILED_VERIFICATION ||
      a.curl_code == CURLE_SSL_CERTPROBLEM || a.curl_code == CURLE_SSL_CACERT_BADFILE ||
      a.curl_code == CURLE_SSL_CIPHER || a.curl_code == CURLE_SSL_ENGINE_NOTFOUND;
  const bool alert = contains(e, "alert");
  if (!ssl_code &&
      !(alert && (a.curl_code == CURLE_RECV_ERROR || a.curl_code == CURLE_SEND_ERROR))) {
    return std::nullopt;
  }
  if (contains(e, "wrong version number") || contains(e, "packet length too long") ||
      contains(e, "record layer failure")) {
    return final_failure<StoreError>(fmt::format(
        "etcd at {} does not speak TLS ({}): this node uses protocol=https; use "
        "--rdzv-conf protocol=http, or give etcd's https client URL (etcd --cert-file/--key-file)",
        member, e));
  }
  if (a.curl_code == CURLE_PEER_FAILED_VERIFICATION) {
    return final_failure<StoreError>(fmt::format(
        "etcd at {} presented a server certificate that {} does not verify ({}). Pass "
        "--rdzv-conf cacert=FILE with the CA that signed etcd's certificate (etcd --cert-file), "
        "and name etcd in --rdzv-endpoint by a host name or address that certificate lists",
        member, o.cacert ? "cacert=" + *o.cacert : std::string("the system's CA store"), e));
  }
  if (a.curl_code == CURLE_SSL_CERTPROBLEM || a.curl_code == CURLE_SSL_CACERT_BADFILE) {
    return final_failure<UsageError>(fmt::format(
        "cannot use this node's TLS files for etcd at {} ({}): {}. Check that the files exist "
        "and are PEM, and that key= is the private key of cert=",
        member, tls_files(o), e));
  }
  if (alert && (contains(e, "unknown ca") || contains(e, "bad certificate") ||
                contains(e, "certificate unknown") || contains(e, "certificate required") ||
                contains(e, "decrypt error") || contains(e, "certificate expired") ||
                contains(e, "handshake failure"))) {
    if (!o.cert) {
      return final_failure<StoreError>(fmt::format(
          "etcd at {} requires a client certificate ({}): pass --rdzv-conf cert=FILE,key=FILE, "
          "a certificate signed by the CA etcd trusts (etcd --trusted-ca-file)",
          member, e));
    }
    return final_failure<StoreError>(fmt::format(
        "etcd at {} refused this node's client certificate cert={} ({}): give every node a "
        "certificate signed by the CA etcd trusts (etcd --trusted-ca-file), with "
        "--rdzv-conf cert=FILE,key=FILE",
        member, *o.cert, e));
  }
  return final_failure<StoreError>(fmt::format(
      "TLS with etcd at {} failed ({}; {}): check protocol=https against etcd's client URL, the "
      "CA in cacert= and this node's cert=/key=",
      member, e, tls_files(o)));
}

}  // namespace

bool etcd_timed_out(const std::string& reason) {
  return reason.rfind("unavailable", 0) == 0 &&
         (contains(reason, "etcdserver: request timed out") ||
          contains(reason, kEtcdTimeoutRanOut.c_str()));
}

bool leader_churn(const std::string& reason) {
  return reason.rfind("unavailable", 0) == 0 && contains(reason, "leader changed");
}

Failure classify(const Attempt& a, const std::string& member, const std::string& request,
                 const HttpOptions& o, bool idempotent) {
  if (a.curl_code != CURLE_OK) {
    if (auto tls = tls_failure(a, member, o)) return *tls;
    switch (a.curl_code) {
      case CURLE_COULDNT_RESOLVE_HOST:
        return retry_failure("cannot resolve the host name: " + a.curl_error);
      case CURLE_COULDNT_CONNECT:
        return retry_failure(a.curl_error.empty() ? "connection refused" : a.curl_error);
      case CURLE_OPERATION_TIMEDOUT:
        if (!a.connected) return retry_failure("connecting timed out: " + a.curl_error);
        // Sending it again elsewhere does no harm; the member may be stopped or cut off.
        if (idempotent) return retry_failure(kNoAnswer + (": " + a.curl_error));
        return final_failure<TimeoutError>(fmt::format(
            "etcd at {} accepted {} but did not answer within {:.1f} s (--rdzv-conf "
            "read_timeout): the etcd cluster may be overloaded or have lost its quorum; check "
            "`etcdctl endpoint status --cluster`",
            member, request, o.read_timeout.count() / 1000.0));
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_WEIRD_SERVER_REPLY:
        return final_failure<ProtocolError>(fmt::format(
            "{} answered {} with something that is not HTTP ({}): is it an etcd client URL? "
            "--rdzv-endpoint takes etcd's client port (2379 by default, not the peer port 2380)",
            member, request, a.curl_error));
      case CURLE_RECV_ERROR:
      case CURLE_SEND_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_PARTIAL_FILE:
        return retry_failure("the connection broke: " + a.curl_error);
      default:
        return final_failure<NetworkError>(
            fmt::format("{} to etcd at {} failed: {}", request, member, a.curl_error));
    }
  }
  if (a.http_status == 200) {
    return final_failure<ProtocolError>(
        fmt::format("{} to etcd at {}: no failure", request, member));
  }
  if (a.http_status == 400 && contains(a.body, "HTTP request to an HTTPS server")) {
    return final_failure<StoreError>(fmt::format(
        "etcd at {} serves HTTPS: pass --rdzv-conf protocol=https (with cacert=FILE, and "
        "cert=FILE,key=FILE when etcd requires client certificates)",
        member));
  }
  auto err = parse_error(a.body);
  if (!err) {
    if (a.http_status == 503 || a.http_status == 502) {
      return retry_failure(fmt::format("HTTP {} {}", a.http_status, quote_start(a.body, 80)));
    }
    return final_failure<ProtocolError>(fmt::format(
        "etcd at {} answered {} with HTTP {} and '{}', not etcd's v3 JSON API. Is the endpoint an "
        "etcd (3.4 or later) client URL? --rdzv-endpoint takes etcd's client port (2379 by "
        "default, not the peer port 2380)",
        member, request, a.http_status, a.body.empty() ? "(no body)" : quote_start(a.body)));
  }
  if (err->code == kGrpcUnavailable || a.http_status == 503) {
    return retry_failure(fmt::format("unavailable: {}", err->message));
  }
  if (contains(err->message, "too many requests")) {
    return retry_failure(fmt::format("{}: {}", kOverloaded, err->message));
  }
  // etcd's own request timeout (7 s by default) ran out while it handed the request to raft,
  // which took nothing in that time (no leader during an election, a starved member): etcd 3.4
  // passes on the bare context error, gRPC code 2 (4 in later versions). The same event as
  // "etcdserver: request timed out" (unavailable, above), with the same unknown outcome:
  // retried the same way, for the budget of a slow cluster (etcd_timed_out, run()). The reason
  // names etcdserver, so that give_up reports a slow or leaderless cluster and not a gateway cut
  // off from etcd.
  if ((err->code == 2 || err->code == 4) && err->message == "context deadline exceeded") {
    return retry_failure(fmt::format("unavailable: {} ({})", err->message, kEtcdTimeoutRanOut));
  }
  if (err->code == kGrpcNotFound && contains(err->message, "lease")) {
    return final_failure<LeaseNotFoundError>(
        fmt::format("etcd at {} refused {}: {}", member, request, err->message));
  }
  if (err->code == kGrpcUnauthenticated || err->code == kGrpcPermissionDenied) {
    return final_failure<StoreError>(fmt::format(
        "etcd at {} refused {}: {} (etcd authentication with users is enabled; ddprun "
        "authenticates with TLS client certificates: start etcd with --client-cert-auth and "
        "give each node cert=FILE,key=FILE whose common name is an etcd user with access to "
        "the prefix)",
        member, request, err->message));
  }
  return final_failure<StoreError>(fmt::format("etcd at {} refused {}: {} (gRPC code {})", member,
                                               request, err->message, err->code));
}

void give_up(const HttpOptions& options, const std::string& request,
             const std::vector<std::string>& last, Clock::time_point first_failure,
             Millis per_attempt) {
  auto member = [&](size_t m) {
    return net::format_endpoint(options.endpoints[m].host, options.endpoints[m].port);
  };
  std::vector<std::string> parts;
  std::vector<std::string> answered;  // the members that answered with etcd's own refusal
  bool no_leader = true;
  bool overloaded = false;  // a member refused as "too many requests"
  bool timed_out = false;   // a member's own request timeout ran out (etcd_timed_out)
  bool none_answered = true;
  for (size_t m = 0; m < last.size(); ++m) {
    const std::string& reason = last[m];
    parts.push_back(fmt::format("{}: {}", member(m), reason.empty() ? "not tried" : reason));
    no_leader = no_leader && reason.rfind("unavailable", 0) == 0;
    none_answered = none_answered && reason.rfind(kNoAnswer, 0) == 0;
    const bool refused = reason.rfind(kOverloaded, 0) == 0;
    overloaded = overloaded || refused;
    timed_out = timed_out || etcd_timed_out(reason);
    if (refused || etcd_timed_out(reason)) answered.push_back(member(m));
  }
  double tried = std::chrono::duration<double>(Clock::now() - first_failure).count();
  // Before the reachability branches: a member that answered "too many requests" or
  // "request timed out" was reached (over the right protocol) and is too slow, whatever the
  // others said meanwhile.
  if (overloaded) {
    throw StoreError(fmt::format(
        "etcd at {} was overloaded for {:.1f} s and did not serve {} (too many requests{}: "
        "{}): it cannot commit the requests of this many agents in time (its apply loop stayed "
        "too far behind its commits). Give etcd machines of its own (more CPU, fast disks), "
        "fewer agents per etcd cluster or a longer --rdzv-conf heartbeat, or raise "
        "--rdzv-conf read_timeout (how long a call waits for an overloaded etcd, now {:.1f} "
        "s); or use --rdzv-backend c10d",
        fmt::join(answered, ", "), tried, request, timed_out ? " / request timed out" : "",
        fmt::join(parts, "; "),
        std::max(options.retry_for, options.read_timeout).count() / 1000.0));
  }
  if (none_answered) {
    throw TimeoutError(fmt::format(
        "every etcd member accepted {} but none answered within {:.1f} s (--rdzv-conf "
        "read_timeout) ({}): the etcd cluster may be overloaded, stopped or have lost its "
        "quorum; check `etcdctl endpoint status --cluster`",
        request, per_attempt.count() / 1000.0, fmt::join(parts, "; ")));
  }
  if (timed_out) {
    // A NetworkError, as the leaderless cluster it may also be (not a TimeoutError, which
    // callers take for a wait that ran out).
    throw NetworkError(fmt::format(
        "etcd at {} did not commit {} in time for {:.1f} s (request timed out: {}): it is "
        "overloaded, or has lost its quorum. Check `etcdctl endpoint status --cluster`: with "
        "a leader, etcd cannot commit the requests of this many agents in time; give etcd more "
        "CPU and fast disks, fewer agents per etcd cluster, or raise --rdzv-conf read_timeout "
        "(how long a call waits for an overloaded etcd, now {:.1f} s). Without one, restart "
        "the lost members",
        fmt::join(answered, ", "), request, tried, fmt::join(parts, "; "),
        std::max(options.retry_for, options.read_timeout).count() / 1000.0));
  }
  bool gateway_cut_off = no_leader;
  for (const auto& reason : last) {
    gateway_cut_off = gateway_cut_off && !contains(reason, "etcdserver:");
  }
  if (gateway_cut_off) {
    // Not etcd's own "etcdserver: no leader": the JSON gateway inside etcd cannot reach
    // etcd's gRPC service. With client-certificate authentication the usual cause is etcd's
    // server certificate, which etcd 3.4's gateway presents to etcd itself as a client.
    throw NetworkError(fmt::format(
        "etcd answered {} with 'unavailable' for {:.1f} s ({}): etcd's JSON gateway cannot reach "
        "etcd's own gRPC service. With --client-cert-auth, etcd's server certificate "
        "(--cert-file) must also allow client authentication (extendedKeyUsage serverAuth, "
        "clientAuth): etcd 3.4's gateway presents it to etcd itself. etcd's log then says "
        "\"rejected connection ... incompatible key usage\"",
        request, tried, fmt::join(parts, "; ")));
  }
  const bool churn = std::any_of(last.begin(), last.end(), leader_churn);
  if (no_leader && churn) {
    throw NetworkError(fmt::format(
        "the etcd cluster kept changing its leader for {:.1f} s and did not serve {} ({}): "
        "elections keep interrupting it, as when its members are starved of CPU or disk "
        "(etcd's log: \"server is likely overloaded\", long wal syncs). Give etcd machines of "
        "its own (CPU, fast disks) or a longer --election-timeout, fewer agents per etcd "
        "cluster, or raise --rdzv-conf read_timeout (how long a call waits for a slow etcd, "
        "now {:.1f} s)",
        tried, request, fmt::join(parts, "; "),
        std::max(options.retry_for, options.read_timeout).count() / 1000.0));
  }
  if (no_leader) {
    throw NetworkError(fmt::format(
        "the etcd cluster did not serve {} for {:.1f} s ({}): it has no leader (a majority of "
        "its members is down or cut off); check `etcdctl endpoint status --cluster` and "
        "restart the lost members",
        request, tried, fmt::join(parts, "; ")));
  }
  bool closed_silently = false;
  for (const auto& reason : last)
    closed_silently = closed_silently || contains(reason, "Empty reply");
  if (closed_silently && !options.https) {
    throw NetworkError(fmt::format(
        "etcd did not answer {} ({}); retried for {:.1f} s (--rdzv-conf connect_timeout). The "
        "member accepted the connection and closed it without a reply, as an etcd that serves "
        "HTTPS does to plain HTTP: pass --rdzv-conf protocol=https (with cacert=FILE, and "
        "cert=FILE,key=FILE when etcd requires client certificates)",
        request, fmt::join(parts, "; "), tried));
  }
  throw NetworkError(fmt::format(
      "cannot reach etcd for {} ({}); retried for {:.1f} s (--rdzv-conf connect_timeout). "
      "Check that etcd runs there and listens on that address (etcd --listen-client-urls), "
      "that --rdzv-endpoint lists its client URLs (port 2379 by default) with the right "
      "protocol= (now {}), and that no firewall blocks the port",
      request, fmt::join(parts, "; "), tried, options.https ? "https" : "http"));
}

}  // namespace ddp::rdzv::etcd
