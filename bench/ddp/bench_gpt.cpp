// GPT-style model under DDP, one JSON object per line on stdout (rank 0):
//
//   bench_gpt --world W [--steps N --warmup K --batch B --seq T --vocab V --d-model D --heads H
//             --layers L --untied] [--independent] [--timeline PATH]
//
// The model is include/ddp/torch/models/gpt.hpp (defaults: 13.8 M parameters), the data
// markov_tokens.hpp's chain (each rank its own stream, all batches generated before timing),
// torch::optim::AdamW (lr 1e-3, betas 0.9/0.95, weight decay 0.1), one intra-op thread per
// rank, W worker processes over the `cpu` backend. bench_gpt.py is the same in PyTorch.
//   --independent   the same W processes without DDP (no gradient averaging): the machine's
//                   ceiling for W ranks, since W busy cores already slow each other
//   --timeline P    DDP's timeline ({rank} in P becomes the rank; the files are written at exit)
//                   and, in the JSON, where the time of a timed step goes beyond forward /
//                   backward / optimizer: the mean time per step spent waiting for peers (the
//                   communication not hidden behind backward, plus the other rank's lag) and
//                   the mean summed duration of the bucket all-reduces
//
// Like bench_ddp, the command re-executes this binary once per rank with torchrun's environment
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the port found by binding port 0) and the workers
// meet through init_process_group's env:// TcpStore.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/version.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "ddp/comm/init.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/models/gpt.hpp"
#include "ddp/torch/models/markov_tokens.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/malloc_tuning.hpp"
#include "ddp/util/socket.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int world = 2;
  int steps = 20;
  int warmup = 3;
  int64_t batch = 8;
  int64_t seq = 128;
  int64_t vocab = 8192;
  int64_t d_model = 384;
  int64_t heads = 6;
  int64_t layers = 6;
  bool untied = false;
  bool independent = false;
  std::string timeline;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// CPU seconds used by this process (all its threads: compute and communication).
double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Summed span durations (ms) by kind, over the timeline's spans from index `first` on:
// "wait" (wait for peers), "allreduce" (every bucket's all-reduce), "backward".
std::map<std::string, double> timeline_totals(const ddp::Timeline& timeline, size_t first) {
  std::map<std::string, double> out{{"wait", 0.0}, {"allreduce", 0.0}, {"backward", 0.0}};
  const auto doc = nlohmann::json::parse(timeline.to_json());
  size_t span = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X" || span++ < first) continue;
    const std::string name = e["name"];
    const double ms = e["dur"].get<double>() / 1e3;
    if (name == "wait for peers") out["wait"] += ms;
    if (name.rfind("allreduce bucket", 0) == 0) out["allreduce"] += ms;
    if (name == "backward") out["backward"] += ms;
  }
  return out;
}

int run_worker(const Options& o) {
  torch::set_num_threads(1);
  auto pg = ddp::init_process_group(ddp::InitOptions());
  const int rank = pg->rank(), world = pg->size();
  const auto gpt = ddp::models::GptOptions()
                       .vocab_size(o.vocab)
                       .context_length(std::max<int64_t>(o.seq, 128))
                       .d_model(o.d_model)
                       .n_heads(o.heads)
                       .n_layers(o.layers)
                       .tie_weights(!o.untied);
  const ddp::models::MarkovTokens text(ddp::models::MarkovTokensOptions().vocab(o.vocab));
  std::vector<torch::Tensor> batches;
  for (int s = 0; s < o.warmup + o.steps; ++s)
    batches.push_back(text.batch(rank, s, o.batch, o.seq));
  const auto flat = batches[0].flatten();
  const int64_t tokens_checksum =
      (flat * torch::arange(1, flat.numel() + 1, torch::kInt64)).sum().item<int64_t>();

  torch::manual_seed(0);
  ddp::models::Gpt net(gpt);
  double init_abs_sum = 0;
  for (const auto& p : net->parameters())
    init_abs_sum += p.to(torch::kDouble).abs().sum().item<double>();
  std::optional<ddp::DistributedDataParallel<ddp::models::GptImpl>> model;
  if (!o.independent) {
    model.emplace(net, pg, ddp::DistributedDataParallelOptions().timeline_path(o.timeline));
  }
  torch::optim::AdamW opt(net->parameters(),
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  std::map<std::string, std::vector<double>> times;
  std::vector<double> losses;
  auto step = [&](int i, bool timed) {
    const auto& tokens = batches[i];
    const auto t0 = Clock::now();
    opt.zero_grad();
    auto inputs = tokens.narrow(1, 0, o.seq);
    auto logits = model ? (*model)(inputs) : net->forward(inputs);
    auto loss = torch::cross_entropy_loss(logits.reshape({-1, o.vocab}),
                                          tokens.narrow(1, 1, o.seq).reshape(-1));
    const auto t1 = Clock::now();
    loss.backward();  // with DDP: returns once every bucket is averaged
    const auto t2 = Clock::now();
    if (model) {
      model->step(opt);
    } else {
      opt.step();
    }
    const auto t3 = Clock::now();
    losses.push_back(loss.item<double>());
    if (timed) {
      times["forward"].push_back(ms_between(t0, t1));
      times["backward"].push_back(ms_between(t1, t2));
      times["optimizer"].push_back(ms_between(t2, t3));
      times["step"].push_back(ms_between(t0, Clock::now()));
    }
  };
  for (int i = 0; i < o.warmup; ++i) step(i, false);
  pg->barrier()->wait(pg->timeout());
  const auto* timeline = model ? model->timeline() : nullptr;
  const size_t first_span = timeline ? timeline->size() : 0;
  const auto begin = Clock::now();
  const double cpu_begin = process_cpu_seconds();
  for (int i = 0; i < o.steps; ++i) step(o.warmup + i, true);
  // The slowest rank's figure of each (the slowest rank sets the throughput).
  std::vector<double> stats = {ms_between(begin, Clock::now()) / 1e3,
                               1e3 * (process_cpu_seconds() - cpu_begin) / o.steps,
                               median(times["step"]),
                               median(times["forward"]),
                               median(times["backward"]),
                               median(times["optimizer"]),
                               0.0,
                               0.0};
  if (timeline) {
    auto totals = timeline_totals(*timeline, first_span);
    stats[6] = totals["wait"] / o.steps;
    stats[7] = totals["allreduce"] / o.steps;
  }
  pg->all_reduce(stats.data(), stats.size(), ddp::DataType::kFloat64, ddp::ReduceOp::kMax)
      ->wait(pg->timeout());
  if (rank == 0) {
    const double seconds = stats[0];
    nlohmann::json out = {
        {"bench", "gpt"},
        {"impl", o.independent ? "independent" : "ddp"},
        {"world", world},
        {"tokens_per_s", static_cast<double>(world * o.batch * o.seq * o.steps) / seconds},
        {"step_ms_median", stats[2]},
        {"params", ddp::models::gpt_parameter_count(gpt)},
        {"forward_ms_median", stats[3]},
        {"backward_ms_median", stats[4]},
        {"optimizer_ms_median", stats[5]},
        {"cpu_ms_per_step_max_rank", stats[1]},
        {"seconds", seconds},
        {"steps", o.steps},
        {"warmup", o.warmup},
        {"batch_per_rank", o.batch},
        {"seq", o.seq},
        {"vocab", o.vocab},
        {"d_model", o.d_model},
        {"heads", o.heads},
        {"layers", o.layers},
        {"tied", !o.untied},
        {"threads_per_rank", 1},
        {"optimizer", "AdamW 1e-3 (0.9, 0.95) wd 0.1"},
        {"backend", o.independent ? "" : "cpu"},
        {"first_loss", losses.front()},
        {"mean_loss", std::accumulate(losses.begin(), losses.end(), 0.0) / losses.size()},
        {"init_abs_sum", init_abs_sum},
        {"tokens_checksum", tokens_checksum},
        {"torch",
         fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH)}};
    if (model) {
      // Gradient buckets in launch order, in MB of float32 gradients.
      std::map<std::string, int64_t> numel;
      for (const auto& p : net->named_parameters()) numel[p.key()] = p.value().numel();
      std::vector<double> bucket_mb;
      for (const auto& names : model->bucket_names()) {
        int64_t n = 0;
        for (const auto& name : names) n += numel[name];
        bucket_mb.push_back(4.0 * static_cast<double>(n) / 1e6);
      }
      out["bucket_mb"] = bucket_mb;
    }
    if (timeline) {
      out["wait_for_peers_ms_per_step"] = stats[6];
      out["allreduce_ms_per_step"] = stats[7];
    }
    fmt::print("{}\n", out.dump());
  }
  return 0;
}

// Starts `world` copies of this binary as workers with torchrun's environment; 0 when all
// exited 0.
int run_ranks(int world, const std::vector<std::string>& worker_args) {
  const int port = ddp::net::free_tcp_port("127.0.0.1");
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string s(*e);
      bool replaced = false;
      for (const char* k : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                            "MASTER_ADDR=", "MASTER_PORT=", "OMP_NUM_THREADS="}) {
        replaced = replaced || s.rfind(k, 0) == 0;
      }
      if (!replaced) env.push_back(s);
    }
    for (const auto& s :
         {fmt::format("RANK={}", r), fmt::format("LOCAL_RANK={}", r),
          fmt::format("WORLD_SIZE={}", world), fmt::format("LOCAL_WORLD_SIZE={}", world),
          std::string("MASTER_ADDR=127.0.0.1"), fmt::format("MASTER_PORT={}", port),
          std::string("OMP_NUM_THREADS=1")}) {
      env.push_back(s);
    }
    std::vector<std::string> args = {"bench_gpt", "--worker"};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
      throw ddp::UsageError("bench_gpt: posix_spawn of a worker failed");
    }
    pids.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  if (failures) fmt::print(stderr, "bench_gpt: {} of {} workers failed\n", failures, world);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("GPT-style model under DDP: tokens/s (JSON lines)");
  Options o;
  bool worker = false;
  app.add_option("--world", o.world, "ranks (processes)")
      ->default_val(2)
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "timed steps per rank")
      ->default_val(20)
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")
      ->default_val(3)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", o.batch, "sequences per rank and step")
      ->default_val(8)
      ->check(CLI::PositiveNumber);
  app.add_option("--seq", o.seq, "tokens per sequence")
      ->default_val(128)
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.vocab, "vocabulary size")
      ->default_val(8192)
      ->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.d_model, "embedding width")
      ->default_val(384)
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads")->default_val(6)->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "transformer blocks")
      ->default_val(6)
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--untied", o.untied, "a separate LM head (default: tied to the token embedding)");
  app.add_flag("--independent", o.independent,
               "no DDP: W processes train alone (this machine's ceiling for W ranks)");
  app.add_option("--timeline", o.timeline,
                 "per-rank DDP timeline, e.g. tl_rank{rank}.json; adds the wait and all-reduce "
                 "times per step to the JSON");
  app.add_flag("--worker", worker, "one rank (internal)")->group("");
  CLI11_PARSE(app, argc, argv);
  // Before the first tensor: a step's freed activations stay mapped (malloc_tuning.hpp).
  ddp::keep_freed_memory();
  try {
    if (worker) return run_worker(o);
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    return run_ranks(o.world, args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpt: {}\n", e.what());
    return 1;
  }
}
