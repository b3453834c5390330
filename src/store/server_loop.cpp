// TcpStoreServer::Loop: sockets, epoll, timers and connection teardown. The request handlers
// (handshake, key-value operations, waiters) are in server_requests.cpp.
#include "server_loop.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp {

namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr int kMaxEvents = 256;
constexpr size_t kReadChunk = 64 * 1024;
// Bytes read from one connection per readiness event, so one busy client cannot starve others
// (epoll is level-triggered: the rest is read on the next round).
constexpr size_t kReadBudget = 1024 * 1024;
// How long a connection being closed after an error may take to read our error frame.
constexpr auto kLinger = std::chrono::seconds(1);
// Pause before accepting again when the process runs out of file descriptors.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

// The peer's IP address without the port ("10.0.0.7", "::1", "::ffff:10.0.0.7").
std::string address_text(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

TcpStoreServer::Loop::Loop(const TcpStoreServerOptions& options, net::Socket listener,
                           std::string token)
    : options_(options),
      listener_(std::move(listener)),
      token_(std::move(token)),
      logger_(log::get("ddp.store")) {
  standby_.store(options_.standby);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    throw NetworkError(
        fmt::format("store server: cannot create epoll/eventfd: {}", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listener_.fd(), &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

TcpStoreServer::Loop::~Loop() {
  conns_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void TcpStoreServer::Loop::request_stop() {
  stop_requested_.store(true);
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

void TcpStoreServer::Loop::run() {
  epoll_event events[kMaxEvents];
  while (!stop_requested_.load()) {
    int n = epoll_wait(epoll_fd_, events, kMaxEvents, next_timeout_ms());
    if (n < 0) {
      if (errno == EINTR) continue;
      logger_->error("store server: epoll_wait failed ({}); stopping", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      uint32_t flags = events[i].events;
      if (id == kListenerId) {
        accept_all();
        continue;
      }
      if (id == kWakeId) {
        // stop_requested_ is checked by the loop condition; the rest are tasks and the
        // replicator's progress.
        uint64_t count = 0;
        ssize_t ignored = ::read(wake_fd_, &count, sizeof(count));
        (void)ignored;
        run_posted();
        take_replica_progress();
        run_runnable();
        continue;
      }
      Connection* conn = find(id);
      if (conn == nullptr) continue;
      if (flags & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(*conn);
      if ((flags & EPOLLOUT) && conn->state != State::kDead) on_writable(*conn);
      run_runnable();
    }
    expire_timers();
    run_runnable();
    reap_dead();
  }
  replicator_.reset();  // joins its thread before the connections go
  size_t open = conns_.size();
  conns_.clear();
  num_connections_.store(0);
  logger_->debug("store server stopped; closed {} connections", open);
}

int TcpStoreServer::Loop::next_timeout_ms() {
  // Drop timers whose connection or waiter is gone so they do not wake the loop for nothing.
  while (!timers_.empty()) {
    const Timer& top = timers_.top();
    Connection* conn = find(top.conn_id);
    bool live = top.conn_id == kListenerId ||
                (conn != nullptr && ((conn->waiter.active && conn->waiter.seq == top.seq) ||
                                     conn->timer_seq == top.seq));
    if (live) break;
    timers_.pop();
  }
  if (timers_.empty()) return -1;
  return net::millis_until(timers_.top().at);
}

void TcpStoreServer::Loop::expire_timers() {
  auto now = net::Clock::now();
  while (!timers_.empty() && timers_.top().at <= now) {
    Timer timer = timers_.top();
    timers_.pop();
    if (timer.conn_id == kListenerId) {
      if (listener_paused_ && now >= listener_resume_at_) resume_listener();
      continue;
    }
    Connection* conn = find(timer.conn_id);
    if (conn == nullptr || conn->state == State::kDead) continue;
    if (conn->waiter.active && conn->waiter.seq == timer.seq) {
      time_out_waiter(*conn);
    } else if (conn->timer_seq == timer.seq) {
      if (conn->state == State::kClosing) {
        kill(*conn);
      } else if (conn->state == State::kHello || conn->state == State::kAuth) {
        logger_->warn("store server: closing {}: no handshake within {} ms", conn->peer,
                      options_.handshake_timeout.count());
        close_with_error(*conn, 0, store_protocol::kErrorProtocol,
                         fmt::format("handshake not completed within {} ms",
                                     options_.handshake_timeout.count()));
      }
    }
  }
}

void TcpStoreServer::Loop::accept_all() {
  for (;;) {
    // At the total cap a newcomer is accepted only if the oldest handshake may give way to it;
    // otherwise newcomers wait in the listen backlog (unread, no descriptor here) until a slot
    // frees or the oldest has waited long enough, so a burst of real clients is only delayed.
    if (handshaking_.size() >= options_.max_handshakes && !oldest_evictable(handshaking_)) {
      Connection* oldest = find(*handshaking_.begin());
      log_cap(fmt::format(
          "store server: {} connections are in the handshake (max_handshakes = {}); new "
          "connections wait in the listen backlog until one completes or has waited {} ms",
          handshaking_.size(), options_.max_handshakes, kEvictableAfter.count()));
      paused_for_cap_ = true;
      pause_listener(oldest->accepted_at + kEvictableAfter);
      return;
    }
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    int fd = ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&addr), &addr_len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop listening for a moment instead of spinning on the
        // level-triggered listener; pending clients wait in the backlog (and retry).
        logger_->error(
            "store server: cannot accept more clients ({}; {} open); raise the open "
            "files limit (ulimit -n)",
            std::strerror(errno), conns_.size());
        pause_listener(net::Clock::now() + kAcceptBackoff);
        return;
      }
      logger_->warn("store server: accept failed: {}", std::strerror(errno));
      return;
    }
    auto conn = std::make_unique<Connection>();
    conn->id = next_id_++;
    conn->sock = net::Socket(fd);
    conn->peer = net::peer_address(fd);
    conn->address = address_text(addr);
    conn->accepted_at = net::Clock::now();
    if (!admit(*conn)) continue;  // closes the socket
    net::set_nodelay(fd);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = conn->id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      logger_->warn("store server: cannot watch {}: {}", conn->peer, std::strerror(errno));
      continue;
    }
    add_timer(*conn, deadline_after(options_.handshake_timeout), conn->timer_seq);
    conn->in_handshake = true;
    handshaking_.insert(conn->id);
    handshaking_by_address_[conn->address].insert(conn->id);
    num_connections_.fetch_add(1);
    conns_.emplace(conn->id, std::move(conn));
  }
}

void TcpStoreServer::Loop::on_readable(Connection& conn) {
  size_t budget = kReadBudget;
  bool eof = false;
  while (budget > 0) {
    size_t old = conn.in.size();
    conn.in.resize(old + kReadChunk);
    ssize_t n = ::recv(conn.sock.fd(), conn.in.data() + old, kReadChunk, 0);
    conn.in.resize(old + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n > 0) {
      budget -= std::min(budget, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    // ECONNRESET and friends: the peer is gone; nothing can be sent back.
    logger_->debug("store server: {} reset the connection: {}", conn.peer, std::strerror(errno));
    kill(conn);
    return;
  }
  if (conn.state == State::kClosing) {
    conn.in.clear();  // discard: only waiting for the peer to read our error and leave
    conn.in_off = 0;
    if (eof) kill(conn);
    return;
  }
  process(conn);
  if (conn.state == State::kDead || conn.state == State::kClosing) return;
  if (eof) {
    if (conn.state == State::kAuth) {
      // A client whose token differs hangs up here, after checking our proof: it failed
      // authentication as surely as one that answered wrongly.
      auth_refusals_.fetch_add(1);
      logger_->warn(
          "store server: {} hung up during the auth handshake (a client with another token "
          "refuses this server's proof)",
          conn.peer);
    } else if (conn.waiter.active) {
      logger_->debug("store server: {} disconnected while waiting for {} keys", conn.peer,
                     conn.waiter.keys.size());
    } else if (conn.in.size() > conn.in_off) {
      logger_->warn("store server: {} disconnected in the middle of a frame ({} bytes unread)",
                    conn.peer, conn.in.size() - conn.in_off);
    }
    kill(conn);
    return;
  }
  // Requests stay buffered while one is pending; bound what a client may queue that way.
  size_t buffered = conn.in.size() - conn.in_off;
  size_t limit = frame_limit(conn);
  if (buffered > limit + store_protocol::kHeaderBytes) {
    std::string why = fmt::format(
        "{} bytes sent ahead of replies (limit {}){}", buffered, limit,
        conn.state == State::kReady ? "; wait for each reply" : " before authentication");
    logger_->warn("store server: closing {}: {}", conn.peer, why);
    close_with_error(conn, 0, store_protocol::kErrorProtocol, why);
  }
}

size_t TcpStoreServer::Loop::frame_limit(const Connection& conn) const {
  if (conn.state == State::kReady) return options_.max_frame_bytes;
  return std::min(options_.max_frame_bytes, options_.max_handshake_frame_bytes);
}

void TcpStoreServer::Loop::on_writable(Connection& conn) {
  flush(conn);
  if (conn.state == State::kReady && conn.out.empty()) runnable_.push_back(conn.id);
}

void TcpStoreServer::Loop::run_runnable() {
  while (!runnable_.empty()) {
    std::vector<uint64_t> batch;
    batch.swap(runnable_);
    for (uint64_t id : batch) {
      Connection* conn = find(id);
      if (conn != nullptr) process(*conn);
    }
  }
}

void TcpStoreServer::Loop::reap_dead() {
  for (uint64_t id : dead_) conns_.erase(id);
  dead_.clear();
}

void TcpStoreServer::Loop::reply(Connection& conn, Op op, uint32_t request_id,
                                 std::vector<std::string> fields) {
  if (conn.state == State::kDead) return;
  Frame frame;
  frame.op = op;
  frame.request_id = request_id;
  frame.fields = std::move(fields);
  conn.out += store_protocol::encode_frame(frame);
  flush(conn);
}

void TcpStoreServer::Loop::flush(Connection& conn) {
  while (conn.out_off < conn.out.size()) {
    ssize_t n = ::send(conn.sock.fd(), conn.out.data() + conn.out_off,
                       conn.out.size() - conn.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      conn.out_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!conn.want_write) {
        conn.want_write = true;
        update_interest(conn);
      }
      return;
    }
    logger_->debug("store server: sending to {} failed: {}", conn.peer, std::strerror(errno));
    kill(conn);
    return;
  }
  conn.out.clear();
  conn.out_off = 0;
  if (conn.want_write) {
    conn.want_write = false;
    update_interest(conn);
  }
  if (conn.state == State::kClosing) ::shutdown(conn.sock.fd(), SHUT_WR);
}

void TcpStoreServer::Loop::update_interest(Connection& conn) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (conn.want_write ? uint32_t{EPOLLOUT} : uint32_t{0});
  ev.data.u64 = conn.id;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, conn.sock.fd(), &ev);
}

void TcpStoreServer::Loop::close_with_error(Connection& conn, uint32_t request_id, const char* kind,
                                            const std::string& message) {
  if (conn.state == State::kDead || conn.state == State::kClosing) return;
  if (std::strcmp(kind, store_protocol::kErrorProtocol) == 0) protocol_errors_.fetch_add(1);
  unregister_waiter(conn);
  conn.state = State::kClosing;
  conn.in.clear();
  conn.in_off = 0;
  // The peer gets kLinger to read the error; after our FIN we keep reading (and discarding)
  // so that unread input does not turn the close into a reset that destroys the error frame.
  add_timer(conn, net::Clock::now() + kLinger, conn.timer_seq);
  reply(conn, Op::kError, request_id, {kind, message});
}

void TcpStoreServer::Loop::pause_listener(net::Clock::time_point until) {
  if (!listener_paused_) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listener_.fd(), nullptr);
    listener_paused_ = true;
  }
  listener_resume_at_ = until;
  timers_.push(Timer{until, kListenerId, 0});
}

void TcpStoreServer::Loop::resume_listener() {
  if (!listener_paused_) return;
  listener_paused_ = false;
  paused_for_cap_ = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listener_.fd(), &ev);
}

void TcpStoreServer::Loop::kill(Connection& conn) {
  if (conn.state == State::kDead) return;
  release_handshake_slot(conn);
  unregister_waiter(conn);
  conn.state = State::kDead;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, conn.sock.fd(), nullptr);
  conn.sock.close();
  num_connections_.fetch_sub(1);  // counts open sockets: this one is closed, if not yet reaped
  dead_.push_back(conn.id);
}

void TcpStoreServer::Loop::add_timer(Connection& conn, net::Clock::time_point at,
                                     uint64_t& seq_slot) {
  seq_slot = next_seq_++;
  timers_.push(Timer{at, conn.id, seq_slot});
}

TcpStoreServer::Loop::Connection* TcpStoreServer::Loop::find(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second->state == State::kDead) return nullptr;
  return it->second.get();
}

}  // namespace ddp
