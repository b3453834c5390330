// DDP benchmarks, one JSON object per line on stdout.
//
//   bench_ddp overhead [--steps N --blocks K] world-1 DDP step time / plain LibTorch (CNN, batch
//                                         64, N*K alternating steps of each, medians)
//   bench_ddp train --world W [--steps N] Fashion-MNIST CNN, Adam 1e-3, batch 64 per rank,
//                                         one intra-op thread per rank, W worker processes
//     --independent                       the same W processes without DDP (no gradient
//                                         averaging): the machine's ceiling for W ranks, since
//                                         W busy cores already slow each other (shared memory
//                                         bandwidth) before any communication
//     --gradient-as-bucket-view           DDP option of that name (default off, as PyTorch)
//     --default-malloc                    skip ddp::keep_freed_memory() (glibc's defaults:
//                                         every step faults its freed tensors back in)
//     --optimizer O                       adam (torch::optim::Adam, default) or fused-adam
//                                         (ddp::FusedAdam: the same update in one pass)
//     --single-bucket                     all gradients in one bucket (both caps 1 GiB), e.g. to
//                                         compare powersgd with PyTorch's on gloo, which
//                                         aborts with several buckets (see README.md)
//     --comm-hook H                       allreduce (default), fp16, bf16, powersgd (rank 1,
//                                         compressing from iteration 2, as bench_ddp.py's), or a
//                                         diagnostic that tells DDP's costs apart: `none` reduces
//                                         nothing (the bucket copies and hooks alone), `sync`
//                                         all-reduces one element per bucket (the lockstep
//                                         of the ranks without moving the gradients)
//
// `train` re-executes this binary once per rank with torchrun's environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT; the port found by binding port 0) and the workers meet through
// init_process_group's env:// TcpStore. Rank 0 prints the result.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/torch/data/idx_dataset.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/powersgd_hook.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/models/mnist_cnn.hpp"
#include "ddp/torch/optim/fused_adam.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/malloc_tuning.hpp"
#include "ddp/util/socket.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
// The tutorials' CNN without dropout, as in bench_ddp.py.
using Cnn = ddp::models::MnistCnn;

constexpr int kBatch = 64;

// Diagnostic hooks (--comm-hook none|sync): the gradients stay local, so training diverges
// across ranks; only the step time means something.
// Holds the tensor it reduces (if any) until the reduction is destroyed, after finish().
class LocalReduction : public ddp::BucketReduction {
 public:
  LocalReduction() = default;
  LocalReduction(ddp::ProcessGroup& pg, torch::Tensor token)
      : token_(std::move(token)), work_(ddp::all_reduce(pg, token_, ddp::ReduceOp::kSum)) {}
  bool is_completed() override { return !work_ || work_->is_completed(); }
  void finish(std::chrono::milliseconds timeout) override {
    if (work_) work_->wait(timeout);
  }

 private:
  torch::Tensor token_;
  ddp::WorkPtr work_;
};

class DiagnosticHook : public ddp::CommHook {
 public:
  explicit DiagnosticHook(bool sync) : sync_(sync) {}
  std::string name() const override { return sync_ ? "sync" : "none"; }
  std::unique_ptr<ddp::BucketReduction> launch(ddp::ProcessGroup& pg,
                                               const torch::Tensor& bucket) override {
    if (!sync_) return std::make_unique<LocalReduction>();
    return std::make_unique<LocalReduction>(pg, bucket.narrow(0, 0, 1).clone());
  }

 private:
  bool sync_;
};

ddp::CommHookPtr make_hook(const std::string& name) {
  if (name == "allreduce") return ddp::allreduce_hook();
  if (name == "fp16") return ddp::fp16_compress_hook();
  if (name == "bf16") return ddp::bf16_compress_hook();
  if (name == "powersgd") {
    return ddp::powerSGD_hook(
        ddp::PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2));
  }
  return std::make_shared<DiagnosticHook>(name == "sync");
}

// CPU seconds used by this process (all its threads: compute and communication).
double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Loads Fashion-MNIST; on failure random data of the same shape, reported in the "data" field.
ddp::TensorDataset load_data(std::string& source) {
  try {
    source = "fashion-mnist";
    return ddp::load_mnist();
  } catch (const ddp::Error& e) {
    fmt::print(stderr, "bench_ddp: {}; using random data of the same shape\n", e.what());
    source = "random";
    return ddp::TensorDataset(torch::randn({60000, 1, 28, 28}),
                              torch::randint(0, 10, {60000}, torch::kLong));
  }
}

// Trains `steps` batches (after `warmup`) and returns the seconds the timed steps took.
template <typename Step>
double time_steps(int warmup, int steps, Step&& step) {
  for (int i = 0; i < warmup; ++i) step(i);
  auto begin = Clock::now();
  for (int i = 0; i < steps; ++i) step(warmup + i);
  return seconds_since(begin);
}

int run_overhead(int steps, int repeats, const std::string& timeline) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  auto x = torch::randn({kBatch, 1, 28, 28});
  auto y = torch::randint(0, 10, {kBatch}, torch::kLong);
  Cnn plain;
  Cnn wrapped;
  torch::optim::Adam plain_opt(plain->parameters(), 1e-3);

  ddp::InitOptions opts;
  opts.rank = 0;
  opts.world_size = 1;
  opts.store = std::make_shared<ddp::HashStore>();
  auto pg = ddp::init_process_group(opts);
  ddp::DistributedDataParallel model(wrapped, pg,
                                     ddp::DistributedDataParallelOptions().timeline_path(timeline));
  torch::optim::Adam ddp_opt(model.parameters(), 1e-3);

  auto plain_step = [&](int) {
    plain_opt.zero_grad();
    torch::nll_loss(plain->forward(x), y).backward();
    plain_opt.step();
  };
  auto ddp_step = [&](int) {
    ddp_opt.zero_grad();
    torch::nll_loss(model(x), y).backward();
    model.step(ddp_opt);
  };
  // Single steps alternate between the two, so load from other processes hits both alike;
  // medians of the per-step times resist outliers.
  for (int i = 0; i < 3; ++i) {
    plain_step(i);
    ddp_step(i);
  }
  std::vector<double> plain_ms, ddp_ms;
  for (int i = 0; i < steps * repeats; ++i) {
    plain_ms.push_back(1e3 * time_steps(0, 1, plain_step));
    ddp_ms.push_back(1e3 * time_steps(0, 1, ddp_step));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double p = median(plain_ms), d = median(ddp_ms);
  nlohmann::json out = {{"bench", "ddp_overhead"}, {"impl", "ddp"},
                        {"model", "cnn"},          {"world", 1},
                        {"batch", kBatch},         {"threads", 1},
                        {"plain_step_ms", p},      {"ddp_step_ms", d},
                        {"ratio", d / p},          {"steps", steps * repeats}};
  fmt::print("{}\n", out.dump());
  return 0;
}

struct WorkerOptions {
  int steps = 60;
  int warmup = 5;
  std::string timeline;
  bool independent = false;     // no DDP wrapper: every process trains alone (ceiling)
  bool bucket_view = false;     // gradient_as_bucket_view
  bool single_bucket = false;   // bucket caps of 1 GiB: one bucket
  bool default_malloc = false;  // do not call keep_freed_memory()
  bool malloc_tuned = false;    // keep_freed_memory() applied its settings
  std::string comm_hook = "allreduce";
  std::string optimizer = "adam";
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params) {
  if (name == "fused-adam") return std::make_unique<ddp::FusedAdam>(std::move(params), 1e-3);
  return std::make_unique<torch::optim::Adam>(std::move(params), 1e-3);
}

int run_worker(const WorkerOptions& o) {
  const int steps = o.steps, warmup = o.warmup;
  torch::set_num_threads(1);
  auto pg = ddp::init_process_group(ddp::InitOptions());
  const int rank = pg->rank(), world = pg->size();
  std::string source;
  ddp::TensorDataset data = load_data(source);
  // Rank r's shard: samples r, r + world, ... (DistributedSampler without shuffling).
  auto index = torch::arange(rank, data.size(), world, torch::kLong);
  auto images = data.data().index_select(0, index);
  auto labels = data.target().index_select(0, index);
  const int64_t batches = images.size(0) / kBatch;

  torch::manual_seed(0);
  Cnn net;
  std::optional<ddp::DistributedDataParallel<ddp::models::MnistCnnImpl>> model;
  if (!o.independent) {
    model.emplace(net, pg,
                  ddp::DistributedDataParallelOptions()
                      .timeline_path(o.timeline)
                      .gradient_as_bucket_view(o.bucket_view)
                      .bucket_cap_mb(o.single_bucket ? 1024 : 25)
                      .first_bucket_cap_mb(o.single_bucket ? 1024 : 1)
                      .comm_hook(make_hook(o.comm_hook)));
  }
  auto opt = make_optimizer(o.optimizer, net->parameters());
  double loss_sum = 0;
  auto step = [&](int i) {
    const int64_t b = i % batches;
    opt->zero_grad();
    auto x = images.narrow(0, b * kBatch, kBatch);
    auto loss = torch::nll_loss(model ? (*model)(x) : net->forward(x),
                                labels.narrow(0, b * kBatch, kBatch));
    loss.backward();
    if (model) {
      model->step(*opt);
    } else {
      opt->step();
    }
    loss_sum += loss.item<double>();
  };
  for (int i = 0; i < warmup; ++i) step(i);
  pg->barrier()->wait(pg->timeout());
  auto begin = Clock::now();
  const double cpu_begin = process_cpu_seconds();
  for (int i = 0; i < steps; ++i) step(warmup + i);
  double elapsed = seconds_since(begin);
  // CPU per step tells compute cost apart from waiting for a core on a shared machine.
  double cpu_ms_per_step = 1e3 * (process_cpu_seconds() - cpu_begin) / steps;
  pg->all_reduce(&cpu_ms_per_step, 1, ddp::DataType::kFloat64, ddp::ReduceOp::kMax)
      ->wait(pg->timeout());
  // The slowest rank defines the throughput.
  pg->all_reduce(&elapsed, 1, ddp::DataType::kFloat64, ddp::ReduceOp::kMax)->wait(pg->timeout());
  if (rank == 0) {
    nlohmann::json out = {{"bench", "ddp_cnn"},
                          {"impl", o.independent ? "independent" : "ddp"},
                          {"gradient_as_bucket_view", o.bucket_view},
                          {"comm_hook", o.independent ? "" : o.comm_hook},
                          {"single_bucket", o.single_bucket},
                          {"malloc_tuned", o.malloc_tuned},
                          {"data", source},
                          {"world", world},
                          {"batch_per_rank", kBatch},
                          {"threads_per_rank", 1},
                          {"optimizer", o.optimizer + " 1e-3"},
                          {"steps", steps},
                          {"seconds", elapsed},
                          {"cpu_ms_per_step_max_rank", cpu_ms_per_step},
                          {"samples_per_s", world * kBatch * steps / elapsed},
                          {"mean_loss", loss_sum / (steps + warmup)}};
    fmt::print("{}\n", out.dump());
  }
  return 0;
}

int run_train(int world, const WorkerOptions& o) {
  const int port = ddp::net::free_tcp_port("127.0.0.1");
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      std::string s(*e);
      for (const char* k : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                            "MASTER_ADDR=", "MASTER_PORT=", "OMP_NUM_THREADS="}) {
        if (s.rfind(k, 0) == 0) s.clear();
      }
      if (!s.empty()) env_strings.push_back(s);
    }
    env_strings.push_back(fmt::format("RANK={}", r));
    env_strings.push_back(fmt::format("LOCAL_RANK={}", r));
    env_strings.push_back(fmt::format("WORLD_SIZE={}", world));
    env_strings.push_back(fmt::format("LOCAL_WORLD_SIZE={}", world));
    env_strings.push_back("MASTER_ADDR=127.0.0.1");
    env_strings.push_back(fmt::format("MASTER_PORT={}", port));
    env_strings.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = {"bench_ddp",   "worker",
                                     "--steps",     std::to_string(o.steps),
                                     "--warmup",    std::to_string(o.warmup),
                                     "--timeline",  o.timeline,
                                     "--comm-hook", o.comm_hook,
                                     "--optimizer", o.optimizer};
    if (o.independent) args.push_back("--independent");
    if (o.bucket_view) args.push_back("--gradient-as-bucket-view");
    if (o.single_bucket) args.push_back("--single-bucket");
    if (o.default_malloc) args.push_back("--default-malloc");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
      throw ddp::UsageError("bench_ddp: posix_spawn of a worker failed");
    }
    pids.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  if (failures) fmt::print(stderr, "bench_ddp: {} of {} workers failed\n", failures, world);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("DDP benchmarks (JSON lines)");
  app.require_subcommand(1);
  // One variable per subcommand: CLI11 writes default_val() into the variable at once.
  std::string timeline;  // DDP timeline_path, "{rank}" replaced; empty: none
  int overhead_steps = 10, blocks = 5, world = 2;
  WorkerOptions w;
  auto* overhead = app.add_subcommand("overhead", "world-1 DDP step time / plain LibTorch");
  overhead->add_option("--steps", overhead_steps, "steps per timed block")->default_val(10);
  overhead->add_option("--blocks", blocks, "interleaved blocks")->default_val(5);
  overhead->add_option("--timeline", timeline, "write the DDP timeline here");
  auto* train = app.add_subcommand("train", "Fashion-MNIST CNN samples/s with W processes");
  train->add_option("--world", world, "ranks (processes)")->default_val(2);
  train->add_option("--steps", w.steps, "timed steps per rank")->default_val(60);
  train->add_option("--warmup", w.warmup, "untimed steps first")->default_val(5);
  train->add_option("--timeline", w.timeline, "per-rank DDP timeline, e.g. tl_rank{rank}.json");
  train->add_flag("--independent", w.independent,
                  "no DDP: W processes train alone (this machine's ceiling for W ranks)");
  train->add_flag("--single-bucket", w.single_bucket, "all gradients in one bucket");
  train->add_flag("--gradient-as-bucket-view", w.bucket_view,
                  "DDP's gradient_as_bucket_view (no gradient copies)");
  train->add_flag("--default-malloc", w.default_malloc,
                  "glibc's malloc defaults instead of ddp::keep_freed_memory()");
  const std::vector<std::string> hooks = {"allreduce", "fp16", "bf16", "powersgd", "none", "sync"};
  train
      ->add_option("--comm-hook", w.comm_hook,
                   "allreduce, fp16, bf16, powersgd (rank 1 from iteration 2); diagnostics: none "
                   "(no reduction), sync (lockstep only)")
      ->check(CLI::IsMember(hooks));
  const std::vector<std::string> optimizers = {"adam", "fused-adam"};
  train->add_option("--optimizer", w.optimizer, "adam (torch::optim::Adam) or fused-adam")
      ->check(CLI::IsMember(optimizers));
  auto* worker = app.add_subcommand("worker", "one rank of `train` (internal)");
  worker->add_option("--steps", w.steps)->default_val(60);
  worker->add_option("--warmup", w.warmup)->default_val(5);
  worker->add_option("--timeline", w.timeline);
  worker->add_flag("--independent", w.independent);
  worker->add_flag("--gradient-as-bucket-view", w.bucket_view);
  worker->add_flag("--single-bucket", w.single_bucket);
  worker->add_flag("--default-malloc", w.default_malloc);
  worker->add_option("--comm-hook", w.comm_hook)->check(CLI::IsMember(hooks));
  worker->add_option("--optimizer", w.optimizer)->check(CLI::IsMember(optimizers));
  CLI11_PARSE(app, argc, argv);
  // Before the first tensor: a step's freed activations stay mapped (malloc_tuning.hpp).
  if (!w.default_malloc) w.malloc_tuned = ddp::keep_freed_memory();
  try {
    if (*overhead) return run_overhead(overhead_steps, blocks, timeline);
    if (*train) return run_train(world, w);
    return run_worker(w);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_ddp: {}\n", e.what());
    return 1;
  }
}
