#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "checkpoint_dir.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "shard_io.hpp"
#include "state_items.hpp"

namespace ddp {

namespace fs = std::filesystem;

// Host copies of the items a save writes, kept from save to save: copying into memory that is
// already mapped costs a memcpy, a fresh allocation also costs a page fault per 4 KiB.
struct Checkpointer::Staging {
  std::map<std::string, torch::Tensor> buffers;

  torch::Tensor stage(const std::string& fqn, const torch::Tensor& live) {
    torch::Tensor& buf = buffers[fqn];
    if (!buf.defined() || buf.sizes() != live.sizes() || buf.scalar_type() != live.scalar_type()) {
      buf = torch::empty(
          live.sizes(),
          torch::TensorOptions().dtype(live.scalar_type()).pinned_memory(live.is_cuda()));
    }
    buf.copy_(live);  // from a GPU: a blocking copy into pinned memory (full bandwidth)
    return buf;
  }
};

namespace {

// One small all-reduce: the largest of each rank's values.
std::vector<int64_t> max_over_ranks(ProcessGroup& pg, std::vector<int64_t> values) {
  auto t = torch::tensor(values, torch::kInt64).to(comm_device(pg));
  wait_on_current_stream(pg, *all_reduce(pg, t, ReduceOp::kMax), pg.timeout());
  t = t.cpu();
  for (size_t i = 0; i < values.size(); ++i) values[i] = t[static_cast<int64_t>(i)].item<int64_t>();
  return values;
}

bool ready(const std::future<void>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace

Checkpointer::Checkpointer(CheckpointOptions options, ProcessGroupPtr pg)
    : options_(std::move(options)), pg_(std::move(pg)), staging_(std::make_unique<Staging>()) {
  if (options_.dir_.empty()) throw UsageError("checkpoint: the directory is empty");
  if (options_.keep_ < 1) {
    throw UsageError(fmt::format("checkpoint: keep is {}; keep at least 1", options_.keep_));
  }
  if (!pg_) throw UsageError("checkpoint: no process group");
  std::error_code ec;
  fs::create_directories(options_.dir_, ec);
  if (ec) {
    throw UsageError(fmt::format("checkpoint: cannot create {}: {}", options_.dir_, ec.message()));
  }
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "ddp: the last checkpoint did not complete: " << e.what() << "\n";
  }
}

void Checkpointer::wait() {
  if (in_flight_.valid()) in_flight_.get();
}

bool Checkpointer::save(const TrainingProgress& progress, const torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer, const CheckpointExtras& extras) {
  const int rank = pg_->rank(), world = pg_->size();
  if (in_flight_.valid()) {
    // Every rank must make the same choice, or one rank would write a step the others skip.
    const bool busy = !ready(in_flight_);
    const bool any_busy =
        options_.in_flight_ == SaveInFlight::kSkip && max_over_ranks(*pg_, {busy ? 1 : 0})[0] != 0;
    if (any_busy) return false;
    wait();  // the previous save's error, if any, surfaces here
  }

  auto items = checkpoint::items_written_by(
      checkpoint::collect_items(progress, module, optimizer, extras, rank, world), rank, world);
  // A background write needs its own copy (training changes the live state meanwhile); a
  // write inside save() reads the live CPU tensors directly.
  for (auto& item : items) {
    if (!item.tensor.defined()) continue;
    item.tensor = options_.async_ ? staging_->stage(item.fqn, item.tensor)
                                  : item.tensor.to(torch::kCPU).contiguous();
  }

  // On the first save, rank 0 clears what a killed job left (a step directory without
  // .metadata may hold another run's shard reports) before any rank writes into it. Later saves
  // never meet such a directory: the previous save of this run completed or was waited for.
  const std::string path = checkpoint::step_dir(options_.dir_, progress.step);
  // Every rank writes this save into the same staging directory: its id is agreed (a rank
  // that replaced a lost one in place starts counting at 0; the others' count wins).
  const int64_t save_id = world == 1 ? saves_ : max_over_ranks(*pg_, {saves_})[0];
  saves_ = save_id + 1;
  const std::string staging = checkpoint::staging_dir(options_.dir_, progress.step, save_id);
  if (!cleared_) {
    if (rank == 0) checkpoint::remove_incomplete(options_.dir_);
    pg_->barrier()->wait(pg_->timeout());
    cleared_ = true;
  }
  auto write = [path, staging, rank, world, items = std::move(items), options = options_]() {
    checkpoint::write_shard(staging, rank, items);
    if (rank == 0) {
      checkpoint::commit(staging, world, options.timeout_);
      checkpoint::publish(staging, path);
      checkpoint::remove_incomplete(options.dir_, /*below_step=*/checkpoint::step_of_name(
                                        fs::path(path).filename().string()));
      checkpoint::prune_complete(options.dir_, options.keep_);
    }
  };
  if (options_.async_) {
    in_flight_ = std::async(std::launch::async, std::move(write));
  } else {
    write();
  }
  return true;
}

ResumedCheckpoint Checkpointer::load(const std::string& path, torch::nn::Module* module,
                                     torch::optim::Optimizer* optimizer, int rank) {
  checkpoint::EntryReader reader(path, checkpoint::read_complete(path));
  if (module) checkpoint::load_module(reader, *module);
  if (optimizer) {
    if (!module) throw UsageError("checkpoint: loading an optimizer needs its module (names)");
    checkpoint::load_optimizer(reader, *module, *optimizer);
  }
  checkpoint::load_rng(reader, rank, module);
  ResumedCheckpoint r;
  r.path = path;
  r.progress = checkpoint::load_progress(reader);
  r.extras = checkpoint::load_extras(reader);
  return r;
}

std::vector<std::pair<int64_t, std::string>> Checkpointer::list(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> r;
  for (const auto& d : checkpoint::complete_step_dirs(dir)) r.emplace_back(d.step, d.path);
  return r;
}

std::optional<ResumedCheckpoint> Checkpointer::load_newest(torch::nn::Module& module,
                                                           torch::optim::Optimizer* optimizer) {
  wait();
  std::vector<std::string> skipped;
  const auto complete = checkpoint::complete_step_dirs(options_.dir_, &skipped);
  const int64_t mine = complete.empty() ? -1 : complete.front().step;
  const auto agreed = max_over_ranks(*pg_, {mine, -mine});
  if (agreed[0] != -agreed[1]) {
    throw UsageError(fmt::format(
        "checkpoint: the ranks see different newest checkpoints in {} (rank {} sees {}; the "
        "newest any rank sees is step {}, the oldest {}): put the checkpoint directory on a file "
        "system every node shares",
        options_.dir_, pg_->rank(), mine < 0 ? "none" : "step " + std::to_string(mine), agreed[0],
        -agreed[1]));
  }
  if (mine < 0) return std::nullopt;
  ResumedCheckpoint r = load(complete.front().path, &module, optimizer, pg_->rank());
  r.skipped = std::move(skipped);
  return r;
}

}  // namespace ddp
