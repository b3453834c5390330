// TcpStoreServer::Loop: request handling (handshake, key-value operations, parked waiters).
// Socket I/O, timers and teardown are in server_loop.cpp.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "ddp/store/auth.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "request_fields.hpp"
#include "server_loop.hpp"

namespace ddp {

using store_protocol::kErrorAuth;
using store_protocol::kErrorProtocol;
using store_protocol::kErrorStore;
using store_protocol::kErrorUsage;
using namespace request_fields;

void TcpStoreServer::Loop::process(Connection& conn) {
  if (conn.waiter.active && conn.state == State::kReady) take_cancel(conn);
  while (
      (conn.state == State::kHello || conn.state == State::kAuth || conn.state == State::kReady) &&
      !conn.waiter.active && !conn.awaiting_replica && conn.out.empty() &&
      conn.in_off < conn.in.size()) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(conn.in.data()) + conn.in_off;
    size_t available = conn.in.size() - conn.in_off;
    size_t limit = frame_limit(conn);
    auto parsed = store_protocol::parse_frame(bytes, available, limit);
    if (parsed.status == store_protocol::ParseStatus::kNeedMore) break;
    if (parsed.status == store_protocol::ParseStatus::kError) {
      std::string why = parsed.error;
      // Only the pre-auth size limit failed when the frame is fine under the normal one.
      if (limit < options_.max_frame_bytes &&
          store_protocol::parse_frame(bytes, available, options_.max_frame_bytes).status !=
              store_protocol::ParseStatus::kError) {
        uint64_t declared = store_protocol::declared_frame_bytes(bytes, available);
        why = fmt::format(
            "frame of {} bytes before authentication (limit {} bytes until the handshake "
            "completes); the peer is not a ddp store client, or is probing the server",
            declared, limit);
      }
      logger_->warn("store server: closing {}: {}", conn.peer, why);
      close_with_error(conn, parsed.request_id, kErrorProtocol, why);
      return;
    }
    conn.in_off += parsed.consumed;
    try {
      handle(conn, parsed.frame);
    } catch (const BadRequest& bad) {
      logger_->warn("store server: closing {}: {}", conn.peer, bad.message);
      close_with_error(conn, parsed.frame.request_id, kErrorProtocol, bad.message);
      return;
    }
  }
  if (conn.in_off == conn.in.size()) {
    conn.in.clear();
    conn.in_off = 0;
  } else if (conn.in_off > (1u << 20)) {
    conn.in.erase(0, conn.in_off);
    conn.in_off = 0;
  }
}

void TcpStoreServer::Loop::take_cancel(Connection& conn) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(conn.in.data()) + conn.in_off;
  auto parsed = store_protocol::parse_frame(bytes, conn.in.size() - conn.in_off, frame_limit(conn));
  if (parsed.status != store_protocol::ParseStatus::kComplete ||
      parsed.frame.op != Op::kCancelWait) {
    return;
  }
  conn.in_off += parsed.consumed;
  if (parsed.frame.request_id == conn.waiter.request_id) time_out_waiter(conn);
}

void TcpStoreServer::Loop::handle(Connection& conn, Frame& frame) {
  if (conn.state == State::kReady) {
    handle_request(conn, frame);
  } else {
    handle_handshake(conn, frame);
  }
}

void TcpStoreServer::Loop::handle_handshake(Connection& conn, Frame& frame) {
  auto refuse = [&](const std::string& reason, const std::string& message) {
    auth_refusals_.fetch_add(1);
    logger_->warn("store server: refused client {}: {}", conn.peer, reason);
    close_with_error(conn, frame.request_id, kErrorAuth, message);
  };
  if (conn.state == State::kHello) {
    if (frame.op != Op::kHello) {
      refuse(fmt::format("sent {} before the hello handshake", store_protocol::op_name(frame.op)),
             "the first request must be hello (is the client a ddp TcpStore?)");
      return;
    }
    const std::string who = frame.fields.empty() ? "" : frame.fields[0];
    const auto id_at = who.find(" id=");
    conn.role = who.substr(0, id_at);
    if (id_at != std::string::npos) conn.client_id = who.substr(id_at + 4);
    if (conn.role == store_protocol::kReplicaRole && !standby_.load()) {
      close_with_error(conn, frame.request_id, kErrorStore,
                       "this store serves clients (a primary, or a standby promoted already): it "
                       "takes no replication stream");
      return;
    }
    if (conn.role == store_protocol::kReplicaRole && token_.empty()) {
      // Without a token nothing proves who the primary is; the first stream's address is
      // taken as its, so a stranger who reaches the port cannot replace the copy later.
      if (replica_address_.empty()) replica_address_ = conn.address;
      if (conn.address != replica_address_) {
        refuse(fmt::format("a replication stream from {}, but this standby's primary is at {}",
                           conn.address, replica_address_),
               fmt::format("this standby takes its primary's replication stream only (from {}); "
                           "without a store token it cannot tell another primary from a "
                           "stranger: give the job a token (--rdzv-conf token_file=FILE)",
                           replica_address_));
        return;
      }
    }
    if (conn.role != store_protocol::kReplicaRole && conn.role != store_protocol::kAdminRole &&
        standby_.load()) {
      close_with_error(conn, frame.request_id, store_protocol::kErrorStandby,
                       "it serves clients only once promoted (when its primary is declared lost)");
      return;
    }
    if (token_.empty()) {
      handshake_done(conn);
      reply(conn, Op::kOk, frame.request_id, {"auth:none"});
      return;
    }
    conn.nonce = store_auth::make_nonce();
    conn.state = State::kAuth;
    if (frame.fields.size() < 2) {
      // A client without a token (or a raw tool) sends no nonce and gets no server proof.
      reply(conn, Op::kChallenge, frame.request_id, {conn.nonce});
      return;
    }
    // Mutual auth: prove to the client that this server knows the token too.
    const std::string& client_nonce = frame.fields[1];
    if (client_nonce.size() != store_auth::kNonceBytes) {
      refuse(fmt::format("sent a {}-byte hello nonce (expected {})", client_nonce.size(),
                         store_auth::kNonceBytes),
             fmt::format("the hello nonce must be {} bytes", store_auth::kNonceBytes));
      return;
    }
    reply(conn, Op::kChallenge, frame.request_id,
          {conn.nonce, store_auth::server_proof(token_, client_nonce, conn.nonce)});
    return;
  }
  // State::kAuth
  if (frame.op != Op::kAuth || frame.fields.size() != 1) {
    refuse(fmt::format("sent {} instead of the auth answer", store_protocol::op_name(frame.op)),
           "the store requires an auth token; the client did not answer the challenge");
    return;
  }
  const std::string& answer = frame.fields[0];
  if (answer.empty()) {
    refuse("it has no auth token", "the store requires an auth token and the client has none");
    return;
  }
  if (!store_auth::proofs_equal(store_auth::proof(token_, conn.nonce), answer)) {
    refuse("auth token mismatch", "auth token mismatch");
    return;
  }
  handshake_done(conn);
  conn.nonce.clear();
  reply(conn, Op::kOk, frame.request_id, {"auth:ok"});
}

void TcpStoreServer::Loop::handle_request(Connection& conn, Frame& frame) {
  const uint32_t rid = frame.request_id;
  auto& f = frame.fields;
  if (frame.op == Op::kPing) {
    reply(conn, Op::kOk, rid, {});
    return;
  }
  if (frame.op == Op::kPromote) {
    promote(std::move(f));
    reply(conn, Op::kOk, rid, {});
    return;
  }
  if (conn.role == store_protocol::kReplicaRole || conn.role == store_protocol::kAdminRole) {
    if (conn.role == store_protocol::kReplicaRole && frame.op == Op::kReplicate) {
      handle_replicate(conn, frame);
      return;
    }
    throw BadRequest{
        fmt::format("{} on a {} connection", store_protocol::op_name(frame.op), conn.role)};
  }
  if (store_protocol::is_write(frame.op)) {
    handle_write(conn, frame);
    return;
  }
  switch (frame.op) {
    case Op::kCancelWait:
      // The wait it names was answered before the cancel arrived: nothing to do, no reply.
      return;
    case Op::kGet: {
      expect_fields(frame, 2);
      int64_t timeout_ms = field_i64(f[1], "timeout");
      auto it = data_.find(f[0]);
      if (it != data_.end()) {
        reply(conn, Op::kOk, rid, {it->second});
      } else {
        park(conn, Op::kGet, rid, {std::move(f[0])}, timeout_ms);
      }
      return;
    }
    case Op::kNumKeys:
      expect_fields(frame, 0);
      reply(conn, Op::kOk, rid, {store_protocol::encode_i64(static_cast<int64_t>(data_.size()))});
      return;
    case Op::kCheck:
      reply(conn, Op::kOk, rid, {std::string(1, all_present(f) ? '\1' : '\0')});
      return;
    case Op::kWait:
    case Op::kMultiGet: {
      expect_min_fields(frame, 1);
      int64_t timeout_ms = field_i64(f[0], "timeout");
      std::vector<std::string> keys(std::make_move_iterator(f.begin() + 1),
                                    std::make_move_iterator(f.end()));
      park(conn, frame.op, rid, std::move(keys), timeout_ms);
      return;
    }
    case Op::kHello:
    case Op::kAuth:
      throw BadRequest{"hello/auth sent twice on one connection"};
    default:
      throw BadRequest{fmt::format("unknown request {} (is the client newer than the server?)",
                                   store_protocol::op_name(frame.op))};
  }
}

void TcpStoreServer::Loop::set_key(const std::string& key, std::string value) {
  data_[key] = std::move(value);
  notify(key);
}

bool TcpStoreServer::Loop::all_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return data_.count(key) > 0; });
}

void TcpStoreServer::Loop::park(Connection& conn, Op op, uint32_t request_id,
                                std::vector<std::string> keys, int64_t timeout_ms) {
  conn.waiter.op = op;
  conn.waiter.request_id = request_id;
  conn.waiter.keys = std::move(keys);
  conn.waiter.start = net::Clock::now();
  if (all_present(conn.waiter.keys)) {
    complete_waiter(conn);
    return;
  }
  if (timeout_ms <= 0) {
    time_out_waiter(conn);
    return;
  }
  add_timer(conn, deadline_after(std::chrono::milliseconds(timeout_ms), conn.waiter.start),
            conn.waiter.seq);
  register_waiter(conn);
}

void TcpStoreServer::Loop::register_waiter(Connection& conn) {
  conn.waiter.active = true;
  num_waiting_.fetch_add(1);
  conn.waiter.missing = 0;
  for (const auto& key : conn.waiter.keys) {
    if (data_.count(key) == 0) {
      waiters_[key].push_back(conn.id);
      ++conn.waiter.missing;
    }
  }
}

void TcpStoreServer::Loop::unregister_waiter(Connection& conn) {
  if (!conn.waiter.active) return;
  for (const auto& key : conn.waiter.keys) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) continue;
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), conn.id), ids.end());
    if (ids.empty()) waiters_.erase(it);
  }
  conn.waiter.active = false;
  num_waiting_.fetch_sub(1);
}

void TcpStoreServer::Loop::complete_waiter(Connection& conn) {
  unregister_waiter(conn);
  Waiter& w = conn.waiter;
  std::vector<std::string> fields;
  if (w.op == Op::kGet || w.op == Op::kMultiGet) {
    fields.reserve(w.keys.size());
    for (const auto& key : w.keys) fields.push_back(data_.at(key));
  }
  reply(conn, Op::kOk, w.request_id, std::move(fields));
  w.keys.clear();
  runnable_.push_back(conn.id);
}

void TcpStoreServer::Loop::time_out_waiter(Connection& conn) {
  unregister_waiter(conn);
  Waiter& w = conn.waiter;
  std::vector<std::string> missing;
  for (const auto& key : w.keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  reply(conn, Op::kTimeout, w.request_id, std::move(missing));
  w.keys.clear();
  runnable_.push_back(conn.id);
}

void TcpStoreServer::Loop::notify(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    Connection* conn = find(id);
    if (conn == nullptr || !conn->waiter.active) continue;
    if (conn->waiter.missing > 0 && --conn->waiter.missing > 0) continue;  // others still absent
    // The last absent key arrived: one scan confirms the rest are still there.
    if (all_present(conn->waiter.keys)) {
      complete_waiter(*conn);
    } else {
      // A key deleted after it was counted: re-index under what is missing now.
      unregister_waiter(*conn);
      register_waiter(*conn);
    }
  }
}

}  // namespace ddp
