// The C++ side of kill_during_write_test.py.
//
//   checkpoint_stress save DIR     2 ranks (threads) save a ~32 MB model in the background after
//                                  every step, forever; every parameter of step s holds s. Prints
//                                  "step s" as each save starts.
//   checkpoint_stress save-twice DIR
//                                  the same, keeping one checkpoint, and every step is saved
//                                  twice: first holding s, then s + 0.5 (a resume at step s and
//                                  a save at s, or a periodic and a preemption save of one step,
//                                  with the state changed between). Issue 49, finding 6.
//   checkpoint_stress verify DIR   loads the newest complete checkpoint; exit 0 and prints
//                                  "loaded step s" when every parameter holds s (or every one
//                                  s + 0.5), 3 when there is none, 1 on any damage or mix.
#include <chrono>
#include <iostream>
#include <thread>

#include "../ddp/rank_threads.hpp"
#include "checkpoint_test_util.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"

namespace {

using namespace ddp;

torch::nn::Sequential big_model() {
  // 4 x 2M floats: each shard file is large enough that a kill often lands mid-write.
  return torch::nn::Sequential(torch::nn::Linear(2048, 1024), torch::nn::Linear(1024, 2048),
                               torch::nn::Linear(2048, 1024), torch::nn::Linear(1024, 2048));
}

void fill(torch::nn::Module& m, double v) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.fill_(v);
}

int save(const std::string& dir, bool twice) {
  test::run_ranks(2, [&](int rank, ProcessGroupPtr pg) {
    auto model = big_model();
    Checkpointer ckpt(CheckpointOptions(dir).keep(twice ? 1 : 2), pg);
    for (int64_t step = 1;; ++step) {
      fill(*model, static_cast<double>(step));
      if (rank == 0) std::cout << "step " << step << std::endl;
      ckpt.save({step, 0, step}, *model, nullptr);
      if (!twice) continue;
      fill(*model, static_cast<double>(step) + 0.5);
      // Rank 1 comes to the second save late: a kill often lands after rank 0 wrote its part
      // of it and before rank 1's (a save made in place would then load as a mix).
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ckpt.save({step, 0, step}, *model, nullptr);
    }
  });
  return 0;
}

int verify(const std::string& dir) {
  const auto list = Checkpointer::list(dir);
  if (list.empty()) {
    std::cout << "no complete checkpoint\n";
    return 3;
  }
  auto model = big_model();
  auto r = Checkpointer::load(list.front().second, model.get(), nullptr, 0);
  const double step = static_cast<double>(r.progress.step);
  const double first = model->parameters().front().flatten()[0].item<double>();
  if (first != step && first != step + 0.5) {
    std::cout << "DAMAGED: " << r.path << " holds values of another step (" << first << ")\n";
    return 1;
  }
  for (const auto& p : model->parameters()) {
    if (!torch::all(p == first).item<bool>()) {
      std::cout << "DAMAGED: " << r.path << " mixes two saves of step " << r.progress.step << "\n";
      return 1;
    }
  }
  std::cout << "loaded step " << r.progress.step << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc == 3 ? argv[1] : "";
    if (mode == "save" || mode == "save-twice") return save(argv[2], mode == "save-twice");
    if (mode == "verify") return verify(argv[2]);
    std::cerr << "usage: checkpoint_stress save|save-twice|verify DIR\n";
    return 2;
  } catch (const std::exception& e) {
    std::cout << "checkpoint_stress: " << e.what() << "\n";
    return 1;
  }
}
