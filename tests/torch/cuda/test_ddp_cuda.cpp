// DDP on CUDA: DDP-wrapped training on the GPU ends with the parameters of plain training on the
// whole batch (max relative error over parameters below kTolerance), over the nccl backend at
// world size 1 (buckets really all-reduced through NCCL by a hook that never skips) and 2 (with
// 2 GPUs), on a side stream, and over the cpu backend with CUDA tensors (host staging).
// Without a usable GPU every test here skips with the reason.
//
// Two ranks on one GPU run as two processes (this binary re-executed with "--cpu-backend-worker
// DIR"), as ddprun runs them: ranks as threads of one process would share LibTorch's one
// autograd thread per GPU, where one rank's backward (its gradient hooks, the final callback
// that waits for the all-reduces) blocks the other's, so they would wait for each other until
// the group timeout.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "../../support/free_port_range.hpp"
#include "../../support/wait_or_kill.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"
#include "ddp/util/socket.hpp"
#include "models.hpp"
#include "rank_threads.hpp"

#if defined(DDP_WITH_CUDA_TORCH)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using ddp::DistributedDataParallel;
using ddp::DistributedDataParallelOptions;
using ddp::test::Cnn;

// float32 reductions on the GPU (cuDNN/cuBLAS algorithms, NCCL's summation order) differ from
// the reference in the last bits, which Adam's normalisation amplifies a little.
constexpr double kTolerance = 1e-4;
constexpr auto kTimeout = std::chrono::seconds(120);

// Why the GPU tests cannot run here, or "" when they can.
std::string gpu_skip_reason(int gpus_needed) {
  if (!ddp::built_with_cuda_torch()) return "this build's LibTorch is CPU-only (no CUDA)";
  if (!torch::cuda::is_available()) return "no usable CUDA device";
  const int count = static_cast<int>(torch::cuda::device_count());
  if (count < gpus_needed) {
    return "needs " + std::to_string(gpus_needed) + " GPUs, this machine has " +
           std::to_string(count);
  }
  return "";
}

bool have_nccl() {
  const auto backends = ddp::available_backends();
  return std::find(backends.begin(), backends.end(), "nccl") != backends.end();
}

#define SKIP_WITHOUT_GPUS(n)                    \
  do {                                          \
    const std::string why = gpu_skip_reason(n); \
    if (!why.empty()) GTEST_SKIP() << why;      \
  } while (0)

#define SKIP_WITHOUT_NCCL()                                                             \
  do {                                                                                  \
    if (!have_nccl()) GTEST_SKIP() << "built without the nccl backend (DDP_WITH_NCCL)"; \
  } while (0)

// Runs `world` ranks as threads, rank r with its own nccl group on cuda:r.
void run_nccl_ranks(int world, const std::function<void(int, ddp::ProcessGroupPtr)>& fn) {
  auto store = std::make_shared<ddp::HashStore>();
  store->set_timeout(kTimeout);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ddp::InitOptions opts;
        opts.backend = "nccl";
        opts.rank = r;
        opts.world_size = world;
        opts.store = store;
        opts.device = r;
        opts.timeout = kTimeout;
        fn(r, ddp::init_process_group(opts));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

struct Data {
  std::vector<torch::Tensor> xs, ys;  // per step, the whole batch (world * B) on the CPU
};

Data make_data(int steps, int rows) {
  torch::manual_seed(0);
  Data d;
  for (int s = 0; s < steps; ++s) {
    d.xs.push_back(torch::randn({rows, 1, 28, 28}));
    d.ys.push_back(torch::randint(0, 10, {rows}, torch::kLong));
  }
  return d;
}

// Plain training of `model` on the whole batches, on `device`.
void train_reference(Cnn& model, const Data& d, const torch::Device& device) {
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  for (size_t s = 0; s < d.xs.size(); ++s) {
    opt.zero_grad();
    torch::nll_loss(model->forward(d.xs[s].to(device)), d.ys[s].to(device)).backward();
    opt.step();
  }
}

// One rank of DDP training: its share (B rows) of every batch.
void train_rank(DistributedDataParallel<ddp::models::MnistCnnImpl>& model, const Data& d, int rank,
                int B, const torch::Device& device) {
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-3));
  for (size_t s = 0; s < d.xs.size(); ++s) {
    opt.zero_grad();
    auto x = d.xs[s].narrow(0, rank * B, B).to(device);
    auto y = d.ys[s].narrow(0, rank * B, B).to(device);
    torch::nll_loss(model(x), y).backward();
    model.step(opt);
  }
}

double error_against(Cnn& model, Cnn& ref) {
  Cnn a, b;
  ddp::test::copy_state(*model, *a);  // copy_ moves CUDA tensors to the CPU
  ddp::test::copy_state(*ref, *b);
  return ddp::test::max_relative_error(*a, *b);
}

// World 1 over nccl with every bucket all-reduced: as plain training (also with
// find_unused_parameters, whose used-parameter flags then travel through NCCL too).
void world1_matches(const DistributedDataParallelOptions& options) {
  const torch::Device cuda(torch::kCUDA, 0);
  const Data d = make_data(3, 4);
  torch::manual_seed(7);
  Cnn ref, net;
  ddp::test::copy_state(*ref, *net);
  train_reference(ref, d, cuda);
  net->to(cuda);
  run_nccl_ranks(1, [&](int rank, ddp::ProcessGroupPtr pg) {
    DistributedDataParallel model(net, pg, options);
    train_rank(model, d, rank, 4, cuda);
  });
  EXPECT_LT(error_against(net, ref), kTolerance);
}

TEST(CudaDdp, NcclWorld1MatchesPlainTraining) {
  SKIP_WITHOUT_GPUS(1);
  SKIP_WITHOUT_NCCL();
  world1_matches(
      DistributedDataParallelOptions().comm_hook(ddp::always_allreduce_hook()).bucket_cap_mb(1));
}

TEST(CudaDdp, NcclWorld1FindUnusedParameters) {
  SKIP_WITHOUT_GPUS(1);
  SKIP_WITHOUT_NCCL();
  world1_matches(DistributedDataParallelOptions()
                     .comm_hook(ddp::always_allreduce_hook())
                     .find_unused_parameters(true));
}

TEST(CudaDdp, NcclWorld1GradientAsBucketViewDefaultHook) {
  SKIP_WITHOUT_GPUS(1);
  SKIP_WITHOUT_NCCL();
  world1_matches(DistributedDataParallelOptions().gradient_as_bucket_view(true));
}

#if defined(DDP_WITH_CUDA_TORCH)
// Forward, backward and the optimizer on a side stream: the collectives must order with that
// stream (not the default one), or the all-reduce would read buckets before the copies.
TEST(CudaDdp, NcclWorld1OnASideStream) {
  SKIP_WITHOUT_GPUS(1);
  SKIP_WITHOUT_NCCL();
  const torch::Device cuda(torch::kCUDA, 0);
  const Data d = make_data(3, 4);
  torch::manual_seed(7);
  Cnn ref, net;
  ddp::test::copy_state(*ref, *net);
  train_reference(ref, d, cuda);
  net->to(cuda);
  run_nccl_ranks(1, [&](int rank, ddp::ProcessGroupPtr pg) {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(false, 0));
    DistributedDataParallel model(
        net, pg, DistributedDataParallelOptions().comm_hook(ddp::always_allreduce_hook()));
    train_rank(model, d, rank, 4, cuda);
    c10::cuda::getCurrentCUDAStream(0).synchronize();
  });
  EXPECT_LT(error_against(net, ref), kTolerance);
}
#endif

TEST(CudaDdp, NcclWorld2MatchesOneProcessWithTheWholeBatch) {
  SKIP_WITHOUT_GPUS(2);
  SKIP_WITHOUT_NCCL();
  const int world = 2, B = 3;
  const Data d = make_data(3, world * B);
  torch::manual_seed(7);
  Cnn ref;
  std::vector<Cnn> nets(world);  // different initial states: DDP broadcasts rank 0's
  ddp::test::copy_state(*nets[0], *ref);
  train_reference(ref, d, torch::Device(torch::kCUDA, 0));
  run_nccl_ranks(world, [&](int rank, ddp::ProcessGroupPtr pg) {
    const torch::Device cuda(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
    nets[rank]->to(cuda);
    DistributedDataParallel model(nets[rank], pg,
                                  DistributedDataParallelOptions().bucket_cap_mb(1));
    train_rank(model, d, rank, B, cuda);
  });
  for (int r = 0; r < world; ++r) EXPECT_LT(error_against(nets[r], ref), kTolerance) << r;
}

// CUDA tensors over a host backend go through host copies (needs_host_staging).
constexpr int kCpuBackendSteps = 3, kCpuBackendRowsPerRank = 3;

// One rank of the CpuBackendWithCudaTensors tests, in its own process (torchrun's environment
// set by the test): trains its share on cuda:0 over the cpu backend, saves its parameters to
// DIR/rank<r>.pt. MODE: "overlap" (the default staging: copies on a side stream, all-reduces
// issued by the staging thread), "sync" (DDP_HOST_STAGING=sync: the synchronous copies),
// "unused" (overlap with find_unused_parameters: the used-parameter all-reduce must follow
// the staged ones on every rank).
int cpu_backend_worker_main(const std::string& dir, const std::string& mode) {
  if (mode == "sync") ::setenv("DDP_HOST_STAGING", "sync", 1);
  ddp::InitOptions init;
  init.backend = "cpu";
  init.timeout = kTimeout;
  auto pg = ddp::init_process_group(init);
  const int rank = pg->rank(), world = pg->size();
  const torch::Device cuda(torch::kCUDA, 0);
  const Data d = make_data(kCpuBackendSteps, world * kCpuBackendRowsPerRank);
  torch::manual_seed(7);
  Cnn net;
  net->to(cuda);
  DistributedDataParallel model(
      net, pg, DistributedDataParallelOptions().find_unused_parameters(mode == "unused"));
  train_rank(model, d, rank, kCpuBackendRowsPerRank, cuda);
  std::vector<torch::Tensor> params;
  for (const auto& p : net->parameters()) params.push_back(p.detach().cpu());
  torch::save(params, dir + "/rank" + std::to_string(rank) + ".pt");
  return 0;
}

// Starts this binary as rank `rank` of `world` with torchrun's variables; its pid.
pid_t spawn_cpu_backend_worker(int rank, int world, int port, const std::string& dir,
                               const std::string& mode) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    bool ours = false;
    for (const char* name : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                             "MASTER_ADDR=", "MASTER_PORT="}) {
      ours = ours || kv.rfind(name, 0) == 0;
    }
    if (!ours) env.push_back(kv);
  }
  for (std::string kv :
       {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
        "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=" + std::to_string(world),
        std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port)}) {
    env.push_back(kv);
  }
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::string arg0 = "test_ddp_cuda", arg1 = "--cpu-backend-worker", arg2 = dir, arg3 = mode;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), arg3.data(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return pid;
}

using ddp::test::wait_or_kill;

// Two ranks on cuda:0 over the cpu backend (worker MODE above) match one process training on
// the whole batch.
void cpu_backend_world2_matches(const std::string& mode) {
  const int world = 2;
  const torch::Device cuda(torch::kCUDA, 0);
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("ddp_cuda_cpu_backend_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // Below the ephemeral range: a port found by binding port 0 and closed could be taken by an
  // outgoing connection before rank 0's store binds it ("address already in use").
  const int port = ddp::test::free_ports_below_ephemeral_range();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(spawn_cpu_backend_worker(r, world, port, dir, mode));
  }
  const auto deadline = std::chrono::steady_clock::now() + kTimeout + std::chrono::seconds(30);
  for (int r = 0; r < world; ++r) {
    ASSERT_GT(pids[r], 0) << "posix_spawn failed for rank " << r;
    EXPECT_EQ(wait_or_kill(pids[r], deadline), 0) << "rank " << r << " failed (its stderr above)";
  }

  const Data d = make_data(kCpuBackendSteps, world * kCpuBackendRowsPerRank);
  torch::manual_seed(7);
  Cnn ref;
  train_reference(ref, d, cuda);
  for (int r = 0; r < world; ++r) {
    const fs::path file = dir / ("rank" + std::to_string(r) + ".pt");
    ASSERT_TRUE(fs::exists(file)) << file;
    std::vector<torch::Tensor> params;
    torch::load(params, file.string());
    Cnn net;
    ASSERT_EQ(params.size(), net->parameters().size());
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) net->parameters()[i].copy_(params[i]);
    }
    EXPECT_LT(error_against(net, ref), kTolerance) << "rank " << r;
  }
  ddp::remove_tree(dir);
}

TEST(CudaDdp, CpuBackendWithCudaTensorsWorld2) {
  SKIP_WITHOUT_GPUS(1);
  cpu_backend_world2_matches("overlap");
}

TEST(CudaDdp, CpuBackendWithCudaTensorsWorld2SynchronousStaging) {
  SKIP_WITHOUT_GPUS(1);
  cpu_backend_world2_matches("sync");
}

TEST(CudaDdp, CpuBackendWithCudaTensorsWorld2FindUnusedParameters) {
  SKIP_WITHOUT_GPUS(1);
  cpu_backend_world2_matches("unused");
}

TEST(CudaDdp, NcclRejectsAModelOnTheCpu) {
  SKIP_WITHOUT_GPUS(1);
  SKIP_WITHOUT_NCCL();
  run_nccl_ranks(1, [&](int, ddp::ProcessGroupPtr pg) {
    Cnn net;  // left on the CPU
    try {
      DistributedDataParallel model(net, pg);
      ADD_FAILURE() << "a CPU model was accepted by the nccl backend";
    } catch (const ddp::UsageError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("parameter conv1.weight is on cpu"), std::string::npos) << message;
      EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  // cuDNN's TF32 convolutions (LibTorch's default) round to 10 mantissa bits, and a batch split
  // over ranks picks other algorithms than the whole batch: plain float32 keeps the comparison
  // with the one-process reference at kTolerance (seen on an H100: 4e-4 with TF32).
  at::globalContext().setAllowTF32CuDNN(false);
  if (argc == 4 && std::string(argv[1]) == "--cpu-backend-worker") {
    try {
      return cpu_backend_worker_main(argv[2], argv[3]);
    } catch (const std::exception& e) {
      std::cerr << "cpu backend worker: " << e.what() << "\n";
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
