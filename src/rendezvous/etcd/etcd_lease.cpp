#include "etcd_lease.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "ddp/util/logging.hpp"

namespace ddp::rdzv::etcd {

namespace {
constexpr int kAcquireAttempts = 8;
}  // namespace

int64_t renew_lease(EtcdHttp& http, int64_t id, std::optional<Millis> timeout) {
  CallOptions how;
  how.idempotent = true;
  how.timeout = timeout;
  Json reply = http.call("/v3/lease/keepalive", {{"ID", std::to_string(id)}}, how);
  // The gateway streams keepalive replies: one {"result": {...}} for one request, or an error
  // in the stream ({"error": {"grpc_code": ...}}) once it had answered 200.
  if (!reply.contains("result")) {
    if (auto e = parse_error_object(reply)) {
      if (e->code == kGrpcNotFound) throw LeaseNotFoundError("etcd lease keepalive: " + e->message);
      throw StoreError(
          fmt::format("etcd lease keepalive failed: {} (gRPC code {})", e->message, e->code));
    }
  }
  const Json& r = reply.contains("result") ? reply["result"] : reply;
  return int_field(r, "TTL", "etcd lease keepalive reply");
}

int64_t grant_lease(EtcdHttp& http, Millis ttl, const std::string& context) {
  const int64_t seconds = std::max<int64_t>((ttl.count() + 999) / 1000, 1);
  Json grant = http.call("/v3/lease/grant", {{"TTL", std::to_string(seconds)}});
  const int64_t id = int_field(grant, "ID", context);
  if (id == 0) throw ProtocolError(fmt::format("{}: lease grant returned no ID", context));
  return id;
}

SharedLease::SharedLease(HttpOptions http, std::string lease_key, Millis ttl)
    : http_(http),
      renew_http_(http),
      key_(std::move(lease_key)),
      ttl_(ttl),
      read_timeout_(http.read_timeout) {
  thread_ = std::thread([this] { keep_alive(); });
}

SharedLease::~SharedLease() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

int64_t SharedLease::id() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id_ == 0) id_ = acquire_locked();
  return id_;
}

void SharedLease::lost(int64_t lease) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id_ == lease) id_ = 0;
}

int64_t SharedLease::acquire_locked() {
  const std::string context = "etcd lease at " + key_;
  for (int attempt = 0; attempt < kAcquireAttempts; ++attempt) {
    RangeReply current = parse_range(http_.call("/v3/kv/range", range_op(key_)), context);
    if (!current.kvs.empty()) {
      // Not a lease id (written by something else): replaced below once it is gone.
      const int64_t theirs = parse_int64(current.kvs.front().value).value_or(0);
      if (theirs != 0 && renew_lease(http_, theirs) > 0) return theirs;
      continue;  // expired since it was read: etcd deletes the key with it
    }
    const int64_t mine = grant_lease(http_, ttl_, context);
    TxnReply t = parse_txn(
        http_.call("/v3/kv/txn",
                   txn(Json::array({compare_absent(key_)}),
                       Json::array({{{"request_put", put_op(key_, std::to_string(mine), mine)}}}),
                       Json::array())),
        context);
    if (t.succeeded) return mine;
    // Another client created the key first: use its lease.
    try {
      http_.call("/v3/lease/revoke", {{"ID", std::to_string(mine)}});
    } catch (const Error&) {
      // It expires after ttl anyway.
    }
  }
  throw StoreError(fmt::format(
      "{}: could not agree on a lease after {} attempts (leases expiring as soon as they are "
      "granted?); check the etcd cluster's clock and load",
      context, kAcquireAttempts));
}

void SharedLease::keep_alive() {
  // One renewal attempt at a member waits at most a third of the TTL, whatever read_timeout.
  const Millis bound = std::min(read_timeout_, std::max(ttl_ / 3, Millis(1)));
  Millis pause = ttl_ / 3;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    stop_cv_.wait_for(lock, pause, [this] { return stop_; });
    if (stop_) return;
    pause = ttl_ / 3;
    const int64_t id = id_;
    if (id == 0) continue;
    // The request goes out without the lock: id() and lost() go on meanwhile.
    lock.unlock();
    int64_t ttl_left = 1;
    std::optional<std::string> failure;
    try {
      ttl_left = renew_lease(renew_http_, id, bound);
    } catch (const LeaseNotFoundError&) {
      ttl_left = 0;
    } catch (const Error& e) {
      failure = e.what();
    }
    lock.lock();
    if (failure) {
      log::get("ddp.rdzv")->warn("could not renew the etcd lease of {}: {}", key_, *failure);
      // Soon again: the lease has at most ttl - bound left.
      pause = std::min(pause, Millis(1000));
    } else if (ttl_left <= 0 && id_ == id) {
      log::get("ddp.rdzv")
          ->warn(
              "the etcd lease {} of {} expired: every agent was gone for {} s; the run's "
              "keys were deleted with it",
              id, key_, ttl_.count() / 1000.0);
      id_ = 0;
    }
  }
}

}  // namespace ddp::rdzv::etcd
