#include "ddp/store/wait_interrupter.hpp"

#include <utility>

namespace ddp {

void WaitInterrupter::interrupt() {
  std::lock_guard<std::mutex> lock(mutex_);
  interrupted_ = true;
  for (auto& [id, wake] : wakes_) wake();
}

bool WaitInterrupter::interrupted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return interrupted_;
}

void WaitInterrupter::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  interrupted_ = false;
}

WaitInterrupter::Registration WaitInterrupter::on_interrupt(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (interrupted_) wake();
  uint64_t id = next_id_++;
  wakes_.emplace(id, std::move(wake));
  return Registration(this, id);
}

WaitInterrupter::Registration::Registration(Registration&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}

WaitInterrupter::Registration& WaitInterrupter::Registration::operator=(
    Registration&& other) noexcept {
  if (this != &other) {
    Registration gone(std::move(*this));
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

WaitInterrupter::Registration::~Registration() {
  if (owner_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  owner_->wakes_.erase(id_);
}

}  // namespace ddp
