#include "gloo_process_group.hpp"

#include "../host_topology.hpp"
#include "../recorded_p2p.hpp"

namespace ddp::detail {

namespace {
std::vector<int> identity_ranks(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}
}  // namespace

GlooProcessGroup::GlooProcessGroup(GroupConfig config) : AsyncProcessGroup(std::move(config)) {
  // Joining first through the store gives a precise "k of n joined" timeout message.
  HostTopology::exchange(*config_.store, config_.prefix, rank_, size_, default_host_id(), timeout_);
  comm_ = std::make_unique<GlooComm>(config_.store, config_.prefix + "gloo/", rank_, size_,
                                     timeout_, identity_ranks(size_), where(), &abort_signal());
}

GlooProcessGroup::~GlooProcessGroup() {
  shutdown();
}

void GlooProcessGroup::run_all_gather_v(const void* in, void* out,
                                        const std::vector<size_t>& counts, DataType dtype,
                                        const CallInfo& call) {
  std::vector<size_t> bytes(counts);
  for (auto& b : bytes) b *= element_size(dtype);
  comm_->all_gather_v(in, out, bytes, call);
}

WorkPtr GlooProcessGroup::send(const void* data, size_t count, DataType dtype, int dst, int tag) {
  validate_p2p(data, count, dst, "send", "dst");
  CallInfo c{OpKind::kSend, dtype, ReduceOp::kSum, false, dst, tag, count, 0, 0};
  const uint64_t record = record_p2p_started(flight_recorder(), "send", dtype, count, dst);
  return record_p2p_completion(flight_recorder(), record,
                               comm_->post_send(data, count * element_size(dtype), dst, tag, c));
}

WorkPtr GlooProcessGroup::recv(void* data, size_t count, DataType dtype, int src, int tag) {
  validate_p2p(data, count, src, "recv", "src");
  CallInfo c{OpKind::kRecv, dtype, ReduceOp::kSum, false, src, tag, count, 0, 0};
  const uint64_t record = record_p2p_started(flight_recorder(), "recv", dtype, count, src);
  return record_p2p_completion(flight_recorder(), record,
                               comm_->post_recv(data, count * element_size(dtype), src, tag, c));
}

WorkPtr GlooProcessGroup::recv_any_source(void* data, size_t count, DataType dtype, int tag,
                                          std::shared_ptr<int> source) {
  check_buffer(data, count, "data", "recv from any source");
  if (size() == 1) {
    throw UsageError("recv from any source: this group has no other rank to receive from");
  }
  CallInfo c{OpKind::kRecv, dtype, ReduceOp::kSum, false, -1, tag, count, 0, 0};
  const uint64_t record = record_p2p_started(flight_recorder(), "recv", dtype, count, -1);
  return record_p2p_completion(
      flight_recorder(), record,
      comm_->post_recv_any(data, count * element_size(dtype), tag, c, std::move(source)));
}

}  // namespace ddp::detail
