// NcclProcessGroupImpl: every ProcessGroup operation as NCCL calls on the group's
// communication stream, ordered after the compute stream by an event (see the header for
// the stream contract). Operations NCCL lacks are grouped point-to-point calls:
// all_gather_v is one broadcast per rank, gather/scatter/all_to_all are sends and receives.
// Arguments are checked before anything is queued, so bad input is a UsageError on the
// calling rank, never a hang or a CUDA fault.

#include "ddp/comm/nccl_process_group.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda_util.hpp"
#include "ddp/store/store.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "nccl_bootstrap.hpp"
#include "nccl_communicator.hpp"
#include "nccl_watchdog.hpp"
#include "nccl_work.hpp"

namespace ddp {

namespace nccl_detail {
namespace {

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

const char* at(const void* base, size_t offset) {
  return static_cast<const char*>(base) + offset;
}
char* at(void* base, size_t offset) {
  return static_cast<char*>(base) + offset;
}

class NcclProcessGroupImpl final : public NcclProcessGroup {
 public:
  NcclProcessGroupImpl(int rank, int size, int device, const NcclOptions& options,
                       const ncclUniqueId& id)
      : NcclProcessGroup(rank, size, options.timeout),
        device_(device),
        blocking_wait_(options.blocking_wait),
        compute_stream_(std::make_shared<std::atomic<cudaStream_t>>(options.compute_stream)) {
    DeviceGuard guard(device_, rank_);
    try {
      check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking),
                 "cudaStreamCreate (communication stream)", rank_);
      check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate",
                 rank_);
      check_cuda(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc (barrier buffer)", rank_);
      communicator_ =
          std::make_unique<NcclCommunicator>(id, rank_, size_, timeout_, options.interrupt);
      if (const size_t entries = FlightRecorder::entries_from_env(); entries > 0) {
        FlightRecorderIdentity id;
        id.group = options.group_name + "/";
        id.backend = "nccl";
        id.rank = rank_;
        id.group_size = size_;
        id.global_ranks = options.member_ranks;
        if (id.global_ranks.empty()) {
          for (int r = 0; r < size_; ++r) id.global_ranks.push_back(r);
        }
        recorder_ = std::make_shared<FlightRecorder>(std::move(id), entries);
        FlightRecorder::install_dump_signal_handler();
        signals_seen_ = FlightRecorder::dump_signals_received();
      }
      watchdog_ = std::make_unique<NcclWatchdog>(
          *communicator_, device_, rank_, size_, options.watchdog_interval,
          [this](const std::string& reason) { abort_communicator(reason); },
          [this] { check_dump_request(); });
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclProcessGroupImpl() override { release(); }

  std::string backend_name() const override { return "nccl"; }

  FlightRecorder* flight_recorder() override { return recorder_.get(); }

  void set_compute_stream(CUstream_st* stream) override { compute_stream_->store(stream); }
  CUstream_st* compute_stream() const override { return compute_stream_->load(); }
  CUstream_st* communication_stream() const override { return comm_stream_; }
  int device() const override { return device_; }

  void abort(const std::string& reason) override {
    const std::string message = fmt::format(
        "nccl backend: rank {} of {}: the application aborted the group: {}", rank_, size_, reason);
    abort_communicator(message);
    watchdog_->fail_all(message);
  }

  // In-place recovery (RecoverableGroup's watcher): the communicator is aborted (it is
  // non-blocking, so the abort returns at once) and every pending and later operation fails
  // with `cause` itself, a PeerLostError, which StepManager takes for the announced loss.
  void notify_peer_lost(const PeerLostError& cause) override {
    {
      std::lock_guard<std::mutex> guard(peer_lost_mutex_);
      if (peer_lost_) return;  // the first cause wins
      peer_lost_ = std::make_exception_ptr(cause);
    }
    abort_communicator(cause.what());
    watchdog_->fail_all(peer_lost());
  }

  WorkPtr all_reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    const std::string what =
        fmt::format("all_reduce({}, {} x {})", to_string(op), to_string(dtype), count);
    const ncclDataType_t type = to_nccl(dtype);
    const ncclRedOp_t nccl_op = to_nccl(op);
    check_buffer(data, count * element_size(dtype), "data", what);
    return launch(
        what, false, record("all_reduce", dtype, count, op), [&](const std::string& label) {
          if (count == 0) return;
          nccl(ncclAllReduce(data, data, count, type, nccl_op, comm(), comm_stream_), label);
        });
  }

  WorkPtr broadcast(void* data, size_t count, DataType dtype, int root) override {
    const std::string what =
        fmt::format("broadcast({} x {}, root {})", to_string(dtype), count, root);
    const ncclDataType_t type = to_nccl(dtype);
    check_rank(root, "root", what);
    check_buffer(data, count * element_size(dtype), "data", what);
    return launch(what, false, record("broadcast", dtype, count, std::nullopt, root),
                  [&](const std::string& label) {
                    if (count == 0) return;
                    nccl(ncclBroadcast(data, data, count, type, root, comm(), comm_stream_), label);
                  });
  }

  WorkPtr reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root) override {
    const std::string what =
        fmt::format("reduce({}, {} x {}, root {})", to_string(op), to_string(dtype), count, root);
    const ncclDataType_t type = to_nccl(dtype);
    const ncclRedOp_t nccl_op = to_nccl(op);
    check_rank(root, "root", what);
    check_buffer(data, count * element_size(dtype), "data", what);
    return launch(
        what, false, record("reduce", dtype, count, op, root), [&](const std::string& label) {
          if (count == 0) return;
          nccl(ncclReduce(data, data, count, type, nccl_op, root, comm(), comm_stream_), label);
        });
  }

  WorkPtr all_gather(const void* in, void* out, size_t count, DataType dtype) override {
    const std::string what = fmt::format("all_gather({} x {})", to_string(dtype), count);
    const ncclDataType_t type = to_nccl(dtype);
    const size_t block = count * element_size(dtype);
    check_buffer(in, block, "in", what);
    check_buffer(out, block * size_, "out", what);
    check_in_place_or_disjoint(in, block, out, block * size_, rank_ * block, what);
    return launch(what, false, record("all_gather", dtype, count), [&](const std::string& label) {
      if (count == 0) return;
      nccl(ncclAllGather(in, out, count, type, comm(), comm_stream_), label);
    });
  }

  WorkPtr all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                       DataType dtype) override {
    const std::string what =
        fmt::format("all_gather_v({}, {} counts)", to_string(dtype), counts.size());
    const ncclDataType_t type = to_nccl(dtype);
    if (counts.size() != static_cast<size_t>(size_)) {
      throw UsageError(fmt::format(
          "nccl backend: rank {}: {}: counts has {} entries but the group has {} ranks; pass one "
          "count per rank",
          rank_, what, counts.size(), size_));
    }
    const size_t element = element_size(dtype);
    std::vector<size_t> offsets(counts.size());
    size_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = total * element;
      total += counts[r];
    }
    const size_t mine = counts[static_cast<size_t>(rank_)] * element;
    check_buffer(in, mine, "in", what);
    check_buffer(out, total * element, "out", what);
    check_in_place_or_disjoint(in, mine, out, total * element, offsets[static_cast<size_t>(rank_)],
                               what);
    return launch(what, false, record("all_gather_v", dtype, total), [&](const std::string& label) {
      grouped(label, [&] {
        // One broadcast per contributing rank: every rank skips the same empty blocks.
        for (int r = 0; r < size_; ++r) {
          if (counts[r] == 0) continue;
          const void* send = r == rank_ ? in : at(out, offsets[r]);
          nccl(ncclBroadcast(send, at(out, offsets[r]), counts[r], type, r, comm(), comm_stream_),
               label);
        }
      });
    });
  }

  WorkPtr gather(const void* in, void* out, size_t count, DataType dtype, int root) override {
    const std::string what = fmt::format("gather({} x {}, root {})", to_string(dtype), count, root);
    const ncclDataType_t type = to_nccl(dtype);
    check_rank(root, "root", what);
    const size_t block = count * element_size(dtype);
    check_buffer(in, block, "in", what);
    if (rank_ == root) {
      check_buffer(out, block * size_, "out", what);
      check_in_place_or_disjoint(in, block, out, block * size_, root * block, what);
    }
    return launch(what, false, record("gather", dtype, count, std::nullopt, root),
                  [&](const std::string& label) {
                    if (count == 0) return;
                    if (rank_ == root) copy(at(out, root * block), in, block);
                    grouped(label, [&] {
                      if (rank_ != root)
                        return nccl(ncclSend(in, count, type, root, comm(), comm_stream_), label);
                      for (int r = 0; r < size_; ++r) {
                        if (r == root) continue;
                        nccl(ncclRecv(at(out, r * block), count, type, r, comm(), comm_stream_),
                             label);
                      }
                    });
                  });
  }

  WorkPtr scatter(const void* in, void* out, size_t count, DataType dtype, int root) override {
    const std::string what =
        fmt::format("scatter({} x {}, root {})", to_string(dtype), count, root);
    const ncclDataType_t type = to_nccl(dtype);
    check_rank(root, "root", what);
    const size_t block = count * element_size(dtype);
    check_buffer(out, block, "out", what);
    if (rank_ == root) {
      check_buffer(in, block * size_, "in", what);
      check_in_place_or_disjoint(out, block, in, block * size_, root * block, what);
    }
    return launch(what, false, record("scatter", dtype, count, std::nullopt, root),
                  [&](const std::string& label) {
                    if (count == 0) return;
                    if (rank_ == root) copy(out, at(in, root * block), block);
                    grouped(label, [&] {
                      if (rank_ != root)
                        return nccl(ncclRecv(out, count, type, root, comm(), comm_stream_), label);
                      for (int r = 0; r < size_; ++r) {
                        if (r == root) continue;
                        nccl(ncclSend(at(in, r * block), count, type, r, comm(), comm_stream_),
                             label);
                      }
                    });
                  });
  }

  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                         ReduceOp op) override {
    const std::string what =
        fmt::format("reduce_scatter({}, {} x {})", to_string(op), to_string(dtype), count);
    const ncclDataType_t type = to_nccl(dtype);
    const ncclRedOp_t nccl_op = to_nccl(op);
    const size_t block = count * element_size(dtype);
    check_buffer(in, block * size_, "in", what);
    check_buffer(out, block, "out", what);
    check_in_place_or_disjoint(out, block, in, block * size_, rank_ * block, what);
    return launch(
        what, false, record("reduce_scatter", dtype, count, op), [&](const std::string& label) {
          if (count == 0) return;
          nccl(ncclReduceScatter(in, out, count, type, nccl_op, comm(), comm_stream_), label);
        });
  }

  WorkPtr all_to_all(const void* in, void* out, size_t count, DataType dtype) override {
    const std::string what = fmt::format("all_to_all({} x {})", to_string(dtype), count);
    const ncclDataType_t type = to_nccl(dtype);
    const size_t block = count * element_size(dtype);
    check_buffer(in, block * size_, "in", what);
    check_buffer(out, block * size_, "out", what);
    if (overlaps(in, block * size_, out, block * size_)) {
      throw UsageError(fmt::format(
          "nccl backend: rank {}: {}: in and out overlap; NCCL needs separate buffers for "
          "all_to_all",
          rank_, what));
    }
    return launch(what, false, record("all_to_all", dtype, count), [&](const std::string& label) {
      if (count == 0) return;
      copy(at(out, rank_ * block), at(in, rank_ * block), block);
      grouped(label, [&] {
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          nccl(ncclSend(at(in, r * block), count, type, r, comm(), comm_stream_), label);
          nccl(ncclRecv(at(out, r * block), count, type, r, comm(), comm_stream_), label);
        }
      });
    });
  }

  WorkPtr barrier() override {
    // An all-reduce of one scratch element; its Work blocks the host, as a barrier must.
    return launch("barrier", true, record("barrier", DataType::kFloat32, 0),
                  [&](const std::string& label) {
                    nccl(ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum,
                                       comm(), comm_stream_),
                         label);
                  });
  }

  WorkPtr send(const void* data, size_t count, DataType dtype, int dst, int tag) override {
    const std::string what =
        fmt::format("send({} x {}, to rank {}, tag {})", to_string(dtype), count, dst, tag);
    const ncclDataType_t type = to_nccl(dtype);
    check_peer(dst, "dst", tag, what);
    check_buffer(data, count * element_size(dtype), "data", what);
    return launch(what, false, std::nullopt, [&](const std::string& label) {
      if (count == 0) return;
      nccl(ncclSend(data, count, type, dst, comm(), comm_stream_), label);
    });
  }

  WorkPtr recv(void* data, size_t count, DataType dtype, int src, int tag) override {
    const std::string what =
        fmt::format("recv({} x {}, from rank {}, tag {})", to_string(dtype), count, src, tag);
    const ncclDataType_t type = to_nccl(dtype);
    check_peer(src, "src", tag, what);
    check_buffer(data, count * element_size(dtype), "data", what);
    return launch(what, false, std::nullopt, [&](const std::string& label) {
      if (count == 0) return;
      nccl(ncclRecv(data, count, type, src, comm(), comm_stream_), label);
    });
  }

 private:
  ncclComm_t comm() const { return communicator_->get(); }

  // Queues one operation: the communication stream waits for the compute stream, `body`
  // queues the NCCL calls, and a completion event is recorded for the Work and the watchdog.
  // `info`: the flight recorder entry of a collective (nullopt for send/recv, whose order
  // differs between ranks). Its state is "started" once queued on the stream (the host cannot
  // see the GPU start it) and "completed" when the watchdog or a Work sees its event fire.
  template <class Body>
  WorkPtr launch(const std::string& what, bool block_host, std::optional<CollectiveRecordInfo> info,
                 Body&& body) {
    std::lock_guard<std::mutex> guard(launch_mutex_);
    if (const std::exception_ptr lost = peer_lost()) std::rethrow_exception(lost);
    communicator_->throw_if_aborting();
    DeviceGuard device(device_, rank_);
    auto state =
        std::make_shared<CollectiveState>(what, ++sequence_, rank_, size_, device_, timeout_);
    if (recorder_ && info) {
      info->seq = ++collective_sequence_;
      state->record_id = recorder_->record(*info);
      recorder_->started(state->record_id);
      state->recorder = recorder_;
    }
    const std::string label = fmt::format("{} (sequence {})", what, state->sequence);
    check_cuda(cudaEventRecord(ready_, compute_stream_->load()),
               "cudaEventRecord on the compute stream", rank_);
    check_cuda(cudaStreamWaitEvent(comm_stream_, ready_, 0),
               "cudaStreamWaitEvent (communication stream on the compute stream)", rank_);
    body(label);
    check_cuda(cudaEventRecord(state->done, comm_stream_),
               "cudaEventRecord on the communication stream", rank_);
    watchdog_->watch(state);
    return std::make_shared<NcclWork>(state, compute_stream_, block_host || blocking_wait_);
  }

  void nccl(ncclResult_t result, const std::string& label) { communicator_->check(result, label); }

  std::exception_ptr peer_lost() {
    std::lock_guard<std::mutex> guard(peer_lost_mutex_);
    return peer_lost_;
  }

  // ncclGroupStart/End around `calls`; the group is closed even when a call throws.
  template <class Calls>
  void grouped(const std::string& label, Calls&& calls) {
    nccl(ncclGroupStart(), label);
    try {
      calls();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    nccl(ncclGroupEnd(), label);
  }

  // Device-to-device copy on the communication stream (a rank's own block).
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, comm_stream_),
               "cudaMemcpyAsync (own block)", rank_);
  }

  static CollectiveRecordInfo record(const char* op, DataType dtype, size_t count,
                                     std::optional<ReduceOp> reduce = std::nullopt, int root = -1) {
    return CollectiveRecordInfo::of(op, dtype, count, reduce, root);
  }

  // Writes this rank's flight record once (DDP_FLIGHT_RECORDER_DIR, else a temporary folder).
  // There is no store watcher: a rank dumps when its own watchdog aborts the group, or when
  // the launcher asks (the dump signal, checked every watchdog round).
  void dump_record(const std::string& reason) {
    if (!recorder_ || dumped_.exchange(true)) return;
    try {
      const std::string path = recorder_->dump_to_file(reason, FlightRecorder::dir_from_env());
      log::get("ddp.nccl")
          ->warn("flight recorder: rank {} of {} (backend nccl) wrote {} ({})", rank_, size_, path,
                 reason);
    } catch (const std::exception& e) {
      log::get("ddp.nccl")
          ->error("flight recorder: rank {} of {} (backend nccl) could not write its record: {}",
                  rank_, size_, e.what());
    }
  }

  void check_dump_request() {
    if (recorder_ && FlightRecorder::dump_signals_received() != signals_seen_) {
      dump_record("requested by the launcher (a rank of the job failed)");
    }
  }

  void abort_communicator(const std::string& reason) {
    dump_record(reason);
    communicator_->request_abort(reason);
    std::lock_guard<std::mutex> guard(launch_mutex_);
    communicator_->abort();
  }

  void release() {
    watchdog_.reset();      // joins the thread before what it watches goes away
    communicator_.reset();  // finalises, bounded by the timeout, or aborts
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
    barrier_buffer_ = nullptr;
    ready_ = nullptr;
    comm_stream_ = nullptr;
    if (previous >= 0) cudaSetDevice(previous);
  }

  void check_rank(int root, const char* name, const std::string& what) const {
    if (root < 0 || root >= size_) {
      throw UsageError(
          fmt::format("nccl backend: rank {}: {}: {} {} is not a rank of this group; pass 0..{}",
                      rank_, what, name, root, size_ - 1));
    }
  }

  void check_peer(int peer, const char* name, int tag, const std::string& what) const {
    check_rank(peer, name, what);
    if (peer == rank_) {
      throw UsageError(fmt::format(
          "nccl backend: rank {}: {}: a rank cannot send to or receive from itself outside a "
          "collective; copy the buffer on the device instead",
          rank_, what));
    }
    if (tag < 0) {
      throw UsageError(
          fmt::format("nccl backend: rank {}: {}: tag {} is negative; pass a tag >= 0 (NCCL "
                      "matches send/recv in issue order, the tag is not transmitted)",
                      rank_, what, tag));
    }
  }

  // Device memory of this group's device (or managed memory), non-null when bytes > 0.
  void check_buffer(const void* buffer, size_t bytes, const char* name,
                    const std::string& what) const {
    if (bytes == 0) return;
    if (buffer == nullptr) {
      throw UsageError(fmt::format("nccl backend: rank {}: {}: {} is null but holds {} bytes",
                                   rank_, what, name, bytes));
    }
    cudaPointerAttributes attributes{};
    const cudaError_t result = cudaPointerGetAttributes(&attributes, buffer);
    if (result != cudaSuccess) {
      cudaGetLastError();
      throw UsageError(fmt::format(
          "nccl backend: rank {}: {}: {} is not CUDA memory ({}); NCCL needs device memory on "
          "cuda:{}",
          rank_, what, name, cudaGetErrorString(result), device_));
    }
    if (attributes.type == cudaMemoryTypeManaged) return;
    if (attributes.type != cudaMemoryTypeDevice) {
      throw UsageError(fmt::format(
          "nccl backend: rank {}: {}: {} is host memory; NCCL needs device memory on cuda:{}: "
          "copy the data to the GPU first, or use the cpu backend for host buffers",
          rank_, what, name, device_));
    }
    if (attributes.device != device_) {
      throw UsageError(fmt::format(
          "nccl backend: rank {}: {}: {} lives on cuda:{} but this group runs on cuda:{}; "
          "allocate it on the group's device",
          rank_, what, name, attributes.device, device_));
    }
  }

  // NCCL supports a block of the larger buffer being exactly the other (in-place); any other
  // overlap would corrupt data.
  void check_in_place_or_disjoint(const void* block, size_t block_bytes, const void* whole,
                                  size_t whole_bytes, size_t in_place_offset,
                                  const std::string& what) const {
    if (!overlaps(block, block_bytes, whole, whole_bytes)) return;
    if (block == at(whole, in_place_offset)) return;
    throw UsageError(fmt::format(
        "nccl backend: rank {}: {}: the buffers overlap, but not as the in-place form (this "
        "rank's block at byte offset {} of the larger buffer); use separate buffers",
        rank_, what, in_place_offset));
  }

  const int device_;
  const bool blocking_wait_;
  StreamCell compute_stream_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream before each operation
  void* barrier_buffer_ = nullptr;
  std::unique_ptr<NcclCommunicator> communicator_;
  std::unique_ptr<NcclWatchdog> watchdog_;
  std::mutex launch_mutex_;  // one operation queued at a time: NCCL needs one issue order
  uint64_t sequence_ = 0;
  uint64_t collective_sequence_ = 0;          // flight recorder sequence numbers (no send/recv)
  std::shared_ptr<FlightRecorder> recorder_;  // null: DDP_FLIGHT_RECORDER_ENTRIES=0
  uint64_t signals_seen_ = 0;
  std::atomic<bool> dumped_{false};
  std::mutex peer_lost_mutex_;
  std::exception_ptr peer_lost_;  // under peer_lost_mutex_: notify_peer_lost's cause
};

int visible_devices(int rank) {
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw UsageError(fmt::format(
        "nccl backend: rank {}: no CUDA device is visible ({}): the nccl backend needs one GPU "
        "per rank; check the driver and CUDA_VISIBLE_DEVICES={}, or use the cpu backend",
        rank, result == cudaSuccess ? "0 devices" : cudaGetErrorString(result),
        env::get_or("CUDA_VISIBLE_DEVICES", "<unset>")));
  }
  return count;
}

}  // namespace
}  // namespace nccl_detail

ProcessGroupPtr make_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                        int device, const NcclOptions& options) {
  using namespace nccl_detail;
  if (!store) throw UsageError("nccl backend: store is null; pass the rendezvous store");
  if (size < 1 || rank < 0 || rank >= size) {
    throw UsageError(fmt::format(
        "nccl backend: rank {} and size {} do not describe a group; need 0 <= rank < size", rank,
        size));
  }
  if (options.timeout.count() <= 0 || options.watchdog_interval.count() <= 0) {
    throw UsageError(
        fmt::format("nccl backend: timeout ({} ms) and watchdog_interval ({} ms) must be positive",
                    options.timeout.count(), options.watchdog_interval.count()));
  }
  if (!options.member_ranks.empty() && static_cast<int>(options.member_ranks.size()) != size) {
    throw UsageError(fmt::format(
        "nccl backend: rank {}: member_ranks lists {} ranks but the group has {}; pass the "
        "global rank of every member, in group-rank order",
        rank, options.member_ranks.size(), size));
  }
  const int devices = visible_devices(rank);
  if (device < 0 || device >= devices) {
    throw UsageError(fmt::format(
        "nccl backend: rank {}: device {} is not visible: this process sees {} CUDA device(s) "
        "(CUDA_VISIBLE_DEVICES={}); pass LOCAL_RANK % {} or fix CUDA_VISIBLE_DEVICES",
        rank, device, devices, env::get_or("CUDA_VISIBLE_DEVICES", "<unset>"), devices));
  }
  GroupIdentity group{options.group_name, size, options.member_ranks};
  if (!options.host_id.empty()) {
    check_one_rank_per_gpu(*store, group, rank, options.timeout,
                           options.host_id + "/" + cuda_pci_bus_id(device), options.interrupt);
  }
  const ncclUniqueId id =
      exchange_unique_id(*store, group, rank, options.timeout, options.interrupt);
  return std::make_shared<NcclProcessGroupImpl>(rank, size, device, options, id);
}

ProcessGroupPtr make_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                        int device, std::chrono::milliseconds timeout) {
  return make_nccl_process_group(std::move(store), rank, size, device,
                                 NcclOptions::from_env(timeout));
}

}  // namespace ddp
