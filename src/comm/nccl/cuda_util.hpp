#pragma once
// CUDA and NCCL plumbing for the NCCL backend: error checks that throw ddp exceptions, a
// device guard, and the mapping of ddp types onto NCCL's.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "ddp/comm/types.hpp"

namespace ddp::nccl_detail {

// Throws CollectiveError "nccl backend: rank R: <what> failed: <CUDA's message>" unless ok.
void check_cuda(cudaError_t result, const char* what, int rank);

// Makes `device` current for the scope and restores the previous device after: the calling
// thread's current device belongs to the application.
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_;
};

// Throws UsageError on a value outside the enums.
ncclDataType_t to_nccl(DataType dtype);
ncclRedOp_t to_nccl(ReduceOp op);

}  // namespace ddp::nccl_detail
