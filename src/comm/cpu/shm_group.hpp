#pragma once
// ShmGroup: blocking collectives among the ranks of one host through one shared-memory
// segment (internal header). Threads of one process and separate processes are handled alike:
// each rank maps the segment itself.
//
// Segment: header, one phase counter per rank, one point-to-point channel per ordered pair,
// two sets ("parities") of one staging slot per rank, and the channel buffers.
//
// Synchronisation: a rank announces progress by bumping its phase counter; "wait_all" waits
// until every rank's counter reached ours. Every collective runs as rounds over alternating
// slot sets, and every round starts with arrive + wait_all, so when a rank writes set s in
// round t all ranks have finished reading set s of round t-2 (they announced round t-1).
// Reductions combine sources in rank order, so every rank gets bit-identical results.
//
// Large all_reduce is a pipelined reduce-scatter + all-gather: per chunk, each rank stages the
// parts of its data the others reduce, reduces its own part (1/n) from the peers' slots and
// publishes it, then copies the others' reduced parts.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../abort_signal.hpp"
#include "../call_info.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/util/error.hpp"
#include "futex_wait.hpp"
#include "shm_segment.hpp"

namespace ddp::detail {

struct ShmLayout {
  int ranks = 1;
  size_t slot_bytes = 1 << 20;  // staging bytes per rank and parity
  size_t p2p_bytes = 64 << 10;  // buffer per ordered pair of ranks

  size_t total_bytes() const;
};

// Identifies the running collective in timeout messages.
struct ShmContext {
  const CallInfo* call = nullptr;
  Clock::time_point deadline;
  std::string where;  // "rank 0 of 2 (backend cpu, group ...)"
  std::chrono::milliseconds timeout{0};
  // The group's abort (notify_peer_lost): a wait it ends rethrows its error. May be null.
  const AbortSignal* abort = nullptr;
};

class ShmGroup {
 public:
  // Writes the header of a freshly created (zeroed) segment.
  static void initialize(void* memory, const ShmLayout& layout);

  // `group_ranks[i]` is the process-group rank of local rank i (for messages).
  ShmGroup(ShmSegment segment, ShmLayout layout, int local_rank, std::vector<int> group_ranks,
           std::chrono::microseconds spin);

  int rank() const { return me_; }
  int size() const { return n_; }
  ShmSegment& segment() { return segment_; }

  // kAvg divides by the number of local ranks.
  void all_reduce(void* data, size_t count, DataType dtype, ReduceOp op, const ShmContext& ctx);
  void broadcast(void* data, size_t bytes, int root, const ShmContext& ctx);
  // bytes[j] from rank j packed into out; only `root` receives when root >= 0.
  void gather_v(const void* in, void* out, const std::vector<size_t>& bytes, int root,
                const ShmContext& ctx);
  void scatter(const void* in, void* out, size_t bytes, int root, const ShmContext& ctx);
  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      const ShmContext& ctx);
  void all_to_all(const void* in, void* out, size_t block_bytes, const ShmContext& ctx);
  void barrier(const ShmContext& ctx);
  void send(const void* data, size_t bytes, int dst, int tag, const ShmContext& ctx);
  void recv(void* data, size_t bytes, int src, int tag, const ShmContext& ctx);
  // For a recv from any source: receives a message from `src` with `tag` if one has arrived
  // (or has begun to arrive: then it waits for the rest), stashing the earlier ones with other
  // tags; false when none has, or when a recv from `src` is in progress on another thread (its
  // messages are that recv's). Never waits for a message to begin.
  bool try_recv(void* data, size_t bytes, int src, int tag, const ShmContext& ctx);

  // Wakes this process's waits asleep in this group (every word it may wait on) so they read
  // their abort flag now, not at the end of their sleep; other processes' sleepers on those
  // words wake too and sleep again. Thread-safe; for ProcessGroup::notify_peer_lost.
  void wake_waiters() noexcept;

  // Tests only: publishes one chunk to `dst` with these header fields and no payload, as a
  // corrupt or hostile peer process could (after the receiver released the previous chunk).
  // The receiver must refuse what does not fit its protocol, never trust it.
  void publish_raw_chunk(int dst, int tag, uint64_t chunk_bytes, uint64_t total_bytes,
                         uint64_t offset, const ShmContext& ctx);

 private:
  friend struct ShmLayout;
  struct Header;
  // The single-round all_reduce's (count, dtype, op), packed; compared across ranks.
  static uint64_t call_signature(size_t count, DataType dtype, ReduceOp op);
  CollectiveError signature_mismatch(const ShmContext& ctx, int peer, uint64_t theirs,
                                     uint64_t mine) const;
  struct RankCtl;
  struct Channel;

  void arrive();
  void wait_all(const ShmContext& ctx);
  std::chrono::microseconds spin_now() const;
  void after_wait(bool slept);
  void wait_word(std::atomic<uint32_t>* word, uint32_t target, const ShmContext& ctx,
                 const char* waiting_for, int peer);
  char* slot(int set, int rank) const;
  int next_set() { return static_cast<int>(round_++ & 1); }
  Channel& channel(int src, int dst) const;
  // recv's and try_recv's: a matching early message from `src` taken into `data`, if any.
  bool take_early(void* data, size_t bytes, int src, int tag, const ShmContext& ctx);
  // Reads one whole message from `src` (waiting for its chunks): into `data` when its tag is
  // `tag` (true), else into pending_ (false).
  bool read_message(void* data, size_t bytes, int src, int tag, const ShmContext& ctx);
  CollectiveError size_mismatch(const ShmContext& ctx, int src, int tag, size_t got,
                                size_t bytes) const;
  // A chunk whose header does not continue the message read so far (read_message).
  CollectiveError corrupt_chunk(const ShmContext& ctx, int src, int chunk_tag, uint64_t chunk,
                                uint64_t chunk_total, uint64_t at, int msg_tag, uint64_t total,
                                uint64_t off) const;
  // A zeroed buffer for an early message of `bytes` from `src`; CollectiveError when no
  // process could hold that many (the size is the peer's word).
  std::string stash_buffer(const ShmContext& ctx, int src, int tag, size_t bytes) const;
  char* channel_buffer(int src, int dst) const;

  ShmSegment segment_;
  ShmLayout layout_;
  int me_;
  int n_;
  std::vector<int> group_ranks_;
  std::chrono::microseconds spin_;  // the most a wait spins before sleeping
  // The current spin is spin_ / 2^spin_shift_ (adapted by the collectives' waits; also read by
  // the point-to-point threads, hence atomic).
  static constexpr int kMaxSpinShift = 5;
  std::atomic<int> spin_shift_{0};
  Header* header_;
  RankCtl* ctl_;
  Channel* channels_;
  char* slots_;
  char* p2p_;
  uint32_t phase_ = 0;
  uint64_t round_ = 0;
  std::vector<uint32_t> sent_;      // chunks written per destination channel
  std::vector<uint32_t> consumed_;  // chunks consumed per source channel
  // Messages that arrived before their recv was posted, per source, in arrival order.
  std::vector<std::deque<std::pair<int, std::string>>> pending_;
  // Per source: held by a recv from it (which may wait), tried by try_recv, so consumed_[src]
  // and pending_[src] have one user at a time (recvs from different sources run on different
  // threads).
  std::unique_ptr<std::mutex[]> source_mutex_;
};

}  // namespace ddp::detail
