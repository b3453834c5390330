#pragma once
// DeviceBuffer: a TypedBuffer mirrored in CUDA device memory, for checking NCCL collectives
// against host-computed references.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "typed_buffer.hpp"

namespace ddp::test {

inline void cuda_ok(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
  }
}

class DeviceBuffer {
 public:
  DeviceBuffer(DataType dtype, size_t count) : host(dtype, count) {
    bytes_ = count * element_size(dtype);
    cuda_ok(cudaMalloc(&device_, bytes_ + 1), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return device_; }
  char* at(size_t i) { return static_cast<char*>(device_) + i * element_size(host.dtype()); }

  // Synchronous copies on the legacy default stream, which Work::wait orders after the
  // collective (the group's default compute stream).
  void upload() {
    cuda_ok(cudaMemcpy(device_, host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
  }
  void download() {
    cuda_ok(cudaMemcpy(host.data(), device_, bytes_, cudaMemcpyDeviceToHost), "download");
  }

  TypedBuffer host;

 private:
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

inline int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// A test that needs a visible GPU: skipped, saying why, on a machine without one.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (visible_gpus() == 0) GTEST_SKIP() << "no CUDA device visible: NCCL tests need a GPU";
  }
};

}  // namespace ddp::test
