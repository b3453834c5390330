// A small GPT-style language model (include/ddp/torch/models/gpt.hpp) trained with ddp's
// DistributedDataParallel on locally generated text: a fixed random Markov chain
// (markov_tokens.hpp), each rank drawing its own stream, AdamW, next-token cross-entropy.
// Rank 0 prints the model's size, its loss every --log-every steps and a final line with the
// training time and the tokens/s over all ranks; then every rank prints a checksum of its
// parameters, equal on all ranks when DDP averaged every gradient.
//
//   ddprun --standalone --nproc-per-node 2 build/examples/gpt/gpt --steps 100
//       (13.8 M parameters; the loss falls slowly at vocab 8192: 9.09 -> 8.56 in 100 steps)
//   ddprun --standalone --nproc-per-node 2 build/examples/gpt/gpt --steps 30 --layers 1
//       --d-model 32 --heads 2 --vocab 64 --seq 16 --batch 4        (a smoke run, seconds)
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <iostream>

#include <ddp/ddp.hpp>

#include "ddp/torch/models/gpt.hpp"
#include "ddp/torch/models/markov_tokens.hpp"

namespace {

struct Args {
  int64_t steps = 200;
  int64_t batch = 8;
  int64_t seq = 128;
  int64_t vocab = ddp::models::MarkovTokensOptions::kVocab;
  int64_t branching = ddp::models::MarkovTokensOptions::kBranching;
  int64_t context = 128;
  int64_t d_model = 384;
  int64_t heads = 6;
  int64_t layers = 6;
  bool untied = false;
  double lr = 1e-3;
  double weight_decay = 0.1;
  uint64_t seed = 0;
  int64_t log_every = 10;
  std::string device = "auto";
  std::string backend = "auto";
  std::string timeline;
};

// FNV-1a over the bytes of every parameter, in the module's order: equal on two ranks exactly
// when their parameters are bitwise equal (up to hash collisions).
uint64_t parameter_checksum(const torch::nn::Module& model) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& p : model.parameters()) {
    const auto cpu = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(cpu.data_ptr());
    for (size_t i = 0, n = cpu.numel() * cpu.element_size(); i < n; ++i) {
      h = (h ^ bytes[i]) * 0x100000001b3ULL;
    }
  }
  return h;
}

int run(const Args& args) {
  const torch::Device device = ddp::local_device(args.device);
  ddp::InitOptions init;
  init.backend = args.backend == "auto" ? ddp::default_backend(device) : args.backend;
  if (device.is_cuda()) init.device = device.index();
  auto pg = ddp::init_process_group(init);
  const int rank = pg->rank(), world = pg->size();

  const auto options = ddp::models::GptOptions()
                           .vocab_size(args.vocab)
                           .context_length(args.context)
                           .d_model(args.d_model)
                           .n_heads(args.heads)
                           .n_layers(args.layers)
                           .tie_weights(!args.untied);
  torch::manual_seed(static_cast<int64_t>(args.seed));
  ddp::models::Gpt model(options);
  model->to(device);
  const ddp::models::MarkovTokens text(ddp::models::MarkovTokensOptions()
                                           .vocab(args.vocab)
                                           .branching(args.branching)
                                           .seed(args.seed));
  if (rank == 0) {
    std::cout << fmt::format(
        "GPT: {} parameters (vocab {}, context {}, d_model {}, {} heads, {} layers, {} LM head); "
        "batch {} x {} tokens per rank, {} ranks; loss floor {:.4f}\n",
        ddp::models::gpt_parameter_count(options), args.vocab, args.context, args.d_model,
        args.heads, args.layers, args.untied ? "untied" : "tied", args.batch, args.seq, world,
        text.entropy_floor());
  }

  ddp::DistributedDataParallel ddp_model(
      model, pg, ddp::DistributedDataParallelOptions().timeline_path(args.timeline));
  torch::optim::AdamW optimizer(
      ddp_model.parameters(),
      torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}).weight_decay(args.weight_decay));

  double first_loss = 0, last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < args.steps; ++step) {
    // Each rank its own stream: the batch is a function of (seed, rank, step).
    auto tokens = text.batch(rank, step, args.batch, args.seq).to(device);
    auto inputs = tokens.narrow(1, 0, args.seq);
    auto targets = tokens.narrow(1, 1, args.seq);
    optimizer.zero_grad();
    auto logits = ddp_model(inputs);
    auto loss = torch::cross_entropy_loss(logits.reshape({-1, args.vocab}), targets.reshape(-1));
    loss.backward();
    ddp_model.step(optimizer);
    const bool log = step == 0 || step + 1 == args.steps || (step + 1) % args.log_every == 0;
    if (rank == 0 && log) {
      last_loss = loss.item<double>();
      if (step == 0) first_loss = last_loss;
      std::cout << fmt::format("step {}/{} | loss {:.4f}\n", step + 1, args.steps, last_loss)
                << std::flush;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  pg->barrier()->wait(pg->timeout());
  if (rank == 0) {
    const double tokens = static_cast<double>(args.steps * args.batch * args.seq * world);
    std::cout << fmt::format(
                     "Training time = {:.2f} s | {:.0f} tokens/s over {} ranks | loss {:.4f} -> "
                     "{:.4f} (floor {:.4f})\n",
                     seconds, seconds > 0 ? tokens / seconds : 0.0, world, first_loss, last_loss,
                     text.entropy_floor())
              << std::flush;
  }
  std::cout << fmt::format("rank {} parameter checksum {:016x}\n", rank, parameter_checksum(*model))
            << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-style language model on synthetic Markov-chain text with DDP"};
  Args a;
  app.add_option("--steps", a.steps, "Training steps (default: 200)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", a.batch, "Sequences per rank and step (default: 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seq", a.seq, "Tokens per sequence, at most --context (default: 128)")
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", a.vocab, "Vocabulary size (default: 8192)")->check(CLI::PositiveNumber);
  app.add_option("--branching", a.branching,
                 "Successors per token in the Markov chain; the loss floor is log(branching) "
                 "(default: 4)")
      ->check(CLI::PositiveNumber);
  app.add_option("--context", a.context, "Context length: position embeddings (default: 128)")
      ->check(CLI::PositiveNumber);
  app.add_option("--d-model", a.d_model, "Embedding width (default: 384)")
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", a.heads, "Attention heads; divides --d-model (default: 6)")
      ->check(CLI::PositiveNumber);
  app.add_option("--layers", a.layers, "Transformer blocks (default: 6)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--untied", a.untied,
               "A separate LM head instead of the token embedding's matrix (default: tied)");
  app.add_option("--lr", a.lr, "AdamW learning rate (default: 0.001)")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay (default: 0.1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", a.seed, "Seed of the model and the text (default: 0)");
  app.add_option("--log-every", a.log_every,
                 "Rank 0 prints its loss every this many steps, and at the first and last "
                 "(default: 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", a.device, "cpu, cuda (cuda:LOCAL_RANK), cuda:N or auto (default)");
  app.add_option("--backend", a.backend,
                 "Process-group backend: cpu, gloo, mpi, nccl, or auto: nccl on CUDA, cpu "
                 "otherwise (default: auto)");
  app.add_option("--timeline", a.timeline,
                 "Write each rank's Chrome trace of forward, backward, bucket all-reduces and "
                 "optimizer steps here; {rank} becomes the rank (default: none)");
  CLI11_PARSE(app, argc, argv);
  // Freed activations stay mapped between steps (malloc_tuning.hpp).
  ddp::keep_freed_memory();
  try {
    return run(a);
  } catch (const ddp::Error& e) {
    std::cerr << "gpt: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "gpt: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
