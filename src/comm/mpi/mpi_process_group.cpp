// MpiProcessGroup: every ProcessGroup operation as one non-blocking MPI call on a duplicate
// of MPI_COMM_WORLD. Argument checks happen before MPI is touched, so bad input is a
// UsageError on the calling rank rather than an MPI abort or a hang.

#include "ddp/comm/mpi_process_group.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "dump_request_watcher.hpp"
#include "mpi_arith.hpp"
#include "mpi_runtime.hpp"
#include "mpi_work.hpp"

namespace ddp {
namespace mpi_detail {
namespace {

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, int rank, int size, std::chrono::milliseconds timeout,
                  int group_index)
      : ProcessGroup(rank, size, timeout),
        runtime_(Runtime::get()),
        comm_(comm),
        recorder_(std::make_shared<RecorderHandle>()) {
    if (const size_t entries = FlightRecorder::entries_from_env(); entries > 0) {
      FlightRecorderIdentity id;
      id.group = fmt::format("mpi/{}/", group_index);
      id.backend = "mpi";
      id.rank = rank;
      id.group_size = size;
      for (int r = 0; r < size; ++r) id.global_ranks.push_back(r);
      recorder_->recorder = std::make_unique<FlightRecorder>(std::move(id), entries);
      recorder_->dir = FlightRecorder::dir_from_env();
      dump_watcher_ = std::make_unique<DumpRequestWatcher>([handle = recorder_] {
        handle->dump("requested by the launcher (a rank of the job failed)");
      });
    }
    int* tag_ub = nullptr;
    int found = 0;
    auto lock = runtime_.lock();
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found);
    if (found && tag_ub != nullptr) max_tag_ = *tag_ub;
  }

  ~MpiProcessGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Pending operations on the communicator still complete normally after MPI_Comm_free.
    auto lock = runtime_.lock();
    MPI_Comm_free(&comm_);
  }

  std::string backend_name() const override { return "mpi"; }

  FlightRecorder* flight_recorder() override { return recorder_->recorder.get(); }

  WorkPtr all_reduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    auto operation =
        begin(fmt::format("all_reduce({}, {} x {})", to_string(op), to_string(dtype), count));
    track(*operation, "all_reduce", dtype, count, op);
    const int n = check_count(count, *operation);
    check_buffer(data, count, "data", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const MPI_Op mpi_op = runtime_.op(dtype, op);
    if (op == ReduceOp::kAvg) {
      operation->finish = [data, count, dtype, size = size_] { divide(data, count, dtype, size); };
    }
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, n, type, mpi_op, comm_, request);
    });
  }

  WorkPtr broadcast(void* data, size_t count, DataType dtype, int root) override {
    auto operation =
        begin(fmt::format("broadcast({} x {}, root {})", to_string(dtype), count, root));
    track(*operation, "broadcast", dtype, count, std::nullopt, root);
    const int n = check_count(count, *operation);
    check_root(root, *operation);
    check_buffer(data, count, "data", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Ibcast(data, n, type, root, comm_, request);
    });
  }

  WorkPtr reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root) override {
    auto operation = begin(
        fmt::format("reduce({}, {} x {}, root {})", to_string(op), to_string(dtype), count, root));
    track(*operation, "reduce", dtype, count, op, root);
    const int n = check_count(count, *operation);
    check_root(root, *operation);
    check_buffer(data, count, "data", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const MPI_Op mpi_op = runtime_.op(dtype, op);
    const bool is_root = rank_ == root;
    if (op == ReduceOp::kAvg && is_root) {
      operation->finish = [data, count, dtype, size = size_] { divide(data, count, dtype, size); };
    }
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Ireduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr, n, type, mpi_op,
                         root, comm_, request);
    });
  }

  WorkPtr all_gather(const void* in, void* out, size_t count, DataType dtype) override {
    auto operation = begin(fmt::format("all_gather({} x {})", to_string(dtype), count));
    track(*operation, "all_gather", dtype, count);
    const int n = check_count(count, *operation);
    check_count(count * static_cast<size_t>(size_), *operation);
    check_buffer(in, count, "in", *operation);
    check_buffer(out, count, "out", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const size_t block = count * element_size(dtype);
    const void* send = own_block_or_copy(in, out, block, static_cast<size_t>(rank_) * block,
                                         block * size_, *operation);
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Iallgather(send, n, type, out, n, type, comm_, request);
    });
  }

  WorkPtr all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                       DataType dtype) override {
    auto operation =
        begin(fmt::format("all_gather_v({}, {} counts)", to_string(dtype), counts.size()));
    if (counts.size() != static_cast<size_t>(size_)) {
      throw UsageError(fmt::format(
          "mpi backend: rank {}: {}: counts has {} entries but the group has {} ranks; pass "
          "one count per rank",
          rank_, operation->description, counts.size(), size_));
    }
    size_t total = 0;
    operation->counts.resize(counts.size());
    operation->displacements.resize(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) {
      operation->counts[r] = check_count(counts[r], *operation);
      operation->displacements[r] = check_count(total, *operation);
      total += counts[r];
    }
    check_count(total, *operation);
    const size_t mine = counts[static_cast<size_t>(rank_)];
    track(*operation, "all_gather_v", dtype, mine);
    check_buffer(in, mine, "in", *operation);
    check_buffer(out, total, "out", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const size_t element = element_size(dtype);
    const void* send = own_block_or_copy(
        in, out, mine * element,
        static_cast<size_t>(operation->displacements[static_cast<size_t>(rank_)]) * element,
        total * element, *operation);
    const int n = static_cast<int>(mine);
    Operation& op = *operation;
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Iallgatherv(send, n, type, out, op.counts.data(), op.displacements.data(), type,
                             comm_, request);
    });
  }

  WorkPtr gather(const void* in, void* out, size_t count, DataType dtype, int root) override {
    auto operation = begin(fmt::format("gather({} x {}, root {})", to_string(dtype), count, root));
    track(*operation, "gather", dtype, count, std::nullopt, root);
    const int n = check_count(count, *operation);
    check_count(count * static_cast<size_t>(size_), *operation);
    check_root(root, *operation);
    check_buffer(in, count, "in", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const size_t block = count * element_size(dtype);
    const void* send = in;
    if (rank_ == root) {
      check_buffer(out, count, "out", *operation);
      send = own_block_or_copy(in, out, block, static_cast<size_t>(rank_) * block, block * size_,
                               *operation);
    }
    void* receive = rank_ == root ? out : nullptr;
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Igather(send, n, type, receive, n, type, root, comm_, request);
    });
  }

  WorkPtr scatter(const void* in, void* out, size_t count, DataType dtype, int root) override {
    auto operation = begin(fmt::format("scatter({} x {}, root {})", to_string(dtype), count, root));
    track(*operation, "scatter", dtype, count, std::nullopt, root);
    const int n = check_count(count, *operation);
    check_count(count * static_cast<size_t>(size_), *operation);
    check_root(root, *operation);
    check_buffer(out, count, "out", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const size_t block = count * element_size(dtype);
    const void* send = nullptr;
    void* receive = out;
    if (rank_ == root) {
      check_buffer(in, count, "in", *operation);
      const auto* own = static_cast<const unsigned char*>(in) + static_cast<size_t>(root) * block;
      if (block > 0 && out == own) {
        receive = MPI_IN_PLACE;  // root's block already sits in out
        send = in;
      } else {
        send = input_or_copy(in, block * size_, out, block, *operation);
      }
    }
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Iscatter(send, n, type, receive, n, type, root, comm_, request);
    });
  }

  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                         ReduceOp op) override {
    auto operation =
        begin(fmt::format("reduce_scatter({}, {} x {})", to_string(op), to_string(dtype), count));
    track(*operation, "reduce_scatter", dtype, count, op);
    const int n = check_count(count, *operation);
    check_count(count * static_cast<size_t>(size_), *operation);
    check_buffer(in, count, "in", *operation);
    check_buffer(out, count, "out", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const MPI_Op mpi_op = runtime_.op(dtype, op);
    const size_t block = count * element_size(dtype);
    const void* send = input_or_copy(in, block * size_, out, block, *operation);
    if (op == ReduceOp::kAvg) {
      operation->finish = [out, count, dtype, size = size_] { divide(out, count, dtype, size); };
    }
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Ireduce_scatter_block(send, out, n, type, mpi_op, comm_, request);
    });
  }

  WorkPtr all_to_all(const void* in, void* out, size_t count, DataType dtype) override {
    auto operation = begin(fmt::format("all_to_all({} x {})", to_string(dtype), count));
    track(*operation, "all_to_all", dtype, count);
    const int n = check_count(count, *operation);
    check_count(count * static_cast<size_t>(size_), *operation);
    check_buffer(in, count, "in", *operation);
    check_buffer(out, count, "out", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const size_t bytes = count * element_size(dtype) * size_;
    const void* send = input_or_copy(in, bytes, out, bytes, *operation);
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Ialltoall(send, n, type, out, n, type, comm_, request);
    });
  }

  WorkPtr barrier() override {
    auto operation = begin("barrier");
    track(*operation, "barrier", DataType::kUInt8, 0);
    return start(std::move(operation),
                 [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  }

  WorkPtr send(const void* data, size_t count, DataType dtype, int dst, int tag) override {
    auto operation =
        begin(fmt::format("send({} x {}, to rank {}, tag {})", to_string(dtype), count, dst, tag));
    const int n = check_count(count, *operation);
    check_peer(dst, "dst", *operation);
    check_tag(tag, *operation);
    check_buffer(data, count, "data", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Isend(data, n, type, dst, tag, comm_, request);
    });
  }

  WorkPtr recv(void* data, size_t count, DataType dtype, int src, int tag) override {
    auto operation = begin(
        fmt::format("recv({} x {}, from rank {}, tag {})", to_string(dtype), count, src, tag));
    const int n = check_count(count, *operation);
    check_peer(src, "src", *operation);
    check_tag(tag, *operation);
    check_buffer(data, count, "data", *operation);
    const MPI_Datatype type = runtime_.datatype(dtype);
    operation->expected_count = n;
    operation->datatype = type;
    return start(std::move(operation), [&](MPI_Request* request) {
      return MPI_Irecv(data, n, type, src, tag, comm_, request);
    });
  }

 private:
  std::unique_ptr<Operation> begin(std::string what) {
    auto operation = std::make_unique<Operation>();
    operation->description = fmt::format("{} #{}", what, ++sequence_);
    operation->rank = rank_;
    operation->size = size_;
    return operation;
  }

  WorkPtr start(std::unique_ptr<Operation> operation,
                const std::function<int(MPI_Request*)>& call) {
    int rc;
    {
      auto lock = runtime_.lock();
      rc = call(&operation->request);
    }
    if (rc != MPI_SUCCESS) {
      throw CollectiveError(fmt::format("mpi backend: rank {} of {}: starting {} failed: {}", rank_,
                                        size_, operation->description, error_string(rc)));
    }
    if (operation->record_info && recorder_->recorder) {
      // Collectives only: their order is the same on every rank, send/recv's is not.
      operation->record_info->seq = ++collective_sequence_;
      operation->record_id = recorder_->recorder->record(*operation->record_info);
      recorder_->recorder->started(operation->record_id);
      operation->recorder = recorder_;
    }
    return std::make_shared<MpiWork>(std::move(operation));
  }

  void track(Operation& operation, const char* op, DataType dtype, size_t count,
             std::optional<ReduceOp> reduce = std::nullopt, int root = -1) const {
    if (!recorder_->recorder) return;
    operation.record_info = CollectiveRecordInfo::of(op, dtype, count, reduce, root);
  }

  // MPI counts are int: a larger count cannot be expressed in one call.
  int check_count(size_t count, const Operation& operation) const {
    if (count > static_cast<size_t>(INT_MAX)) {
      throw UsageError(fmt::format(
          "mpi backend: rank {}: {}: {} elements exceed MPI's int count limit ({}); split the "
          "buffer into several smaller operations",
          rank_, operation.description, count, INT_MAX));
    }
    return static_cast<int>(count);
  }

  void check_root(int root, const Operation& operation) const {
    if (root < 0 || root >= size_) {
      throw UsageError(
          fmt::format("mpi backend: rank {}: {}: root {} is not a rank of this group; pass 0..{}",
                      rank_, operation.description, root, size_ - 1));
    }
  }

  void check_peer(int peer, const char* name, const Operation& operation) const {
    if (peer < 0 || peer >= size_) {
      throw UsageError(
          fmt::format("mpi backend: rank {}: {}: {} {} is not a rank of this group; pass 0..{}",
                      rank_, operation.description, name, peer, size_ - 1));
    }
  }

  void check_tag(int tag, const Operation& operation) const {
    if (tag < 0 || tag > max_tag_) {
      throw UsageError(
          fmt::format("mpi backend: rank {}: {}: tag {} is outside MPI's tag range; pass 0..{}",
                      rank_, operation.description, tag, max_tag_));
    }
  }

  void check_buffer(const void* buffer, size_t count, const char* name,
                    const Operation& operation) const {
    if (buffer == nullptr && count > 0) {
      throw UsageError(fmt::format("mpi backend: rank {}: {}: {} is null but count is {}", rank_,
                                   operation.description, name, count));
    }
  }

  // The send buffer of a gather whose own block belongs at out + offset: MPI_IN_PLACE when the
  // input already sits there, a scratch copy when it overlaps out elsewhere, else `in`.
  static const void* own_block_or_copy(const void* in, void* out, size_t block, size_t offset,
                                       size_t out_bytes, Operation& operation) {
    if (block > 0 && in == static_cast<unsigned char*>(out) + offset) return MPI_IN_PLACE;
    return input_or_copy(in, block, out, out_bytes, operation);
  }

  // `in`, or a scratch copy of it when it overlaps the output (MPI forbids aliasing).
  static const void* input_or_copy(const void* in, size_t in_bytes, const void* out,
                                   size_t out_bytes, Operation& operation) {
    if (!overlaps(in, in_bytes, out, out_bytes)) return in;
    operation.scratch.resize(in_bytes);
    std::memcpy(operation.scratch.data(), in, in_bytes);
    return operation.scratch.data();
  }

  Runtime& runtime_;
  MPI_Comm comm_;
  int max_tag_ = 32767;  // the minimum MPI guarantees
  std::atomic<uint64_t> sequence_{0};
  std::atomic<uint64_t> collective_sequence_{0};  // flight recorder sequence numbers
  std::shared_ptr<RecorderHandle> recorder_;
  // Writes the record when ddprun sends the dump signal (null without a recorder).
  std::unique_ptr<DumpRequestWatcher> dump_watcher_;
};

// Refuses a torchrun environment that contradicts MPI: workers started by ddprun or torchrun
// each see a world of one under MPI, and would otherwise train alone without an error.
void check_environment(int rank, int size) {
  const auto world_size = env::get_int("WORLD_SIZE");
  if (world_size && *world_size != size) {
    throw UsageError(fmt::format(
        "mpi backend: MPI_COMM_WORLD has {} rank(s) but WORLD_SIZE={}: the mpi backend takes "
        "its ranks from MPI, so start the workers with `mpirun -np {} <program>` instead of "
        "ddprun/torchrun, or choose the cpu/gloo backend",
        size, *world_size, *world_size));
  }
  const auto env_rank = env::get_int("RANK");
  if (world_size && env_rank && *env_rank != rank) {
    throw UsageError(fmt::format(
        "mpi backend: MPI rank is {} but RANK={}: the mpi backend takes its ranks from MPI; "
        "unset RANK and WORLD_SIZE or set them from OMPI_COMM_WORLD_RANK/SIZE",
        rank, *env_rank));
  }
}

}  // namespace
}  // namespace mpi_detail

ProcessGroupPtr make_mpi_process_group(std::chrono::milliseconds timeout) {
  using namespace mpi_detail;
  if (timeout.count() <= 0) {
    throw UsageError(
        fmt::format("mpi backend: timeout must be positive, got {} ms", timeout.count()));
  }
  Runtime& runtime = Runtime::get();
  int rank = 0;
  int size = 0;
  {
    auto lock = runtime.lock();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  check_environment(rank, size);

  // MPI_Comm_dup blocks until every rank calls it; the non-blocking form keeps the timeout.
  // MPI writes the new handle when the dup completes, possibly after a timeout, so the handle
  // lives on the heap and is abandoned with the pending request if the wait fails.
  auto pending = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  auto operation = std::make_unique<Operation>();
  operation->description = "creating the group (MPI_Comm_idup of MPI_COMM_WORLD)";
  operation->rank = rank;
  operation->size = size;
  int rc;
  {
    auto lock = runtime.lock();
    rc = MPI_Comm_idup(MPI_COMM_WORLD, pending.get(), &operation->request);
  }
  if (rc != MPI_SUCCESS) {
    throw CollectiveError(fmt::format("mpi backend: rank {} of {}: MPI_Comm_idup failed: {}", rank,
                                      size, error_string(rc)));
  }
  try {
    MpiWork(std::move(operation)).wait(timeout);
  } catch (...) {
    (void)pending.release();
    throw;
  }
  const MPI_Comm comm = *pending;
  {
    auto lock = runtime.lock();
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
  // Every rank creates its MPI groups in the same order (MPI_Comm_idup is collective), so the
  // n-th group of each process has the same flight recorder name on every rank.
  static std::atomic<int> groups_created{0};
  return std::make_shared<MpiProcessGroup>(comm, rank, size, timeout, groups_created++);
}

}  // namespace ddp
