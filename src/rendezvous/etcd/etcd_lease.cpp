#include "etcd_lease.hpp"

#include <fmt/format.h>

#include "ddp/util/logging.hpp"

namespace ddp::rdzv::etcd {

namespace {

constexpr int kAcquireAttempts = 8;

int64_t renew(EtcdHttp& http, int64_t id) {
  Json reply = http.call("/v3/lease/keepalive", {{"ID", std::to_string(id)}});
  // The gateway streams keepalive replies: one {"result": {...}} for one request.
  const Json& r = reply.contains("result") ? reply["result"] : reply;
  return int_field(r, "TTL", "etcd lease keepalive reply");
}

}  // namespace

SharedLease::SharedLease(HttpOptions http, std::string lease_key, Millis ttl)
    : http_(std::move(http)), key_(std::move(lease_key)), ttl_(ttl) {
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
      int64_t theirs = std::strtoll(current.kvs.front().value.c_str(), nullptr, 10);
      if (theirs != 0 && renew(http_, theirs) > 0) return theirs;
      continue;  // expired since it was read: etcd deletes the key with it
    }
    Json grant = http_.call("/v3/lease/grant",
                            {{"TTL", std::to_string(std::max<int64_t>(ttl_.count() / 1000, 1))}});
    int64_t mine = int_field(grant, "ID", context);
    if (mine == 0) throw ProtocolError(fmt::format("{}: lease grant returned no ID", context));
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
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    stop_cv_.wait_for(lock, ttl_ / 3, [this] { return stop_; });
    if (stop_) return;
    if (id_ == 0) continue;
    try {
      if (renew(http_, id_) <= 0) {
        log::get("ddp.rdzv")
            ->warn(
                "the etcd lease {} of {} expired: every agent was gone for {} s; the run's "
                "keys were deleted with it",
                id_, key_, ttl_.count() / 1000.0);
        id_ = 0;
      }
    } catch (const Error& e) {
      log::get("ddp.rdzv")->warn("could not renew the etcd lease of {}: {}", key_, e.what());
    }
  }
}

}  // namespace ddp::rdzv::etcd
