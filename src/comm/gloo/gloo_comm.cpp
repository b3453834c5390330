#include "gloo_comm.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "../local_address.hpp"
#include "../reduce_kernels.hpp"
#include "connection_sockets.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "store_adapter.hpp"

namespace ddp::detail {

namespace {

// Gloo writes to its sockets with writev(), without MSG_NOSIGNAL: a write to a peer that just
// died raises SIGPIPE, whose default action kills this process before Gloo can report the
// closed connection (seen: a survivor of GlooFailure's test exited with signal 13 instead of
// failing its collective). So each Gloo device sets SIGPIPE to ignored when it has its default
// action, as Python does at startup for every PyTorch job; a handler or an ignore the program
// installed itself is kept. Writes then fail with EPIPE, which Gloo reports.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
      (current.sa_flags & SA_SIGINFO) != 0) {
    return;
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

std::shared_ptr<gloo::transport::Device> make_device() {
  ignore_default_sigpipe();
  gloo::transport::tcp::attr attr;
  if (auto ifname = env::get("DDP_GLOO_IFNAME"); ifname && !ifname->empty()) {
    attr.iface = *ifname;
  } else if (auto master = env::get("MASTER_ADDR"); master && !master->empty()) {
    attr.hostname = ipv4_towards(*master);
  } else {
    attr.hostname = "127.0.0.1";
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw NetworkError(
        fmt::format("gloo: cannot create a TCP device on {}: {}; check "
                    "DDP_GLOO_IFNAME / MASTER_ADDR",
                    attr.iface.empty() ? attr.hostname : attr.iface, e.what()));
  }
}

// Gloo moves bytes; the element type only sets the element size.
template <typename Fn>
void with_element_type(size_t es, Fn&& fn) {
  switch (es) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
  }
  throw UsageError(fmt::format("gloo: unsupported element size {}", es));
}

bool is_half(DataType d) {
  return d == DataType::kFloat16 || d == DataType::kBFloat16;
}

// Widens a half buffer to float32 and narrows it back (reductions in float32 precision).
std::vector<float> widen(const void* data, size_t count, DataType dtype) {
  std::vector<float> out(count);
  const auto* h = static_cast<const uint16_t*>(data);
  if (dtype == DataType::kFloat16) {
    halves_to_floats(h, out.data(), count);
  } else {
    bfloat16s_to_floats(h, out.data(), count);
  }
  return out;
}

void narrow(const std::vector<float>& in, void* data, DataType dtype) {
  auto* h = static_cast<uint16_t*>(data);
  if (dtype == DataType::kFloat16) {
    floats_to_halves(in.data(), h, in.size());
  } else {
    floats_to_bfloat16s(in.data(), h, in.size());
  }
}

std::function<void(void*, const void*, const void*, size_t)> reducer(DataType dtype, ReduceOp op) {
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  return [dtype, combine](void* c, const void* a, const void* b, size_t n) {
    const void* srcs[2] = {a, b};
    reduce_buffers(dtype, combine, c, srcs, 2, n, 0);
  };
}

}  // namespace

void GlooComm::shut_down_connections() noexcept {
  // The transfers first: once they are ended, a connection's end fails them with the notice's
  // error rather than Gloo's.
  pending_->end(abort_ != nullptr && abort_->raised() ? abort_->error() : nullptr);
  sockets_.shut_down_all();
}

void GlooComm::close_connections() noexcept {
  if (!context_) return;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    try {
      if (auto& pair = context_->getPair(r)) pair->close();
    } catch (const std::exception&) {
      // Already failed or closed: nothing left to tell that peer.
    }
  }
}

GlooComm::GlooComm(std::shared_ptr<Store> store, const std::string& prefix, int rank, int size,
                   std::chrono::milliseconds timeout, std::vector<int> group_ranks,
                   std::string where, const AbortSignal* abort)
    : store_(store),
      prefix_(prefix),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      group_ranks_(std::move(group_ranks)),
      where_(std::move(where)),
      abort_(abort) {
  auto device = make_device();
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  StoreAdapter adapter(store, prefix, timeout);
  try {
    ctx->connectFullMesh(adapter, device);
  } catch (const ddp::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError(
        fmt::format("gloo: {} could not connect to its {} peers within {} ms "
                    "(listening on {}): {}",
                    where_, size - 1, timeout.count(), device->str(), e.what()));
  }
  // connectFullMesh stored each rank's listening addresses under its rank: with them the
  // sockets of this context's connections can be found (for shut_down_connections).
  std::vector<std::vector<char>> published(size);
  for (int r = 0; r < size; ++r) {
    if (r != rank) published[r] = adapter.fetched(std::to_string(r));
  }
  sockets_ = GlooConnectionSockets::find(*ctx, rank, size, published);
  if (sockets_.count() != static_cast<size_t>(size - 1)) {
    log::get("ddp.comm")
        ->debug(
            "gloo: {} found the sockets of {} of its {} connections; in-place recovery's "
            "notice cannot end a call on the others, which end at the group timeout",
            where_, sockets_.count(), size - 1);
  }
  context_ = std::move(ctx);
  // Store barrier: a rank that finished connecting must not tear its context down (closing
  // its sockets) while a peer is still inside connectFullMesh reading from them.
  Store& st = *store;
  st.set(fmt::format("{}connected/{}", prefix, rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}connected/{}", prefix, r));
  st.wait(keys, timeout);
}

GlooComm::~GlooComm() = default;

std::vector<int> GlooComm::missing_ranks(const CallInfo& call) {
  // Every rank that times out in this collective reports it; ranks still absent after a grace
  // period (a few seconds covers ranks that entered the collective a little later) never
  // reached it. Only runs after a timeout, so normal operation pays nothing.
  std::vector<int> missing;
  try {
    const std::string base = fmt::format("{}reached/{}/", prefix_, call.seq);
    store_->set(base + std::to_string(rank_), "1");
    const auto deadline =
        deadline_after(std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5)));
    for (;;) {
      missing.clear();
      for (int r = 0; r < size_; ++r) {
        if (!store_->check({base + std::to_string(r)})) missing.push_back(group_ranks_[r]);
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    missing.clear();  // the store is unreachable too: report the timeout without names
  }
  return missing;
}

template <typename Fn>
void GlooComm::guarded(const CallInfo& call, Fn&& fn) {
  try {
    fn();
  } catch (...) {
    // After the group's abort the failure is its doing (shut_down_connections): the caller
    // re-forms on the abort's PeerLostError.
    if (abort_ != nullptr && abort_->raised()) abort_->rethrow();
    throw_gloo_failure(call);
  }
}

void GlooComm::throw_gloo_failure(const CallInfo& call) {
  try {
    throw;
  } catch (const ddp::Error&) {
    throw;
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (what.find("imed out") != std::string::npos) {
      const std::vector<int> missing = missing_ranks(call);
      const std::string who = missing.empty()
                                  ? std::string(
                                        "every rank reported reaching it, so a peer is stuck "
                                        "inside it or its connection broke")
                                  : fmt::format("ranks {} never reached it ({} of {} did)", missing,
                                                size_ - missing.size(), size_);
      throw TimeoutError(fmt::format("{} on {} timed out after {} ms in gloo: {} ({})",
                                     call.describe(), where_, timeout_.count(), who, what));
    }
    close_connections();
    throw NetworkError(fmt::format("{} on {} failed in gloo: {}; a peer process probably died",
                                   call.describe(), where_, what));
  } catch (const std::exception& e) {
    throw CollectiveError(
        fmt::format("{} on {} failed in gloo: {}", call.describe(), where_, e.what()));
  }
}

template <typename Options>
Options GlooComm::call_options(uint32_t tag) const {
  Options opts(context_);
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  return opts;
}

void GlooComm::all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                          const CallInfo& call, int avg_divisor) {
  if (count == 0) return;
  const int divisor = avg_divisor > 0 ? avg_divisor : size_;
  if (is_half(dtype)) {
    std::vector<float> wide = widen(data, count, dtype);
    all_reduce(wide.data(), count, DataType::kFloat32, op, call, divisor);
    narrow(wide, data, dtype);
    return;
  }
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    if (size_ > 1) {
      with_element_type(element_size(dtype), [&](auto t) {
        using T = decltype(t);
        auto opts = call_options<gloo::AllreduceOptions>(tag);
        opts.setOutput(static_cast<T*>(data), count);
        opts.setReduceFunction(reducer(dtype, op));
        gloo::allreduce(opts);
      });
    }
  });
  if (op == ReduceOp::kAvg) divide_in_place(dtype, data, count, divisor);
}

void GlooComm::reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root,
                      const CallInfo& call) {
  if (count == 0) return;
  if (is_half(dtype)) {
    std::vector<float> wide = widen(data, count, dtype);
    reduce(wide.data(), count, DataType::kFloat32, op, root, call);
    if (rank_ == root) narrow(wide, data, dtype);
    return;
  }
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    if (size_ > 1) {
      with_element_type(element_size(dtype), [&](auto t) {
        using T = decltype(t);
        auto opts = call_options<gloo::ReduceOptions>(tag);
        opts.setInput(static_cast<T*>(data), count);
        opts.setOutput(static_cast<T*>(data), count);
        opts.setRoot(root);
        opts.setReduceFunction(reducer(dtype, op));
        gloo::reduce(opts);
      });
    }
  });
  if (op == ReduceOp::kAvg && rank_ == root) divide_in_place(dtype, data, count, size_);
}

void GlooComm::broadcast(void* data, size_t bytes, int root, const CallInfo& call) {
  if (bytes == 0 || size_ == 1) return;
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    auto opts = call_options<gloo::BroadcastOptions>(tag);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    gloo::broadcast(opts);
  });
}

void GlooComm::all_gather_v(const void* in, void* out, const std::vector<size_t>& bytes,
                            const CallInfo& call) {
  size_t total = 0, displ = 0;
  for (int r = 0; r < size_; ++r) {
    if (r < rank_) displ += bytes[r];
    total += bytes[r];
  }
  if (total == 0) return;
  if (size_ == 1) {
    if (bytes[0] > 0 && in != out) std::memmove(out, in, bytes[0]);
    return;
  }
  // Gloo needs a non-null input even for zero bytes.
  const void* src = bytes[rank_] > 0 ? in : static_cast<char*>(out) + displ;
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    auto opts = call_options<gloo::AllgathervOptions>(tag);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(src)), bytes[rank_]);
    opts.setOutput(static_cast<uint8_t*>(out), bytes);
    gloo::allgatherv(opts);
  });
}

void GlooComm::gather(const void* in, void* out, size_t bytes, int root, const CallInfo& call) {
  if (bytes == 0) return;
  if (size_ == 1) {
    if (in != out) std::memmove(out, in, bytes);
    return;
  }
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    auto opts = call_options<gloo::GatherOptions>(tag);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
    if (rank_ == root) opts.setOutput(static_cast<uint8_t*>(out), bytes * size_);
    opts.setRoot(root);
    gloo::gather(opts);
  });
}

void GlooComm::scatter(const void* in, void* out, size_t bytes, int root, const CallInfo& call) {
  if (bytes == 0) return;
  if (size_ == 1) {
    if (in != out) std::memmove(out, in, bytes);
    return;
  }
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    auto opts = call_options<gloo::ScatterOptions>(tag);
    if (rank_ == root) {
      std::vector<uint8_t*> blocks;
      for (int r = 0; r < size_; ++r) {
        blocks.push_back(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)) + r * bytes);
      }
      opts.setInputs(blocks, bytes);
    }
    opts.setOutput(static_cast<uint8_t*>(out), bytes);
    opts.setRoot(root);
    gloo::scatter(opts);
  });
}

void GlooComm::reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                              const CallInfo& call) {
  // Gloo has no unbound-buffer reduce-scatter: all-reduce the whole input, keep our block.
  const size_t es = element_size(dtype);
  std::vector<char> tmp(count * size_ * es);
  if (!tmp.empty()) std::memcpy(tmp.data(), in, tmp.size());
  all_reduce(tmp.data(), count * size_, dtype, op, call);
  if (count > 0) std::memcpy(out, tmp.data() + rank_ * count * es, count * es);
}

void GlooComm::all_to_all(const void* in, void* out, size_t block_bytes, const CallInfo& call) {
  if (block_bytes == 0) return;
  if (size_ == 1) {
    if (in != out) std::memmove(out, in, block_bytes);
    return;
  }
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    auto opts = call_options<gloo::AlltoallOptions>(tag);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), block_bytes * size_);
    opts.setOutput(static_cast<uint8_t*>(out), block_bytes * size_);
    gloo::alltoall(opts);
  });
}

void GlooComm::barrier(const CallInfo& call) {
  if (size_ == 1) return;
  const uint32_t tag = next_tag();
  guarded(call, [&] {
    auto opts = call_options<gloo::BarrierOptions>(tag);
    gloo::barrier(opts);
  });
}

namespace {
// Point-to-point slots live above every collective slot prefix Gloo uses (0x01..0x08).
uint64_t p2p_slot(int tag) {
  return (uint64_t{0x7f} << 56) | static_cast<uint32_t>(tag);
}
}  // namespace

namespace {

// A posted Gloo transfer. Gloo cannot poll an unbound buffer without blocking, so
// is_completed() turns true once a wait() has succeeded. Listed in `pending` while it lives, so
// that in-place recovery's notice ends its wait (pending_transfers.hpp).
class P2PWork : public Work {
 public:
  // `source`: for a multi-source recv, where wait() stores the sender (mapped through
  // `group_ranks`, the enclosing group's rank of each communicator rank); else null.
  P2PWork(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send, std::string what,
          std::unique_ptr<char> dummy, std::shared_ptr<GlooPendingTransfers> pending,
          std::shared_ptr<int> source = nullptr, std::vector<int> group_ranks = {})
      : buf_(std::move(buf)),
        is_send_(is_send),
        what_(std::move(what)),
        dummy_(std::move(dummy)),
        pending_(std::move(pending)),
        source_(std::move(source)),
        group_ranks_(std::move(group_ranks)) {
    pending_->add(buf_.get(), is_send_);
  }
  ~P2PWork() override { pending_->forget(buf_.get()); }

  void wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    try {
      int peer = -1;
      const bool ok = is_send_ ? buf_->waitSend(timeout) : buf_->waitRecv(&peer, timeout);
      if (!ok) throw_ended();  // only the notice aborts a wait
      if (source_)
        *source_ =
            peer >= 0 && peer < static_cast<int>(group_ranks_.size()) ? group_ranks_[peer] : peer;
    } catch (const gloo::IoException& e) {
      // The notice shut the connections down: its error, not the connection's.
      if (pending_->ended_by()) throw_ended();
      const std::string m = e.what();
      if (m.find("imed out") != std::string::npos) {
        throw TimeoutError(fmt::format("{} did not complete within {} ms: {}", what_,
                                       timeout.count(),
                                       source_    ? "no rank sent a message with its tag"
                                       : is_send_ ? "the peer posted no matching recv"
                                                  : "the peer posted no matching send"));
      }
      throw NetworkError(fmt::format("{} failed in gloo: {}", what_, m));
    } catch (const gloo::EnforceNotMet& e) {
      throw CollectiveError(
          fmt::format("{} failed in gloo (do the sizes of send and recv "
                      "match?): {}",
                      what_, e.what()));
    }
    done_ = true;
  }

  bool is_completed() override {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    return lock.owns_lock() && done_;
  }

 private:
  // The notice's error (a PeerLostError), or one saying the group ended the transfer.
  [[noreturn]] void throw_ended() const {
    if (std::exception_ptr error = pending_->ended_by()) std::rethrow_exception(error);
    throw NetworkError(fmt::format("{} ended: its group shut its connections down", what_));
  }

  std::mutex mutex_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  std::string what_;
  std::unique_ptr<char> dummy_;
  std::shared_ptr<GlooPendingTransfers> pending_;
  std::shared_ptr<int> source_;
  std::vector<int> group_ranks_;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<Work> GlooComm::post_send(const void* data, size_t bytes, int dst, int tag,
                                          const CallInfo& call) {
  auto dummy = std::make_unique<char>(0);  // Gloo refuses null buffers, even for 0 bytes
  void* p = bytes > 0 ? const_cast<void*>(data) : dummy.get();
  auto buf = context_->createUnboundBuffer(p, bytes);
  buf->send(dst, p2p_slot(tag));
  return std::make_shared<P2PWork>(std::move(buf), true, call.describe() + " on " + where_,
                                   std::move(dummy), pending_);
}

std::shared_ptr<Work> GlooComm::post_recv(void* data, size_t bytes, int src, int tag,
                                          const CallInfo& call) {
  auto dummy = std::make_unique<char>(0);
  void* p = bytes > 0 ? data : dummy.get();
  auto buf = context_->createUnboundBuffer(p, bytes);
  buf->recv(src, p2p_slot(tag));
  return std::make_shared<P2PWork>(std::move(buf), false, call.describe() + " on " + where_,
                                   std::move(dummy), pending_);
}

std::shared_ptr<Work> GlooComm::post_recv_any(void* data, size_t bytes, int tag,
                                              const CallInfo& call, std::shared_ptr<int> source) {
  std::vector<int> srcs;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) srcs.push_back(r);
  }
  auto dummy = std::make_unique<char>(0);
  void* p = bytes > 0 ? data : dummy.get();
  auto buf = context_->createUnboundBuffer(p, bytes);
  buf->recv(srcs, p2p_slot(tag));
  return std::make_shared<P2PWork>(std::move(buf), false,
                                   call.describe() + " from any source on " + where_,
                                   std::move(dummy), pending_, std::move(source), group_ranks_);
}

}  // namespace ddp::detail
