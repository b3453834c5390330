#include "ddp/store/tcp_store_server.hpp"

#include <fmt/format.h>

#include "ddp/store/auth.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "ddp/util/socket.hpp"
#include "server_loop.hpp"

namespace ddp {

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : options_(std::move(options)) {
  if (options_.max_handshakes == 0 || options_.max_handshakes_per_address == 0) {
    throw UsageError(fmt::format(
        "TcpStoreServerOptions: max_handshakes ({}) and max_handshakes_per_address ({}) must "
        "be at least 1, or no client could ever connect",
        options_.max_handshakes, options_.max_handshakes_per_address));
  }
  net::raise_fd_limit();
  net::Socket listener = net::listen_tcp(options_.host, options_.port, options_.backlog);
  port_ = net::local_port(listener.fd());
  loop_ = std::make_unique<Loop>(options_, std::move(listener),
                                 store_auth::resolve_token(options_.token));
  log::get("ddp.store")
      ->debug("store server listening on {}{}",
              net::format_endpoint(options_.host.empty() ? "0.0.0.0" : options_.host, port_),
              loop_->auth_required() ? " (auth token required)" : "");
}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

void TcpStoreServer::start() {
  if (running_.exchange(true)) {
    throw UsageError("TcpStoreServer::start: the server is already serving; call start() once");
  }
  thread_ = std::thread([this] { loop_->run(); });
}

void TcpStoreServer::run() {
  if (running_.exchange(true)) {
    throw UsageError("TcpStoreServer::run: the server is already serving; call run() once");
  }
  loop_->run();
}

void TcpStoreServer::stop() {
  if (!loop_) return;
  loop_->request_stop();
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::replicate_to(std::vector<std::string> standbys,
                                  std::chrono::milliseconds request_timeout) {
  loop_->replicate_to(std::move(standbys), request_timeout);
}

bool TcpStoreServer::is_standby() const {
  return loop_->is_standby();
}

std::string TcpStoreServer::replica() const {
  return loop_->replica();
}

size_t TcpStoreServer::num_connections() const {
  return loop_->num_connections();
}
size_t TcpStoreServer::num_waiting() const {
  return loop_->num_waiting();
}
uint64_t TcpStoreServer::num_auth_refusals() const {
  return loop_->num_auth_refusals();
}
uint64_t TcpStoreServer::num_protocol_errors() const {
  return loop_->num_protocol_errors();
}

}  // namespace ddp
