#include "nccl_lane.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/store/prefix_store.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::python {

bool nccl_lanes_enabled() {
  const auto backends = available_backends();
  const bool built = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  const std::string choice = env::get_or("DDP_CUDA_COLLECTIVES", "");
  if (choice.empty()) return built;
  if (choice == "host") return false;
  if (choice != "nccl") {
    throw UsageError(fmt::format(
        "DDP_CUDA_COLLECTIVES={}: say 'nccl' (the ddp backend runs CUDA tensors' collectives on "
        "NCCL, in device memory) or 'host' (it stages them through host memory)",
        choice));
  }
  if (!built) {
    throw UsageError(
        "DDP_CUDA_COLLECTIVES=nccl, but this build of ddp has no nccl backend (built without "
        "the CUDA toolkit or NCCL: see docs/nccl.md); unset it to stage CUDA tensors through "
        "the host");
  }
  return true;
}

NcclLane::NcclLane(std::shared_ptr<Store> store, int rank, int size,
                   std::chrono::milliseconds timeout, std::string group_name)
    : name_(std::move(group_name)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      blocking_wait_(env::get_bool("DDP_NCCL_BLOCKING_WAIT", false)) {}

NcclLane::NcclLane(std::shared_ptr<RecoverableGroup> job, RecoverableSubgroupOptions subgroup)
    : name_(subgroup.name),
      job_(std::move(job)),
      subgroup_options_(std::move(subgroup)),
      blocking_wait_(env::get_bool("DDP_NCCL_BLOCKING_WAIT", false)) {
  subgroup_options_.backend = "nccl";
}

NcclLane::~NcclLane() = default;

std::shared_ptr<NcclProcessGroup> NcclLane::group(int device,
                                                  const std::function<void()>& before_reform) {
  RecoverableSubgroup* subgroup = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (device_ && *device_ != device) {
      throw UsageError(fmt::format(
          "group '{}' of the ddp backend runs its CUDA tensors on cuda:{}, its first CUDA "
          "tensors' device, but got a tensor on cuda:{}: a group's CUDA tensors must live on "
          "one device (one GPU per process, as with nccl)",
          name_, *device_, device));
    }
    if (staging()) return nullptr;
    // A replacement that has not claimed its slot back trains alone: nothing to meet.
    if (job_ && job_->returning()) return nullptr;
    device_ = device;
    if (!job_) {
      try {
        if (!plain_) plain_ = make_group(device);
      } catch (const SharedGpuError& e) {
        fall_back(e);
        return nullptr;
      }
      return std::dynamic_pointer_cast<NcclProcessGroup>(plain_);
    }
    if (!subgroup_) {
      subgroup_options_.device = device;
      subgroup_ = std::make_unique<RecoverableSubgroup>(job_, subgroup_options_);
    }
    subgroup = subgroup_.get();
  }
  // Outside the lock: a re-form first lets the operations in flight end (before_reform), which
  // may take the completer thread through here.
  try {
    return std::dynamic_pointer_cast<NcclProcessGroup>(subgroup->group(before_reform));
  } catch (const SharedGpuError& e) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    fall_back(e);
    return nullptr;
  }
}

bool NcclLane::staging() const {
  // Under step recovery the members of each generation check afresh (a replacement knows
  // nothing of an earlier verdict, and must meet the others in whatever they do).
  return job_ ? staging_generation_ == job_->generation() : staging_generation_ >= 0;
}

std::string NcclLane::path() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (staging()) return "host";
  return plain_ || (subgroup_ && subgroup_->generation() >= 0) ? "nccl" : "undecided";
}

ProcessGroupPtr NcclLane::make_group(int device) {
  InitOptions o;
  o.backend = "nccl";
  o.timeout = timeout_;
  o.rank = rank_;
  o.world_size = size_;
  o.device = device;
  o.store = std::make_shared<PrefixStore>("cuda", store_);
  o.group_name = name_;
  return init_process_group(o);
}

void NcclLane::fall_back(const SharedGpuError& error) {  // state_mutex_ held
  if (staging()) return;  // another thread fell back first and said why
  staging_generation_ = job_ ? job_->generation() : 0;
  plain_.reset();
  fmt::print(stderr, "ddp backend: group '{}' stages its CUDA tensors through host memory: {}\n",
             name_, error.what());
}

namespace {

// A lane operation's Work. ddp's nccl Work::wait makes the group's compute stream wait for the
// collective, and that is one setting for the whole group, which every issue() changes; this
// Work first sets it back to the stream its operation was issued from, so the wait orders that
// stream even after another stream issued on the lane since (a future's callback runs on a
// stream of its own), under the same lock as the issues.
class LaneWork : public Work {
 public:
  LaneWork(WorkPtr inner, std::shared_ptr<NcclProcessGroup> group, CUstream_st* stream,
           std::shared_ptr<std::mutex> issue_mutex, bool blocking_wait)
      : inner_(std::move(inner)),
        group_(std::move(group)),
        stream_(stream),
        issue_mutex_(std::move(issue_mutex)),
        blocking_wait_(blocking_wait) {}

  void wait(std::chrono::milliseconds timeout) override {
    // DDP_NCCL_BLOCKING_WAIT: the host waits for the collective itself and no stream is
    // ordered, so no lock either (holding it would stall every issue() meanwhile, e.g. the
    // next bucket's all_reduce from autograd).
    if (blocking_wait_) return inner_->wait(timeout);
    std::lock_guard<std::mutex> lock(*issue_mutex_);
    group_->set_compute_stream(stream_);
    inner_->wait(timeout);
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<NcclProcessGroup> group_;  // the generation's group the operation ran on
  CUstream_st* stream_;
  std::shared_ptr<std::mutex> issue_mutex_;
  bool blocking_wait_;
};

}  // namespace

WorkPtr NcclLane::issue(const std::shared_ptr<NcclProcessGroup>& nccl, void* stream,
                        const std::function<WorkPtr(ProcessGroup&)>& op) {
  auto* caller = static_cast<CUstream_st*>(stream);
  WorkPtr inner;
  {
    std::lock_guard<std::mutex> lock(*issue_mutex_);
    nccl->set_compute_stream(caller);
    inner = op(*nccl);
  }
  return std::make_shared<LaneWork>(std::move(inner), nccl, caller, issue_mutex_, blocking_wait_);
}

void NcclLane::hold_until_complete(std::vector<WorkPtr> works,
                                   std::shared_ptr<const void> buffers) {
  const auto complete = [](const Held& h) {
    return std::all_of(h.works.begin(), h.works.end(),
                       [](const WorkPtr& w) { return w->is_completed(); });
  };
  std::deque<Held> released;  // freed outside the lock
  std::lock_guard<std::mutex> lock(held_mutex_);
  // One communication stream runs them in issue order: the oldest complete first.
  while (!held_.empty() && complete(held_.front())) {
    released.push_back(std::move(held_.front()));
    held_.pop_front();
  }
  held_.push_back({std::move(works), std::move(buffers)});
}

}  // namespace ddp::python
