#pragma once
// GlooComm: blocking collectives over one Gloo context (TCP transport) (internal header).
// Used by the "gloo" backend directly and by the "cpu" backend among hosts.
//
// Rendezvous goes through a ddp::Store under a key prefix (StoreAdapter). The address Gloo
// listens on: DDP_GLOO_IFNAME (an interface name) if set, else the local address that routes
// to MASTER_ADDR, else 127.0.0.1 when MASTER_ADDR is unset (single-host jobs and tests).
//
// float16 / bfloat16 reductions are carried out in float32 (converted before and after), so
// summing over many ranks does not lose precision at every hop.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../abort_signal.hpp"
#include "../call_info.hpp"
#include "connection_sockets.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/store/store.hpp"
#include "pending_transfers.hpp"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace ddp::detail {

class GlooComm {
 public:
  // Collective over all `size` ranks: blocks until all connected or `timeout`.
  // `group_ranks[i]` names rank i in messages (ranks of the enclosing process group).
  // `abort` (the enclosing group's, outliving this; may be null): once raised, a collective
  // that fails throws the abort's error (a PeerLostError) instead of its own; so does a
  // point-to-point Work that shut_down_connections ended (it keeps a copy of the error).
  GlooComm(std::shared_ptr<Store> store, const std::string& prefix, int rank, int size,
           std::chrono::milliseconds timeout, std::vector<int> group_ranks, std::string where,
           const AbortSignal* abort = nullptr);
  ~GlooComm();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // kAvg divides by `avg_divisor` (0: by size()).
  void all_reduce(void* data, size_t count, DataType dtype, ReduceOp op, const CallInfo& call,
                  int avg_divisor = 0);
  void broadcast(void* data, size_t bytes, int root, const CallInfo& call);
  void reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root,
              const CallInfo& call);
  void all_gather_v(const void* in, void* out, const std::vector<size_t>& bytes,
                    const CallInfo& call);
  void gather(const void* in, void* out, size_t bytes, int root, const CallInfo& call);
  void scatter(const void* in, void* out, size_t bytes, int root, const CallInfo& call);
  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      const CallInfo& call);
  void all_to_all(const void* in, void* out, size_t block_bytes, const CallInfo& call);
  void barrier(const CallInfo& call);
  // Non-blocking point to point: posts the transfer and returns a Work whose wait() completes
  // it. Posting never waits for the peer, so sends and recvs may be issued in any order.
  std::shared_ptr<Work> post_send(const void* data, size_t bytes, int dst, int tag,
                                  const CallInfo& call);
  std::shared_ptr<Work> post_recv(void* data, size_t bytes, int src, int tag, const CallInfo& call);
  // A recv from whichever other rank sends with `tag` first, Gloo's multi-source receive. Once
  // wait() returned, *source holds the sender as a rank of the enclosing group. A message sent to
  // this rank with `tag` while a recv naming its sender is posted goes to that recv (Gloo matches a
  // pair's own recvs before multi-source ones).
  std::shared_ptr<Work> post_recv_any(void* data, size_t bytes, int tag, const CallInfo& call,
                                      std::shared_ptr<int> source);

  // In-place recovery (the enclosing group's notify_peer_lost, after raising `abort`): shuts
  // every connection down (connection_sockets.hpp), so the call in flight on this rank and
  // every peer's call waiting on this rank fail now instead of at the timeout (Gloo gives no
  // other way to end a call in flight), and ends the wait of every point-to-point transfer
  // whose Work still exists, a recv from any source included (pending_transfers.hpp): those
  // throw the abort's error. Thread-safe; this communicator is unusable afterwards.
  void shut_down_connections() noexcept;

 private:
  // Runs a blocking Gloo call; its failure leaves as one of ddp's errors naming `call`.
  template <typename Fn>
  void guarded(const CallInfo& call, Fn&& fn);
  // Only inside a catch block: rethrows the exception being handled as ddp's TimeoutError
  // (naming the ranks that never reached `call`), NetworkError or CollectiveError.
  [[noreturn]] void throw_gloo_failure(const CallInfo& call);
  uint32_t next_tag() { return tag_++; }
  // A Gloo options object (gloo::AllreduceOptions, ...) for one call: this communicator's
  // context, the call's tag and the group timeout.
  template <typename Options>
  Options call_options(uint32_t tag) const;
  // After a timeout: the ranks (of the enclosing group) that never reached `call`.
  std::vector<int> missing_ranks(const CallInfo& call);
  // After a connection failed: closes every connection of this communicator (unusable now),
  // so that peers waiting on this rank fail at once ("connection closed by peer") instead of
  // at the group timeout. Without it a peer whose partner in the collective was this rank,
  // alive but out of the collective, waited the whole timeout (in-place recovery then lost a
  // minute and a second restart: rank 2 died, rank 1 saw it, rank 0 waited on rank 1).
  void close_connections() noexcept;

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<int> group_ranks_;
  std::string where_;
  const AbortSignal* abort_;
  GlooConnectionSockets sockets_;  // of context_'s connections, found once it connected
  // The point-to-point transfers posted whose Work still exists (shared with each Work).
  std::shared_ptr<GlooPendingTransfers> pending_ = std::make_shared<GlooPendingTransfers>();
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
};

}  // namespace ddp::detail
