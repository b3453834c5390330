#include "etcd_http.hpp"

#include <curl/curl.h>
#include <fmt/format.h>

#if LIBCURL_VERSION_NUM < 0x074400
#error "ddp's etcd client needs libcurl 7.68 or later (curl_multi_poll, curl_multi_wakeup)"
#endif

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "../store_wait.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::rdzv::etcd {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxReplyBytes = size_t(64) << 20;
// The start of the reason of an idempotent request that a member accepted and left unanswered.
const std::string kNoAnswer = "accepted the request, no answer";
// etcd's back-pressure: its apply loop is more than 5,000 raft entries behind the commits, and
// it refuses new proposals before proposing them, so the request was not applied (any request,
// a write included, may be sent again).
const std::string kOverloaded = "overloaded";
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

// etcd answered, but did not commit the request within its own request timeout (7 s by
// default): "etcdserver: request timed out" (and its variants: "possibly due to previous leader
// failure", "waiting for the applied index took too long"), or etcd 3.4's bare "context deadline
// exceeded". The member is alive and serves its client port; raft is too slow (overload: slow
// disks, starved CPU) or has no quorum.
bool etcd_timed_out(const std::string& reason) {
  return reason.rfind("unavailable", 0) == 0 &&
         (contains(reason, "etcdserver: request timed out") ||
          contains(reason, kEtcdTimeoutRanOut.c_str()));
}

// etcd answered that its leader changed while it handled the request: the cluster has a quorum
// and elects leaders, but elections keep interrupting it (members starved of CPU or disk miss
// their heartbeats: etcd's log says "server is likely overloaded", long wal syncs). Measured
// with 10,000 simulated agents on 3 members sharing 2 cores: 65 s of "leader changed" from
// every member.
bool leader_churn(const std::string& reason) {
  return reason.rfind("unavailable", 0) == 0 && contains(reason, "leader changed");
}

}  // namespace

std::string base_url(const Endpoint& endpoint, bool https) {
  return fmt::format("{}://{}", https ? "https" : "http",
                     net::format_endpoint(endpoint.host, endpoint.port));
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

struct EtcdHttp::Impl {
  HttpOptions options;
  CURL* unary = nullptr;
  CURL* stream = nullptr;
  CURLM* stream_multi = nullptr;  // drives `stream` when a WaitInterrupter may end it
  curl_slist* headers = nullptr;
  size_t current = 0;  // the member that answered last
  char error_buffer[CURL_ERROR_SIZE] = {};

  // Per transfer: the body so far, or the stream's unfinished line and callback.
  struct Sink {
    std::string body;
    bool too_large = false;
    const std::function<bool(const WatchMessage&)>* on_message = nullptr;
    std::string context;
    bool done = false;
    std::exception_ptr error;
  };

  static size_t write(char* data, size_t size, size_t n, void* user) {
    auto* sink = static_cast<Sink*>(user);
    size_t bytes = size * n;
    sink->body.append(data, bytes);
    if (sink->body.size() > kMaxReplyBytes) {
      sink->too_large = true;
      return 0;
    }
    if (sink->on_message == nullptr) return bytes;
    size_t start = 0, nl;
    while ((nl = sink->body.find('\n', start)) != std::string::npos) {
      std::string line = sink->body.substr(start, nl - start);
      start = nl + 1;
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      try {
        if ((*sink->on_message)(parse_watch_message(line, sink->context))) {
          sink->done = true;
          return 0;  // ends the transfer
        }
      } catch (...) {
        sink->error = std::current_exception();
        return 0;
      }
    }
    sink->body.erase(0, start);
    return bytes;
  }

  void prepare(CURL* h, const std::string& url, const std::string& body, Sink& sink, Millis total,
               Millis connect) {
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    // The cluster is named by the user: no proxy from the environment may sit in between.
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    // A peer that vanished without a reset (power loss, a cut cable) breaks the connection.
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
    // One cached connection: this client talks to one member at a time, and the connection to a
    // member it failed over from is closed once the next one is cached, instead of kept (curl
    // keeps 5 by default: after elections in a 3-member etcd, each of 4,000 agents held 6-7
    // connections, one per handle to every member, and each member twice the descriptors).
    curl_easy_setopt(h, CURLOPT_MAXCONNECTS, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<int64_t>(total.count(), 1)));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(connect.count(), 1)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Impl::write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
    if (options.local_address)
      curl_easy_setopt(h, CURLOPT_INTERFACE, options.local_address->c_str());
    if (options.https) {
      if (options.cacert) curl_easy_setopt(h, CURLOPT_CAINFO, options.cacert->c_str());
      if (options.cert) curl_easy_setopt(h, CURLOPT_SSLCERT, options.cert->c_str());
      if (options.key) curl_easy_setopt(h, CURLOPT_SSLKEY, options.key->c_str());
    }
  }

  // curl_easy_perform(h), through stream_multi so that `interrupter` can end it at once (its
  // wake-up is curl_multi_wakeup, which is thread-safe). Sets `interrupted` when it did.
  CURLcode perform_interruptibly(CURL* h, WaitInterrupter& interrupter, bool& interrupted) {
    if (curl_multi_add_handle(stream_multi, h) != CURLM_OK) return CURLE_FAILED_INIT;
    CURLcode result = CURLE_OK;
    {
      auto registration = interrupter.on_interrupt([m = stream_multi] { curl_multi_wakeup(m); });
      for (;;) {
        int running = 0;
        if (curl_multi_perform(stream_multi, &running) != CURLM_OK) {
          result = CURLE_FAILED_INIT;
          break;
        }
        int queued = 0;
        if (CURLMsg* msg = curl_multi_info_read(stream_multi, &queued);
            msg != nullptr && msg->msg == CURLMSG_DONE) {
          result = msg->data.result;
          break;
        }
        if (interrupter.interrupted()) {
          interrupted = true;
          break;
        }
        // curl's own timers (CURLOPT_TIMEOUT_MS) wake the poll earlier when due.
        curl_multi_poll(stream_multi, nullptr, 0, 1000, nullptr);
      }
    }
    curl_multi_remove_handle(stream_multi, h);
    return result;
  }

  // One attempt at member `m`; a watch with an interrupter ends when it is interrupted.
  Attempt attempt(CURL* h, size_t m, const std::string& path, const std::string& body, Sink& sink,
                  Millis total, WaitInterrupter* interrupter = nullptr) {
    std::string url = base_url(options.endpoints[m], options.https) + path;
    Millis connect = std::min(total, options.retry_for);
    prepare(h, url, body, sink, total, connect);
    error_buffer[0] = '\0';
    Attempt a;
    a.curl_code = interrupter != nullptr ? perform_interruptibly(h, *interrupter, a.interrupted)
                                         : curl_easy_perform(h);
    a.curl_error =
        error_buffer[0] ? error_buffer : curl_easy_strerror(static_cast<CURLcode>(a.curl_code));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a.http_status);
    long os_errno = 0;
    curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &os_errno);
    // curl's "Couldn't connect to server" does not say why; the system's error does.
    if (a.curl_code == CURLE_COULDNT_CONNECT && os_errno != 0) {
      a.curl_error += fmt::format(" ({})", std::strerror(static_cast<int>(os_errno)));
    }
    // Connected (TCP and TLS) exactly when the request went out; this also holds on a reused
    // connection, for which curl reports no connect time.
    long request_bytes = 0;
    curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &request_bytes);
    a.connected = request_bytes > 0;
    a.body = sink.body;
    return a;
  }

  std::string member(size_t m) const {
    return net::format_endpoint(options.endpoints[m].host, options.endpoints[m].port);
  }

  [[noreturn]] void give_up(const std::string& request, const std::vector<std::string>& last,
                            Clock::time_point first_failure, Millis per_attempt) {
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

  struct Result {
    std::string body;                                                    // unary: the reply
    const std::function<bool(const WatchMessage&)>* callback = nullptr;  // watch
    WaitInterrupter* interrupter = nullptr;                              // watch, optional
    bool done = false;         // watch: the callback returned true
    bool interrupted = false;  // watch: the interrupter ended it
  };

  // Runs attempts over the members until one completes. For a watch, `deadline` bounds the
  // whole call and a timeout after connecting is no error (the watched key stayed unset).
  // `per_attempt`: the bound of one unary attempt.
  void run(const std::string& path, const std::string& body, Clock::time_point deadline,
           bool is_watch, bool idempotent, Millis per_attempt, Result& on_complete) {
    const std::string request = "POST " + path;
    std::vector<std::string> last(options.endpoints.size());
    std::optional<Clock::time_point> first_failure;
    Millis backoff{20};
    size_t tried_in_pass = 0;
    // Whether a member of the cluster answered that it is too slow, in this call (sticky).
    bool slow_cluster = false;
    for (;;) {
      Sink sink;
      sink.context = fmt::format("etcd at {} ({})", member(current), request);
      Millis total = is_watch ? remaining(deadline) : per_attempt;
      const std::function<bool(const WatchMessage&)>* callback = nullptr;
      if (is_watch) callback = on_complete.callback;
      sink.on_message = callback;
      if (is_watch && on_complete.interrupter && on_complete.interrupter->interrupted()) {
        on_complete.interrupted = true;
        return;
      }
      Attempt a = attempt(is_watch ? stream : unary, current, path, body, sink, total,
                          is_watch ? on_complete.interrupter : nullptr);
      if (sink.error) std::rethrow_exception(sink.error);
      if (sink.too_large) {
        throw ProtocolError(fmt::format("{} answered more than {} MiB: not an etcd reply",
                                        sink.context, kMaxReplyBytes >> 20));
      }
      if (is_watch && sink.done) {
        on_complete.done = true;
        return;
      }
      if (a.interrupted) {
        on_complete.interrupted = true;
        return;
      }
      if (is_watch && a.curl_code == CURLE_OPERATION_TIMEDOUT && a.connected) return;
      if (a.curl_code == CURLE_OK && a.http_status == 200) {
        if (is_watch) {
          // The member ended the stream (it is shutting down): go on with the next one.
          a.curl_code = CURLE_GOT_NOTHING;
          a.curl_error = "the watch stream ended";
        } else {
          on_complete.body = std::move(sink.body);
          return;
        }
      }
      Failure f = classify(a, member(current), request, options, idempotent || is_watch);
      if (!f.retry) std::rethrow_exception(f.final_error);
      last[current] = f.reason;
      auto now = Clock::now();
      if (!first_failure) first_failure = now;
      // Every member accepted the request and kept silent: waiting on them again is no use.
      if (std::all_of(last.begin(), last.end(),
                      [](const std::string& r) { return r.rfind(kNoAnswer, 0) == 0; })) {
        give_up(request, last, *first_failure, per_attempt);
      }
      // An overloaded etcd catches up within seconds to a minute: it gets read_timeout, and
      // pauses that grow to 2 s, spread so that thousands of agents do not come back at once.
      // Overloaded: a member refused as "too many requests", or etcd's own request timeout ran
      // out (etcd_timed_out: the member answered, and raft did not commit within etcd's 7 s).
      // The latter is also what a cluster without quorum answers, which now fails after
      // read_timeout instead of connect_timeout; but taken as unavailable, each such answer used
      // up 7 s of a 5 s connect_timeout, and a busy cluster was given up after two attempts.
      // Sticky for the rest of the call: one busy cluster's members answer both ways (10,000
      // agents: two "too many requests", the third "request timed out"), and the budget of the
      // latest failure alone gave up after connect_timeout. Members that never answered
      // (refused, unresolvable, silent) do not set it: a wrong endpoint fails after
      // connect_timeout.
      slow_cluster = slow_cluster || f.reason.rfind(kOverloaded, 0) == 0 ||
                     etcd_timed_out(f.reason) || leader_churn(f.reason);
      const Millis budget =
          slow_cluster ? std::max(options.retry_for, options.read_timeout) : options.retry_for;
      if (now - *first_failure >= budget || now >= deadline) {
        if (is_watch && now >= deadline) return;
        give_up(request, last, *first_failure, per_attempt);
      }
      current = (current + 1) % options.endpoints.size();
      if (++tried_in_pass >= options.endpoints.size()) {
        tried_in_pass = 0;
        Millis pause_for = backoff;
        if (slow_cluster) {
          thread_local std::minstd_rand spread(std::random_device{}());
          pause_for =
              Millis(backoff.count() / 2 +
                     static_cast<int64_t>(spread() % static_cast<uint64_t>(backoff.count() + 1)));
        }
        auto pause = std::min<Clock::duration>(pause_for, deadline - now);
        if (pause.count() > 0) std::this_thread::sleep_for(pause);
        backoff = std::min(backoff * 2, slow_cluster ? Millis(2000) : Millis(500));
      }
    }
  }
};

EtcdHttp::EtcdHttp(HttpOptions options) : impl_(std::make_unique<Impl>()) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (options.endpoints.empty()) throw UsageError("etcd: no endpoint given (--rdzv-endpoint)");
  impl_->options = std::move(options);
  impl_->unary = curl_easy_init();
  impl_->stream = curl_easy_init();
  impl_->stream_multi = curl_multi_init();
  if (!impl_->unary || !impl_->stream || !impl_->stream_multi) {
    throw Error("libcurl: curl_easy_init or curl_multi_init failed");
  }
  impl_->headers = curl_slist_append(nullptr, "Content-Type: application/json");
  // No "Expect: 100-continue" round trip before larger bodies.
  impl_->headers = curl_slist_append(impl_->headers, "Expect:");
}

EtcdHttp::~EtcdHttp() {
  if (impl_->unary) curl_easy_cleanup(impl_->unary);
  if (impl_->stream) curl_easy_cleanup(impl_->stream);
  if (impl_->stream_multi) curl_multi_cleanup(impl_->stream_multi);
  curl_slist_free_all(impl_->headers);
}

std::string EtcdHttp::members() const {
  std::vector<std::string> m;
  for (size_t i = 0; i < impl_->options.endpoints.size(); ++i) m.push_back(impl_->member(i));
  return fmt::format("{}", fmt::join(m, ", "));
}

Json EtcdHttp::call(const std::string& path, const Json& body, const CallOptions& how) {
  Impl::Result r;
  const Millis per_attempt = how.timeout.value_or(impl_->options.read_timeout);
  const bool idempotent = how.idempotent || path == "/v3/kv/range";
  // An idempotent request may time out at each member in turn before one answers.
  const size_t tries = idempotent ? impl_->options.endpoints.size() : 1;
  auto deadline =
      deadline_after(per_attempt * static_cast<int64_t>(tries) + impl_->options.retry_for);
  impl_->run(path, body.dump(), deadline, false, idempotent, per_attempt, r);
  return parse_reply(r.body,
                     fmt::format("etcd at {} (POST {})", impl_->member(impl_->current), path));
}

EtcdHttp::WatchEnd EtcdHttp::watch(const Json& body, Millis limit,
                                   const std::function<bool(const WatchMessage&)>& on_message,
                                   WaitInterrupter* interrupter) {
  Impl::Result r;
  r.callback = &on_message;
  r.interrupter = interrupter;
  impl_->run("/v3/watch", body.dump(), deadline_after(limit), true, true, limit, r);
  if (r.done) return WatchEnd::kMessage;
  return r.interrupted ? WatchEnd::kInterrupted : WatchEnd::kLimit;
}

}  // namespace ddp::rdzv::etcd
