// TcpStoreServer::Loop: the caps on connections still in the handshake (issue 25, defect 10).
// Without them anyone who can reach the port could open connections that never speak until
// the server runs out of descriptors and the rendezvous stalls. The contract is on
// TcpStoreServerOptions::max_handshakes; the invariant in server_loop.hpp.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "server_loop.hpp"

namespace ddp {

namespace {

using Ms = std::chrono::milliseconds;

constexpr auto kCapLogInterval = std::chrono::seconds(1);

Ms age(net::Clock::time_point since) {
  return std::chrono::duration_cast<Ms>(net::Clock::now() - since);
}

}  // namespace

bool TcpStoreServer::Loop::admit(Connection& conn) {
  auto same = handshaking_by_address_.find(conn.address);
  if (same != handshaking_by_address_.end() &&
      same->second.size() >= options_.max_handshakes_per_address) {
    Connection* oldest = oldest_evictable(same->second);
    if (oldest == nullptr) {
      log_cap(fmt::format(
          "store server: refusing {}: {} connections from {} are in the handshake "
          "(max_handshakes_per_address = {}) and none has waited {} ms; something there opens "
          "connections without completing the handshake (or more clients than the cap connect "
          "at once: they retry)",
          conn.peer, same->second.size(), conn.address, options_.max_handshakes_per_address,
          kEvictableAfter.count()));
      return false;
    }
    log_cap(fmt::format(
        "store server: closing {}, in the handshake for {} ms, to admit {}: {} holds {} "
        "connections in the handshake (max_handshakes_per_address = {})",
        oldest->peer, age(oldest->accepted_at).count(), conn.peer, conn.address,
        same->second.size(), options_.max_handshakes_per_address));
    kill(*oldest);  // may erase `same`
  }
  if (handshaking_.size() >= options_.max_handshakes) {
    // accept_all() accepts at the total cap only when the oldest may give way.
    Connection* oldest = oldest_evictable(handshaking_);
    if (oldest == nullptr) return false;
    log_cap(fmt::format(
        "store server: closing {}, in the handshake for {} ms, to admit {}: {} connections are "
        "in the handshake (max_handshakes = {})",
        oldest->peer, age(oldest->accepted_at).count(), conn.peer, handshaking_.size(),
        options_.max_handshakes));
    kill(*oldest);
  }
  return true;
}

TcpStoreServer::Loop::Connection* TcpStoreServer::Loop::oldest_evictable(
    const std::set<uint64_t>& ids) {
  if (ids.empty()) return nullptr;
  Connection* oldest = find(*ids.begin());
  if (oldest == nullptr || age(oldest->accepted_at) < kEvictableAfter) return nullptr;
  return oldest;
}

void TcpStoreServer::Loop::release_handshake_slot(Connection& conn) {
  if (!conn.in_handshake) return;
  conn.in_handshake = false;
  handshaking_.erase(conn.id);
  auto same = handshaking_by_address_.find(conn.address);
  if (same != handshaking_by_address_.end()) {
    same->second.erase(conn.id);
    if (same->second.empty()) handshaking_by_address_.erase(same);
  }
  if (paused_for_cap_ && handshaking_.size() < options_.max_handshakes) resume_listener();
}

void TcpStoreServer::Loop::handshake_done(Connection& conn) {
  conn.state = State::kReady;
  conn.timer_seq = 0;
  release_handshake_slot(conn);
}

void TcpStoreServer::Loop::log_cap(const std::string& message) {
  auto now = net::Clock::now();
  if (cap_logged_at_ != net::Clock::time_point{} && now - cap_logged_at_ < kCapLogInterval) {
    ++cap_logs_left_out_;
    return;
  }
  if (cap_logs_left_out_ > 0) {
    logger_->warn("{} ({} similar messages left out since the last one)", message,
                  cap_logs_left_out_);
  } else {
    logger_->warn("{}", message);
  }
  cap_logged_at_ = now;
  cap_logs_left_out_ = 0;
}

}  // namespace ddp
