#include "shm_group.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "../reduce_kernels.hpp"
#include "ddp/util/error.hpp"

namespace ddp::detail {

namespace {
constexpr uint64_t kMagic = 0x6464705f73686d31ull;  // "ddp_shm1"
constexpr size_t kLine = 64;
constexpr size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}
// Up to this, all_reduce stages whole buffers and every rank reduces all of them: one
// synchronisation instead of two. 64 KB (was 32): with polling waits the second
// synchronisation and the extra copy cost more than reducing n whole buffers (2 ranks, 64 KB:
// p50 12-19 us against 28 us).
constexpr size_t kSmallAllReduceBytes = 64 << 10;
}  // namespace

struct ShmGroup::Header {
  uint64_t magic;
  uint32_t ranks;
  uint32_t pad;
  uint64_t slot_bytes;
  uint64_t p2p_bytes;
  alignas(kLine) std::atomic<uint32_t> waiters;
};

struct ShmGroup::RankCtl {
  alignas(kLine) std::atomic<uint32_t> phase;
  // What the rank's single-round all_reduce staged in slot set s (call_signature), on the
  // phase's cache line: peers read it right after reading the phase. Per set, so a rank
  // already in its next round cannot overwrite what a slower peer is still comparing.
  std::atomic<uint64_t> signature[2];
};

struct ShmGroup::Channel {
  alignas(kLine) std::atomic<uint32_t> written;   // chunks published by the sender
  alignas(kLine) std::atomic<uint32_t> consumed;  // chunks released by the receiver
  int32_t tag;
  uint32_t chunk_bytes;
  uint64_t total_bytes;
  uint64_t offset;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex needs lock-free 32-bit atomics");

size_t ShmLayout::total_bytes() const {
  const size_t n = static_cast<size_t>(ranks);
  size_t off = align_up(sizeof(ShmGroup::Header), kLine);
  off += n * sizeof(ShmGroup::RankCtl);
  off += n * n * sizeof(ShmGroup::Channel);
  off = align_up(off, 4096);
  off += 2 * n * slot_bytes;
  off += n * n * p2p_bytes;
  return off;
}

void ShmGroup::initialize(void* memory, const ShmLayout& layout) {
  auto* h = new (memory) Header{};
  h->ranks = static_cast<uint32_t>(layout.ranks);
  h->slot_bytes = layout.slot_bytes;
  h->p2p_bytes = layout.p2p_bytes;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h->magic = kMagic;
}

ShmGroup::ShmGroup(ShmSegment segment, ShmLayout layout, int local_rank,
                   std::vector<int> group_ranks, std::chrono::microseconds spin)
    : segment_(std::move(segment)),
      layout_(layout),
      me_(local_rank),
      n_(layout.ranks),
      group_ranks_(std::move(group_ranks)),
      spin_(spin),
      sent_(n_, 0),
      consumed_(n_, 0),
      pending_(n_),
      source_mutex_(std::make_unique<std::mutex[]>(static_cast<size_t>(n_))) {
  char* base = static_cast<char*>(segment_.data());
  header_ = reinterpret_cast<Header*>(base);
  if (header_->magic != kMagic || header_->ranks != static_cast<uint32_t>(n_) ||
      header_->slot_bytes != layout.slot_bytes || header_->p2p_bytes != layout.p2p_bytes) {
    throw ProtocolError(fmt::format(
        "shared memory segment {} has an unexpected header (ranks {}, slot {} bytes); ranks "
        "disagree on DDP_SHM_SLOT_BYTES or the segment was reused",
        segment_.name(), header_->ranks, header_->slot_bytes));
  }
  size_t off = align_up(sizeof(Header), kLine);
  ctl_ = reinterpret_cast<RankCtl*>(base + off);
  off += n_ * sizeof(RankCtl);
  channels_ = reinterpret_cast<Channel*>(base + off);
  off += static_cast<size_t>(n_) * n_ * sizeof(Channel);
  off = align_up(off, 4096);
  slots_ = base + off;
  off += 2 * static_cast<size_t>(n_) * layout_.slot_bytes;
  p2p_ = base + off;
}

char* ShmGroup::slot(int set, int rank) const {
  return slots_ + (static_cast<size_t>(set) * n_ + rank) * layout_.slot_bytes;
}

ShmGroup::Channel& ShmGroup::channel(int src, int dst) const {
  return channels_[static_cast<size_t>(src) * n_ + dst];
}

char* ShmGroup::channel_buffer(int src, int dst) const {
  return p2p_ + (static_cast<size_t>(src) * n_ + dst) * layout_.p2p_bytes;
}

void ShmGroup::arrive() {
  publish(&ctl_[me_].phase, ++phase_, &header_->waiters);
}

std::chrono::microseconds ShmGroup::spin_now() const {
  return spin_ / (1 << spin_shift_.load(std::memory_order_relaxed));
}

void ShmGroup::after_wait(bool slept) {
  // Halve the spin each time it ran out, double it back each time it sufficed: ranks in
  // lockstep spin the full time, ranks that arrive far apart (or on a CPU-starved host) soon
  // go straight to sleep and leave the CPU to others.
  const int shift = spin_shift_.load(std::memory_order_relaxed);
  if (slept && shift < kMaxSpinShift) spin_shift_.store(shift + 1, std::memory_order_relaxed);
  if (!slept && shift > 0) spin_shift_.store(shift - 1, std::memory_order_relaxed);
}

void ShmGroup::wait_all(const ShmContext& ctx) {
  for (int j = 0; j < n_; ++j) {
    if (j == me_) continue;
    bool slept = false;
    const bool ok = wait_reached(&ctl_[j].phase, phase_, &header_->waiters, ctx.deadline,
                                 spin_now(), &slept, ctx.abort ? ctx.abort->flag() : nullptr);
    if (spin_.count() > 0) after_wait(slept);
    if (ok) continue;
    if (ctx.abort != nullptr && ctx.abort->raised()) ctx.abort->rethrow();
    std::vector<int> missing;
    for (int k = 0; k < n_; ++k) {
      if (!reached(ctl_[k].phase.load(), phase_)) missing.push_back(group_ranks_[k]);
    }
    throw TimeoutError(fmt::format(
        "{} on {}: timed out after {} ms waiting for ranks {} ({} of {} ranks on this host "
        "arrived); those ranks did not reach this collective: they crashed, hang, or issue "
        "different collectives (set DDP_DEBUG_COLLECTIVES=1 to compare calls)",
        ctx.call->describe(), ctx.where, ctx.timeout.count(), missing, n_ - missing.size(), n_));
  }
}

void ShmGroup::wake_waiters() noexcept {
  for (int j = 0; j < n_; ++j) {
    if (j == me_) continue;
    wake_sleepers(&ctl_[j].phase);             // wait_all
    wake_sleepers(&channel(me_, j).consumed);  // send
    wake_sleepers(&channel(j, me_).written);   // recv
  }
}

void ShmGroup::wait_word(std::atomic<uint32_t>* word, uint32_t target, const ShmContext& ctx,
                         const char* waiting_for, int peer) {
  if (wait_reached(word, target, &header_->waiters, ctx.deadline, spin_now(), nullptr,
                   ctx.abort ? ctx.abort->flag() : nullptr)) {
    return;
  }
  if (ctx.abort != nullptr && ctx.abort->raised()) ctx.abort->rethrow();
  throw TimeoutError(fmt::format("{} on {}: timed out after {} ms waiting for rank {} to {}",
                                 ctx.call->describe(), ctx.where, ctx.timeout.count(),
                                 group_ranks_[peer], waiting_for));
}

uint64_t ShmGroup::call_signature(size_t count, DataType dtype, ReduceOp op) {
  // count < 2^48 (the small path holds at most a slot of bytes); never 0, so an all-zero
  // (never written) signature differs from every real one.
  return (uint64_t{1} << 63) | (static_cast<uint64_t>(dtype) << 56) |
         (static_cast<uint64_t>(op) << 48) | static_cast<uint64_t>(count);
}

CollectiveError ShmGroup::signature_mismatch(const ShmContext& ctx, int peer, uint64_t theirs,
                                             uint64_t mine) const {
  auto describe = [](uint64_t sig) {
    const auto dtype = static_cast<DataType>((sig >> 56) & 0x7f);
    const auto op = static_cast<ReduceOp>((sig >> 48) & 0xff);
    return fmt::format("all_reduce({}, count={}, {})", to_string(dtype),
                       sig & ((uint64_t{1} << 48) - 1), to_string(op));
  };
  return CollectiveError(fmt::format(
      "{} on {}: rank {} issued {} at the same point; every rank must issue the same "
      "collectives with the same count, dtype and op (a rank that skipped or added one, e.g. "
      "a SyncBatchNorm or a Join without its peers, shifts all that follow; set "
      "DDP_DEBUG_COLLECTIVES=1 to compare every call)",
      describe(mine), ctx.where, group_ranks_[peer], describe(theirs)));
}

void ShmGroup::barrier(const ShmContext& ctx) {
  next_set();
  arrive();
  wait_all(ctx);
}

void ShmGroup::all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                          const ShmContext& ctx) {
  const size_t es = element_size(dtype);
  char* d = static_cast<char*>(data);
  if (n_ == 1) {
    return;  // kAvg over one rank is the identity
  }
  std::vector<const void*> srcs(n_);
  if (count * es <= std::min(kSmallAllReduceBytes, layout_.slot_bytes)) {
    const int set = next_set();
    std::memcpy(slot(set, me_), d, count * es);
    const uint64_t mine = call_signature(count, dtype, op);
    ctl_[me_].signature[set].store(mine, std::memory_order_relaxed);
    arrive();  // publishes the slot and the signature (release)
    wait_all(ctx);
    // Slots of another size or dtype would be reduced as if they were this rank's: compare
    // what every rank staged (one load per peer, on a line wait_all just read).
    for (int j = 0; j < n_; ++j) {
      const uint64_t theirs = ctl_[j].signature[set].load(std::memory_order_relaxed);
      if (theirs != mine) throw signature_mismatch(ctx, j, theirs, mine);
    }
    for (int j = 0; j < n_; ++j) srcs[j] = slot(set, j);
    reduce_buffers(dtype, op, d, srcs.data(), n_, count, n_);
    return;
  }
  const size_t chunk = std::max<size_t>(layout_.slot_bytes / es / n_ * n_, n_);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t c = std::min(chunk, count - off);
    auto start = [&](int j) { return c * j / n_; };
    const int set = next_set();
    char* mine = slot(set, me_);
    for (int j = 0; j < n_; ++j) {
      if (j == me_) continue;
      std::memcpy(mine + start(j) * es, d + (off + start(j)) * es, (start(j + 1) - start(j)) * es);
    }
    arrive();
    wait_all(ctx);
    const size_t s = start(me_), len = start(me_ + 1) - s;
    char* my_part = d + (off + s) * es;
    for (int j = 0; j < n_; ++j) srcs[j] = j == me_ ? my_part : slot(set, j) + s * es;
    reduce_buffers(dtype, op, my_part, srcs.data(), n_, len, n_, mine + s * es);
    arrive();
    wait_all(ctx);
    for (int j = 0; j < n_; ++j) {
      if (j == me_) continue;
      std::memcpy(d + (off + start(j)) * es, slot(set, j) + start(j) * es,
                  (start(j + 1) - start(j)) * es);
    }
  }
}

void ShmGroup::broadcast(void* data, size_t bytes, int root, const ShmContext& ctx) {
  if (n_ == 1) return;
  char* d = static_cast<char*>(data);
  // Only the root writes, so a round can use the whole set (all slots are contiguous).
  const size_t chunk = layout_.slot_bytes * n_;
  for (size_t off = 0; off < bytes || off == 0; off += chunk) {
    const size_t c = std::min(chunk, bytes - off);
    const int set = next_set();
    if (me_ == root) std::memcpy(slot(set, 0), d + off, c);
    arrive();
    wait_all(ctx);
    if (me_ != root) std::memcpy(d + off, slot(set, 0), c);
    if (bytes == 0) break;
  }
}

void ShmGroup::gather_v(const void* in, void* out, const std::vector<size_t>& bytes, int root,
                        const ShmContext& ctx) {
  const char* src = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  std::vector<size_t> displ(n_ + 1, 0);
  size_t most = 0;
  for (int j = 0; j < n_; ++j) {
    displ[j + 1] = displ[j] + bytes[j];
    most = std::max(most, bytes[j]);
  }
  const bool receive = root < 0 || root == me_;
  // My own block: memmove, since callers may pass in == out + displ[me] (in place).
  if (receive && bytes[me_] > 0 && o + displ[me_] != src) {
    std::memmove(o + displ[me_], src, bytes[me_]);
  }
  if (n_ == 1) return;
  const size_t chunk = layout_.slot_bytes;
  for (size_t off = 0; off < most; off += chunk) {
    const int set = next_set();
    if (off < bytes[me_]) std::memcpy(slot(set, me_), src + off, std::min(chunk, bytes[me_] - off));
    arrive();
    wait_all(ctx);
    if (!receive) continue;
    for (int j = 0; j < n_; ++j) {
      if (j == me_ || off >= bytes[j]) continue;
      std::memcpy(o + displ[j] + off, slot(set, j), std::min(chunk, bytes[j] - off));
    }
  }
}

void ShmGroup::scatter(const void* in, void* out, size_t bytes, int root, const ShmContext& ctx) {
  const char* src = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  if (me_ == root && bytes > 0 && o != src + me_ * bytes) {
    std::memmove(o, src + me_ * bytes, bytes);
  }
  if (n_ == 1) return;
  const size_t chunk = layout_.slot_bytes;
  for (size_t off = 0; off < bytes; off += chunk) {
    const size_t c = std::min(chunk, bytes - off);
    const int set = next_set();
    if (me_ == root) {
      for (int j = 0; j < n_; ++j) {
        if (j != root) std::memcpy(slot(set, j), src + j * bytes + off, c);
      }
    }
    arrive();
    wait_all(ctx);
    if (me_ != root) std::memcpy(o + off, slot(set, me_), c);
  }
}

void ShmGroup::reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                              const ShmContext& ctx) {
  const size_t es = element_size(dtype);
  const char* src = static_cast<const char*>(in);
  if (n_ == 1) {
    if (count > 0 && out != in) std::memmove(out, in, count * es);
    return;
  }
  // Per round, each rank stages a piece of every block but its own.
  const size_t piece = std::max<size_t>(layout_.slot_bytes / n_ / es, 1);
  std::vector<const void*> srcs(n_);
  for (size_t off = 0; off < count; off += piece) {
    const size_t c = std::min(piece, count - off);
    const int set = next_set();
    for (int j = 0; j < n_; ++j) {
      if (j == me_) continue;
      std::memcpy(slot(set, me_) + j * piece * es, src + (j * count + off) * es, c * es);
    }
    arrive();
    wait_all(ctx);
    for (int j = 0; j < n_; ++j) {
      srcs[j] = j == me_ ? src + (me_ * count + off) * es : slot(set, j) + me_ * piece * es;
    }
    reduce_buffers(dtype, op, static_cast<char*>(out) + off * es, srcs.data(), n_, c, n_);
  }
}

void ShmGroup::all_to_all(const void* in, void* out, size_t block_bytes, const ShmContext& ctx) {
  const char* src = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  if (block_bytes > 0) std::memmove(o + me_ * block_bytes, src + me_ * block_bytes, block_bytes);
  if (n_ == 1) return;
  const size_t piece = std::max<size_t>(layout_.slot_bytes / n_, 1);
  for (size_t off = 0; off < block_bytes; off += piece) {
    const size_t c = std::min(piece, block_bytes - off);
    const int set = next_set();
    for (int j = 0; j < n_; ++j) {
      if (j != me_) std::memcpy(slot(set, me_) + j * piece, src + j * block_bytes + off, c);
    }
    arrive();
    wait_all(ctx);
    for (int j = 0; j < n_; ++j) {
      if (j != me_) std::memcpy(o + j * block_bytes + off, slot(set, j) + me_ * piece, c);
    }
  }
}

void ShmGroup::send(const void* data, size_t bytes, int dst, int tag, const ShmContext& ctx) {
  Channel& ch = channel(me_, dst);
  char* buf = channel_buffer(me_, dst);
  const char* src = static_cast<const char*>(data);
  size_t off = 0;
  do {
    // The channel holds one chunk: wait until the receiver released the previous one.
    wait_word(&ch.consumed, sent_[dst], ctx,
              "receive an earlier chunk (is a matching recv posted?)", dst);
    const size_t c = std::min(layout_.p2p_bytes, bytes - off);
    ch.tag = tag;
    ch.chunk_bytes = static_cast<uint32_t>(c);
    ch.total_bytes = bytes;
    ch.offset = off;
    // A zero-byte send may pass nullptr, and memcpy's pointers must be valid even for 0 bytes.
    if (c > 0) std::memcpy(buf, src + off, c);
    publish(&ch.written, ++sent_[dst], &header_->waiters);
    off += c;
  } while (off < bytes);
}

CollectiveError ShmGroup::size_mismatch(const ShmContext& ctx, int src, int tag, size_t got,
                                        size_t bytes) const {
  return CollectiveError(fmt::format(
      "{} on {}: the matching send from rank {} with tag {} carries {} bytes but this recv "
      "expects {} bytes; send and recv must use the same count and dtype",
      ctx.call->describe(), ctx.where, group_ranks_[src], tag, got, bytes));
}

bool ShmGroup::take_early(void* data, size_t bytes, int src, int tag, const ShmContext& ctx) {
  auto& early = pending_[src];
  for (auto it = early.begin(); it != early.end(); ++it) {
    if (it->first != tag) continue;
    if (it->second.size() != bytes) throw size_mismatch(ctx, src, tag, it->second.size(), bytes);
    if (bytes > 0) std::memcpy(data, it->second.data(), bytes);
    early.erase(it);
    return true;
  }
  return false;
}

bool ShmGroup::read_message(void* data, size_t bytes, int src, int tag, const ShmContext& ctx) {
  Channel& ch = channel(src, me_);
  const char* buf = channel_buffer(src, me_);
  std::string stash;
  bool match = false;
  int msg_tag = 0;
  size_t total = 0, off = 0;
  do {
    wait_word(&ch.written, consumed_[src] + 1, ctx, "send (no matching send arrived)", src);
    // The sender's process wrote these fields: each is read once, and checked before it sizes
    // a copy, so a corrupt peer is a CollectiveError here, never a write past `data`.
    const int chunk_tag = ch.tag;
    const uint64_t chunk = ch.chunk_bytes, chunk_total = ch.total_bytes, at = ch.offset;
    if (off == 0) {
      msg_tag = chunk_tag;
      total = chunk_total;
      match = msg_tag == tag;
    }
    if (chunk_tag != msg_tag || chunk_total != total || at != off || chunk > layout_.p2p_bytes ||
        chunk > total - off || (chunk == 0 && total > 0)) {
      throw corrupt_chunk(ctx, src, chunk_tag, chunk, chunk_total, at, msg_tag, total, off);
    }
    if (off == 0 && match && total != bytes) throw size_mismatch(ctx, src, tag, total, bytes);
    if (off == 0 && !match) stash = stash_buffer(ctx, src, msg_tag, total);
    if (chunk > 0)
      std::memcpy(match ? static_cast<char*>(data) + off : stash.data() + off, buf, chunk);
    off += chunk;
    publish(&ch.consumed, ++consumed_[src], &header_->waiters);
    // Kept aside for a later recv with its tag.
    if (!match && off >= total) pending_[src].emplace_back(msg_tag, std::move(stash));
  } while (off < total);
  return match;
}

std::string ShmGroup::stash_buffer(const ShmContext& ctx, int src, int tag, size_t bytes) const {
  try {
    return std::string(bytes, '\0');
  } catch (const std::exception& e) {  // bad_alloc, length_error: a size no process can hold
    throw CollectiveError(fmt::format(
        "{} on {}: rank {} sent a message with tag {} of {} bytes before the one this recv "
        "waits for, and it cannot be held aside ({}); post the recvs in the order of the sends",
        ctx.call->describe(), ctx.where, group_ranks_[src], tag, bytes, e.what()));
  }
}

CollectiveError ShmGroup::corrupt_chunk(const ShmContext& ctx, int src, int chunk_tag,
                                        uint64_t chunk, uint64_t chunk_total, uint64_t at,
                                        int msg_tag, uint64_t total, uint64_t off) const {
  return CollectiveError(fmt::format(
      "{} on {}: rank {} published a corrupt point-to-point chunk: {} bytes at offset {} of a "
      "{}-byte message with tag {}, where this rank expected offset {} of {} bytes with tag {} "
      "and at most {} bytes a chunk (the channel's buffer). Its process wrote into the shared "
      "segment outside ddp's protocol (memory corruption, or not a ddp peer); the messages "
      "from it are out of step now: restart the job",
      ctx.call->describe(), ctx.where, group_ranks_[src], chunk, at, chunk_total, chunk_tag, off,
      total, msg_tag, layout_.p2p_bytes));
}

void ShmGroup::publish_raw_chunk(int dst, int tag, uint64_t chunk_bytes, uint64_t total_bytes,
                                 uint64_t offset, const ShmContext& ctx) {
  Channel& ch = channel(me_, dst);
  wait_word(&ch.consumed, sent_[dst], ctx, "receive an earlier chunk", dst);
  ch.tag = tag;
  ch.chunk_bytes = static_cast<uint32_t>(chunk_bytes);
  ch.total_bytes = total_bytes;
  ch.offset = offset;
  publish(&ch.written, ++sent_[dst], &header_->waiters);
}

void ShmGroup::recv(void* data, size_t bytes, int src, int tag, const ShmContext& ctx) {
  std::lock_guard<std::mutex> lock(source_mutex_[src]);
  if (take_early(data, bytes, src, tag, ctx)) return;
  while (!read_message(data, bytes, src, tag, ctx)) {
  }
}

bool ShmGroup::try_recv(void* data, size_t bytes, int src, int tag, const ShmContext& ctx) {
  std::unique_lock<std::mutex> lock(source_mutex_[src], std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (take_early(data, bytes, src, tag, ctx)) return true;
  Channel& ch = channel(src, me_);
  // A chunk not yet consumed: a message has begun.
  while (ch.written.load(std::memory_order_acquire) != consumed_[src]) {
    if (read_message(data, bytes, src, tag, ctx)) return true;
  }
  return false;
}

}  // namespace ddp::detail
