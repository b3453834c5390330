#include "host_staging.hpp"

// Device-generic c10 streams and events (no CUDA headers): this compiles in every build and
// runs only where a CUDA bucket meets a host backend, i.e. in builds against a CUDA LibTorch.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

// Launches queued or running on the staging thread (below), readable without starting it.
std::atomic<size_t> g_unfinished_launches{0};

// One thread for the whole process runs the staged launches in the order they were queued:
// every rank queues its buckets in the same order, so the all-reduces reach the groups in the
// same order too. Never joined: it sleeps on its queue until the process exits.
class StagingThread {
 public:
  static StagingThread& instance() {
    static auto* thread = new StagingThread();  // leaked on purpose: no join at exit
    return *thread;
  }

  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
      ++g_unfinished_launches;
    }
    ready_.notify_one();
  }

 private:
  StagingThread() : thread_([this] { run(); }) { thread_.detach(); }

  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();                    // never throws: a launch records its own error
      --g_unfinished_launches;  // after the job issued its collective
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::thread thread_;
};

// What the staging thread hands to the reduction: the issued work, or why it could not be.
struct Launch {
  std::mutex mutex;
  std::condition_variable done;
  bool launched = false;
  WorkPtr work;
  std::exception_ptr error;
};

class StagedReduction : public BucketReduction {
 public:
  StagedReduction(torch::Tensor bucket, torch::Tensor host, std::shared_ptr<Launch> launch)
      : bucket_(std::move(bucket)), host_(std::move(host)), launch_(std::move(launch)) {}

  // The queued launch refers to the group, which the contract keeps alive only as long as the
  // reduction: wait until it ran (the copy it waits for is already queued on the GPU).
  ~StagedReduction() override {
    std::unique_lock<std::mutex> lock(launch_->mutex);
    launch_->done.wait_for(lock, std::chrono::minutes(10), [&] { return launch_->launched; });
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(launch_->mutex);
    if (!launch_->launched) return false;
    return launch_->error != nullptr || launch_->work->is_completed();
  }

  void wait_launched(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(launch_->mutex);
    if (!launch_->done.wait_for(lock, timeout, [&] { return launch_->launched; })) {
      throw TimeoutError(fmt::format(
          "the bucket's copy to the host (for the host backend's all-reduce) did not complete "
          "within {} ms: the GPU is still busy with the kernels queued before it, or hung",
          timeout.count()));
    }
    if (launch_->error) std::rethrow_exception(launch_->error);
  }

  void finish(std::chrono::milliseconds timeout) override {
    wait_launched(timeout);
    launch_->work->wait(timeout);
    // From pinned memory on the current stream: queued, not waited for; the caching host
    // allocator keeps host_'s block until the copy ran, even when host_ is freed first.
    if (!host_.is_same(bucket_)) bucket_.copy_(host_, /*non_blocking=*/true);
  }

 private:
  torch::Tensor bucket_;
  torch::Tensor host_;
  std::shared_ptr<Launch> launch_;
};

// Queues the all-reduce of `host` (a host tensor, `bucket` itself or its staging copy) on the
// staging thread, after `copied` (the copy into it; null: nothing to wait for); its result goes
// into `bucket` at finish().
std::unique_ptr<BucketReduction> queue_launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                              torch::Tensor host,
                                              std::shared_ptr<c10::Event> copied, ReduceOp op,
                                              std::string tag);

}  // namespace

bool overlapped_host_staging() {
#if defined(DDP_WITH_CUDA_TORCH)
  static const bool on = env::get_or("DDP_HOST_STAGING", "overlap") != "sync";
  return on;
#else
  return false;
#endif
}

std::unique_ptr<BucketReduction> launch_staged_all_reduce(ProcessGroup& pg,
                                                          const torch::Tensor& bucket,
                                                          const torch::Tensor& device_wire,
                                                          ReduceOp op, std::string tag) {
  const c10::Device device = device_wire.device();
  const c10::impl::VirtualGuardImpl streams(device.type());
  const c10::Stream compute = streams.getStream(device);
  const c10::Stream side = streams.getStreamFromGlobalPool(device);

  // The side stream copies after the kernels queued so far on the compute stream (those that
  // filled the wire); the wire's memory is not reused before the copy ran.
  c10::Event filled(device.type());
  filled.record(compute);
  filled.block(side);
  streams.recordDataPtrOnStream(device_wire.storage().data_ptr(), side);

  torch::Tensor host = torch::empty(device_wire.sizes(),
                                    device_wire.options().device(torch::kCPU).pinned_memory(true));
  auto copied = std::make_shared<c10::Event>(device.type());
  {
    c10::StreamGuard on_side(side);
    host.copy_(device_wire, /*non_blocking=*/true);
    copied->record(side);
  }

  return queue_launch(pg, bucket, std::move(host), std::move(copied), op, std::move(tag));
}

std::unique_ptr<BucketReduction> launch_behind_staged(ProcessGroup& pg, const torch::Tensor& bucket,
                                                      const torch::Tensor& wire, ReduceOp op,
                                                      std::string tag) {
  // A launch still queued or running must issue its collective first.
  if (g_unfinished_launches.load() == 0) return nullptr;
  return queue_launch(pg, bucket, wire, nullptr, op, std::move(tag));
}

namespace {

std::unique_ptr<BucketReduction> queue_launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                              torch::Tensor host,
                                              std::shared_ptr<c10::Event> copied, ReduceOp op,
                                              std::string tag) {
  auto launch = std::make_shared<Launch>();
  StagingThread::instance().submit([&pg, host, copied, launch, op, tag = std::move(tag)] {
    WorkPtr work;
    std::exception_ptr error;
    try {
      if (copied) copied->synchronize();
      FlightRecorder::ScopedThreadTag scoped(tag);
      work = all_reduce(pg, host, op);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(launch->mutex);
      launch->launched = true;
      launch->work = std::move(work);
      launch->error = error;
    }
    launch->done.notify_all();
  });
  return std::make_unique<StagedReduction>(bucket, std::move(host), std::move(launch));
}

}  // namespace
}  // namespace ddp
