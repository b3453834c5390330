#include "ddp/rendezvous/etcd/etcd_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <exception>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "../keys.hpp"
#include "../store_wait.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/logging.hpp"
#include "etcd_counter.hpp"
#include "etcd_http.hpp"
#include "etcd_http_options.hpp"
#include "etcd_json.hpp"
#include "etcd_lease.hpp"

namespace ddp::rdzv {

using namespace etcd;

namespace {

// etcd refuses transactions of more than --max-txn-ops operations (128 by default).
constexpr size_t kOpsPerTxn = 64;
// At most this many txns of one multi_get or multi_set at once (Impl::for_each_chunk).
constexpr size_t kParallelChunks = 8;

std::string random_client_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace

struct EtcdStore::Impl {
  EtcdStoreOptions options;
  EtcdHttp http;
  std::unique_ptr<SharedLease> lease;
  std::string client_id = random_client_id();  // names this client's add() tickets
  uint64_t add_seq = 0;
  int64_t liveness_lease = 0;  // keep_alive's lease; 0: none yet, or found expired
  std::string liveness_key;    // the key attached to it (full)

  explicit Impl(EtcdStoreOptions o) : options(std::move(o)), http(http_options(options)) {
    if (options.lease_key) {
      lease = std::make_unique<SharedLease>(http_options(options),
                                            options.prefix + *options.lease_key, options.lease_ttl);
    }
  }

  std::string full(const std::string& key) const { return options.prefix + key; }

  std::string context(const char* op, const std::string& key) const {
    return fmt::format("etcd at {} ({} {}{})", http.members(), op, options.prefix, key);
  }

  // The lease a write of `key` (relative) attaches to; 0: none.
  int64_t lease_for(const std::string& key) {
    if (!lease) return 0;
    for (const auto& p : options.unleased_prefixes) {
      if (key.rfind(p, 0) == 0) return 0;
    }
    return lease->id();
  }

  // Sends a request built for the current lease; a request refused because the lease expired
  // is sent once more with a fresh one.
  template <class Build>
  Json call_leased(const std::string& path, Build build) {
    return call_leased(http, path, build);
  }
  template <class Build>
  Json call_leased(EtcdHttp& via, const std::string& path, Build build) {
    for (int attempt = 0;; ++attempt) {
      int64_t id = lease ? lease->id() : 0;
      try {
        return via.call(path, build());
      } catch (const LeaseNotFoundError&) {
        if (!lease || attempt > 0) throw;
        lease->lost(id);
      }
    }
  }

  // Values of `keys` (nullopt: absent) and the revision they were read at (of the first
  // chunk; every later chunk reads a revision at least as new).
  std::pair<std::vector<std::optional<std::string>>, int64_t> read(
      const std::vector<std::string>& keys) {
    std::vector<std::optional<std::string>> values(keys.size());
    std::vector<int64_t> revisions(chunks(keys.size()));
    for_each_chunk(keys.size(), [&](size_t chunk, EtcdHttp& via) {
      const size_t begin = chunk * kOpsPerTxn, end = std::min(keys.size(), begin + kOpsPerTxn);
      Json ops = Json::array();
      for (size_t i = begin; i < end; ++i)
        ops.push_back({{"request_range", range_op(full(keys[i]))}});
      CallOptions how;
      how.idempotent = true;  // ranges only
      TxnReply r = parse_txn(via.call("/v3/kv/txn", txn(Json::array(), ops, Json::array()), how),
                             context("range", keys[begin]));
      if (r.ranges.size() != end - begin) {
        throw ProtocolError(fmt::format("{}: {} range results for {} ranges",
                                        context("range", keys[begin]), r.ranges.size(),
                                        end - begin));
      }
      revisions[chunk] = r.revision;
      for (size_t i = begin; i < end; ++i) {
        const auto& kvs = r.ranges[i - begin].kvs;
        if (!kvs.empty()) values[i] = visible_value(kvs.front());
      }
    });
    // The oldest: a watch from just after it misses no put to any key read (chunks run at once).
    const int64_t revision =
        revisions.empty() ? 0 : *std::min_element(revisions.begin(), revisions.end());
    return {std::move(values), revision};
  }

  static size_t chunks(size_t keys) { return (keys + kOpsPerTxn - 1) / kOpsPerTxn; }

  // Runs fn(chunk, connection) for every chunk of kOpsPerTxn keys of a request that one txn
  // cannot hold: the first on this store's connection, the others on up to kParallelChunks - 1
  // connections more at once. Node 0 of a 10,000-node round reads 10,000 node keys twice and
  // writes 10,000 rank keys, 157 txns each: one after the other their round trips added up to
  // minutes on a busy etcd. Chunks are separate txns either way (as before: no atomicity across
  // chunks). The first failure is rethrown once every chunk under way has ended.
  void for_each_chunk(size_t keys, const std::function<void(size_t, EtcdHttp&)>& fn) {
    const size_t n = chunks(keys);
    std::atomic<size_t> next{0};
    std::mutex m;
    std::exception_ptr failure;
    auto work = [&](EtcdHttp& via) {
      for (size_t c; (c = next++) < n;) {
        {
          std::lock_guard<std::mutex> lock(m);
          if (failure) return;
        }
        fn(c, via);
      }
    };
    auto record = [&] {
      std::lock_guard<std::mutex> lock(m);
      if (!failure) failure = std::current_exception();
    };
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < std::min(n, kParallelChunks); ++t) {
      helpers.emplace_back([&] {
        try {
          EtcdHttp own(http_options(options));
          work(own);
        } catch (...) {
          record();
        }
      });
    }
    try {
      work(http);
    } catch (...) {
      record();
    }
    for (auto& t : helpers) t.join();
    if (failure) std::rethrow_exception(failure);
  }

  // The key (full) as stored now; nullopt: absent.
  std::optional<KeyValue> read_one(const std::string& key, const std::string& context) {
    CallOptions how;
    how.idempotent = true;
    RangeReply r = parse_range(http.call("/v3/kv/range", range_op(key), how), context);
    if (r.kvs.empty()) return std::nullopt;
    return r.kvs.front();
  }

  // Thrown by await() when its interrupter was interrupted (nothing failed).
  struct Interrupted {};

  // Waits until every key is set; returns their values. TimeoutError after `limit`;
  // Interrupted soon after `interrupter` (optional) is interrupted.
  std::vector<std::string> await(const std::vector<std::string>& keys, Millis limit,
                                 WaitInterrupter* interrupter = nullptr) {
    auto start = std::chrono::steady_clock::now();
    auto deadline = deadline_after(limit, start);
    std::vector<std::string> out(keys.size());
    std::vector<size_t> pending(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) pending[i] = i;
    std::string cancel_reason;  // of the last watch etcd cancelled
    Millis cancel_backoff{0};
    auto timed_out = [&] {
      std::vector<std::string> missing;
      for (size_t i = 0; i < pending.size() && i < 8; ++i) missing.push_back(keys[pending[i]]);
      return TimeoutError(fmt::format(
          "timed out after {} ms waiting for {} of {} keys ({}{}) in etcd at {} (prefix {}){}",
          std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - start).count(),
          pending.size(), keys.size(), fmt::join(missing, ", "),
          pending.size() > missing.size() ? ", ..." : "", http.members(), options.prefix,
          cancel_reason.empty()
              ? std::string()
              : fmt::format("; etcd cancelled the last watch: {}", cancel_reason)));
    };
    for (;;) {
      if (interrupter && interrupter->interrupted()) throw Interrupted{};
      std::vector<std::string> ask;
      for (size_t i : pending) ask.push_back(keys[i]);
      auto [values, revision] = read(ask);
      std::vector<size_t> still;
      for (size_t j = 0; j < pending.size(); ++j) {
        if (values[j]) {
          out[pending[j]] = std::move(*values[j]);
        } else {
          still.push_back(pending[j]);
        }
      }
      pending.swap(still);
      if (pending.empty()) return out;
      if (std::chrono::steady_clock::now() >= deadline) throw timed_out();
      // Watch the first missing key from the revision just read: a put after the read is
      // delivered even if it came before the watch was created. Each watch lasts at most
      // watch_attempt, then the keys are read again (failing over when the member is gone
      // silently: a silent stream looks like an unset key). Compaction cancels the watch: the
      // loop reads again, after a pause that grows while etcd keeps cancelling.
      bool canceled = false;
      std::string reason;
      auto end = http.watch(
          watch_create(full(keys[pending.front()]), revision + 1),
          std::min(remaining(deadline), options.watch_attempt),
          [&](const WatchMessage& m) {
            if (m.canceled) {
              canceled = true;
              reason = m.cancel_reason.empty() ? "(no reason given)" : m.cancel_reason;
            }
            return m.put_events > 0 || m.canceled;
          },
          interrupter);
      if (end == etcd::EtcdHttp::WatchEnd::kInterrupted) throw Interrupted{};
      // A watch that ran to the wait's deadline saw no put since the read: no read again (a
      // wait of the membership watcher per heartbeat would cost a request more each time).
      if (end == etcd::EtcdHttp::WatchEnd::kLimit && std::chrono::steady_clock::now() >= deadline) {
        throw timed_out();
      }
      if (canceled) {
        cancel_reason = std::move(reason);
        cancel_backoff = std::min(std::max(cancel_backoff * 2, Millis(50)), Millis(1000));
        auto pause = std::min(cancel_backoff, remaining(deadline));
        if (pause.count() > 0) std::this_thread::sleep_for(pause);
      } else {
        cancel_backoff = Millis(0);
      }
    }
  }
};

EtcdStore::EtcdStore(EtcdStoreOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  // First contact: unreachable members, TLS refusals and non-etcd endpoints fail here.
  parse_range(impl_->http.call("/v3/kv/range", range_op(impl_->full(""))),
              impl_->context("range", ""));
  // Every live client renews the shared lease, also one that has not written yet.
  if (impl_->lease) impl_->lease->id();
}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::describe() const {
  return fmt::format("etcd at {} (prefix {})", impl_->http.members(), impl_->options.prefix);
}

void EtcdStore::set(const std::string& key, const std::string& value) {
  impl_->call_leased("/v3/kv/put",
                     [&] { return put_op(impl_->full(key), value, impl_->lease_for(key)); });
}

std::string EtcdStore::get(const std::string& key) {
  return impl_->await({key}, timeout_).front();
}

std::vector<std::string> EtcdStore::multi_get(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  return impl_->await(keys, timeout_);
}

void EtcdStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw UsageError(fmt::format("multi_set: {} keys but {} values; pass one value per key",
                                 keys.size(), values.size()));
  }
  impl_->for_each_chunk(keys.size(), [&](size_t chunk, EtcdHttp& via) {
    const size_t begin = chunk * kOpsPerTxn, end = std::min(keys.size(), begin + kOpsPerTxn);
    impl_->call_leased(via, "/v3/kv/txn", [&] {
      Json ops = Json::array();
      for (size_t i = begin; i < end; ++i) {
        ops.push_back(
            {{"request_put", put_op(impl_->full(keys[i]), values[i], impl_->lease_for(keys[i]))}});
      }
      return txn(Json::array(), ops, Json::array());
    });
  });
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  Impl& i = *impl_;
  const std::string k = i.full(key);
  const std::string context = i.context("add", key);
  auto counter = [&](const KeyValue& kv) {
    auto n = counter_of(kv);
    if (!n) {
      throw ProtocolError(
          fmt::format("{} holds '{}', not an integer counter", context, quote_start(kv.value, 40)));
    }
    return *n;
  };
  if (delta == 0) {
    auto kv = i.read_one(k, context);
    return kv ? counter(*kv) : 0;
  }
  // The counter as this add's ticket's transaction left it: a request sent again after a lost
  // reply was applied the first time.
  auto applied_before = [&](const KeyValue& ticket) {
    CallOptions how;
    how.idempotent = true;
    RangeReply then = parse_range(
        i.http.call("/v3/kv/range", range_at_op(k, ticket.create_revision), how), context);
    if (then.kvs.empty()) {
      throw ProtocolError(fmt::format("{}: the key is absent at the revision of this add ({})",
                                      context, ticket.create_revision));
    }
    return counter(then.kvs.front());
  };
  std::optional<KeyValue> current;
  if (delta == 1) {
    // The common case: one request, never retried for contention.
    const std::string ticket = counter_ticket(k, i.client_id, ++i.add_seq);
    TxnReply r = parse_txn(
        i.call_leased("/v3/kv/txn", [&] { return increment_txn(k, ticket, i.lease_for(key)); }),
        context);
    if (!r.succeeded) {
      if (r.ranges.empty() || r.ranges.front().kvs.empty()) {
        throw ProtocolError(fmt::format("{}: its ticket is neither absent nor present", context));
      }
      return applied_before(r.ranges.front().kvs.front());
    }
    auto malformed = [&] {
      return ProtocolError(
          fmt::format("{}: etcd's reply to the increment lacks its nested results", context));
    };
    if (r.txns.empty()) throw malformed();
    const TxnReply& raise = r.txns.front();
    if (raise.succeeded) {
      if (raise.put_prev.empty() || !raise.put_prev.front()) throw malformed();
      KeyValue after = *raise.put_prev.front();
      after.version += 1;  // the put raised it
      return counter(after);
    }
    if (raise.txns.empty()) throw malformed();
    const TxnReply& create = raise.txns.front();
    if (create.succeeded) return 1;
    // set() wrote the key a plain value: add by compare-and-set below.
    if (!create.ranges.empty() && !create.ranges.front().kvs.empty())
      current = create.ranges.front().kvs.front();
  } else {
    current = i.read_one(k, context);
  }
  // Compare-and-set: each failure means another add or set() changed the key (someone made
  // progress), so this ends; bounded by read_timeout all the same.
  const auto deadline = deadline_after(i.options.read_timeout);
  for (int attempt = 1;; ++attempt) {
    const int64_t value = current ? counter(*current) : 0;
    const std::string ticket = counter_ticket(k, i.client_id, ++i.add_seq);
    TxnReply r = parse_txn(i.call_leased("/v3/kv/txn",
                                         [&] {
                                           return compare_and_add_txn(k, ticket, current, value,
                                                                      delta, i.lease_for(key));
                                         }),
                           context);
    if (r.succeeded) return value + delta;
    if (r.ranges.size() != 2) {
      throw ProtocolError(
          fmt::format("{}: {} range results, expected 2", context, r.ranges.size()));
    }
    if (!r.ranges[0].kvs.empty()) return applied_before(r.ranges[0].kvs.front());
    current.reset();
    if (!r.ranges[1].kvs.empty()) current = r.ranges[1].kvs.front();
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "{}: {} compare-and-set attempts in {} ms all lost to other writers of the key; "
          "raise --rdzv-conf read_timeout",
          context, attempt, i.options.read_timeout.count()));
    }
  }
}

std::string EtcdStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  const std::string k = impl_->full(key);
  const std::string context = impl_->context("compare_set", key);
  // Read first: a compare that fails now is the answer (linearisable: the read is), and a
  // read costs etcd no raft proposal, while a txn with a put in it is one even when its
  // compare fails. Thousands of agents creating the same key (the round's generation, the
  // run's registry entry) each cost a read instead of a proposal.
  std::optional<KeyValue> current = impl_->read_one(k, context);
  const bool would_set = expected.empty() ? !current : current && current->value == expected;
  if (!would_set) return current ? visible_value(*current) : expected;
  Json reply = impl_->call_leased("/v3/kv/txn", [&] {
    return txn(Json::array({expected.empty() ? compare_absent(k) : compare_value(k, expected)}),
               Json::array({{{"request_put", put_op(k, desired, impl_->lease_for(key))}}}),
               Json::array({{{"request_range", range_op(k)}}}));
  });
  TxnReply r = parse_txn(reply, context);
  if (r.succeeded) return desired;
  if (r.ranges.empty() || r.ranges.front().kvs.empty()) return expected;
  return visible_value(r.ranges.front().kvs.front());
}

bool EtcdStore::delete_key(const std::string& key) {
  Json reply = impl_->http.call("/v3/kv/deleterange", range_op(impl_->full(key)));
  return int_field(reply, "deleted", impl_->context("delete", key)) > 0;
}

int64_t EtcdStore::num_keys() {
  Json reply = impl_->http.call("/v3/kv/range", prefix_count_op(impl_->options.prefix));
  return parse_range(reply, impl_->context("count", "")).count;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  auto [values, revision] = impl_->read(keys);
  (void)revision;
  return std::all_of(values.begin(), values.end(), [](const auto& v) { return v.has_value(); });
}

void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  impl_->await(keys, timeout);
}

WaitOutcome EtcdStore::wait_interruptibly(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout,
                                          WaitInterrupter& interrupter) {
  if (interrupter.interrupted()) return WaitOutcome::kInterrupted;
  if (keys.empty()) return WaitOutcome::kSet;
  try {
    impl_->await(keys, timeout, &interrupter);
    return WaitOutcome::kSet;
  } catch (const TimeoutError&) {
    return WaitOutcome::kTimedOut;
  } catch (const Impl::Interrupted&) {
    return WaitOutcome::kInterrupted;
  }
}

void EtcdStore::keep_alive(const std::string& key, const std::string& value,
                           std::chrono::milliseconds ttl) {
  Impl& i = *impl_;
  const std::string k = i.full(key);
  const bool same_key = k == i.liveness_key;
  if (i.liveness_lease != 0) {
    // One attempt at a member waits at most a third of the TTL: a member that accepted the
    // renewal and went silent must not hold it until the lease expires.
    const Millis bound = std::min(i.options.read_timeout, std::max(ttl / 3, Millis(1)));
    bool live = false;
    try {
      live = renew_lease(i.http, i.liveness_lease, bound) > 0;
    } catch (const LeaseNotFoundError&) {
    }
    if (live && same_key) return;
    if (!live) {
      if (same_key) {
        log::get("ddp.rdzv")
            ->warn(
                "{}: this node's liveness lease expired (it could not renew it for {:.1f} s, and "
                "etcd deleted {}); its peers may have taken it as lost. Writing it again",
                describe(), ttl.count() / 1000.0, key);
      }
      i.liveness_lease = 0;
    }
  }
  if (i.liveness_lease == 0)
    i.liveness_lease = grant_lease(i.http, ttl, i.context("keep_alive", key));
  if (same_key) {
    // Written again after the lease expired: only while absent, so that a peer's verdict
    // ("lost") written meanwhile stands.
    i.http.call(
        "/v3/kv/txn",
        txn(Json::array({compare_absent(k)}),
            Json::array({{{"request_put", put_op(k, value, i.liveness_lease)}}}), Json::array()));
  } else {
    i.http.call("/v3/kv/put", put_op(k, value, i.liveness_lease));
    i.liveness_key = k;
  }
}

std::vector<std::optional<std::string>> EtcdStore::read_now(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  return impl_->read(keys).first;
}

int64_t EtcdStore::revision() {
  CallOptions how;
  how.idempotent = true;
  return parse_range(impl_->http.call("/v3/kv/range", range_op(impl_->full("")), how),
                     impl_->context("range", ""))
      .revision;
}

EtcdStoreOptions etcd_store_options(const RendezvousOptions& o) {
  EtcdStoreOptions s;
  s.endpoints = o.endpoints.empty() ? std::vector<Endpoint>{o.endpoint} : o.endpoints;
  s.https = o.conf.https;
  s.cacert = o.conf.cacert;
  s.cert = o.conf.cert;
  s.key = o.conf.key;
  s.prefix = o.conf.etcd_prefix;
  s.connect_timeout = o.conf.connect_timeout;
  s.read_timeout = o.conf.read_timeout;
  s.lease_key = "rdzv/" + o.run_id + "/lease";
  s.lease_ttl = o.conf.key_ttl;
  // The endpoint's count of registrations is shared by every run: it must not vanish with one.
  s.unleased_prefixes = {keys::kRunsCount};
  return s;
}

}  // namespace ddp::rdzv
