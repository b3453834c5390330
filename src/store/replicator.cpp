#include "replicator.hpp"

#include <fmt/format.h>

#include <memory>

#include "ddp/store/tcp_store.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp {

Replicator::Replicator(std::string host, uint16_t port, std::string token,
                       std::chrono::milliseconds request_timeout, std::function<void()> wake)
    : host_(std::move(host)),
      port_(port),
      endpoint_(net::format_endpoint(host_, port_)),
      token_(std::move(token)),
      request_timeout_(request_timeout),
      wake_(std::move(wake)) {
  thread_ = std::thread([this] { run(); });
}

Replicator::~Replicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Replicator::push(Write write) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(write));
  cv_.notify_all();
  return ++pushed_;
}

uint64_t Replicator::acknowledged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return acknowledged_;
}

std::optional<std::string> Replicator::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void Replicator::run() {
  std::unique_ptr<TcpStore> standby;
  try {
    TcpStoreOptions o;
    o.host = host_;
    o.port = port_;
    o.token = token_;
    o.role = store_protocol::kReplicaRole;
    o.timeout = request_timeout_;
    o.connect_retry = request_timeout_;
    standby = std::make_unique<TcpStore>(o);
    for (;;) {
      Write next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      standby->replicate(next.client_id, next.request_id, next.op, std::move(next.fields));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++acknowledged_;
      }
      wake_();
    }
  } catch (const Error& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      failed_ = e.what();
    }
    wake_();
  }
}

}  // namespace ddp
