#pragma once
// OpRoute: where one operation of a `ddp`-backend group runs and how its buffers get there,
// chosen when it is called (ProcessGroupDDP::route):
// - the NCCL lane (nccl_lane.hpp): CUDA tensors in device memory, the collective ordered after
//   the work queued on the caller's current stream;
// - the host group with overlapped staging: CUDA tensors copied to pinned host memory on a side
//   stream (after the work queued on the caller's stream), the operation issued by the group's
//   completer thread once those copies ended (so the calling thread, e.g. autograd's, goes on at
//   once), its results copied back on the caller's stream without blocking;
// - the host group as is: CPU tensors, and with DDP_HOST_STAGING=sync CUDA tensors staged by
//   synchronous copies on the calling thread (tensor_args.hpp).
// The CUDA parts use c10's device-generic streams and events (no CUDA headers): they compile in
// every build and run only where torch has CUDA.

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/extension.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "ddp/comm/nccl_process_group.hpp"
#include "tensor_args.hpp"

namespace ddp::python {

// Whether CUDA tensors that go through the host are staged with overlap (above): not when
// DDP_HOST_STAGING=sync (as for ddp's C++ DDP, src/torch/ddp/host_staging.hpp).
bool overlapped_host_staging();

struct OpRoute {
  std::shared_ptr<NcclProcessGroup> nccl;  // set: the lane's NCCL group
  // The caller's current stream on the CUDA tensors' device: for the lane and overlapped
  // staging (the Work's epilogue and future run on it: WorkDDP::set_stream).
  std::optional<c10::Stream> stream;
  // Overlapped staging: the stream the copies to the host run on, and an event recorded after
  // the last of them.
  std::optional<c10::Stream> side;
  std::shared_ptr<c10::Event> copied;

  // Overlapped staging of an operation whose CUDA tensors live on `device`.
  static OpRoute staged_from(c10::Device device);

  bool on_device() const { return nccl != nullptr; }
  bool overlapped() const { return side.has_value(); }

  // The buffer ddp reads and writes for `t`: `t` itself when it is contiguous and where the
  // operation runs, else a contiguous copy there (copied back with copy_back). Under overlapped
  // staging a CUDA tensor's copy is pinned host memory, filled on the side stream.
  at::Tensor buffer(const at::Tensor& t) const;
  // The options of a scratch buffer of `t`'s dtype where the operation runs (pinned host
  // memory under overlapped staging).
  at::TensorOptions options(const at::Tensor& t) const;
  // `ts` (equal dtype) packed into one contiguous 1-D buffer where the operation runs.
  at::Tensor pack(const std::vector<at::Tensor>& ts) const;
  // Blocks until the copies to the host ended (overlapped staging; nothing otherwise): before
  // the host collective reads them. TimeoutError after `limit`.
  void wait_copied(std::chrono::milliseconds limit) const;
  // Copies a result from `staged` (a buffer or a view of one) into `dst` unless they are the
  // same tensor: on the caller's stream without blocking where the route has one (the Work's
  // epilogue runs with it current), else synchronously (copy_back).
  void copy_back(const at::Tensor& dst, const at::Tensor& staged) const;
};

}  // namespace ddp::python
