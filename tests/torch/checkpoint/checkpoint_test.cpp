// ddp::Checkpointer on one and two ranks (threads): what a checkpoint holds comes back, the
// newest complete one wins, incomplete and damaged ones are skipped with their reason, old ones
// are pruned, ranks that see different checkpoints fail together.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../ddp/rank_threads.hpp"
#include "checkpoint_test_util.hpp"
#include "ddp/torch/checkpoint/checkpoint.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using test::make_model;
using test::run_ranks;
using test::set_grads;
using test::TempDir;

void expect_same_params(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& kv : pa) EXPECT_TRUE(torch::equal(kv.value(), pb[kv.key()])) << kv.key();
}

TEST(Checkpoint, RoundTripsModelOptimizerProgressExtrasAndRng) {
  TempDir dir;
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.1);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01).amsgrad(true));
    for (int s = 0; s < 3; ++s) {
      set_grads(*model, s);
      adam.step();
    }
    Checkpointer ckpt(CheckpointOptions(dir.path()).async(false), pg);
    TrainingProgress at{7, 2, 3};
    CheckpointExtras extras{
        {"note", std::string("hi")}, {"loss", 0.5}, {"table", torch::arange(4, torch::kInt64)}};
    torch::manual_seed(123);
    ASSERT_TRUE(ckpt.save(at, *model, &adam, extras));
    const auto after_save = torch::rand({5});

    auto fresh = make_model(3.0);
    torch::optim::Adam fresh_adam(fresh->parameters(), torch::optim::AdamOptions(0.5));
    auto r = ckpt.load_newest(*fresh, &fresh_adam);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->path, dir.path() + "/step-00000007");
    EXPECT_EQ(r->progress.step, 7);
    EXPECT_EQ(r->progress.epoch, 2);
    EXPECT_EQ(r->progress.batches_in_epoch, 3);
    EXPECT_EQ(r->extras.at("note").toStringRef(), "hi");
    EXPECT_EQ(r->extras.at("loss").toDouble(), 0.5);
    EXPECT_TRUE(torch::equal(r->extras.at("table").toTensor(), torch::arange(4, torch::kInt64)));
    EXPECT_TRUE(torch::equal(torch::rand({5}), after_save)) << "the CPU generator came back";
    expect_same_params(*model, *fresh);

    const auto& options =
        static_cast<const torch::optim::AdamOptions&>(fresh_adam.param_groups()[0].options());
    EXPECT_EQ(options.lr(), 0.01);
    EXPECT_TRUE(options.amsgrad());
    auto mp = model->parameters(), fp = fresh->parameters();
    for (size_t i = 0; i < mp.size(); ++i) {
      const auto& want = static_cast<const torch::optim::AdamParamState&>(
          *adam.state().at(mp[i].unsafeGetTensorImpl()));
      const auto& got = static_cast<const torch::optim::AdamParamState&>(
          *fresh_adam.state().at(fp[i].unsafeGetTensorImpl()));
      EXPECT_EQ(got.step(), want.step());
      EXPECT_TRUE(torch::equal(got.exp_avg(), want.exp_avg()));
      EXPECT_TRUE(torch::equal(got.exp_avg_sq(), want.exp_avg_sq()));
      EXPECT_TRUE(torch::equal(got.max_exp_avg_sq(), want.max_exp_avg_sq()));
    }
    // Both optimizers now take the same step.
    set_grads(*model, 3);
    set_grads(*fresh, 3);
    adam.step();
    fresh_adam.step();
    expect_same_params(*model, *fresh);
  });
}

TEST(Checkpoint, SgdMomentumRoundTrips) {
  TempDir dir;
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.1);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    set_grads(*model, 0);
    sgd.step();
    Checkpointer ckpt(CheckpointOptions(dir.path()).async(false), pg);
    ckpt.save({1, 0, 1}, *model, &sgd);
    auto fresh = make_model(2.0);
    torch::optim::SGD fresh_sgd(fresh->parameters(), torch::optim::SGDOptions(0.3));
    ASSERT_TRUE(ckpt.load_newest(*fresh, &fresh_sgd));
    EXPECT_EQ(static_cast<const torch::optim::SGDOptions&>(fresh_sgd.param_groups()[0].options())
                  .momentum(),
              0.9);
    for (int s = 1; s < 3; ++s) {
      set_grads(*model, s);
      set_grads(*fresh, s);
      sgd.step();
      fresh_sgd.step();
    }
    expect_same_params(*model, *fresh);
  });
}

// Parameters all equal to `v`: which save a loaded state came from.
void fill(torch::nn::Module& m, double v) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.fill_(v);
}

TEST(Checkpoint, AsyncSavesKeepTheNewestAndTrainingMayChangeTheStateMeanwhile) {
  TempDir dir;
  run_ranks(2, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    Checkpointer ckpt(CheckpointOptions(dir.path()).keep(2), pg);
    for (int step = 1; step <= 4; ++step) {
      fill(*model, step);
      ASSERT_TRUE(ckpt.save({step, 0, step}, *model, nullptr));
      fill(*model, -1);  // training goes on: the save wrote its own copy
    }
    ckpt.wait();
    pg->barrier()->wait(pg->timeout());
    const auto list = Checkpointer::list(dir.path());
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0].first, 4);
    EXPECT_EQ(list[1].first, 3);
    auto r = ckpt.load_newest(*model, nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->progress.step, 4);
    for (const auto& p : model->parameters()) EXPECT_TRUE(torch::all(p == 4).item<bool>());
  });
}

TEST(Checkpoint, IncompleteAndTruncatedCheckpointsAreSkippedWithTheirReason) {
  TempDir dir;
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    Checkpointer ckpt(CheckpointOptions(dir.path()).async(false).keep(5), pg);
    for (int step = 1; step <= 3; ++step) {
      fill(*model, step);
      ckpt.save({step, 0, step}, *model, nullptr);
    }
    fs::remove(dir.path() + "/step-00000003/.metadata");               // killed before the commit
    fs::resize_file(dir.path() + "/step-00000002/__0_0.distcp", 100);  // a truncated copy
    auto r = ckpt.load_newest(*model, nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->progress.step, 1);
    ASSERT_EQ(r->skipped.size(), 2u);
    EXPECT_NE(r->skipped[0].find("no .metadata"), std::string::npos) << r->skipped[0];
    EXPECT_NE(r->skipped[1].find("truncated"), std::string::npos) << r->skipped[1];
    for (const auto& p : model->parameters()) EXPECT_TRUE(torch::all(p == 1).item<bool>());
  });
}

// On a file system without renameat2's exchange, a step saved twice is replaced by two renames
// (the old checkpoint moved aside, the new one in). A kill between them must not lose the
// step: the moved-aside copy is listed and loaded as that step, and the next run's first save
// moves it back under its name instead of sweeping it away with the staging directories.
TEST(Checkpoint, ACheckpointAKilledReplaceMovedAsideIsStillLoadedAndMovedBack) {
  TempDir dir;
  const std::string step3 = dir.path() + "/step-00000003";
  const std::string aside = step3 + ".saving-4.old";
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    {
      Checkpointer ckpt(CheckpointOptions(dir.path()).async(false).keep(1), pg);
      fill(*model, 3);
      ckpt.save({3, 0, 3}, *model, nullptr);
    }
    fs::rename(step3, aside);                   // the state a kill between the two renames leaves
    fs::create_directory(step3 + ".saving-4");  // the unpublished new save

    const auto list = Checkpointer::list(dir.path());
    ASSERT_EQ(list.size(), 1u) << "the moved-aside checkpoint is step 3's";
    EXPECT_EQ(list[0].first, 3);
    EXPECT_EQ(list[0].second, aside);

    Checkpointer next(CheckpointOptions(dir.path()).async(false).keep(1), pg);
    auto fresh = make_model(0.0);
    auto r = next.load_newest(*fresh, nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->progress.step, 3);
    for (const auto& p : fresh->parameters()) EXPECT_TRUE(torch::all(p == 3).item<bool>());

    // The next save (of step 3 again, as a resume does) first moves it back, then replaces it.
    fill(*model, 5);
    ASSERT_TRUE(next.save({3, 0, 3}, *model, nullptr));
    EXPECT_FALSE(fs::exists(aside));
    EXPECT_FALSE(fs::exists(step3 + ".saving-4"));
    const auto after = Checkpointer::list(dir.path());
    ASSERT_EQ(after.size(), 1u);
    EXPECT_EQ(after[0].second, step3);
    r = next.load_newest(*fresh, nullptr);
    for (const auto& p : fresh->parameters()) EXPECT_TRUE(torch::all(p == 5).item<bool>());
  });
}

// Issue 49, findings 6 and 7: a checkpoint's files are written through new temporaries of
// random names and renamed into place. A link planted under a shard's name or under the old
// fixed temporary name (.metadata.tmp) is replaced or ignored, never written through; a step
// saved twice replaces each file whole, and the checkpoint stays loadable.
TEST(Checkpoint, FilesAreNeverWrittenThroughPlantedLinksAndASecondSaveReplacesThemWhole) {
  TempDir dir;
  const std::string victim = dir.path() + "/victim";
  { std::ofstream(victim) << "precious"; }
  const std::string step = dir.path() + "/step-00000001";
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    Checkpointer ckpt(CheckpointOptions(dir.path()).async(false).keep(5), pg);
    fill(*model, 1);
    ckpt.save({1, 0, 1}, *model, nullptr);
    // Another local user's links where the files of step 1 go (the first save clears what an
    // earlier run left, so they are planted after it).
    fs::remove(step + "/__0_0.distcp");
    fs::create_symlink(victim, step + "/__0_0.distcp");
    fs::create_symlink(victim, step + "/.metadata.tmp");
    // The same step again (a resume at step 1, then a save at step 1).
    ASSERT_TRUE(fs::is_symlink(step + "/__0_0.distcp"));
    ckpt.save({1, 0, 1}, *model, nullptr);
    fill(*model, -1);
    auto r = ckpt.load_newest(*model, nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->progress.step, 1);
    EXPECT_TRUE(r->skipped.empty());
    for (const auto& p : model->parameters()) EXPECT_TRUE(torch::all(p == 1).item<bool>());
  });
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious");
  EXPECT_FALSE(fs::is_symlink(step + "/__0_0.distcp"));
  for (const auto& e : fs::directory_iterator(step)) {  // no temporary left behind
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "__0_0.distcp" || name == ".metadata" || name == ".metadata.tmp") << name;
  }
}

TEST(Checkpoint, GarbageMetadataIsSkippedNamingTheFile) {
  TempDir dir;
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    Checkpointer ckpt(CheckpointOptions(dir.path()).async(false), pg);
    ckpt.save({1, 0, 1}, *model, nullptr);
    fs::create_directories(dir.path() + "/step-00000009");
    std::ofstream(dir.path() + "/step-00000009/.metadata") << "not a pickle at all";
    auto r = ckpt.load_newest(*model, nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->progress.step, 1);
    ASSERT_EQ(r->skipped.size(), 1u);
    EXPECT_NE(r->skipped[0].find("step-00000009/.metadata"), std::string::npos) << r->skipped[0];
  });
}

TEST(Checkpoint, AModelOfAnotherShapeIsRefusedListingTheEntries) {
  TempDir dir;
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    Checkpointer ckpt(CheckpointOptions(dir.path()).async(false), pg);
    ckpt.save({1, 0, 1}, *model, nullptr);
    torch::nn::Sequential other(torch::nn::Linear(5, 8));
    try {
      ckpt.load_newest(*other, nullptr);
      FAIL() << "loaded into a model of another shape";
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("0.weight (checkpoint [7, 5], model [8, 5])"), std::string::npos) << m;
      EXPECT_NE(m.find("unexpected [model.2.bias"), std::string::npos) << m;
    }
  });
}

TEST(Checkpoint, RanksSeeingDifferentCheckpointsFailTogether) {
  TempDir a, b;
  run_ranks(1, [&](int, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    Checkpointer(CheckpointOptions(a.path()).async(false), pg).save({1, 0, 1}, *model, nullptr);
  });
  auto errors = test::run_ranks_collect(2, [&](int rank, ProcessGroupPtr pg) {
    auto model = make_model(0.0);
    // Node-local directories: only rank 0's has a checkpoint.
    Checkpointer ckpt(CheckpointOptions(rank == 0 ? a.path() : b.path()).async(false), pg);
    ckpt.load_newest(*model, nullptr);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " went on";
    EXPECT_NE(test::message_of(errors[r]).find("file system every node shares"), std::string::npos)
        << test::message_of(errors[r]);
  }
}

}  // namespace
}  // namespace ddp
