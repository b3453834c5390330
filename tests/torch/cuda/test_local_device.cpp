// local_device / default_backend / comm_device: which device a rank uses. These run on every
// machine; the branches that need a GPU skip with the reason where none is usable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "ddp/torch/ddp/local_device.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/util/error.hpp"
#include "rank_threads.hpp"

namespace {

// Sets environment variables for one test and restores the previous values.
class EnvGuard {
 public:
  void set(const char* name, const std::string& value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    setenv(name, value.c_str(), 1);
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string usage_error_of(const std::string& request) {
  try {
    ddp::local_device(request);
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LocalDevice, CpuIsAlwaysTheCpu) {
  EXPECT_EQ(ddp::local_device("cpu"), torch::Device(torch::kCPU));
  EXPECT_EQ(ddp::default_backend(torch::Device(torch::kCPU)), "cpu");
  EXPECT_EQ(ddp::default_backend(torch::Device(torch::kCUDA, 1)), "nccl");
}

TEST(LocalDevice, UnknownRequestsNameTheAcceptedForms) {
  for (const std::string bad : {"tpu", "gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA"}) {
    const std::string message = usage_error_of(bad);
    EXPECT_NE(message.find("'" + bad + "'"), std::string::npos) << bad << ": " << message;
    EXPECT_TRUE(message.find("cpu, cuda") != std::string::npos ||
                message.find("cuda:0") != std::string::npos)
        << bad << ": " << message;
  }
}

TEST(LocalDevice, WithoutGpuAutoIsCpuAndCudaIsAnError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is usable: covered by the GPU tests";
  EXPECT_EQ(ddp::local_device("auto"), torch::Device(torch::kCPU));
  for (const std::string request : {"cuda", "cuda:0"}) {
    const std::string message = usage_error_of(request);
    EXPECT_NE(message.find("no CUDA device is usable"), std::string::npos) << message;
    EXPECT_NE(message.find(ddp::built_with_cuda_torch() ? "sees no GPU" : "CPU-only"),
              std::string::npos)
        << message;
  }
}

TEST(LocalDevice, CudaIsTheLocalRanksGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device (CPU-only machine)";
  const int count = static_cast<int>(torch::cuda::device_count());
  EnvGuard env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  env.set("LOCAL_RANK", std::to_string(count - 1));
  EXPECT_EQ(ddp::local_device("cuda"), torch::Device(torch::kCUDA, count - 1));
  EXPECT_EQ(ddp::local_device("auto"), torch::Device(torch::kCUDA, count - 1));
  env.set("LOCAL_RANK", std::to_string(count));
  const std::string message = usage_error_of("cuda");
  EXPECT_NE(message.find("local rank " + std::to_string(count)), std::string::npos) << message;
  EXPECT_NE(message.find("sees " + std::to_string(count) + " CUDA device"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--nproc-per-node"), std::string::npos) << message;
  EXPECT_NE(usage_error_of("cuda:" + std::to_string(count)).find("pick cuda:0"), std::string::npos);
}

TEST(StreamOrder, HostBackendsUseHostBuffers) {
  ddp::test::run_ranks(1, [](int, ddp::ProcessGroupPtr pg) {
    EXPECT_EQ(ddp::comm_device(*pg), torch::Device(torch::kCPU));
    // Host backends take any tensor (CUDA ones through host staging).
    EXPECT_NO_THROW(ddp::check_tensor_device(*pg, torch::zeros({2}), "tensor"));
    EXPECT_NO_THROW(ddp::use_current_stream(*pg));
  });
}

}  // namespace
