#include "ddp/torch/ddp/join.hpp"

#include <fmt/format.h>

#include <exception>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp {
namespace {

// Sum over the ranks of `value` (a small count), waiting at most `timeout`.
int sum_over_ranks(ProcessGroup& pg, int value, std::chrono::milliseconds timeout,
                   const char* what) {
  auto t = torch::full({1}, value, torch::kInt32).to(comm_device(pg));
  try {
    WorkPtr work = all_reduce(pg, t, ReduceOp::kSum);
    wait_on_current_stream(pg, *work, timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format(
        "Join: the all-reduce of {} did not finish on rank {}: {}. Every rank must enter the "
        "same Join guard (same Joinables, same order) and its loop must call the first "
        "Joinable once per iteration",
        what, pg.rank(), e.what()));
  }
  return t.cpu().item<int>();
}

}  // namespace

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)),
      options_(options),
      uncaught_at_entry_(std::uncaught_exceptions()) {
  if (joinables_.empty()) {
    throw UsageError("Join needs at least one Joinable, e.g. ddp::Join joined({&model, &opt})");
  }
  for (size_t i = 0; i < joinables_.size(); ++i) {
    Joinable* j = joinables_[i];
    if (!j) throw UsageError(fmt::format("Join: joinable {} is null", i));
    ProcessGroup* pg = &j->join_process_group();
    if (!pg_) pg_ = pg;
    if (pg != pg_) {
      throw UsageError(fmt::format(
          "Join: joinable {} uses another process group than joinable 0; every Joinable of a "
          "guard must communicate over the same group",
          i));
    }
  }
  for (Joinable* j : joinables_) hooks_.push_back(j->join_hook(options_));
  bool first = true;
  for (Joinable* j : joinables_) {
    j->join_config_.enable = options_.enable();
    j->join_config_.throw_on_early_termination = options_.throw_on_early_termination();
    j->join_config_.is_first_joinable = first;
    first = false;
  }
}

Join::~Join() noexcept(false) {
  // Leaving the scope by an exception: let it propagate untouched, as PyTorch does.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_entry_;
  if (!finished_ && !unwinding) {
    finish();  // resets the configs itself, even when it throws
    return;
  }
  for (Joinable* j : joinables_) j->join_config_ = JoinConfig{};
}

int Join::all_reduce_count(int value) {
  return sum_over_ranks(*pg_, value, joinables_.front()->join_timeout(),
                        "the number of ranks still training");
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  struct ResetConfigs {
    std::vector<Joinable*>& joinables;
    ~ResetConfigs() {
      for (Joinable* j : joinables) j->join_config_ = JoinConfig{};
    }
  } reset{joinables_};
  if (!options_.enable()) return;

  bool is_last_joiner = true;
  constexpr int64_t kWarnAfter = 1000;
  for (int64_t iteration = 0;; ++iteration) {
    if (iteration == kWarnAfter) {
      log::get("ddp.join")
          ->warn(
              "Join: rank {} has shadowed {} iterations of the ranks still training: it has at "
              "least that many fewer inputs. Such skew wastes this rank's time; balance the "
              "inputs (DistributedSampler gives every rank the same number)",
              pg_->rank(), kWarnAfter);
    }
    // Matches the "not joined" all-reduce of the ranks still training.
    const int training = all_reduce_count(0);
    if (training == 0) break;
    if (options_.throw_on_early_termination()) {
      // Matches their "has anyone joined?" all-reduce, which makes them throw.
      sum_over_ranks(*pg_, 1, joinables_.front()->join_timeout(), "the early-termination flag");
      throw CollectiveError(
          fmt::format("Join: rank {} ran out of inputs while {} rank(s) were still training "
                      "(throw_on_early_termination is set, so every rank stops)",
                      pg_->rank(), training));
    }
    for (auto& hook : hooks_) hook->main_hook();
    is_last_joiner = false;
  }
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
}

int Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& config = joinable.join_config();
  if (!config.enable || !config.is_first_joinable) return 0;
  ProcessGroup& pg = joinable.join_process_group();
  const int training =
      sum_over_ranks(pg, 1, joinable.join_timeout(), "the number of ranks still training");
  if (config.throw_on_early_termination) {
    const int joined = sum_over_ranks(pg, 0, joinable.join_timeout(), "the early-termination flag");
    if (joined != 0) {
      throw CollectiveError(fmt::format(
          "Join: rank {} found that {} rank(s) ran out of inputs "
          "(throw_on_early_termination is set, so every rank stops); give every rank the same "
          "number of batches, or leave throw_on_early_termination off to let joined ranks "
          "shadow the others",
          pg.rank(), joined));
    }
  }
  return training;
}

}  // namespace ddp
