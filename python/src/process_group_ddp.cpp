#include "process_group_ddp.hpp"

#include <Python.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>
#include <thread>

#include "ddp/comm/init.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "store_bridge.hpp"
#include "tensor_args.hpp"

namespace ddp::python {

namespace {

const char* reduce_op_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNKNOWN";
  }
}

bool is_bitwise(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR ||
         op.op_ == c10d::ReduceOp::BXOR;
}

// ddp's reduction for `op` on `t`, with the dtype it runs on. Throws NotSupportedError for
// operators ddp lacks (bitwise ones are handled by the caller where it can).
std::pair<ddp::ReduceOp, DataType> reduction(const at::Tensor& t, const c10d::ReduceOp& op,
                                             const std::string& what) {
  ddp::ReduceOp r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      r = ddp::ReduceOp::kSum;
      break;
    case c10d::ReduceOp::AVG:
      r = ddp::ReduceOp::kAvg;
      break;
    case c10d::ReduceOp::PRODUCT:
      r = ddp::ReduceOp::kProduct;
      break;
    case c10d::ReduceOp::MIN:
      r = ddp::ReduceOp::kMin;
      break;
    case c10d::ReduceOp::MAX:
      r = ddp::ReduceOp::kMax;
      break;
    default:
      throw NotSupportedError(
          fmt::format("backend ddp does not support ReduceOp.{} in {}{}", reduce_op_name(op), what,
                      op.op_ == c10d::ReduceOp::PREMUL_SUM
                          ? " (PREMUL_SUM is NCCL's; multiply first, then reduce with SUM)"
                      : is_bitwise(op) ? " (bitwise operators are supported by all_reduce only)"
                                       : ""));
  }
  // A bool is 0 or 1 in one byte: min and max over uint8 are logical and / or.
  if (t.scalar_type() == at::kBool && (r == ddp::ReduceOp::kMin || r == ddp::ReduceOp::kMax)) {
    return {r, DataType::kUInt8};
  }
  return {r, reduce_data_type(t.scalar_type(), what)};
}

// Packs `ts` (equal dtype) into one contiguous 1-D tensor in host memory.
at::Tensor pack(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape(-1));
  return host_contiguous(at::cat(flat));
}

// The bytes of a contiguous tensor as a 1-D uint8 tensor sharing its storage.
at::Tensor bytes_of(const at::Tensor& contiguous_tensor) {
  return at::from_blob(contiguous_tensor.data_ptr(),
                       {static_cast<int64_t>(contiguous_tensor.nbytes())},
                       at::TensorOptions().dtype(at::kByte));
}

}  // namespace

ProcessGroupDDP::ProcessGroupDDP(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout, const std::string& group_name)
    : ProcessGroupBase(rank, size),
      store_(store),
      completer_(std::make_shared<Completer>()),
      timeout_(timeout) {
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
    recoverable_ = std::make_unique<RecoverableGroup>(r);
    // A replacement started after a lost node shrank the job joins a smaller group than the
    // launch's `size`: group_rank() and group_size() say where it stands.
    pg_ = recoverable_->group();
  } else {
    InitOptions o;
    o.backend = "cpu";
    o.timeout = timeout;
    o.rank = rank;
    o.world_size = size;
    o.store = std::make_shared<C10dStoreBridge>(store);
    o.group_name = group_name;
    pg_ = init_process_group(o);
  }
#if TORCH_VERSION_MAJOR < 2
  init();
#endif
}

ProcessGroupDDP::~ProcessGroupDDP() {
  shutdown();
}

ProcessGroup* ProcessGroupDDP::live() const {
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

void ProcessGroupDDP::reform() {
  RecoverableGroup& group = recoverable_group();
  live();
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
  ProcessGroupPtr next = group.reform();
  // A lost node renumbers the survivors (group_rank(), group_size()); c10d's rank and size stay
  // the launch's (getRank(), getSize()).
  {
    std::lock_guard<std::mutex> lock(pg_mutex_);
    pg_ = next;
  }
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
    if (!pg_) return;
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
  pg.reset();            // waits for the operations still queued (each bounded by the timeout)
  recoverable_.reset();  // its watcher thread; the group itself went above
  if (saved) PyEval_RestoreThread(saved);
}

c10::intrusive_ptr<WorkDDP> ProcessGroupDDP::make_work(c10d::OpType type, WorkDDP::Start start,
                                                       std::function<void()> epilogue,
                                                       std::vector<at::Tensor> outputs,
                                                       bool counted) {
  live();  // a group that was shut down refuses at the call
  if (counted && type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
      type != c10d::OpType::RECVANYSOURCE) {
    ++seq_;
  }
  auto work = c10::make_intrusive<WorkDDP>(group_rank(), type, std::move(epilogue),
                                           std::move(outputs), timeout_, completer_);
  // Issued at once unless a future's callbacks may still issue operations before it (see
  // "Issue order" in work_ddp.hpp).
  if (!completer_->defer_if_busy(work, start)) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const auto& t = single_tensor(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  if (opts.rootTensor != 0) throw UsageError("broadcast: the ddp backend takes rootTensor 0");
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  const int root = static_cast<int>(opts.rootRank);
  auto start = [this, buf, e, root] {
    return std::vector<WorkPtr>{live()->broadcast(buf.data_ptr(), e.count, e.dtype, root)};
  };
  return make_work(c10d::OpType::BROADCAST, start, [t, buf] { copy_back(t, buf); }, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::all_reduce_tensor(const at::Tensor& t,
                                                                  const c10d::ReduceOp& op) {
  if (is_bitwise(op)) return bitwise_all_reduce(t, op);
  const auto [r, dtype] = reduction(t, op, "all_reduce");
  auto buf = host_contiguous(t);
  auto start = [this, buf, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{
        live()->all_reduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dtype, r)};
  };
  return make_work(c10d::OpType::ALLREDUCE, start, [t, buf] { copy_back(t, buf); }, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::bitwise_all_reduce(const at::Tensor& t,
                                                                   const c10d::ReduceOp& op) {
  if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    throw NotSupportedError(fmt::format(
        "backend ddp does not support ReduceOp.{} on {} tensors (bitwise operators take "
        "integer or bool tensors)",
        reduce_op_name(op), dtype_name(t.scalar_type())));
  }
  auto buf = host_contiguous(t);
  auto gathered = at::empty({group_size(), t.numel()}, host_options(t));
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto start = [this, buf, gathered, e] {
    return std::vector<WorkPtr>{
        live()->all_gather(buf.data_ptr(), gathered.data_ptr(), e.count, e.dtype)};
  };
  const auto kind = op.op_;
  auto epilogue = [t, buf, gathered, kind] {
    at::Tensor acc = gathered[0].clone();
    for (int64_t r = 1; r < gathered.size(0); ++r) {
      if (kind == c10d::ReduceOp::BAND) {
        acc.bitwise_and_(gathered[r]);
      } else if (kind == c10d::ReduceOp::BOR) {
        acc.bitwise_or_(gathered[r]);
      } else {
        acc.bitwise_xor_(gathered[r]);
      }
    }
    t.copy_(acc.view(t.sizes()));
  };
  return make_work(c10d::OpType::ALLREDUCE, start, std::move(epilogue), {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  return all_reduce_tensor(single_tensor(tensors, "all_reduce"), opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) throw UsageError("all_reduce_coalesced: got no tensors");
  check_same(tensors, tensors[0].scalar_type(), std::nullopt, "all_reduce_coalesced", "tensors");
  if (is_bitwise(opts.reduceOp)) {
    throw NotSupportedError(
        fmt::format("backend ddp does not support ReduceOp.{} in "
                    "all_reduce_coalesced",
                    reduce_op_name(opts.reduceOp)));
  }
  const auto [r, dtype] = reduction(tensors[0], opts.reduceOp, "all_reduce_coalesced");
  auto flat = pack(tensors);
  auto start = [this, flat, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{
        live()->all_reduce(flat.data_ptr(), static_cast<size_t>(flat.numel()), dtype, r)};
  };
  std::vector<at::Tensor> ts = tensors;
  auto epilogue = [ts, flat] {
    int64_t offset = 0;
    for (const auto& t : ts) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  };
  return make_work(c10d::OpType::ALLREDUCE_COALESCED, start, std::move(epilogue), ts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const auto& t = single_tensor(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  if (opts.rootTensor != 0) throw UsageError("reduce: the ddp backend takes rootTensor 0");
  const auto [r, dtype] = reduction(t, opts.reduceOp, "reduce");
  auto buf = host_contiguous(t);
  const int root_rank = static_cast<int>(opts.rootRank);
  auto start = [this, buf, dtype = dtype, r = r, root_rank] {
    return std::vector<WorkPtr>{
        live()->reduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dtype, r, root_rank)};
  };
  // Only the root's result is defined; other ranks' tensors hold unspecified values afterwards
  // (gloo leaves partial sums there too), so only the root copies a staged result back.
  const bool root = opts.rootRank == group_rank();
  auto epilogue = [t, buf, root] {
    if (root) copy_back(t, buf);
  };
  return make_work(c10d::OpType::REDUCE, start, std::move(epilogue), {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const auto& in = single_tensor(inputs, "all_gather");
  if (outputs.size() != 1) {
    throw UsageError(fmt::format("all_gather: expected one output list, got {}", outputs.size()));
  }
  const std::vector<at::Tensor> outs = outputs[0];
  if (static_cast<int>(outs.size()) != group_size()) {
    if (recoverable_ && static_cast<int>(outs.size()) == getSize()) {
      // Sized by torch.distributed's world size, which stays the launch's after a lost node.
      throw UsageError(fmt::format(
          "all_gather: the output list has {} tensors, torch.distributed's world size (the "
          "launch's), but the job lost a node ({}) and runs with {} ranks: size it by "
          "ddp.StepManager.world_size. PyTorch's DistributedDataParallel constructor does "
          "this (it all-gathers the parameter count), so a worker restarted while the job runs "
          "with fewer ranks than it was launched with cannot build its DDP (docs/recovery.md, "
          "\"Python\")",
          outs.size(), recoverable_->loss_description(), group_size()));
    }
    throw UsageError(
        fmt::format("all_gather: the output list has {} tensors but the group has {} ranks",
                    outs.size(), group_size()));
  }
  check_same(outs, in.scalar_type(), std::nullopt, "all_gather", "output");
  if (outs[group_rank()].numel() != in.numel()) {
    throw UsageError(fmt::format(
        "all_gather: output[{}] (this rank's slot) has {} elements but the input has {}",
        group_rank(), outs[group_rank()].numel(), in.numel()));
  }
  auto src = host_contiguous(in);
  bool equal = true;
  int64_t total = 0;
  for (const auto& o : outs) {
    equal = equal && o.numel() == in.numel();
    total += o.numel();
  }
  auto flat = at::empty({total}, host_options(in));
  WorkDDP::Start start;
  if (equal) {
    const auto e = move_elements(in.scalar_type(), in.numel());
    start = [this, src, flat, e] {
      return std::vector<WorkPtr>{
          live()->all_gather(src.data_ptr(), flat.data_ptr(), e.count, e.dtype)};
    };
  } else {
    // Unequal sizes (the ranks' outputs say how much each contributes): all_gather_v.
    const auto e = move_elements(in.scalar_type(), 1);
    std::vector<size_t> counts;
    for (const auto& o : outs) counts.push_back(static_cast<size_t>(o.numel()) * e.count);
    start = [this, src, flat, counts, e] {
      return std::vector<WorkPtr>{
          live()->all_gather_v(src.data_ptr(), flat.data_ptr(), counts, e.dtype)};
    };
  }
  auto epilogue = [outs, src, flat] {
    int64_t offset = 0;
    for (const auto& o : outs) {
      o.copy_(flat.narrow(0, offset, o.numel()).view(o.sizes()));
      offset += o.numel();
    }
  };
  return make_work(c10d::OpType::ALLGATHER, start, std::move(epilogue), outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  check_dense(input, "all_gather_into_tensor");
  check_same({output}, input.scalar_type(), input.numel() * group_size(), "all_gather_into_tensor",
             "output");
  auto src = host_contiguous(input);
  auto dst = host_contiguous(output);
  const auto e = move_elements(input.scalar_type(), input.numel());
  auto start = [this, src, dst, e] {
    return std::vector<WorkPtr>{
        live()->all_gather(src.data_ptr(), dst.data_ptr(), e.count, e.dtype)};
  };
  at::Tensor out = output;
  return make_work(c10d::OpType::_ALLGATHER_BASE, start, [out, src, dst] { copy_back(out, dst); },
                   {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const char* op = "all_gather_coalesced";
  if (static_cast<int>(outputs.size()) != group_size()) {
    throw UsageError(fmt::format("{}: expected {} output lists (one per rank), got {}", op,
                                 group_size(), outputs.size()));
  }
  // Every input travels as bytes, packed in order; every rank's outputs match the inputs.
  std::vector<at::Tensor> staged;
  int64_t bytes = 0;
  for (const auto& t : inputs) {
    check_dense(t, op);
    staged.push_back(host_contiguous(t));
    bytes += static_cast<int64_t>(t.nbytes());
  }
  for (const auto& list : outputs) {
    if (list.size() != inputs.size()) {
      throw UsageError(fmt::format("{}: an output list has {} tensors but there are {} inputs", op,
                                   list.size(), inputs.size()));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      check_same({list[i]}, inputs[i].scalar_type(), inputs[i].numel(), op, "output");
    }
  }
  std::vector<at::Tensor> byte_views;
  for (const auto& s : staged) byte_views.push_back(bytes_of(s));
  auto packed = byte_views.empty() ? at::empty({0}, at::kByte) : at::cat(byte_views);
  auto flat = at::empty({bytes * group_size()}, at::kByte);
  auto start = [this, packed, flat, bytes] {
    return std::vector<WorkPtr>{live()->all_gather(packed.data_ptr(), flat.data_ptr(),
                                                   static_cast<size_t>(bytes), DataType::kUInt8)};
  };
  auto outs = outputs;
  auto epilogue = [outs, packed, flat, bytes] {
    for (size_t r = 0; r < outs.size(); ++r) {
      int64_t offset = static_cast<int64_t>(r) * bytes;
      for (const auto& o : outs[r]) {
        auto dst = host_contiguous(o);
        const auto n = static_cast<int64_t>(o.nbytes());
        bytes_of(dst).copy_(flat.narrow(0, offset, n));
        copy_back(o, dst);
        offset += n;
      }
    }
  };
  std::vector<at::Tensor> all;
  for (const auto& l : outs) all.insert(all.end(), l.begin(), l.end());
  return make_work(c10d::OpType::ALLGATHER_COALESCED, start, std::move(epilogue), all);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const auto& in = single_tensor(inputs, "gather");
  check_root(opts.rootRank, "gather");
  const bool root = opts.rootRank == group_rank();
  std::vector<at::Tensor> outs;
  if (root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != group_size()) {
      throw UsageError(fmt::format(
          "gather: the root needs one output list of {} tensors (got {} lists{})", group_size(),
          outputs.size(),
          outputs.empty() ? std::string() : fmt::format(", the first of {}", outputs[0].size())));
    }
    outs = outputs[0];
    check_same(outs, in.scalar_type(), in.numel(), "gather", "gather_list");
  } else if (!outputs.empty() && !outputs[0].empty()) {
    throw UsageError("gather: only the root passes a gather_list");
  }
  auto src = host_contiguous(in);
  auto flat = root ? at::empty({in.numel() * group_size()}, host_options(in)) : at::Tensor();
  const auto e = move_elements(in.scalar_type(), in.numel());
  const int root_rank = static_cast<int>(opts.rootRank);
  auto start = [this, src, flat, e, root_rank] {
    return std::vector<WorkPtr>{live()->gather(
        src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, e.count, e.dtype, root_rank)};
  };
  auto epilogue = [outs, src, flat] {
    for (size_t r = 0; r < outs.size(); ++r) {
      const auto n = outs[r].numel();
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    }
  };
  return make_work(c10d::OpType::GATHER, start, std::move(epilogue), outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const auto& out = single_tensor(outputs, "scatter");
  check_root(opts.rootRank, "scatter");
  const bool root = opts.rootRank == group_rank();
  at::Tensor flat;
  if (root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != group_size()) {
      throw UsageError(fmt::format(
          "scatter: the root needs one scatter_list of {} tensors (got {} lists{})", group_size(),
          inputs.size(),
          inputs.empty() ? std::string() : fmt::format(", the first of {}", inputs[0].size())));
    }
    check_same(inputs[0], out.scalar_type(), out.numel(), "scatter", "scatter_list");
    flat = pack(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    throw UsageError("scatter: only the root passes a scatter_list");
  }
  auto dst = host_contiguous(out);
  const auto e = move_elements(out.scalar_type(), out.numel());
  const int root_rank = static_cast<int>(opts.rootRank);
  auto start = [this, flat, dst, e, root_rank] {
    return std::vector<WorkPtr>{live()->scatter(flat.defined() ? flat.data_ptr() : nullptr,
                                                dst.data_ptr(), e.count, e.dtype, root_rank)};
  };
  return make_work(c10d::OpType::SCATTER, start, [out, dst, flat] { copy_back(out, dst); }, {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto& out = single_tensor(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != group_size()) {
    throw UsageError(
        fmt::format("reduce_scatter: expected one input list of {} tensors", group_size()));
  }
  check_same(inputs[0], out.scalar_type(), out.numel(), "reduce_scatter", "input_list");
  const auto [r, dtype] = reduction(out, opts.reduceOp, "reduce_scatter");
  auto flat = pack(inputs[0]);
  auto dst = host_contiguous(out);
  auto start = [this, flat, dst, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{live()->reduce_scatter(flat.data_ptr(), dst.data_ptr(),
                                                       static_cast<size_t>(dst.numel()), dtype, r)};
  };
  return make_work(c10d::OpType::REDUCE_SCATTER, start, [out, dst, flat] { copy_back(out, dst); },
                   {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_dense(output, "reduce_scatter_tensor");
  check_same({input}, output.scalar_type(), output.numel() * group_size(), "reduce_scatter_tensor",
             "input");
  const auto [r, dtype] = reduction(output, opts.reduceOp, "reduce_scatter_tensor");
  auto src = host_contiguous(input);
  auto dst = host_contiguous(output);
  auto start = [this, src, dst, dtype = dtype, r = r] {
    return std::vector<WorkPtr>{live()->reduce_scatter(src.data_ptr(), dst.data_ptr(),
                                                       static_cast<size_t>(dst.numel()), dtype, r)};
  };
  at::Tensor out = output;
  return make_work(c10d::OpType::_REDUCE_SCATTER_BASE, start,
                   [out, dst, src] { copy_back(out, dst); }, {out});
}

bool ProcessGroupDDP::all_ranks_even(int64_t block_elements) {
  auto bounds = at::tensor({block_elements, -block_elements}, at::kLong);
  auto start = [this, bounds] {
    return std::vector<WorkPtr>{
        live()->all_reduce(bounds.data_ptr(), 2, DataType::kInt64, ReduceOp::kMax)};
  };
  // Ordered like any operation (issue order); not counted as a collective of the caller's.
  // Waits up to the group timeout; a rank that never calls `op` makes this throw, naming it.
  make_work(c10d::OpType::ALLREDUCE, start, nullptr, {}, /*counted=*/false)->wait(timeout_);
  // max == -min: every rank passed the same value; >= 0: none was uneven.
  const auto* b = bounds.data_ptr<int64_t>();
  return b[0] >= 0 && b[0] == -b[1];
}

std::vector<WorkPtr> ProcessGroupDDP::exchange(const std::vector<at::Tensor>& send_blocks,
                                               const std::vector<at::Tensor>& recv_blocks) {
  // Negative tags never collide with the user's (torch.distributed tags are >= 0); every rank
  // numbers its exchanges alike because collectives are called in the same order.
  const int tag = -1 - static_cast<int>(exchange_seq_++ % (1 << 30));
  std::vector<WorkPtr> works;
  ProcessGroup* group = live();  // one generation for the whole exchange
  const int me = group->rank(), size = group->size();
  recv_blocks[me].copy_(send_blocks[me]);
  for (int p = 0; p < size; ++p) {
    if (p == me || recv_blocks[p].numel() == 0) continue;
    works.push_back(group->recv(bytes_of(recv_blocks[p]).data_ptr(), recv_blocks[p].nbytes(),
                                DataType::kUInt8, p, tag));
  }
  for (int p = 0; p < size; ++p) {
    if (p == me || send_blocks[p].numel() == 0) continue;
    works.push_back(
        group->send(send_blocks[p].data_ptr(), send_blocks[p].nbytes(), DataType::kUInt8, p, tag));
  }
  return works;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& /*opts*/) {
  const char* op = "all_to_all_single";
  check_dense(input, op);
  check_same({output}, input.scalar_type(), std::nullopt, op, "output");
  auto splits_ok = [&](const std::vector<int64_t>& s, const at::Tensor& t, const char* what) {
    if (s.empty()) {
      if (t.dim() == 0 || t.size(0) % group_size() != 0) {
        throw UsageError(
            fmt::format("{}: {} of shape {} does not split evenly into {} ranks along dim 0; pass "
                        "{}_split_sizes",
                        op, what, c10::str(t.sizes()), group_size(), what));
      }
      return std::vector<int64_t>(group_size(), t.size(0) / group_size());
    }
    if (static_cast<int>(s.size()) != group_size() ||
        std::accumulate(s.begin(), s.end(), int64_t{0}) != t.size(0)) {
      throw UsageError(fmt::format(
          "{}: {}_split_sizes has {} entries summing to {}; it needs {} entries summing to "
          "{} (dim 0 of the {})",
          op, what, s.size(), std::accumulate(s.begin(), s.end(), int64_t{0}), group_size(),
          t.dim() ? t.size(0) : 0, what));
    }
    return s;
  };
  const auto in_splits = splits_ok(input_splits, input, "input");
  const auto out_splits = splits_ok(output_splits, output, "output");
  auto src = host_contiguous(input);
  auto dst = host_contiguous(output);
  const int64_t in_row = input.size(0) ? input.numel() / input.size(0) : 0;
  const int64_t out_row = output.size(0) ? output.numel() / output.size(0) : 0;
  const bool even_here = std::all_of(in_splits.begin(), in_splits.end(),
                                     [&](int64_t s) { return s == in_splits[0]; }) &&
                         in_splits == out_splits && in_row == out_row;
  WorkDDP::Start start;
  if (all_ranks_even(even_here ? in_splits[0] * in_row : -1)) {
    const auto e = move_elements(input.scalar_type(), in_splits[0] * in_row);
    start = [this, src, dst, e] {
      return std::vector<WorkPtr>{
          live()->all_to_all(src.data_ptr(), dst.data_ptr(), e.count, e.dtype)};
    };
  } else {
    std::vector<at::Tensor> sends, recvs;
    int64_t so = 0, ro = 0;
    for (int p = 0; p < group_size(); ++p) {
      sends.push_back(src.reshape(-1).narrow(0, so * in_row, in_splits[p] * in_row));
      recvs.push_back(dst.reshape(-1).narrow(0, ro * out_row, out_splits[p] * out_row));
      so += in_splits[p];
      ro += out_splits[p];
    }
    if (sends[group_rank()].numel() != recvs[group_rank()].numel()) {
      throw UsageError(
          fmt::format("{}: this rank sends itself {} elements but expects {} from itself", op,
                      sends[group_rank()].numel(), recvs[group_rank()].numel()));
    }
    start = [this, sends, recvs] { return exchange(sends, recvs); };
  }
  at::Tensor out = output;
  return make_work(c10d::OpType::ALLTOALL_BASE, start, [out, src, dst] { copy_back(out, dst); },
                   {out});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& /*opts*/) {
  const char* op = "all_to_all";
  if (static_cast<int>(inputs.size()) != group_size() ||
      static_cast<int>(outputs.size()) != group_size()) {
    throw UsageError(fmt::format("{}: needs {} input and {} output tensors (got {} and {})", op,
                                 group_size(), group_size(), inputs.size(), outputs.size()));
  }
  check_dense(inputs[0], op);
  const auto dtype = inputs[0].scalar_type();
  check_same(inputs, dtype, std::nullopt, op, "input_tensor_list");
  check_same(outputs, dtype, std::nullopt, op, "output_tensor_list");
  const int64_t n = inputs[0].numel();
  bool even = true;
  for (int p = 0; p < group_size(); ++p) {
    even = even && inputs[p].numel() == n && outputs[p].numel() == n;
  }
  std::vector<at::Tensor> outs = outputs;
  if (all_ranks_even(even ? n : -1)) {
    auto src = pack(inputs);
    auto flat = at::empty({n * group_size()}, host_options(inputs[0]));
    const auto e = move_elements(dtype, n);
    auto start = [this, src, flat, e] {
      return std::vector<WorkPtr>{
          live()->all_to_all(src.data_ptr(), flat.data_ptr(), e.count, e.dtype)};
    };
    auto epilogue = [outs, src, flat, n] {
      for (size_t p = 0; p < outs.size(); ++p) {
        outs[p].copy_(flat.narrow(0, static_cast<int64_t>(p) * n, n).view(outs[p].sizes()));
      }
    };
    return make_work(c10d::OpType::ALLTOALL, start, std::move(epilogue), outs);
  }
  std::vector<at::Tensor> sends, recvs;
  for (int p = 0; p < group_size(); ++p) {
    sends.push_back(host_contiguous(inputs[p]));
    recvs.push_back(host_contiguous(outputs[p]));
  }
  if (sends[group_rank()].numel() != recvs[group_rank()].numel()) {
    throw UsageError(fmt::format("{}: this rank sends itself {} elements but expects {}", op,
                                 sends[group_rank()].numel(), recvs[group_rank()].numel()));
  }
  auto start = [this, sends, recvs] { return exchange(sends, recvs); };
  auto epilogue = [outs, sends, recvs] {
    for (size_t p = 0; p < outs.size(); ++p) copy_back(outs[p], recvs[p]);
  };
  return make_work(c10d::OpType::ALLTOALL, start, std::move(epilogue), outs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::barrier(const c10d::BarrierOptions& opts) {
  if (opts.timeout == c10d::kUnsetTimeout) {
    auto start = [this] { return std::vector<WorkPtr>{live()->barrier()}; };
    return make_work(c10d::OpType::BARRIER, start, nullptr, {});
  }
  // dist.barrier(timeout=...): ddp's barrier collective waits up to the group's timeout in the
  // caller's thread, so a per-call limit is kept by the monitored barrier below, after this
  // group's earlier operations finished (within the same limit), as a barrier orders them.
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  std::deque<c10::intrusive_ptr<WorkDDP>> earlier;
  {
    std::lock_guard<std::mutex> lock(in_flight_mutex_);
    earlier = in_flight_;
  }
  for (auto& w : earlier) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    w->wait(std::max(left, std::chrono::milliseconds(1)));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  monitored_barrier(std::max(left, std::chrono::milliseconds(0)), false, "barrier", opts.timeout);
  return make_work(c10d::OpType::BARRIER, [] { return std::vector<WorkPtr>{}; }, nullptr, {});
}

void ProcessGroupDDP::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // An unset timeout (-1) means the group's; 0 is a timeout of 0 ms, as for gloo.
  const auto limit = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  monitored_barrier(limit, wait_all_ranks, "monitored_barrier", limit);
}

void ProcessGroupDDP::monitored_barrier(std::chrono::milliseconds limit, bool wait_all_ranks,
                                        const char* op, std::chrono::milliseconds stated) {
  if (group_size() == 1) return;
  // Through the group's store, as gloo's monitored barrier goes through its own messages:
  // every rank sets its key, rank 0 watches them until `limit` and then writes the outcome
  // every rank waits for. Store requests leave nothing pending behind a failed barrier (a
  // posted receive would hold the group's teardown for the group timeout), and the keys of
  // each call are its own.
  const int64_t seq = monitored_seq_++;
  const std::string prefix = fmt::format("ddp_monitored_barrier/{}/", seq);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const std::string outcome_key = prefix + "outcome";
  try {
    store_->set(prefix + std::to_string(group_rank()), std::vector<uint8_t>{1});
    if (group_rank() != 0) {
      store_->wait({outcome_key}, left());
      const auto outcome = store_->get(outcome_key);
      if (outcome.empty() || outcome[0] != 'o') {
        throw TimeoutError(fmt::format("{}: rank 0 reported: {}", op,
                                       std::string(outcome.begin(), outcome.end())));
      }
      return;
    }
    if (seq >= 2) {
      // The keys of the call two before: every rank arrived at the previous call, so all read
      // that one's outcome. (One call before could still be read by a slow rank.)
      const std::string old = fmt::format("ddp_monitored_barrier/{}/", seq - 2);
      try {
        for (int r = 0; r < group_size(); ++r) store_->deleteKey(old + std::to_string(r));
        store_->deleteKey(old + "outcome");
      } catch (const c10::Error&) {
        // A store without deleteKey keeps them: a few bytes per call.
      }
    }
    std::vector<int> missing;
    for (int r = 1; r < group_size(); ++r) {
      const std::string key = prefix + std::to_string(r);
      while (!store_->check({key}) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (!store_->check({key})) {
        missing.push_back(r);
        if (!wait_all_ranks) break;
      }
    }
    std::string outcome = "ok";
    if (!missing.empty()) {
      outcome = fmt::format(
          "{} {} failed to pass the barrier within {} ms (rank 0 of {}); they crashed, hang or "
          "run something else{}",
          missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "), stated.count(),
          group_size(), wait_all_ranks ? "" : " (wait_all_ranks=True lists every missing rank)");
    }
    store_->set(outcome_key, std::vector<uint8_t>(outcome.begin(), outcome.end()));
    if (!missing.empty()) throw TimeoutError(fmt::format("{}: {}", op, outcome));
  } catch (const c10::Error& e) {
    // The store's own timeout (DistStoreError): rank 0 wrote no outcome in time.
    throw TimeoutError(fmt::format(
        "{}: rank {} was not released by rank 0 within {} ms: rank 0 did not reach the barrier "
        "or is still waiting for other ranks (its error names them): {}",
        op, group_rank(), stated.count(), e.what_without_backtrace()));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  const auto& t = single_tensor(tensors, "send");
  if (dst < 0 || dst >= group_size() || dst == group_rank()) {
    throw UsageError(fmt::format("send: destination rank {} is invalid for rank {} of {}", dst,
                                 group_rank(), group_size()));
  }
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto start = [this, buf, e, dst, tag] {
    return std::vector<WorkPtr>{live()->send(buf.data_ptr(), e.count, e.dtype, dst, tag)};
  };
  return make_work(c10d::OpType::SEND, start, [buf] {}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  const auto& t = single_tensor(tensors, "recv");
  if (src < 0 || src >= group_size() || src == group_rank()) {
    throw UsageError(fmt::format("recv: source rank {} is invalid for rank {} of {}", src,
                                 group_rank(), group_size()));
  }
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto start = [this, buf, e, src, tag] {
    return std::vector<WorkPtr>{live()->recv(buf.data_ptr(), e.count, e.dtype, src, tag)};
  };
  return make_work(c10d::OpType::RECV, start, [t, buf] { copy_back(t, buf); }, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDP::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  const auto& t = single_tensor(tensors, "recv");
  auto buf = host_contiguous(t);
  const auto e = move_elements(t.scalar_type(), t.numel());
  auto source = std::make_shared<int>(-1);
  auto start = [this, buf, e, tag, source] {
    return std::vector<WorkPtr>{
        live()->recv_any_source(buf.data_ptr(), e.count, e.dtype, tag, source)};
  };
  auto work = make_work(c10d::OpType::RECVANYSOURCE, start, [t, buf] { copy_back(t, buf); }, {t});
  work->set_source(source);
  return work;
}

}  // namespace ddp::python
