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
#include "etcd_failure.hpp"

namespace ddp::rdzv::etcd {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxReplyBytes = size_t(64) << 20;

}  // namespace

std::string base_url(const Endpoint& endpoint, bool https) {
  return fmt::format("{}://{}", https ? "https" : "http",
                     net::format_endpoint(endpoint.host, endpoint.port));
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
        give_up(options, request, last, *first_failure, per_attempt);
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
        give_up(options, request, last, *first_failure, per_attempt);
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
