#include "op_route.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::python {

bool overlapped_host_staging() {
  static const bool on = env::get_or("DDP_HOST_STAGING", "overlap") != "sync";
  return on;
}

OpRoute OpRoute::staged_from(c10::Device device) {
  const c10::impl::VirtualGuardImpl streams(device.type());
  OpRoute r;
  r.stream = streams.getStream(device);
  r.side = streams.getStreamFromGlobalPool(device);
  r.copied = std::make_shared<c10::Event>(device.type());
  return r;
}

at::Tensor OpRoute::buffer(const at::Tensor& t) const {
  if (on_device()) return t.contiguous();
  if (!overlapped() || t.is_cpu()) return host_contiguous(t);
  // The side stream copies after the kernels queued so far on the caller's stream (those that
  // wrote `t`), and `t`'s memory is not reused before that copy ran.
  const c10::impl::VirtualGuardImpl streams(t.device().type());
  c10::Event written(t.device().type());
  written.record(*stream);
  written.block(*side);
  streams.recordDataPtrOnStream(t.storage().data_ptr(), *side);
  at::Tensor host = at::empty(t.sizes(), options(t));
  c10::StreamGuard on_side(*side);
  host.copy_(t, /*non_blocking=*/true);
  copied->record(*side);  // after every copy queued so far on the side stream
  return host;
}

at::TensorOptions OpRoute::options(const at::Tensor& t) const {
  if (on_device()) return t.options();
  if (overlapped() && t.is_cuda()) return host_options(t).pinned_memory(true);
  return host_options(t);
}

at::Tensor OpRoute::pack(const std::vector<at::Tensor>& ts) const {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape(-1));
  return buffer(at::cat(flat));
}

void OpRoute::wait_copied(std::chrono::milliseconds limit) const {
  if (!copied) return;
  // Polled, not synchronize(): a GPU that never gets there (a hung kernel before the copies)
  // fails the operation after `limit` instead of holding the completer's thread forever. The
  // pause grows to 200 us: a copy takes from microseconds (a small tensor) to milliseconds.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::chrono::microseconds pause{10};
  while (!copied->query()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "ddp backend: the copies of an operation's CUDA tensors to host memory did not end "
          "within {} ms: the GPU is still busy with the work queued before them on the "
          "caller's stream, or hung",
          limit.count()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

void OpRoute::copy_back(const at::Tensor& dst, const at::Tensor& staged) const {
  if (staged.is_same(dst)) return;
  // From pinned memory: queued, not waited for; the caching host allocator keeps the block
  // until the copy ran, even when `staged` is freed first.
  dst.copy_(staged.view(dst.sizes()), /*non_blocking=*/stream.has_value());
}

}  // namespace ddp::python
