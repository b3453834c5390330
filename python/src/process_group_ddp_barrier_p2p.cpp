// Barriers (barrier, and monitored_barrier through the store, naming the ranks that never
// arrived) and point-to-point send and receive of the ddp backend.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "ddp/util/error.hpp"
#include "process_group_ddp.hpp"
#include "tensor_args.hpp"

namespace ddp::python {

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::barrier(const c10d::BarrierOptions& opts) {
  if (opts.timeout == c10d::kUnsetTimeout) {
    auto start = [this] { return std::vector<WorkPtr>{live()->barrier()}; };
    return make_work(c10d::OpType::BARRIER, start, nullptr, {});
  }
  // dist.barrier(timeout=...): ddp's barrier collective waits up to the group's timeout in the
  // caller's thread, so a per-call limit is kept by the monitored barrier below, after this
  // group's earlier operations finished (within the same limit), as a barrier orders them.
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  std::deque<c10::intrusive_ptr<WorkDDP>> earlier;
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    earlier = in_flight_;
  }
  for (auto& w : earlier) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    w->wait(std::max(left, std::chrono::milliseconds(1)));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  monitored_barrier(std::max(left, std::chrono::milliseconds(0)), false, "barrier", opts.timeout);
  return make_work(c10d::OpType::BARRIER, [] { return std::vector<WorkPtr>{}; }, nullptr, {});
}

void ProcessGroupDDP::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // An unset timeout (-1) means the group's; 0 is a timeout of 0 ms, as for gloo.
  const auto limit = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  monitored_barrier(limit, wait_all_ranks, "monitored_barrier", limit);
}

void ProcessGroupDDP::monitored_barrier(std::chrono::milliseconds limit, bool wait_all_ranks,
                                        const char* op, std::chrono::milliseconds stated) {
  if (group_size() == 1) return;
  // Through the group's store, as gloo's monitored barrier goes through its own messages:
  // every rank sets its key, rank 0 watches them until `limit` and then writes the outcome
  // every rank waits for. Store requests leave nothing pending behind a failed barrier (a
  // posted receive would hold the group's teardown for the group timeout), and the keys of
  // each call are its own.
  const int64_t seq = monitored_seq_++;
  const std::string prefix = fmt::format("ddp_monitored_barrier/{}/", seq);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const std::string outcome_key = prefix + "outcome";
  try {
    store_->set(prefix + std::to_string(group_rank()), std::vector<uint8_t>{1});
    if (group_rank() != 0) {
      store_->wait({outcome_key}, left());
      const auto outcome = store_->get(outcome_key);
      if (outcome.empty() || outcome[0] != 'o') {
        throw TimeoutError(fmt::format("{}: rank 0 reported: {}", op,
                                       std::string(outcome.begin(), outcome.end())));
      }
      return;
    }
    if (seq >= 2) {
      // The keys of the call two before: every rank arrived at the previous call, so all read
      // that one's outcome. (One call before could still be read by a slow rank.)
      const std::string old = fmt::format("ddp_monitored_barrier/{}/", seq - 2);
      try {
        for (int r = 0; r < group_size(); ++r) store_->deleteKey(old + std::to_string(r));
        store_->deleteKey(old + "outcome");
      } catch (const c10::Error&) {
        // A store without deleteKey keeps them: a few bytes per call.
      }
    }
    std::vector<int> missing;
    for (int r = 1; r < group_size(); ++r) {
      const std::string key = prefix + std::to_string(r);
      while (!store_->check({key}) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (!store_->check({key})) {
        missing.push_back(r);
        if (!wait_all_ranks) break;
      }
    }
    std::string outcome = "ok";
    if (!missing.empty()) {
      outcome = fmt::format(
          "{} {} failed to pass the barrier within {} ms (rank 0 of {}); they crashed, hang or "
          "run something else{}",
          missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "), stated.count(),
          group_size(), wait_all_ranks ? "" : " (wait_all_ranks=True lists every missing rank)");
    }
    store_->set(outcome_key, std::vector<uint8_t>(outcome.begin(), outcome.end()));
    if (!missing.empty()) throw TimeoutError(fmt::format("{}: {}", op, outcome));
  } catch (const c10::Error& e) {
    // The store's own timeout (DistStoreError): rank 0 wrote no outcome in time.
    throw TimeoutError(fmt::format(
        "{}: rank {} was not released by rank 0 within {} ms: rank 0 did not reach the barrier "
        "or is still waiting for other ranks (its error names them): {}",
        op, group_rank(), stated.count(), e.what_without_backtrace()));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  const auto& t = single_tensor(tensors, "send");
  if (dst < 0 || dst >= group_size() || dst == group_rank()) {
    throw UsageError(fmt::format("send: destination rank {} is invalid for rank {} of {}", dst,
                                 group_rank(), group_size()));
  }
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto start = [this, buf, e, dst, tag] {
    return std::vector<WorkPtr>{live()->send(buf.data_ptr(), e.count, e.dtype, dst, tag)};
  };
  return make_work(c10d::OpType::SEND, start, [buf] {}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  const auto& t = single_tensor(tensors, "recv");
  if (src < 0 || src >= group_size() || src == group_rank()) {
    throw UsageError(fmt::format("recv: source rank {} is invalid for rank {} of {}", src,
                                 group_rank(), group_size()));
  }
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto start = [this, buf, e, src, tag] {
    return std::vector<WorkPtr>{live()->recv(buf.data_ptr(), e.count, e.dtype, src, tag)};
  };
  return make_work(c10d::OpType::RECV, start, [t, buf] { copy_back(t, buf); }, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  const auto& t = single_tensor(tensors, "recv");
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto source = std::make_shared<int>(-1);
  auto start = [this, buf, e, tag, source] {
    return std::vector<WorkPtr>{
        live()->recv_any_source(buf.data_ptr(), e.count, e.dtype, tag, source)};
  };
  auto work = make_work(c10d::OpType::RECVANYSOURCE, start, [t, buf] { copy_back(t, buf); }, {t});
  work->set_source(source);
  return work;
}

}  // namespace ddp::python
