#include "cpu_process_group.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "../gloo/gloo_comm.hpp"
#include "../recorded_p2p.hpp"
#include "../reduce_kernels.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "tcp_ring.hpp"

namespace ddp::detail {

namespace {

ShmLayout layout_for(int local_size) {
  ShmLayout l;
  l.ranks = local_size;
  l.slot_bytes = local_size <= 4 ? (1 << 20) : (512 << 10);
  if (auto v = env::get_int("DDP_SHM_SLOT_BYTES")) {
    if (*v < 4096 || *v % 64 != 0) {
      throw UsageError(
          fmt::format("DDP_SHM_SLOT_BYTES={} must be a multiple of 64 and at "
                      "least 4096",
                      *v));
    }
    l.slot_bytes = static_cast<size_t>(*v);
  }
  return l;
}

// How long a shared-memory wait polls before it sleeps in futex(2). DDP_SHM_SPIN_US sets it;
// the default polls up to kDefaultSpin when the group lives on one host and every rank of it
// can have a CPU of its own (local ranks <= CPUs this process may run on), and never
// otherwise. With more ranks than CPUs a poller takes the CPU from the very peer it waits for
// (measured: 4 ranks on 2 vCPUs, 4 KB all_reduce 10x slower with a 100 us pure spin); across
// hosts the link dominates the latency anyway and the CPU is better left to the leader's
// network thread (measured at 10 Gbit/s, 2 hosts x 2 ranks on 2 vCPUs: 10 % more bandwidth
// without the spin). Polling turns a 4 KB all_reduce of 2 ranks from a futex wake-up (15-20 us
// here) into a few cache-line transfers (1-2 us); the poll yields every few microseconds and
// backs off when it keeps running out (ShmGroup).
constexpr std::chrono::microseconds kDefaultSpin{200};

std::chrono::microseconds spin_for(int local_ranks, bool single_host) {
  if (auto v = env::get_int("DDP_SHM_SPIN_US")) {
    if (*v < 0) {
      throw UsageError(fmt::format(
          "DDP_SHM_SPIN_US={} is negative; use 0 to sleep at once or a number of microseconds",
          *v));
    }
    return std::chrono::microseconds(*v);
  }
  if (!single_host) return std::chrono::microseconds(0);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return local_ranks <= cpus ? kDefaultSpin : std::chrono::microseconds(0);
}

// How the host leaders all-reduce: "ring" (ddp's TCP ring, tcp_ring.hpp: payload only, full
// duplex, reduction overlapped with the transfer) or "gloo". DDP_CPU_LEADER_TRANSPORT; it must
// be equal on all ranks.
std::string leader_transport() {
  const std::string v = env::get_or("DDP_CPU_LEADER_TRANSPORT", "ring");
  if (v != "ring" && v != "gloo") {
    throw UsageError(fmt::format("DDP_CPU_LEADER_TRANSPORT={}: expected ring or gloo", v));
  }
  return v;
}

std::string unique_shm_name() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return fmt::format("/ddp-{}-{:016x}", ::getpid(), r);
}

}  // namespace

CpuProcessGroup::CpuProcessGroup(GroupConfig config, std::string host_id)
    : AsyncProcessGroup(std::move(config)), host_id_(std::move(host_id)) {
  if (auto v = env::get_int("DDP_CPU_PIPELINE_BYTES")) {
    if (*v < 0) {
      throw UsageError(fmt::format(
          "DDP_CPU_PIPELINE_BYTES={} is negative; use 0 to turn pipelining off or a chunk size "
          "in bytes",
          *v));
    }
    pipeline_bytes_ = static_cast<size_t>(*v);
  }
  Store& store = *config_.store;
  topo_ = HostTopology::exchange(store, config_.prefix, rank_, size_, host_id_, timeout_);
  const auto& local = topo_.ranks_of_host[topo_.my_host];
  if (local.size() > 1) {
    const ShmLayout layout = layout_for(static_cast<int>(local.size()));
    const std::string name_key = fmt::format("{}shm/{}", config_.prefix, topo_.my_host);
    ShmSegment seg;
    if (topo_.is_leader()) {
      seg = ShmSegment::create(unique_shm_name(), layout.total_bytes());
      ShmGroup::initialize(seg.data(), layout);
      store.set(name_key, seg.name());
    } else {
      store.wait({name_key}, timeout_);
      seg = ShmSegment::open(store.get(name_key), layout.total_bytes());
    }
    // The last rank to map the segment removes its name.
    const std::string mapped_key = fmt::format("{}shm_mapped/{}", config_.prefix, topo_.my_host);
    const std::string all_mapped_key =
        fmt::format("{}shm_all_mapped/{}", config_.prefix, topo_.my_host);
    if (store.add(mapped_key, 1) == static_cast<int64_t>(local.size())) {
      seg.unlink();
      store.set(all_mapped_key, "1");
    }
    // Nobody may leave init (and possibly destroy the group, unlinking the name as the
    // creator) before every rank of the host has mapped the segment.
    try {
      store.wait({all_mapped_key}, timeout_);
    } catch (const TimeoutError&) {
      throw TimeoutError(fmt::format(
          "{}: only {} of {} ranks on this host mapped the shared memory segment {} within {} "
          "ms",
          where(), store.add(mapped_key, 0), local.size(), seg.name(), timeout_.count()));
    }
    seg.release_name();
    shm_ = std::make_unique<ShmGroup>(
        std::move(seg), layout, topo_.local_rank, local,
        spin_for(static_cast<int>(local.size()), topo_.num_hosts() == 1));
  }
  if (topo_.num_hosts() > 1) {
    if (topo_.is_leader()) {
      const auto leaders = topo_.leaders();
      leaders_ = std::make_unique<GlooComm>(config_.store, config_.prefix + "gloo_leaders/",
                                            topo_.my_host, topo_.num_hosts(), timeout_, leaders,
                                            where(), &abort_signal());
      if (leader_transport() == "ring") {
        ring_ = std::make_unique<TcpRing>(store, config_.prefix + "ring_leaders/", topo_.my_host,
                                          topo_.num_hosts(), timeout_, leaders, where(),
                                          advertised_host_address(), &abort_signal());
      }
    }
    std::vector<int> ranks(size_);
    for (int r = 0; r < size_; ++r) ranks[r] = r;
    all_ranks_ = std::make_unique<GlooComm>(config_.store, config_.prefix + "gloo_all/", rank_,
                                            size_, timeout_, ranks, where(), &abort_signal());
  }
}

void CpuProcessGroup::end_running_operation() noexcept {
  // Shared memory and the leaders' ring poll the abort themselves (a shared-memory wait asleep
  // is woken to see it now); Gloo's calls do not.
  if (shm_) shm_->wake_waiters();
  if (leaders_) leaders_->shut_down_connections();
  if (all_ranks_) all_ranks_->shut_down_connections();
}

CpuProcessGroup::~CpuProcessGroup() {
  shutdown();
  p2p_.clear();
}

SerialExecutor& CpuProcessGroup::p2p_executor(int index) {
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  // Sends to each rank, recvs from each rank, then recvs from any source.
  if (p2p_.empty()) p2p_.resize(2 * size_ + 1);
  if (!p2p_[index]) p2p_[index] = std::make_unique<SerialExecutor>();
  return *p2p_[index];
}

WorkPtr CpuProcessGroup::send(const void* data, size_t count, DataType dtype, int dst, int tag) {
  validate_p2p(data, count, dst, "send", "dst");
  CallInfo c{OpKind::kSend, dtype, ReduceOp::kSum, false, dst, tag, count, 0, 0};
  const size_t bytes = count * element_size(dtype);
  if (p2p_over_gloo()) {
    const uint64_t record = record_p2p_started(flight_recorder(), "send", dtype, count, dst);
    return record_p2p_completion(flight_recorder(), record,
                                 all_ranks(c).post_send(data, bytes, dst, tag, c));
  }
  auto work = std::make_shared<FutureWork>(c.describe() + " on " + where());
  const uint64_t record = record_p2p(flight_recorder(), "send", dtype, count, dst);
  p2p_executor(dst).post([this, work, c, data, bytes, dst, tag, record] {
    std::exception_ptr error;
    record_p2p_start(flight_recorder(), record);
    try {
      shm_->send(data, bytes, topo_.local_rank_of(dst), tag, context(c));
    } catch (...) {
      error = std::current_exception();
    }
    record_p2p_finished(flight_recorder(), record, error);
    work->finish(error);
  });
  return work;
}

WorkPtr CpuProcessGroup::recv(void* data, size_t count, DataType dtype, int src, int tag) {
  validate_p2p(data, count, src, "recv", "src");
  CallInfo c{OpKind::kRecv, dtype, ReduceOp::kSum, false, src, tag, count, 0, 0};
  const size_t bytes = count * element_size(dtype);
  if (p2p_over_gloo()) {
    const uint64_t record = record_p2p_started(flight_recorder(), "recv", dtype, count, src);
    return record_p2p_completion(flight_recorder(), record,
                                 all_ranks(c).post_recv(data, bytes, src, tag, c));
  }
  auto work = std::make_shared<FutureWork>(c.describe() + " on " + where());
  const uint64_t record = record_p2p(flight_recorder(), "recv", dtype, count, src);
  p2p_executor(size_ + src).post([this, work, c, data, bytes, src, tag, record] {
    std::exception_ptr error;
    record_p2p_start(flight_recorder(), record);
    try {
      shm_->recv(data, bytes, topo_.local_rank_of(src), tag, context(c));
    } catch (...) {
      error = std::current_exception();
    }
    record_p2p_finished(flight_recorder(), record, error);
    work->finish(error);
  });
  return work;
}

WorkPtr CpuProcessGroup::recv_any_source(void* data, size_t count, DataType dtype, int tag,
                                         std::shared_ptr<int> source) {
  check_buffer(data, count, "data", "recv from any source");
  if (size_ == 1) {
    throw UsageError("recv from any source: this group has no other rank to receive from");
  }
  CallInfo c{OpKind::kRecv, dtype, ReduceOp::kSum, false, -1, tag, count, 0, 0};
  const size_t bytes = count * element_size(dtype);
  if (p2p_over_gloo()) {
    const uint64_t record = record_p2p_started(flight_recorder(), "recv", dtype, count, -1);
    return record_p2p_completion(
        flight_recorder(), record,
        all_ranks(c).post_recv_any(data, bytes, tag, c, std::move(source)));
  }
  auto work = std::make_shared<FutureWork>(c.describe() + " from any source on " + where());
  const uint64_t record = record_p2p(flight_recorder(), "recv", dtype, count, -1);
  p2p_executor(2 * size_).post([this, work, c, data, bytes, tag, record, source] {
    std::exception_ptr error;
    record_p2p_start(flight_recorder(), record);
    try {
      const ShmContext ctx = context(c);
      const auto& locals = topo_.ranks_of_host[topo_.my_host];
      const int n = static_cast<int>(locals.size());
      auto nap = std::chrono::microseconds(20);
      for (int found = -1; found < 0;) {
        // Round-robin from the next rank, so no sender is always asked last.
        for (int k = 1; k < n && found < 0; ++k) {
          const int local = (topo_.local_rank + k) % n;
          if (shm_->try_recv(data, bytes, local, tag, ctx)) found = locals[local];
        }
        if (found >= 0) {
          *source = found;
          break;
        }
        if (abort_signal().raised()) std::rethrow_exception(abort_signal().error());
        if (Clock::now() >= ctx.deadline) {
          throw TimeoutError(
              fmt::format("{} from any source on {}: no rank sent a message "
                          "with tag {} within {} ms",
                          c.describe(), where(), tag, timeout_.count()));
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
    } catch (...) {
      error = std::current_exception();
    }
    record_p2p_finished(flight_recorder(), record, error);
    work->finish(error);
  });
  return work;
}

ShmContext CpuProcessGroup::context(const CallInfo& call) const {
  ShmContext ctx;
  ctx.call = &call;
  ctx.timeout = timeout_;
  ctx.deadline = deadline_after(timeout_);
  ctx.where = where();
  ctx.abort = &abort_signal();
  return ctx;
}

GlooComm& CpuProcessGroup::all_ranks(const CallInfo& call) {
  if (!all_ranks_) {
    throw CollectiveError(
        fmt::format("{} on {}: internal error: no cross-host context", call.describe(), where()));
  }
  return *all_ranks_;
}

void CpuProcessGroup::run_all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                                     const CallInfo& call) {
  const auto ctx = context(call);
  if (single_host()) {
    if (shm_) shm_->all_reduce(data, count, dtype, op, ctx);
    return;
  }
  // Hierarchical: sum within the host, combine among leaders, share within the host.
  const ReduceOp partial = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const size_t es = element_size(dtype);
  const size_t chunk = pipeline_chunk_elems(count, es);
  // Every leader must make the same Gloo calls: the choice depends on count and dtype only.
  if (chunk < count) {
    all_reduce_pipelined(static_cast<char*>(data), count, chunk, dtype, partial, call, ctx);
  } else {
    if (shm_) shm_->all_reduce(data, count, dtype, partial, ctx);
    if (leaders_) leaders_all_reduce(data, count, dtype, partial, call);
    if (shm_) shm_->broadcast(data, count * es, 0, ctx);
  }
  if (op == ReduceOp::kAvg) divide_in_place(dtype, data, count, size_);
}

size_t CpuProcessGroup::pipeline_chunk_elems(size_t count, size_t es) const {
  // DDP_CPU_PIPELINE_BYTES sets the chunk (0: no pipelining; it must be equal on all ranks, as
  // the leaders' Gloo calls must match). By default, chunks of at least
  // kPipelineChunkBytes (a Gloo call costs a few hundred microseconds on its own) and at most
  // kPipelineChunks of them: enough to hide the shared-memory steps behind the link, few
  // enough that the per-call cost stays small.
  const size_t bytes = count * es;
  size_t chunk_bytes = std::max(kPipelineChunkBytes, bytes / kPipelineChunks);
  if (pipeline_bytes_) chunk_bytes = *pipeline_bytes_ == 0 ? bytes : *pipeline_bytes_;
  return std::max<size_t>(chunk_bytes / es, 1);
}

void CpuProcessGroup::all_reduce_pipelined(char* data, size_t count, size_t chunk, DataType dtype,
                                           ReduceOp op, const CallInfo& call,
                                           const ShmContext& ctx) {
  // Chunk i: reduce within the host (all local ranks), then the leader hands it to its Gloo
  // thread and goes on reducing chunk i+1 while chunk i crosses the link; the result of chunk
  // i is shared within the host once chunk i+1 was reduced. Every local rank runs the same
  // sequence of shared-memory steps: R0 R1 B0 R2 B1 ... B(k-1).
  const size_t es = element_size(dtype);
  const size_t chunks = (count + chunk - 1) / chunk;
  std::vector<std::future<void>> links(chunks);
  auto part = [&](size_t i) {
    return std::make_pair(data + i * chunk * es, std::min(chunk, count - i * chunk));
  };
  auto wait_link = [&](size_t i) {
    if (!leaders_) return;
    // Gloo's own timeout bounds the call; the margin only covers the hand-off.
    if (links[i].wait_for(timeout_ + std::chrono::seconds(5)) != std::future_status::ready) {
      throw TimeoutError(
          fmt::format("{} on {}: chunk {} of {} did not cross to the other hosts within {} ms",
                      call.describe(), where(), i, chunks, timeout_.count()));
    }
    links[i].get();
  };
  size_t waited = 0;  // links[0..waited) are settled
  try {
    for (size_t i = 0; i <= chunks; ++i) {
      if (i < chunks) {
        auto [p, n] = part(i);
        if (shm_) shm_->all_reduce(p, n, dtype, op, ctx);
        if (leaders_) {
          auto done = std::make_shared<std::promise<void>>();
          links[i] = done->get_future();
          leader_executor().post([this, p = p, n = n, dtype, op, call, done] {
            try {
              leaders_all_reduce(p, n, dtype, op, call);
              done->set_value();
            } catch (...) {
              done->set_exception(std::current_exception());
            }
          });
        }
      }
      if (i >= 1) {
        wait_link(i - 1);
        waited = i;
        auto [p, n] = part(i - 1);
        if (shm_) shm_->broadcast(p, n * es, 0, ctx);
      }
    }
  } catch (...) {
    // The Gloo thread still writes into `data`: let it finish before the caller may free it.
    for (size_t i = waited; i < chunks; ++i) {
      if (links[i].valid()) links[i].wait_for(timeout_ + std::chrono::seconds(5));
    }
    throw;
  }
}

void CpuProcessGroup::leaders_all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                                         const CallInfo& call) {
  if (ring_) return ring_->all_reduce(data, count, dtype, op, call);
  leaders_->all_reduce(data, count, dtype, op, call);
}

SerialExecutor& CpuProcessGroup::leader_executor() {
  if (!leader_exec_) leader_exec_ = std::make_unique<SerialExecutor>();
  return *leader_exec_;
}

void CpuProcessGroup::run_broadcast(void* data, size_t count, DataType dtype, int root,
                                    const CallInfo& call) {
  const auto ctx = context(call);
  const size_t bytes = count * element_size(dtype);
  if (single_host()) {
    if (shm_) shm_->broadcast(data, bytes, topo_.local_rank_of(root), ctx);
    return;
  }
  const int root_host = topo_.host_of_rank[root];
  // 1. On the root's host, bring the data to the leader; 2. leaders; 3. within other hosts.
  if (topo_.my_host == root_host && shm_) {
    shm_->broadcast(data, bytes, topo_.local_rank_of(root), ctx);
  }
  if (leaders_) leaders_->broadcast(data, bytes, root_host, call);
  if (topo_.my_host != root_host && shm_) shm_->broadcast(data, bytes, 0, ctx);
}

void CpuProcessGroup::run_reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root,
                                 const CallInfo& call) {
  if (single_host()) {
    // All ranks get the result; the contract leaves non-root data unspecified.
    if (shm_) shm_->all_reduce(data, count, dtype, op, context(call));
    return;
  }
  (void)root;  // the result is computed on every rank anyway
  run_all_reduce(data, count, dtype, op, call);
}

void CpuProcessGroup::run_all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                                       DataType dtype, const CallInfo& call) {
  std::vector<size_t> bytes(counts);
  for (auto& b : bytes) b *= element_size(dtype);
  if (!single_host()) return all_ranks(call).all_gather_v(in, out, bytes, call);
  if (shm_) return shm_->gather_v(in, out, bytes, -1, context(call));
  if (bytes[0] > 0 && in != out) std::memmove(out, in, bytes[0]);
}

void CpuProcessGroup::run_gather(const void* in, void* out, size_t count, DataType dtype, int root,
                                 const CallInfo& call) {
  const size_t b = count * element_size(dtype);
  if (!single_host()) return all_ranks(call).gather(in, out, b, root, call);
  if (shm_) return shm_->gather_v(in, out, std::vector<size_t>(size_, b), root, context(call));
  if (b > 0 && in != out) std::memmove(out, in, b);
}

void CpuProcessGroup::run_scatter(const void* in, void* out, size_t count, DataType dtype, int root,
                                  const CallInfo& call) {
  const size_t b = count * element_size(dtype);
  if (!single_host()) return all_ranks(call).scatter(in, out, b, root, call);
  if (shm_) return shm_->scatter(in, out, b, root, context(call));
  if (b > 0 && in != out) std::memmove(out, in, b);
}

void CpuProcessGroup::run_reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                                         ReduceOp op, const CallInfo& call) {
  if (!single_host()) return all_ranks(call).reduce_scatter(in, out, count, dtype, op, call);
  if (shm_) return shm_->reduce_scatter(in, out, count, dtype, op, context(call));
  if (count > 0 && in != out) std::memmove(out, in, count * element_size(dtype));
}

void CpuProcessGroup::run_all_to_all(const void* in, void* out, size_t count, DataType dtype,
                                     const CallInfo& call) {
  const size_t b = count * element_size(dtype);
  if (!single_host()) return all_ranks(call).all_to_all(in, out, b, call);
  if (shm_) return shm_->all_to_all(in, out, b, context(call));
  if (b > 0 && in != out) std::memmove(out, in, b);
}

void CpuProcessGroup::run_barrier(const CallInfo& call) {
  const auto ctx = context(call);
  if (shm_) shm_->barrier(ctx);
  if (leaders_) leaders_->barrier(call);
  if (shm_ && !single_host()) shm_->barrier(ctx);
}

ProcessGroupPtr CpuProcessGroup::make_same_backend(GroupConfig config) {
  return std::make_shared<CpuProcessGroup>(std::move(config), host_id_);
}

}  // namespace ddp::detail
