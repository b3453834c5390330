#include "process_group_ddp.hpp"

// The group itself: joining (plain, or the recoverable default group of step recovery),
// reforming after a lost rank, shutdown, and the Works its operations hand to torch. The
// operations live beside it by kind: process_group_ddp_reductions.cpp,
// process_group_ddp_data_movement.cpp (broadcast, gathers, scatter, all_to_all) and
// process_group_ddp_barrier_p2p.cpp.

#include <Python.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "ddp/comm/init.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "store_bridge.hpp"

namespace ddp::python {
namespace {

// The default group's RecoverableGroup under step recovery, which the process's new_group()s
// follow (RecoverableSubgroup). A process has one default group at a time.
std::mutex job_group_mutex;
std::weak_ptr<RecoverableGroup> job_group;

// The job's group a new_group() follows: under step recovery, once the default group exists.
std::shared_ptr<RecoverableGroup> step_recovery_job_group() {
  if (env::get("DDP_RECOVERY").value_or("") != "step") return nullptr;
  std::lock_guard<std::mutex> lock(job_group_mutex);
  return job_group.lock();
}

}  // namespace

ProcessGroupDDP::ProcessGroupDDP(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout, const std::string& group_name)
    : ProcessGroupBase(rank, size),
      store_(store),
      completer_(std::make_shared<Completer>()),
      timeout_(timeout) {
  // Before anything joins: a bad DDP_CUDA_COLLECTIVES fails every rank alike, at once.
  const bool lanes = nccl_lanes_enabled();
  if (env::get("DDP_RECOVERY").value_or("") == "step" && group_name == "default_pg") {
    // The group rendezvouses through ddprun's store (its own connections), under the
    // generation's prefix, not through `store`: every generation must be reachable by a
    // restarted rank, whatever torch prefixed.
    RecoverableGroupOptions r;
    r.backend = "cpu";
    r.timeout = timeout;
    r.rank = rank;
    r.world_size = size;
    r.group_name = "python_recovery";
    // PyTorch's DDP built with init_sync=False runs no collective: the replacement claims its
    // slot in ddp.StepManager (claim_return()), after the program built its model.
    r.defer_return = true;
    recoverable_ = std::make_shared<RecoverableGroup>(r);
    // A replacement started after a lost node shrank the job joins a smaller group than the
    // launch's `size`: group_rank() and group_size() say where it stands.
    pg_ = recoverable_->group();
    if (lanes) {
      RecoverableSubgroupOptions lane;
      lane.name = group_name + "/cuda";
      lane.whole_job = true;  // follows a lost node, as the default group does
      lane.timeout = timeout;
      lane_ = std::make_unique<NcclLane>(recoverable_, lane);
    }
    std::lock_guard<std::mutex> lock(job_group_mutex);
    job_group = recoverable_;
  } else if (auto parent = step_recovery_job_group(); parent) {
    // A new_group() of a job under step recovery: its collectives end at ddprun's notice too,
    // and it follows the default group into each new generation (recoverable_subgroup.hpp).
    RecoverableSubgroupOptions o;
    o.name = group_name;
    o.rank = rank;
    o.size = size;
    o.timeout = timeout;
    if (lanes) {
      RecoverableSubgroupOptions lane = o;
      lane.name = group_name + "/cuda";
      lane_ = std::make_unique<NcclLane>(parent, lane);
    }
    // Formed at its first operation (live() -> follow_job()).
    job_ = parent;
    subgroup_ = std::make_unique<RecoverableSubgroup>(std::move(parent), o);
  } else {
    InitOptions o;
    o.backend = "cpu";
    o.timeout = timeout;
    o.rank = rank;
    o.world_size = size;
    o.store = std::make_shared<C10dStoreBridge>(store);
    o.group_name = group_name;
    pg_ = init_process_group(o);
    if (lanes) {
      lane_ = std::make_unique<NcclLane>(o.store, rank, size, timeout, group_name);
    }
  }
#if TORCH_VERSION_MAJOR < 2
  init();
#endif
}

ProcessGroupDDP::~ProcessGroupDDP() {
  shutdown();
}

ProcessGroup* ProcessGroupDDP::live() const {
  if (subgroup_) follow_job();
  std::lock_guard<std::mutex> lock(pg_mutex_);
  if (!pg_) {
    throw UsageError(
        "this ddp process group was shut down (destroy_process_group); make a new "
        "one with init_process_group or new_group");
  }
  return pg_.get();
}

RecoverableGroup& ProcessGroupDDP::recoverable_group() const {
  if (!recoverable_) {
    throw UsageError(
        "this ddp process group has no in-place recovery: only the default group of a job "
        "launched with 'ddprun --recovery step' has (DDP_RECOVERY=step)");
  }
  return *recoverable_;
}

int64_t ProcessGroupDDP::generation() const {
  return recoverable_group().generation();
}

bool ProcessGroupDDP::stale() const {
  return recoverable_group().stale();
}

int ProcessGroupDDP::lost_rank() const {
  return recoverable_group().lost_rank().value_or(-1);
}

void ProcessGroupDDP::drain_in_flight() const {
  // Operations still queued or in flight belong to the aborted generation: let them fail
  // there (at once) rather than be issued on the next.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::deque<c10::intrusive_ptr<WorkDDP>> in_flight;
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    in_flight.swap(in_flight_);
  }
  for (auto& w : in_flight) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      w->wait(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      // Failed (aborted), as expected; a Work still running after the limit is left behind.
    }
  }
}

void ProcessGroupDDP::drain_unless_on_completer() const {
  // On the completer's thread (running a callback, or issuing a deferred operation) the
  // operations a drain would wait for can only be issued by that thread after it returned
  // (make_work fails the deferred ones of an older generation instead).
  if (!completer_->is_current_thread()) drain_in_flight();
}

void ProcessGroupDDP::follow_job() const {
  ProcessGroupPtr current = subgroup_->group([this] { drain_unless_on_completer(); });
  std::lock_guard<std::mutex> lock(pg_mutex_);
  pg_ = std::move(current);
}

void ProcessGroupDDP::reform() {
  RecoverableGroup& group = recoverable_group();
  live();
  drain_in_flight();
  ProcessGroupPtr next = group.reform();
  // A lost node renumbers the survivors (group_rank(), group_size()); c10d's rank and size stay
  // the launch's (getRank(), getSize()).
  {
    std::lock_guard<std::mutex> lock(pg_mutex_);
    pg_ = next;
  }
}

void ProcessGroupDDP::claim_return() {
  RecoverableGroup& group = recoverable_group();
  if (!group.returning()) return;
  live();
  drain_in_flight();
  ProcessGroupPtr next = group.claim_return();
  std::lock_guard<std::mutex> lock(pg_mutex_);
  pg_ = next;
}

int ProcessGroupDDP::group_rank() const {
  return live()->rank();
}

int ProcessGroupDDP::group_size() const {
  return live()->size();
}

void ProcessGroupDDP::shutdown() {
  {
    std::lock_guard<std::mutex> lock(pg_mutex_);
    if (!pg_ && !subgroup_) return;  // shut down already (a new_group's forms at first use)
  }
  // The completer may be running a future's callback that needs the GIL (a Python comm hook);
  // joining it while holding the GIL would deadlock.
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
  completer_.reset();
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    in_flight_.clear();
  }
  ProcessGroupPtr pg;
  {
    std::lock_guard<std::mutex> lock(pg_mutex_);
    pg.swap(pg_);
  }
  pg.reset();         // waits for the operations still queued (each bounded by the timeout)
  lane_.reset();      // likewise its NCCL group's
  subgroup_.reset();  // its aborting thread, and its own reference to the group
  job_.reset();
  recoverable_.reset();  // its watcher thread; the group itself went above
  if (saved) PyEval_RestoreThread(saved);
}

OpRoute ProcessGroupDDP::route(const std::vector<at::Tensor>& tensors, bool lane) {
  std::optional<c10::Device> cuda;  // the CUDA tensors' device
  bool host_tensors = false;
  for (const auto& t : tensors) {
    if (!t.is_cuda()) {
      host_tensors = true;
    } else if (!cuda) {
      cuda = t.device();
    } else if (*cuda != t.device()) {
      return {};  // several devices: synchronous staging, as before
    }
  }
  if (!cuda) return {};
  if (lane && lane_ && !host_tensors) {
    OpRoute r;
    // A re-form lets the operations in flight end first.
    r.nccl = lane_->group(cuda->index(), [this] { drain_unless_on_completer(); });
    if (r.nccl) {
      r.stream = c10::impl::VirtualGuardImpl(cuda->type()).getStream(*cuda);
      return r;
    }
  }
  return overlapped_host_staging() ? OpRoute::staged_from(*cuda) : OpRoute{};
}

WorkPtr ProcessGroupDDP::run(const OpRoute& route,
                             const std::function<WorkPtr(ProcessGroup&)>& op) const {
  if (!route.on_device()) {
    route.wait_copied(timeout_);
    return op(*live());
  }
  return lane_->issue(route.nccl, route.stream->native_handle(), op);
}

c10::intrusive_ptr<WorkDDP> ProcessGroupDDP::make_work(c10d::OpType type, WorkDDP::Start start,
                                                       std::function<void()> epilogue,
                                                       std::vector<at::Tensor> outputs,
                                                       bool counted, const OpRoute& route) {
  live();  // a group that was shut down refuses at the call
  if (counted && type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
      type != c10d::OpType::RECVANYSOURCE) {
    ++seq_;
  }
  if (job_) {
    // A new_group's operation issued later by the completer (deferred) belongs to the
    // generation it was called in: after the job re-formed meanwhile it fails, as it did on the
    // ranks that issued it at once (in the aborted generation), instead of running in the new
    // generation, out of step with them.
    const int64_t called_in = job_->generation();
    start = [this, called_in, inner = std::move(start)] {
      if (job_->generation() != called_in) {
        throw PeerLostError(
            fmt::format("an operation of a new_group called in membership generation {} was "
                        "issued after the job re-formed (generation {}): it fails with that "
                        "generation's step; redo the step",
                        called_in, job_->generation()),
            job_->lost_rank().value_or(-1), job_->generation());
      }
      return inner();
    };
  }
  if (route.on_device()) {
    // The start function holds the buffers NCCL reads and writes: the lane keeps it until the
    // collectives completed on the device (NcclLane::hold_until_complete says why).
    auto held = std::make_shared<WorkDDP::Start>(std::move(start));
    start = [this, held] {
      auto works = (*held)();
      lane_->hold_until_complete(works, held);
      return works;
    };
  }
  auto work = c10::make_intrusive<WorkDDP>(group_rank(), type, std::move(epilogue),
                                           std::move(outputs), timeout_, completer_);
  if (route.stream) work->set_stream(*route.stream);
  // Issued at once unless a future's callbacks may still issue operations before it (see
  // "Issue order" in work_ddp.hpp), or its copies to the host are still running (overlapped
  // staging: the completer issues it once they ended, and the caller goes on meanwhile).
  if (!completer_->defer_if_busy(work, start, /*always=*/route.overlapped())) {
    work->issue(start);
    // Inline operations finished already: complete now (epilogue, errors) and skip the
    // bookkeeping of operations in flight.
    if (work->isCompleted()) return work;
  }
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  while (!in_flight_.empty() && in_flight_.front()->isCompleted()) in_flight_.pop_front();
  in_flight_.push_back(work);
  return work;
}

void ProcessGroupDDP::check_root(int64_t root, const char* op) const {
  if (root < 0 || root >= group_size()) {
    throw UsageError(fmt::format("{}: root rank {} is out of range for a group of {} ranks", op,
                                 root, group_size()));
  }
}

}  // namespace ddp::python
