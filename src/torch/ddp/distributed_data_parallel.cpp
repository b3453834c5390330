#include "ddp/torch/ddp/distributed_data_parallel.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "blas_warning.hpp"
#include "ddp/torch/ddp/consistency.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/nn/sync_batch_norm.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

NoSyncGuard::NoSyncGuard(Reducer* reducer) : reducer_(reducer) {
  previous_ = reducer_->sync();
  reducer_->set_sync(false);
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : reducer_(other.reducer_), previous_(other.previous_) {
  other.reducer_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (reducer_) reducer_->set_sync(previous_);
}

namespace {

std::string timeline_file_for(const std::string& pattern, int rank, int world) {
  if (pattern.empty()) return "";
  const std::string token = "{rank}";
  const size_t at = pattern.find(token);
  if (at == std::string::npos) {
    if (world > 1) {
      throw UsageError(fmt::format(
          "timeline_path '{}' has no '{{rank}}': with {} ranks every rank would write the same "
          "file; use e.g. 'timeline_rank{{rank}}.json'",
          pattern, world));
    }
    return pattern;
  }
  std::string out = pattern;
  for (size_t pos = out.find(token); pos != std::string::npos; pos = out.find(token)) {
    out.replace(pos, token.size(), std::to_string(rank));
  }
  return out;
}

size_t megabytes_to_bytes(double mb, const char* option) {
  if (!(mb > 0)) {
    throw UsageError(
        fmt::format("DistributedDataParallelOptions::{} must be positive, got {}", option, mb));
  }
  return static_cast<size_t>(mb * 1024.0 * 1024.0);
}

}  // namespace

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         ProcessGroupPtr pg,
                                                         DistributedDataParallelOptions options)
    : base_(std::move(module)), pg_(std::move(pg)), options_(std::move(options)) {
  if (!base_) throw UsageError("DistributedDataParallel: the module is null");
  if (!pg_) throw UsageError("DistributedDataParallel: the process group is null");
  timeout_ = options_.timeout().count() > 0 ? options_.timeout() : pg_->timeout();
  adopt_group_in_sync_batch_norms();
  timeline_file_ = timeline_file_for(options_.timeline_path(), pg_->rank(), pg_->size());
  if (!timeline_file_.empty()) timeline_ = std::make_shared<Timeline>(pg_->rank());

  std::vector<NamedTensor> described;
  std::vector<torch::Tensor> all;
  for (const auto& item : base_->named_parameters(true)) {
    described.push_back({"parameter " + item.key(), item.value()});
    all.push_back(item.value());
  }
  for (const auto& item : base_->named_buffers(true)) {
    described.push_back({"buffer " + item.key(), item.value()});
    all.push_back(item.value());
    buffers_.push_back(item.value());
  }
  // With nccl every tensor must already be on the rank's GPU (no silent host round trips).
  bool on_cpu = false;
  for (const auto& t : described) {
    check_tensor_device(*pg_, t.tensor, t.name);
    on_cpu = on_cpu || t.tensor.device().is_cpu();
  }
  if (on_cpu) detail::warn_once_if_reference_blas();
  FlightRecorder::ScopedThreadTag tag("DDP construction");  // names these in a hang report
  if (options_.init_sync()) {
    verify_same_tensors(*pg_, described, "parameters and buffers", timeout_);
    if (pg_->size() > 1) broadcast_tensors(*pg_, all, /*root=*/0, timeout_);
  }
  reducer_ = make_reducer();
}

void DistributedDataParallelBase::adopt_group_in_sync_batch_norms() {
  // Every SyncBatchNorm inside synchronizes over this group unless given one explicitly.
  for (const auto& m : base_->modules(/*include_self=*/true)) {
    if (auto* sync_bn = dynamic_cast<SyncBatchNormBase*>(m.get())) {
      sync_bn->adopt_process_group(pg_);
    }
  }
}

std::unique_ptr<Reducer> DistributedDataParallelBase::make_reducer() const {
  std::vector<torch::Tensor> grad_params;
  std::vector<std::string> grad_names;
  for (const auto& item : base_->named_parameters(true)) {
    if (item.value().requires_grad()) {
      grad_params.push_back(item.value());
      grad_names.push_back(item.key());
    }
  }
  ReducerConfig config;
  config.first_bucket_cap_bytes =
      megabytes_to_bytes(options_.first_bucket_cap_mb(), "first_bucket_cap_mb");
  config.bucket_cap_bytes = megabytes_to_bytes(options_.bucket_cap_mb(), "bucket_cap_mb");
  config.find_unused_parameters = options_.find_unused_parameters();
  config.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  config.static_graph = options_.static_graph();
  config.comm_hook = options_.comm_hook();
  config.stop_request = options_.stop_request();
  config.timeout = timeout_;
  config.timeline = timeline_;
  return std::make_unique<Reducer>(std::move(grad_params), std::move(grad_names), pg_, config);
}

void DistributedDataParallelBase::reset_process_group(ProcessGroupPtr pg) {
  if (!pg) throw UsageError("DistributedDataParallel::reset_process_group: the group is null");
  // The rank and the size may differ (in-place recovery after a lost node: the survivors are
  // renumbered); the reducer is rebuilt on the new group, so the averages divide by its size.
  reducer_.reset();  // unhooks the old reducer before the new one hooks the same parameters
  pg_ = std::move(pg);
  timeout_ = options_.timeout().count() > 0 ? options_.timeout() : pg_->timeout();
  adopt_group_in_sync_batch_norms();
  reducer_ = make_reducer();
}

DistributedDataParallelBase::~DistributedDataParallelBase() {
  if (!timeline_ || timeline_file_.empty()) return;
  try {
    write_timeline();
  } catch (const std::exception& e) {
    // A destructor must not throw; the caller can call write_timeline() to see the error.
    spdlog::error("DistributedDataParallel: {}", e.what());
  }
}

torch::OrderedDict<std::string, torch::Tensor> DistributedDataParallelBase::named_parameters()
    const {
  return base_->named_parameters(true);
}

torch::OrderedDict<std::string, torch::Tensor> DistributedDataParallelBase::named_buffers() const {
  return base_->named_buffers(true);
}

void DistributedDataParallelBase::load_state_dict(const StateDict& state, bool strict) {
  ddp::load_state_dict(*base_, state, strict);
}

void DistributedDataParallelBase::write_timeline() const {
  if (!timeline_) {
    throw UsageError(
        "write_timeline: no timeline; set DistributedDataParallelOptions::timeline_path");
  }
  timeline_->write(timeline_file_);
}

void DistributedDataParallelBase::before_forward() {
  // A backward that ended outside the engine's callbacks is completed before moving on.
  reducer_->finalize();
  forward_begin_ = Timeline::Clock::now();
  if (join_config().enable) {
    join_before_forward();  // the Join protocol's collectives, buffers included (ddp_join.cpp)
  } else if (options_.broadcast_buffers() && pg_->size() > 1 && !buffers_.empty()) {
    FlightRecorder::ScopedThreadTag tag("DDP buffer broadcast");
    broadcast_tensors(*pg_, buffers_, /*root=*/0, timeout_);
  }
}

bool DistributedDataParallelBase::after_forward(std::vector<torch::Tensor>& outputs) {
  // As PyTorch, whether the coming backward all-reduces is decided now (no_sync's state at
  // forward time); a forward without grad mode builds no graph and decides nothing.
  bool replaced = false;
  if (torch::GradMode::is_enabled()) {
    std::vector<torch::Tensor> replacements = reducer_->prepare_for_backward(outputs);
    if (!replacements.empty()) {
      outputs = std::move(replacements);
      replaced = true;
    }
  }
  if (timeline_) {
    timeline_->add_span("forward", Timeline::Track::kCompute, forward_begin_,
                        Timeline::Clock::now());
  }
  return replaced;
}

}  // namespace ddp
