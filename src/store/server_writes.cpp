// TcpStoreServer::Loop: writes (set, add, compare_set, delete_key, multi_set), each answered
// once per client id, and the replication of writes to a standby (docs/store-protocol.md,
// "Standby stores"): a primary applies a write only once its standby acknowledged it, a
// standby applies the primary's stream, and kPromote turns a standby into a primary.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"
#include "request_fields.hpp"
#include "server_loop.hpp"

namespace ddp {

using namespace request_fields;
using store_protocol::kErrorStore;

void TcpStoreServer::Loop::validate_write(const Frame& frame) {
  switch (frame.op) {
    case Op::kSet:
      expect_fields(frame, 2);
      return;
    case Op::kAdd:
      expect_fields(frame, 2);
      field_i64(frame.fields[1], "delta");
      return;
    case Op::kCompareSet:
      expect_fields(frame, 3);
      return;
    case Op::kDelete:
      expect_fields(frame, 1);
      return;
    case Op::kMultiSet:
    case Op::kSnapshot:
      if (frame.fields.size() % 2 != 0) {
        throw BadRequest{fmt::format("{} needs key/value pairs, got {} fields",
                                     store_protocol::op_name(frame.op), frame.fields.size())};
      }
      return;
    default:
      throw BadRequest{fmt::format("{} is not a write", store_protocol::op_name(frame.op))};
  }
}

void TcpStoreServer::Loop::handle_write(Connection& conn, Frame& frame) {
  validate_write(frame);
  const uint32_t rid = frame.request_id;
  if (!conn.client_id.empty()) {
    // The same write sent again after its connection broke: the reply it got, not a second
    // application.
    auto it = applied_.find(conn.client_id);
    if (it != applied_.end() && it->second.request_id == rid) {
      reply(conn, it->second.reply_op, rid, it->second.fields);
      return;
    }
  }
  if (replicator_) {
    Replicator::Write w{conn.client_id, rid, frame.op, frame.fields};
    const uint64_t seq = replicator_->push(std::move(w));
    pending_writes_.push_back(PendingWrite{seq, conn.id, conn.client_id, std::move(frame)});
    conn.awaiting_replica = true;  // answered by take_replica_progress
    return;
  }
  Applied done = apply_write(conn.client_id, frame);
  reply(conn, done.reply_op, rid, std::move(done.fields));
}

TcpStoreServer::Loop::Applied TcpStoreServer::Loop::apply_write(const std::string& client_id,
                                                                Frame& frame) {
  auto& f = frame.fields;
  Applied out;
  out.request_id = frame.request_id;
  auto refuse = [&](std::string message) {
    out.reply_op = Op::kError;
    out.fields = {kErrorStore, std::move(message)};
  };
  switch (frame.op) {
    case Op::kSet:
      set_key(f[0], std::move(f[1]));
      break;
    case Op::kAdd: {
      const int64_t delta = store_protocol::decode_i64(f[1], "delta");
      auto it = data_.find(f[0]);
      const std::optional<int64_t> current =
          it == data_.end() ? std::optional<int64_t>(0) : parse_counter(it->second);
      int64_t result = 0;
      if (!current) {
        refuse(fmt::format(
            "add on key '{}': its value is not an integer; use a key that only add() writes",
            f[0]));
      } else if (__builtin_add_overflow(*current, delta, &result)) {
        refuse(fmt::format("add on key '{}': {} + {} overflows int64", f[0], *current, delta));
      } else {
        set_key(f[0], std::to_string(result));
        out.fields = {store_protocol::encode_i64(result)};
      }
      break;
    }
    case Op::kCompareSet: {
      auto it = data_.find(f[0]);
      const bool matches = it == data_.end() ? f[1].empty() : it->second == f[1];
      if (matches) {
        out.fields = {f[2]};
        set_key(f[0], std::move(f[2]));
      } else {
        out.fields = {it == data_.end() ? f[1] : it->second};
      }
      break;
    }
    case Op::kDelete:
      out.fields = {std::string(1, data_.erase(f[0]) > 0 ? '\1' : '\0')};
      break;
    case Op::kMultiSet:
      for (size_t i = 0; i < f.size(); i += 2) set_key(f[i], std::move(f[i + 1]));
      break;
    case Op::kSnapshot:
      data_.clear();
      applied_.clear();
      for (size_t i = 0; i < f.size(); i += 2) set_key(f[i], std::move(f[i + 1]));
      break;
    default:
      break;  // validate_write let only writes through
  }
  if (!client_id.empty()) applied_[client_id] = out;
  return out;
}

void TcpStoreServer::Loop::handle_replicate(Connection& conn, Frame& frame) {
  if (!standby_.load()) {
    close_with_error(conn, frame.request_id, kErrorStore,
                     "this standby was promoted (it serves clients now): the replication stream "
                     "is over, its primary was declared lost");
    return;
  }
  expect_min_fields(frame, 3);
  Frame inner;
  inner.request_id = static_cast<uint32_t>(field_i64(frame.fields[1], "request id"));
  if (frame.fields[2].size() != 1) {
    throw BadRequest{"replicate: the inner op must be one byte"};
  }
  inner.op = static_cast<Op>(static_cast<uint8_t>(frame.fields[2][0]));
  inner.fields.assign(std::make_move_iterator(frame.fields.begin() + 3),
                      std::make_move_iterator(frame.fields.end()));
  validate_write(inner);
  Applied done = apply_write(frame.fields[0], inner);
  std::vector<std::string> fields{std::string(1, static_cast<char>(done.reply_op))};
  for (auto& field : done.fields) fields.push_back(std::move(field));
  reply(conn, Op::kOk, frame.request_id, std::move(fields));
}

void TcpStoreServer::Loop::promote(std::vector<std::string> next_standbys) {
  if (!standby_.load()) return;  // serving clients already: a promotion asked twice
  standby_.store(false);
  logger_->info("store server: promoted from standby: serving clients with {} keys{}", data_.size(),
                next_standbys.empty()
                    ? std::string()
                    : fmt::format("; replicating to {}", fmt::join(next_standbys, ", ")));
  // The old primary's stream ends here, so a primary that is alive after all (a network
  // split) cannot go on writing into this store.
  for (auto& [id, conn] : conns_) {
    if (conn->role == store_protocol::kReplicaRole && conn->state == State::kReady) kill(*conn);
  }
  if (!next_standbys.empty()) {
    replica_candidates_ = std::move(next_standbys);
    attach_next_replica();
  }
}

void TcpStoreServer::Loop::replicate_to(std::vector<std::string> standbys,
                                        std::chrono::milliseconds request_timeout) {
  post([this, standbys = std::move(standbys), request_timeout]() mutable {
    replica_timeout_ = request_timeout;
    replica_candidates_ = std::move(standbys);
    // A standby replicates once promoted (promote() attaches then); a primary starts now.
    if (!replicator_ && !standby_.load()) attach_next_replica();
  });
}

std::string TcpStoreServer::Loop::replica() const {
  std::lock_guard<std::mutex> lock(replica_mutex_);
  return replica_endpoint_;
}

void TcpStoreServer::Loop::attach_next_replica() {
  while (!replica_candidates_.empty()) {
    const std::string next = replica_candidates_.front();
    replica_candidates_.erase(replica_candidates_.begin());
    std::pair<std::string, uint16_t> at;
    try {
      at = net::parse_endpoint(next);
    } catch (const Error& e) {
      logger_->warn("store server: cannot replicate to {}: {}", next, e.what());
      continue;
    }
    replicator_ = std::make_unique<Replicator>(at.first, at.second, token_, replica_timeout_,
                                               [this] { wake(); });
    // The standby starts from a copy of everything; the writes from now on follow it.
    Replicator::Write copy;
    copy.op = Op::kSnapshot;
    copy.fields.reserve(data_.size() * 2);
    for (const auto& [key, value] : data_) {
      copy.fields.push_back(key);
      copy.fields.push_back(value);
    }
    replicator_->push(std::move(copy));
    std::lock_guard<std::mutex> lock(replica_mutex_);
    replica_endpoint_ = next;
    return;
  }
  std::lock_guard<std::mutex> lock(replica_mutex_);
  replica_endpoint_.clear();
}

void TcpStoreServer::Loop::take_replica_progress() {
  if (!replicator_) return;
  const uint64_t acknowledged = replicator_->acknowledged();
  const std::optional<std::string> failed = replicator_->failed();
  if (failed) {
    // Before the held writes are answered: a client that got its answer sees the standby gone.
    std::lock_guard<std::mutex> lock(replica_mutex_);
    replica_endpoint_.clear();
  }
  while (!pending_writes_.empty() && (failed || pending_writes_.front().seq <= acknowledged)) {
    PendingWrite w = std::move(pending_writes_.front());
    pending_writes_.pop_front();
    // Applied even when its client is gone: the standby applied it too.
    Applied done = apply_write(w.client_id, w.frame);
    Connection* conn = find(w.conn_id);
    if (conn != nullptr && conn->awaiting_replica) {
      conn->awaiting_replica = false;
      reply(*conn, done.reply_op, w.frame.request_id, std::move(done.fields));
      runnable_.push_back(conn->id);
    }
  }
  if (!failed) return;
  logger_->warn(
      "store server: lost its standby {} ({}); {}", replicator_->endpoint(), *failed,
      replica_candidates_.empty() ? "serving without one" : "replicating to the next one");
  replicator_.reset();
  attach_next_replica();
}

void TcpStoreServer::Loop::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    posted_.push_back(std::move(task));
  }
  wake();
}

void TcpStoreServer::Loop::run_posted() {
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    tasks.swap(posted_);
  }
  for (auto& task : tasks) task();
}

void TcpStoreServer::Loop::wake() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

}  // namespace ddp
