// The tutorial's Fashion-MNIST training (cnn_multigpu.py) in C++: the CNN wrapped in DDP,
// Adam (ddp::FusedAdam: torch::optim::Adam's update in one pass over memory), NLLLoss, a
// DistributedSampler per rank and drop_last batches; rank 0 logs the loss every 100 batches, shows
// progress, and ends with the training time, the throughput over all ranks and the test accuracy:
//
//   ddprun --standalone --nproc-per-node 2 build/examples/mnist/mnist --epochs 1
//
// With --checkpoint-dir, SIGUSR1 or SIGTERM on any rank (SLURM's --signal=USR1@N, scancel,
// preemption; ddprun forwards both) stops every rank after the same step: they checkpoint it
// and exit with ddp::kRequeueExitStatus (75), and the same command resumes there.
#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include <ddp/ddp.hpp>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/models/mnist_cnn.hpp"
#include "step_recovery.hpp"

namespace {

struct Args {
  int64_t epochs = 1;
  int64_t batch_size = 32;
  double lr = 1e-3;
  std::string device = "auto";
  int64_t max_steps = -1;
  std::string snapshot;
  std::string data_dir = ddp::MnistOptions::kDirectory;
  std::string backend = "auto";
  uint64_t seed = 0;
  std::string comm_hook = "allreduce";
  std::string timeline;
  int64_t checkpoint_every = 0;
  std::string checkpoint_dir;
  bool checkpoint_sync = false;
  int64_t total_steps = -1;
  std::string loss_log;
  std::string recovery = "group";  // --recovery step: step_recovery.hpp
  int64_t test_images = -1;        // -1: the whole test set; 0: no evaluation
};

// The --comm-hook choices: how DDP averages a gradient bucket (comm_hooks.hpp).
ddp::CommHookPtr comm_hook_named(const std::string& name) {
  if (name == "allreduce") return ddp::allreduce_hook();
  if (name == "fp16") return ddp::fp16_compress_hook();
  if (name == "bf16") return ddp::bf16_compress_hook();
  throw ddp::UsageError(
      fmt::format("--comm-hook {}: unknown hook; use allreduce, fp16 or bf16", name));
}

// Correct predictions and count over this rank's share of the test set (rank::world, no
// padding, so the sum over ranks covers each test image exactly once).
// Over the first `limit` test images only (--test-images).
std::pair<int64_t, int64_t> evaluate(ddp::models::MnistCnn& model, const ddp::TensorDataset& test,
                                     int64_t limit, int rank, int world,
                                     const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < limit; i += world) mine.push_back(i);
  ddp::PrefetchLoader loader(test, mine, ddp::PrefetchLoaderOptions().batch_size(1000));
  int64_t correct = 0;
  while (auto batch = loader.next()) {
    auto pred = model->forward(batch->data.to(device)).argmax(1);
    correct += pred.eq(batch->target.to(device)).sum().item<int64_t>();
  }
  model->train();
  return {correct, static_cast<int64_t>(mine.size())};
}

int run(const Args& args) {
  // One GPU per process: cuda means cuda:LOCAL_RANK, with the nccl backend unless told.
  const torch::Device device = ddp::local_device(args.device);
  ddp::InitOptions init;
  init.backend = args.backend == "auto" ? ddp::default_backend(device) : args.backend;
  if (device.is_cuda()) init.device = device.index();
  auto pg = ddp::init_process_group(init);
  const int rank = pg->rank(), world = pg->size();

  auto train = ddp::load_mnist(ddp::MnistOptions().directory(args.data_dir));
  auto test =
      ddp::load_mnist(ddp::MnistOptions().directory(args.data_dir).split(ddp::MnistSplit::kTest));

  torch::manual_seed(args.seed);
  // The tutorial's CNN_classifier, with its dropout (include/ddp/torch/models/mnist_cnn.hpp).
  ddp::models::MnistCnn model(ddp::models::MnistCnnOptions::tutorial());
  model->to(device);
  // torch::optim::Adam works the same; the fused one saves a few percent of every step, and
  // snapshots taken with either load into the other.
  ddp::FusedAdam optimizer(model->parameters(), torch::optim::AdamOptions(args.lr));
  int64_t first_epoch = 1;
  bool resumed_at_epoch_start = false;  // from a snapshot (per-step checkpoints know the step)
  std::optional<ddp::SnapshotManager> snapshots;
  if (!args.snapshot.empty()) {
    snapshots.emplace(ddp::SnapshotOptions(args.snapshot));
    // Every rank resumes from the same snapshot, or all fail naming the ranks that differ
    // (--snapshot on node-local disks).
    if (auto resume = snapshots->load_agreed(*pg)) {
      if (rank == 0) {
        for (const auto& why : resume->skipped) std::cout << "Skipping snapshot " << why << "\n";
        std::cout << "Resuming from " << resume->path << " at epoch "
                  << resume->snapshot.epochs_run + 1 << "\n";
      }
      ddp::restore_snapshot(resume->snapshot, *model, &optimizer);
      first_epoch = resume->snapshot.epochs_run + 1;
      resumed_at_epoch_start = true;
    }
  }
  // Per-step checkpoints (--checkpoint-dir): the newest complete one is resumed mid-epoch, with
  // the sampler's position, so the run sees the samples an uninterrupted one would.
  ddp::TrainingProgress at;
  at.epoch = first_epoch;
  std::optional<ddp::Checkpointer> checkpoints;
  if (!args.checkpoint_dir.empty()) {
    checkpoints.emplace(ddp::CheckpointOptions(args.checkpoint_dir).async(!args.checkpoint_sync),
                        pg);
    if (auto resume = checkpoints->load_newest(*model, &optimizer)) {
      if (rank == 0) {
        for (const auto& why : resume->skipped) std::cout << "Skipping checkpoint " << why << "\n";
        std::cout << "Resuming from " << resume->path << " at step " << resume->progress.step
                  << "\n";
      }
      at = resume->progress;
      resumed_at_epoch_start = false;
    }
  }
  // A preemption notice on any rank stops all of them after the same step: the flag rides in
  // DDP's gradient all-reduce (stop_request.hpp), so it costs no collective of its own.
  ddp::StopRequestPtr preempt;
  if (checkpoints) {
    preempt =
        std::make_shared<ddp::StopRequest>(ddp::StopRequestOptions().signals({SIGUSR1, SIGTERM}));
  }
  std::ofstream loss_log;
  if (rank == 0 && !args.loss_log.empty()) loss_log.open(args.loss_log, std::ios::app);

  ddp::DistributedDataParallel ddp_model(model, pg,
                                         ddp::DistributedDataParallelOptions()
                                             .comm_hook(comm_hook_named(args.comm_hook))
                                             .timeline_path(args.timeline)
                                             .stop_request(preempt));

  ddp::DistributedSampler sampler(train.size(),
                                  ddp::DistributedSamplerOptions(world, rank).seed(args.seed));
  if (resumed_at_epoch_start) {
    // A snapshot holds whole epochs: count their steps, so --total-steps and --loss-log go on
    // from where the interrupted run was instead of from 0.
    const int64_t epoch_batches = static_cast<int64_t>(sampler.indices().size()) / args.batch_size;
    const int64_t per_epoch =
        args.max_steps >= 0 ? std::min(args.max_steps, epoch_batches) : epoch_batches;
    at.step = (first_epoch - 1) * per_epoch;
  }
  if (rank == 0) std::cout << "Entering training loop...\n" << std::flush;
  int64_t steps_total = 0;
  const auto start = std::chrono::steady_clock::now();
  bool stop = false;
  for (int64_t epoch = at.epoch; epoch <= args.epochs && !stop; ++epoch) {
    sampler.set_epoch(epoch);
    // A resumed epoch skips the batches it already trained on.
    std::vector<int64_t> indices = sampler.indices();
    const int64_t epoch_batches = static_cast<int64_t>(indices.size()) / args.batch_size;
    const int64_t first_batch =
        epoch == at.epoch ? std::min(at.batches_in_epoch, epoch_batches) : 0;
    indices.erase(indices.begin(), indices.begin() + first_batch * args.batch_size);
    at.epoch = epoch;
    at.batches_in_epoch = first_batch;
    ddp::PrefetchLoader loader(
        [&](const std::vector<int64_t>& idx) {
          auto b = train.get_batch(idx);
          return ddp::Batch{b.data.to(device), b.target.to(device)};
        },
        indices, ddp::PrefetchLoaderOptions().batch_size(args.batch_size).drop_last(true));
    const int64_t steps =
        args.max_steps >= 0 ? std::min(args.max_steps, epoch_batches) : epoch_batches;
    ddp::Progress progress(fmt::format("epoch {}", epoch), steps, args.batch_size * world,
                           ddp::ProgressOptions().enabled(rank == 0));
    for (int64_t batch_idx = first_batch; batch_idx < steps; ++batch_idx) {
      if (args.total_steps >= 0 && at.step >= args.total_steps) {
        stop = true;
        break;
      }
      auto batch = loader.next();
      auto loss = torch::nll_loss(ddp_model(batch->data), batch->target);
      optimizer.zero_grad();
      loss.backward();
      ddp_model.step(optimizer);
      ++steps_total;
      ++at.step;
      ++at.batches_in_epoch;
      if (loss_log.is_open()) {
        // Hex floats: the resume test compares losses bit for bit.
        loss_log << fmt::format("{} {:a}\n", at.step, loss.item<float>()) << std::flush;
      }
      const bool saved_now =
          checkpoints && args.checkpoint_every > 0 && at.step % args.checkpoint_every == 0;
      if (saved_now) checkpoints->save(at, *model, &optimizer);
      if (preempt && preempt->agreed()) {
        const int sig = preempt->signal();
        std::cout << fmt::format(
                         "rank {}: stop agreed after step {} ({}); checkpointing it and "
                         "exiting with {}\n",
                         rank, at.step,
                         sig != 0 ? fmt::format("SIG{} here", sigabbrev_np(sig))
                                  : std::string("asked by another rank"),
                         ddp::kRequeueExitStatus)
                  << std::flush;
        if (!saved_now) checkpoints->save(at, *model, &optimizer);
        checkpoints->wait();
        // Rank 0's wait() returns once the checkpoint is complete: after this barrier no rank
        // exits (and no job script requeues) before it is.
        pg->barrier()->wait(pg->timeout());
        return ddp::kRequeueExitStatus;
      }
      if (batch_idx % 100 == 0 && rank == 0) {
        const double l = loss.item<double>();
        progress.print_line(fmt::format("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}", epoch,
                                        batch_idx * args.batch_size, train.size(),
                                        100.0 * batch_idx / loader.num_batches(), l));
        progress.update(batch_idx + 1, l);
      } else {
        progress.update(batch_idx + 1);
      }
    }
    progress.finish();
    if (stop) break;
    pg->barrier()->wait(pg->timeout());
    if (snapshots && rank == 0) {
      snapshots->save(ddp::capture_snapshot(*model, &optimizer, epoch, epoch));
    }
  }
  if (checkpoints) checkpoints->wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rank == 0) std::cout << "Exiting training loop...\n" << std::flush;

  // "Training time = ... | test accuracy ...", the line scripts and tests read.
  const double samples = static_cast<double>(steps_total * args.batch_size * world);
  const std::string timing =
      fmt::format("Training time = {:.2f} s | {:.1f} samples/s over {} ranks", seconds,
                  seconds > 0 ? samples / seconds : 0.0, world);
  const int64_t test_images = mnist_example::test_images(args.test_images, test.size());
  if (test_images == 0) {
    if (rank == 0) std::cout << timing << " | no test evaluation (--test-images 0)\n" << std::flush;
    return 0;
  }
  auto [correct, count] = evaluate(model, test, test_images, rank, world, device);
  // On the group's device: the nccl backend takes device memory only.
  auto totals = torch::tensor({correct, count}, torch::kInt64).to(ddp::comm_device(*pg));
  ddp::wait_on_current_stream(*pg, *ddp::all_reduce(*pg, totals), pg->timeout());
  totals = totals.cpu();
  if (rank == 0) {
    const int64_t right = totals[0].item<int64_t>(), all = totals[1].item<int64_t>();
    std::cout << fmt::format("{} | test accuracy {:.2f}% ({}/{})\n", timing,
                             100.0 * right / std::max<int64_t>(all, 1), right, all)
              << std::flush;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fashion-MNIST CNN with DistributedDataParallel (the tutorial's workload)"};
  Args args;
  app.add_option("--epochs", args.epochs, "Epochs to train (default: 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size,--batch_size", args.batch_size, "Batch size per rank (default: 32)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", args.lr, "Adam learning rate (default: 0.001)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", args.device,
                 "cpu, cuda (cuda:LOCAL_RANK), cuda:N, or auto: cuda when a GPU is usable "
                 "(default: auto)");
  app.add_option("--max-steps", args.max_steps,
                 "Stop each epoch after this many steps (default: the whole epoch)");
  app.add_option("--snapshot", args.snapshot,
                 "Save a snapshot here after every epoch and resume from it (default: none)");
  app.add_option("--data-dir", args.data_dir,
                 "Directory with the IDX files (default: " + args.data_dir + ")");
  app.add_option("--backend", args.backend,
                 "Process-group backend: cpu, gloo, mpi, nccl, or auto: nccl on CUDA, cpu "
                 "otherwise (default: auto)");
  app.add_option("--seed", args.seed, "Seed of the model and the sampler (default: 0)");
  app.add_option("--comm-hook", args.comm_hook,
                 "How DDP averages gradients: allreduce, or fp16/bf16 compression (half the "
                 "bytes on the wire; default: allreduce)")
      ->check(CLI::IsMember({"allreduce", "fp16", "bf16"}));
  app.add_option("--timeline", args.timeline,
                 "Write each rank's Chrome trace of forward, backward, bucket all-reduces and "
                 "optimizer steps here; {rank} becomes the rank (default: none)");
  app.add_option("--checkpoint-every", args.checkpoint_every,
                 "Save a checkpoint every N optimizer steps into --checkpoint-dir (default: 0, "
                 "none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", args.checkpoint_dir,
                 "Directory of per-step checkpoints (PyTorch DCP layout); started again with the "
                 "same directory, training resumes from the newest complete one");
  app.add_flag("--checkpoint-sync", args.checkpoint_sync,
               "Write checkpoints inside the training step instead of in the background");
  app.add_option("--total-steps", args.total_steps,
                 "Stop after this many optimizer steps in the whole job, counting the steps "
                 "before a resume (default: run every epoch)");
  app.add_option("--loss-log", args.loss_log,
                 "Rank 0 appends each step's number and loss (hex float) to this file");
  app.add_option("--test-images", args.test_images,
                 "Evaluate on the first N images of the test set after training (default: all "
                 "10000; 0 skips the evaluation, for quick runs that only need the losses)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--recovery", args.recovery,
                 "step: train under ddp::StepManager for 'ddprun --recovery step' (a failed rank "
                 "is restarted alone and healed from a peer; docs/recovery.md); group: the "
                 "usual loop (default: group)")
      ->check(CLI::IsMember({"group", "step"}));
  CLI11_PARSE(app, argc, argv);
  if (args.recovery == "step" &&
      (!args.snapshot.empty() || !args.checkpoint_dir.empty() || args.device != "auto")) {
    std::cerr << "mnist: --recovery step does not combine with --snapshot, --checkpoint-dir or "
                 "--device yet (it heals from a live peer, on the CPU); drop those flags\n";
    return 2;
  }
  if (args.checkpoint_every > 0 && args.checkpoint_dir.empty()) {
    std::cerr << "mnist: --checkpoint-every needs --checkpoint-dir DIR (where to write them)\n";
    return 2;
  }
  // Freed activations stay mapped between steps: without this glibc returns them to the kernel
  // and every step faults them back in (about 15 % of a CPU step; malloc_tuning.hpp).
  ddp::keep_freed_memory();
  try {
    if (args.recovery == "step") {
      mnist_example::StepRecoveryArgs step;
      step.epochs = args.epochs;
      step.batch_size = args.batch_size;
      step.lr = args.lr;
      step.data_dir = args.data_dir;
      step.seed = args.seed;
      step.total_steps = args.total_steps;
      step.loss_log = args.loss_log;
      step.test_images = args.test_images;
      step.comm_hook = comm_hook_named(args.comm_hook);
      return mnist_example::run_with_step_recovery(step);
    }
    return run(args);
  } catch (const ddp::Error& e) {
    std::cerr << "mnist: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "mnist: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
