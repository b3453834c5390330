#pragma once
// GlooProcessGroup: the "gloo" backend, every operation through one Gloo TCP context
// (internal header).

#include <memory>

#include "../async_process_group.hpp"
#include "gloo_comm.hpp"

namespace ddp::detail {

class GlooProcessGroup : public AsyncProcessGroup {
 public:
  explicit GlooProcessGroup(GroupConfig config);
  ~GlooProcessGroup() override;

  std::string backend_name() const override { return "gloo"; }

  // Point to point bypasses the queue: Gloo posts transfers without waiting for the peer,
  // so a rank can post recvs in any tag order (as torch's gloo backend does).
  WorkPtr send(const void* data, size_t count, DataType dtype, int dst, int tag) override;
  WorkPtr recv(void* data, size_t count, DataType dtype, int src, int tag) override;
  // Gloo's multi-source receive over every other rank.
  WorkPtr recv_any_source(void* data, size_t count, DataType dtype, int tag,
                          std::shared_ptr<int> source) override;

 protected:
  void run_all_reduce(void* data, size_t count, DataType dtype, ReduceOp op,
                      const CallInfo& call) override {
    comm_->all_reduce(data, count, dtype, op, call);
  }
  void run_broadcast(void* data, size_t count, DataType dtype, int root,
                     const CallInfo& call) override {
    comm_->broadcast(data, count * element_size(dtype), root, call);
  }
  void run_reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root,
                  const CallInfo& call) override {
    comm_->reduce(data, count, dtype, op, root, call);
  }
  void run_all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                        DataType dtype, const CallInfo& call) override;
  void run_gather(const void* in, void* out, size_t count, DataType dtype, int root,
                  const CallInfo& call) override {
    comm_->gather(in, out, count * element_size(dtype), root, call);
  }
  void run_scatter(const void* in, void* out, size_t count, DataType dtype, int root,
                   const CallInfo& call) override {
    comm_->scatter(in, out, count * element_size(dtype), root, call);
  }
  void run_reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                          const CallInfo& call) override {
    comm_->reduce_scatter(in, out, count, dtype, op, call);
  }
  void run_all_to_all(const void* in, void* out, size_t count, DataType dtype,
                      const CallInfo& call) override {
    comm_->all_to_all(in, out, count * element_size(dtype), call);
  }
  void run_barrier(const CallInfo& call) override { comm_->barrier(call); }
  ProcessGroupPtr make_same_backend(GroupConfig config) override {
    return std::make_shared<GlooProcessGroup>(std::move(config));
  }
  void end_running_operation() noexcept override { comm_->shut_down_connections(); }

 private:
  std::unique_ptr<GlooComm> comm_;
};

}  // namespace ddp::detail
