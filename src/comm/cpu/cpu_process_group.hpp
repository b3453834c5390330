#pragma once
// CpuProcessGroup: the "cpu" backend (internal header).
//
// Ranks on one host (equal host ids) run collectives through a ShmGroup. With several hosts
// it is hierarchical: all_reduce, broadcast and barrier go through shared memory within each
// host and TCP among one leader per host (all_reduce over ddp's own ring, TcpRing, unless
// DDP_CPU_LEADER_TRANSPORT=gloo; broadcast and barrier over Gloo; a large all_reduce pipelined
// in chunks, so the shared-memory steps overlap the transfer between hosts); the remaining
// operations (gathers, scatters, all_to_all, send/recv across hosts) use a Gloo context over all
// ranks.
//
// The shared-memory segment's name comes from the host leader through the store
// ("<prefix>shm/<host>"); the last rank to map it unlinks it, so nothing is left in /dev/shm
// even if the job is killed afterwards.

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../async_process_group.hpp"
#include "../host_topology.hpp"
#include "../serial_executor.hpp"
#include "shm_group.hpp"

namespace ddp::detail {

class GlooComm;
class TcpRing;

class CpuProcessGroup : public AsyncProcessGroup {
 public:
  CpuProcessGroup(GroupConfig config, std::string host_id);
  ~CpuProcessGroup() override;

  std::string backend_name() const override { return "cpu"; }
  const HostTopology& topology() const { return topo_; }

  // Point to point bypasses the collective queue. Within one host: sends to a peer run in
  // order on a thread of their own, as do receives from a peer, so recv-before-send patterns
  // (rings) progress. In a group spanning hosts every send and recv, to a peer on the same
  // host too, is posted to the Gloo context of all ranks without waiting: a recv from any
  // source must see every sender in one place, and Gloo's multi-source receive cannot be
  // withdrawn once posted (so it cannot race a shared-memory poll). That is gloo's own cost.
  WorkPtr send(const void* data, size_t count, DataType dtype, int dst, int tag) override;
  WorkPtr recv(void* data, size_t count, DataType dtype, int src, int tag) override;
  // Within one host: polls every peer's channel (try_recv) on a thread of its own, backing off
  // from 20 us to 1 ms between rounds, until a message with `tag` arrives, the group timeout
  // passes or the group is aborted. Groups spanning hosts: Gloo's multi-source receive over
  // every other rank.
  WorkPtr recv_any_source(void* data, size_t count, DataType dtype, int tag,
                          std::shared_ptr<int> source) override;

 protected:
  void run_all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                      const CallInfo& call) override;
  void run_broadcast(void* data, size_t count, DataType dtype, int root,
                     const CallInfo& call) override;
  void run_reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root,
                  const CallInfo& call) override;
  void run_all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                        DataType dtype, const CallInfo& call) override;
  void run_gather(const void* in, void* out, size_t count, DataType dtype, int root,
                  const CallInfo& call) override;
  void run_scatter(const void* in, void* out, size_t count, DataType dtype, int root,
                   const CallInfo& call) override;
  void run_reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                          const CallInfo& call) override;
  void run_all_to_all(const void* in, void* out, size_t count, DataType dtype,
                      const CallInfo& call) override;
  void run_barrier(const CallInfo& call) override;
  ProcessGroupPtr make_same_backend(GroupConfig config) override;
  void end_running_operation() noexcept override;

 private:
  // Hierarchical all_reduce of large buffers is pipelined in chunks (all_reduce_pipelined).
  static constexpr size_t kPipelineChunkBytes = size_t{2} << 20;
  static constexpr size_t kPipelineChunks = 8;
  size_t pipeline_chunk_elems(size_t count, size_t es) const;
  void all_reduce_pipelined(char* data, size_t count, size_t chunk, DataType dtype, ReduceOp op,
                            const CallInfo& call, const ShmContext& ctx);
  SerialExecutor& leader_executor();
  // Point to point goes through Gloo (all_ranks) rather than shared memory (send's comment).
  bool p2p_over_gloo() const { return topo_.num_hosts() > 1; }
  void leaders_all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                          const CallInfo& call);
  ShmContext context(const CallInfo& call) const;
  SerialExecutor& p2p_executor(int index);
  bool single_host() const { return topo_.num_hosts() == 1; }
  GlooComm& all_ranks(const CallInfo& call);

  std::string host_id_;
  std::optional<size_t> pipeline_bytes_;  // DDP_CPU_PIPELINE_BYTES
  HostTopology topo_;
  std::unique_ptr<ShmGroup> shm_;      // null when this rank is alone on its host
  std::unique_ptr<GlooComm> leaders_;  // host leaders only, when there are several hosts
  std::unique_ptr<TcpRing> ring_;  // the leaders' all_reduce, unless DDP_CPU_LEADER_TRANSPORT=gloo
  std::unique_ptr<GlooComm> all_ranks_;  // every rank, when there are several hosts
  // Runs the leaders' Gloo calls of a pipelined all_reduce; declared after leaders_ so it is
  // drained first. Only used from the collective thread, one all_reduce at a time.
  std::unique_ptr<SerialExecutor> leader_exec_;
  std::mutex p2p_mutex_;
  // Lazily created, per peer: [peer] sends, [size + peer] receives. Destroyed (drained)
  // before the shared memory they use.
  std::vector<std::unique_ptr<SerialExecutor>> p2p_;
};

}  // namespace ddp::detail
