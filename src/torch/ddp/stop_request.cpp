#include "ddp/torch/ddp/stop_request.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

// How often each signal number arrived while some StopRequest handled it (signals are
// process-wide, so this is too). Lock-free atomics are all a signal handler may touch.
constexpr int kMaxSignal = 64;
std::atomic<uint32_t> g_arrivals[kMaxSignal];
static_assert(std::atomic<uint32_t>::is_always_lock_free);

void on_signal(int signo) {
  if (signo > 0 && signo < kMaxSignal) g_arrivals[signo].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

StopRequest::StopRequest(StopRequestOptions options) : signals_(options.signals()) {
  for (int s : signals_) {
    if (s <= 0 || s >= kMaxSignal || s == SIGKILL || s == SIGSTOP) {
      throw UsageError(fmt::format(
          "StopRequestOptions::signals: signal {} cannot be caught; use SIGUSR1, SIGUSR2, "
          "SIGTERM, SIGINT or another catchable signal below 64",
          s));
    }
  }
  saved_.resize(signals_.size());
  // Only arrivals from now on count: an earlier StopRequest's signal is not this one's.
  for (int s : signals_) baseline_.push_back(g_arrivals[s].load(std::memory_order_relaxed));
  for (size_t i = 0; i < signals_.size(); ++i) {
    struct sigaction action = {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a read or a wait in progress goes on
    if (::sigaction(signals_[i], &action, &saved_[i]) != 0) {
      const int err = errno;
      for (size_t k = 0; k < i; ++k) ::sigaction(signals_[k], &saved_[k], nullptr);
      throw Error(
          fmt::format("StopRequest: cannot handle signal {}: {}", signals_[i], std::strerror(err)));
    }
  }
}

StopRequest::~StopRequest() {
  for (size_t i = signals_.size(); i-- > 0;) ::sigaction(signals_[i], &saved_[i], nullptr);
}

void StopRequest::request() noexcept {
  requested_.store(true, std::memory_order_relaxed);
}

bool StopRequest::requested() const noexcept {
  return requested_.load(std::memory_order_relaxed) || signal() != 0;
}

int StopRequest::signal() const noexcept {
  for (size_t i = 0; i < signals_.size(); ++i) {
    if (g_arrivals[signals_[i]].load(std::memory_order_relaxed) != baseline_[i]) {
      return signals_[i];
    }
  }
  return 0;
}

void StopRequest::incoming(at::Tensor reduced, int64_t iteration) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (agreed_) return;
  pending_ = std::move(reduced);
  pending_iteration_ = iteration;
}

bool StopRequest::agreed() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (agreed_ || !pending_.defined()) return agreed_;
  // Exact zeros sum to exactly zero in any dtype: non-zero means some rank sent 1.
  agreed_ = pending_.item<double>() != 0.0;
  if (agreed_) agreed_iteration_ = pending_iteration_;
  pending_ = at::Tensor();
  return agreed_;
}

int64_t StopRequest::agreed_iteration() {
  return agreed() ? agreed_iteration_ : 0;
}

bool StopRequest::agree(ProcessGroup& pg) {
  auto flag = torch::tensor({outgoing()}, torch::kFloat64).to(comm_device(pg));
  wait_on_current_stream(pg, *all_reduce(pg, flag, ReduceOp::kSum), pg.timeout());
  int64_t iteration;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    iteration = pending_iteration_ + 1;
  }
  incoming(flag, iteration);
  return agreed();
}

}  // namespace ddp
