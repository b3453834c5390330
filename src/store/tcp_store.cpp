// TcpStore's requests: sending one and reading its reply, retrying on a promoted standby, the
// Store operations and the interruptible wait. The connection itself: tcp_store_connect.cpp.
#include "ddp/store/tcp_store.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ddp/store/auth.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "elapsed.hpp"

namespace ddp {

namespace {

using store_protocol::encode_i64;
using Ms = std::chrono::milliseconds;

// How long past a blocking request's own limit the client waits for the server's timeout
// reply before declaring the server unresponsive.
constexpr Ms kReplyGrace{std::chrono::seconds(5)};
// How often an interruptible wait looks at its interrupter (its latency).
constexpr Ms kInterruptPoll{100};

std::string hex_id(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    out += fmt::format("{:02x}", static_cast<unsigned>(static_cast<uint8_t>(bytes[i])));
  }
  return out;
}

std::string keys_text(const std::vector<std::string>& keys) {
  return fmt::format("[{}]", fmt::join(keys, ", "));
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options)
    : options_(std::move(options)), token_(store_auth::resolve_token(options_.token)) {
  timeout_ = options_.timeout;
  if (options_.is_server) {
    TcpStoreServerOptions server_options;
    server_options.port = options_.port;
    server_options.token = token_;
    server_options.max_frame_bytes = options_.max_frame_bytes;
    server_ = std::make_unique<TcpStoreServer>(server_options);
    server_->start();
    options_.port = server_->port();
  }
  if (!options_.standbys.empty()) {
    endpoints_.emplace_back(options_.host, options_.port);
    for (const auto& s : options_.standbys) endpoints_.push_back(net::parse_endpoint(s));
    client_id_ = hex_id(store_auth::make_nonce());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  connect_locked(deadline_after(options_.timeout));
}

TcpStore::~TcpStore() = default;

std::string TcpStore::endpoint() const {
  return net::format_endpoint(options_.host, options_.port);
}

bool TcpStore::may_fail_over(net::Deadline deadline) const {
  return endpoints_.size() > 1 && net::Clock::now() < deadline;
}

uint32_t TcpStore::send_locked(Frame request, net::Deadline deadline, uint32_t reuse_id) {
  request.request_id = reuse_id != 0 ? reuse_id : next_request_id_++;
  std::string bytes = store_protocol::encode_frame(request);
  net::write_all(sock_.fd(), bytes.data(), bytes.size(), deadline, endpoint());
  return request.request_id;
}

TcpStore::Frame TcpStore::read_reply_locked(uint32_t request_id, net::Deadline deadline) {
  std::string peer = endpoint();
  std::string buffer(store_protocol::kHeaderBytes, '\0');
  net::read_exact(sock_.fd(), buffer.data(), buffer.size(), deadline, peer);
  auto parsed = store_protocol::parse_frame(reinterpret_cast<const uint8_t*>(buffer.data()),
                                            buffer.size(), options_.max_frame_bytes);
  if (parsed.status == store_protocol::ParseStatus::kNeedMore) {
    uint32_t payload = static_cast<uint8_t>(buffer[12]) |
                       (static_cast<uint32_t>(static_cast<uint8_t>(buffer[13])) << 8) |
                       (static_cast<uint32_t>(static_cast<uint8_t>(buffer[14])) << 16) |
                       (static_cast<uint32_t>(static_cast<uint8_t>(buffer[15])) << 24);
    buffer.resize(store_protocol::kHeaderBytes + payload);
    net::read_exact(sock_.fd(), buffer.data() + store_protocol::kHeaderBytes, payload, deadline,
                    peer);
    parsed = store_protocol::parse_frame(reinterpret_cast<const uint8_t*>(buffer.data()),
                                         buffer.size(), options_.max_frame_bytes);
  }
  if (parsed.status != store_protocol::ParseStatus::kComplete) {
    throw ProtocolError(fmt::format("store at {} sent a malformed reply: {}", peer, parsed.error));
  }
  if (parsed.frame.request_id != request_id) {
    throw ProtocolError(fmt::format("store at {} answered request {} while {} was expected", peer,
                                    parsed.frame.request_id, request_id));
  }
  return std::move(parsed.frame);
}

TcpStore::Frame TcpStore::exchange_locked(const Frame& request, net::Deadline deadline) {
  try {
    return read_reply_locked(send_locked(request, deadline), deadline);
  } catch (...) {
    // The connection's state is unknown (a late reply may still arrive): start afresh.
    sock_.close();
    throw;
  }
}

std::vector<std::string> TcpStore::call(Op op, std::vector<std::string> fields, Ms limit,
                                        const std::vector<std::string>& keys_waited) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto start = net::Clock::now();
  if (!sock_.valid()) connect_locked(deadline_after(options_.timeout));
  Frame request;
  request.op = op;
  request.fields = std::move(fields);
  const auto deadline = deadline_after(saturating_add(limit, kReplyGrace));
  Frame reply;
  uint32_t id = 0;  // kept when the request is sent again: the store answers it once
  for (;;) {
    try {
      id = send_locked(request, deadline, id);
      reply = read_reply_locked(id, deadline);
      break;
    } catch (const TimeoutError&) {
      sock_.close();
      skip_silent_endpoint_locked();
      throw TimeoutError(fmt::format(
          "store at {}: no reply to {} after {} ms (limit {} ms){}; the server is unresponsive "
          "or the network is down",
          endpoint(), store_protocol::op_name(op), elapsed_since(start).count(), limit.count(),
          keys_waited.empty() ? "" : " waiting for keys " + keys_text(keys_waited)));
    } catch (const NetworkError& e) {
      sock_.close();
      if (!may_fail_over(deadline)) {
        throw NetworkError(fmt::format("store at {}: {} failed: {}", endpoint(),
                                       store_protocol::op_name(op), e.what()));
      }
      connect_locked(deadline);  // the store's host is gone: its promoted standby, if any
    } catch (...) {
      sock_.close();  // the connection's state is unknown (a late reply may still arrive)
      throw;
    }
  }
  if (reply.op == Op::kOk) return std::move(reply.fields);
  if (reply.op == Op::kTimeout) {
    throw TimeoutError(
        fmt::format("store at {}: timed out after {} ms (limit {} ms) in {} "
                    "waiting for keys {}",
                    endpoint(), elapsed_since(start).count(), limit.count(),
                    store_protocol::op_name(op), keys_text(reply.fields)));
  }
  if (reply.op == Op::kError) throw_reply_error(reply, op);
  sock_.close();
  throw ProtocolError(fmt::format("store at {}: unexpected {} reply to {}", endpoint(),
                                  store_protocol::op_name(reply.op), store_protocol::op_name(op)));
}

namespace {

void expect_reply_fields(const std::vector<std::string>& fields, size_t count, const char* op,
                         const std::string& endpoint) {
  if (fields.size() != count) {
    throw ProtocolError(fmt::format("store at {}: {} reply has {} fields, expected {}", endpoint,
                                    op, fields.size(), count));
  }
}

bool decode_bool(const std::vector<std::string>& fields, const char* op,
                 const std::string& endpoint) {
  expect_reply_fields(fields, 1, op, endpoint);
  if (fields[0].size() != 1) {
    throw ProtocolError(fmt::format("store at {}: {} reply is not a boolean", endpoint, op));
  }
  return fields[0][0] != 0;
}

}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) {
  call(Op::kSet, {key, value}, timeout_, {});
}

std::string TcpStore::get(const std::string& key) {
  return get(key, timeout_);
}

std::string TcpStore::get(const std::string& key, Ms timeout) {
  auto fields = call(Op::kGet, {key, encode_i64(timeout.count())}, timeout, {key});
  expect_reply_fields(fields, 1, "get", endpoint());
  return std::move(fields[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto fields = call(Op::kAdd, {key, encode_i64(delta)}, timeout_, {});
  expect_reply_fields(fields, 1, "add", endpoint());
  return store_protocol::decode_i64(fields[0], "add result");
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  auto fields = call(Op::kCompareSet, {key, expected, desired}, timeout_, {});
  expect_reply_fields(fields, 1, "compare_set", endpoint());
  return std::move(fields[0]);
}

bool TcpStore::delete_key(const std::string& key) {
  return decode_bool(call(Op::kDelete, {key}, timeout_, {}), "delete_key", endpoint());
}

int64_t TcpStore::num_keys() {
  auto fields = call(Op::kNumKeys, {}, timeout_, {});
  expect_reply_fields(fields, 1, "num_keys", endpoint());
  return store_protocol::decode_i64(fields[0], "num_keys result");
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return decode_bool(call(Op::kCheck, keys, timeout_, {}), "check", endpoint());
}

WaitOutcome TcpStore::wait_interruptibly(const std::vector<std::string>& keys, Ms timeout,
                                         WaitInterrupter& interrupter) {
  if (interrupter.interrupted()) return WaitOutcome::kInterrupted;
  std::lock_guard<std::mutex> lock(mutex_);
  auto start = net::Clock::now();
  if (!sock_.valid()) connect_locked(deadline_after(options_.timeout));
  Frame request;
  request.op = Op::kWait;
  request.fields.push_back(encode_i64(timeout.count()));
  request.fields.insert(request.fields.end(), keys.begin(), keys.end());
  const auto deadline = deadline_after(saturating_add(timeout, kReplyGrace));
  Frame reply;
  bool cancelled = false;
  for (;;) {
    try {
      reply = wait_reply_locked(request, deadline, interrupter, cancelled, start, timeout, keys);
      break;
    } catch (const NetworkError& e) {
      sock_.close();
      if (!cancelled && may_fail_over(deadline)) {
        connect_locked(deadline);  // a wait is safe to send again, to the promoted standby
        continue;
      }
      throw NetworkError(fmt::format("store at {}: wait failed: {}", endpoint(), e.what()));
    } catch (const TimeoutError&) {
      sock_.close();
      skip_silent_endpoint_locked();
      throw;
    } catch (...) {
      // The connection's state is unknown (a late reply may still arrive): start afresh.
      sock_.close();
      throw;
    }
  }
  if (reply.op == Op::kOk) return WaitOutcome::kSet;
  if (reply.op == Op::kTimeout)
    return cancelled ? WaitOutcome::kInterrupted : WaitOutcome::kTimedOut;
  if (reply.op == Op::kError) throw_reply_error(reply, Op::kWait);
  sock_.close();
  throw ProtocolError(fmt::format("store at {}: unexpected {} reply to wait", endpoint(),
                                  store_protocol::op_name(reply.op)));
}

TcpStore::Frame TcpStore::wait_reply_locked(const Frame& request, net::Deadline deadline,
                                            WaitInterrupter& interrupter, bool& cancelled,
                                            net::Clock::time_point start, Ms timeout,
                                            const std::vector<std::string>& keys) {
  const uint32_t id = send_locked(request, deadline);
  for (;;) {
    pollfd fd = {sock_.fd(), POLLIN, 0};
    const auto left = std::chrono::duration_cast<Ms>(deadline - net::Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError(fmt::format(
          "store at {}: no reply to wait after {} ms (limit {} ms) waiting for keys {}; the "
          "server is unresponsive or the network is down",
          endpoint(), elapsed_since(start).count(), timeout.count(), keys_text(keys)));
    }
    // The interrupter is polled rather than woken through a descriptor of its own: an
    // eventfd per waiting store would double the descriptors of a process that holds many
    // stores (the rendezvous load bench: 10,000 agents in one process).
    int n =
        ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), kInterruptPoll.count())));
    if (n < 0 && errno != EINTR) {
      throw NetworkError(
          fmt::format("store at {}: poll failed: {}", endpoint(), std::strerror(errno)));
    }
    if (n > 0 && fd.revents != 0) return read_reply_locked(id, deadline);
    if (!cancelled && interrupter.interrupted()) {
      Frame cancel;
      cancel.op = Op::kCancelWait;
      cancel.request_id = id;  // the wait's: the server answers it at once
      std::string bytes = store_protocol::encode_frame(cancel);
      net::write_all(sock_.fd(), bytes.data(), bytes.size(), deadline, endpoint());
      cancelled = true;
    }
  }
}

void TcpStore::wait(const std::vector<std::string>& keys, Ms timeout) {
  std::vector<std::string> fields;
  fields.reserve(keys.size() + 1);
  fields.push_back(encode_i64(timeout.count()));
  fields.insert(fields.end(), keys.begin(), keys.end());
  call(Op::kWait, std::move(fields), timeout, keys);
}

std::vector<std::string> TcpStore::multi_get(const std::vector<std::string>& keys) {
  std::vector<std::string> fields;
  fields.reserve(keys.size() + 1);
  fields.push_back(encode_i64(timeout_.count()));
  fields.insert(fields.end(), keys.begin(), keys.end());
  auto values = call(Op::kMultiGet, std::move(fields), timeout_, keys);
  expect_reply_fields(values, keys.size(), "multi_get", endpoint());
  return values;
}

void TcpStore::multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw UsageError(fmt::format("multi_set: {} keys but {} values; pass one value per key",
                                 keys.size(), values.size()));
  }
  std::vector<std::string> fields;
  fields.reserve(keys.size() * 2);
  for (size_t i = 0; i < keys.size(); ++i) {
    fields.push_back(keys[i]);
    fields.push_back(values[i]);
  }
  call(Op::kMultiSet, std::move(fields), timeout_, {});
}

void TcpStore::ping() {
  call(Op::kPing, {}, timeout_, {});
}

}  // namespace ddp
