#pragma once
// TcpRing: all_reduce among the host leaders of the cpu backend over ddp's own TCP ring
// (internal header).
//
// Why not Gloo here: Gloo's unbound-buffer protocol precedes every segment with a
// ready/ready handshake and runs each call as a fresh set of buffers, so a pipeline of calls
// leaves the link idle between them, and every receive goes through Gloo's event thread. The
// ring keeps one connection to the next leader and one from the previous one for the whole
// life of the group, so the schedule is known to both ends: nothing but payload crosses the
// link, each step is full duplex (send to next while receiving from previous, in one poll
// loop), received bytes are reduced into the caller's buffer as they arrive (the reduction
// overlaps the transfer), and the all-gather receives straight into the caller's buffer.
//
// Algorithm: reduce-scatter then all-gather over n blocks (n-1 steps each); every block is
// reduced exactly once and then copied, so all ranks hold the same bits. float16/bfloat16 go
// on the wire as they are (a compression hook's bytes stay halved); each reduce-scatter step
// adds in float32 and rounds once to the wire type (n-1 roundings for n leaders, as in Gloo's
// and NCCL's rings).
//
// Setup: every rank listens on an ephemeral port of `host`, publishes a fresh random secret
// under "<prefix>secret/<rank>" and then host:port under "<prefix>addr/<rank>"; it connects to
// rank+1 and opens that connection with a hello proving it knows rank+1's secret
// (ring_auth.hpp), and it accepts rank-1, refusing and logging every connection that does not
// prove it is rank-1 (ring_accept.hpp), then deletes its secret from the store. So a stray
// connection to the port (a scanner, another job, a stale process) neither stalls the setup
// nor feeds bytes into the reduction. Every blocking step is bounded by the group timeout; a
// peer that vanishes is a NetworkError naming it.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../abort_signal.hpp"
#include "../call_info.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/store/store.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::detail {

class TcpRing {
 public:
  // `group_ranks[i]` names ring rank i in messages; `host` is the address peers reach us at.
  // `abort` (the group's, outliving the ring; may be null): a raised abort (in-place
  // recovery, a peer lost) ends a wait in the ring within kAbortPoll with the abort's error,
  // instead of at the group timeout.
  TcpRing(Store& store, const std::string& prefix, int rank, int size,
          std::chrono::milliseconds timeout, std::vector<int> group_ranks, std::string where,
          const std::string& host, const AbortSignal* abort = nullptr);

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In place; kAvg is not accepted (the caller divides once at the end).
  void all_reduce(void* data, size_t count, DataType dtype, ReduceOp op, const CallInfo& call);

  // Payload bytes this rank has sent to its successor so far (2 (n-1)/n of the buffer per
  // all_reduce, in the caller's dtype).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  // Sends [out, out+out_len) to next_ while receiving in_len bytes from prev_ into `in`;
  // on_recv(done) is called whenever the received prefix grew (done = bytes received so far).
  template <typename OnRecv>
  void exchange(const char* out, size_t out_len, char* in, size_t in_len, const CallInfo& call,
                OnRecv&& on_recv);
  void ring_all_reduce(char* data, size_t count, DataType dtype, ReduceOp op, const CallInfo& call);

  // How often a wait in the ring looks at the abort signal.
  static constexpr std::chrono::milliseconds kAbortPoll{50};

  int rank_;
  int size_;
  const AbortSignal* abort_;
  std::chrono::milliseconds timeout_;
  std::vector<int> group_ranks_;
  std::string where_;
  net::Socket next_;  // to rank + 1
  net::Socket prev_;  // from rank - 1
  std::string next_name_, prev_name_;
  std::vector<char> tmp_;  // receive buffer of the reduce-scatter
  uint64_t bytes_sent_ = 0;
};

// The address other hosts reach this one at: DDP_GLOO_IFNAME's IPv4 address if set, else the
// local address that routes to MASTER_ADDR, else 127.0.0.1 (as GlooComm chooses).
std::string advertised_host_address();

}  // namespace ddp::detail
