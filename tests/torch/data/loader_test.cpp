// Synthetic dataset against PyTorch; TensorDataset batches; the prefetching loader's contract.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <future>
#include <numeric>
#include <sstream>
#include <thread>

#include "ddp/torch/data/prefetch_loader.hpp"
#include "ddp/torch/data/synthetic_dataset.hpp"
#include "ddp/util/error.hpp"
#include "python_helper.hpp"

namespace {

TEST(SyntheticDataset, MatchesPyTorchDrawOrder) {
  if (auto why = ddp::test::python_torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto py = ddp::test::run_python(R"(
import torch
g = torch.Generator(); g.manual_seed(1234)
data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(50)]
for x, y in data:
    print(*[repr(v) for v in x.tolist() + y.tolist()])
)");
  ASSERT_EQ(py.status, 0);
  auto ds = ddp::make_synthetic_dataset(ddp::SyntheticOptions().size(50).seed(1234));
  ASSERT_EQ(ds.size(), 50);
  std::istringstream lines(py.out);
  std::string line;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(std::getline(lines, line));
    std::istringstream in(line);
    for (int j = 0; j < 21; ++j) {
      double v;
      in >> v;
      const float got = j < 20 ? ds.data()[i][j].item<float>() : ds.target()[i][0].item<float>();
      ASSERT_EQ(got, static_cast<float>(v)) << "sample " << i << " value " << j;
    }
  }
}

ddp::TensorDataset counting(int64_t n) {
  return ddp::TensorDataset(torch::arange(n, torch::kFloat).unsqueeze(1),
                            torch::arange(n, torch::kLong));
}

TEST(TensorDataset, GathersInIndexOrderAndChecksBounds) {
  auto ds = counting(10);
  auto b = ds.get_batch({7, 2, 7});
  std::vector<int64_t> got(b.target.data_ptr<int64_t>(), b.target.data_ptr<int64_t>() + 3);
  EXPECT_EQ(got, (std::vector<int64_t>{7, 2, 7}));
  EXPECT_EQ(b.data.sizes(), (std::vector<int64_t>{3, 1}));
  EXPECT_THROW(ds.get_batch({10}), ddp::UsageError);
  EXPECT_THROW(ddp::TensorDataset(torch::zeros({3}), torch::zeros({4})), ddp::UsageError);
}

std::vector<std::vector<int64_t>> drain(ddp::PrefetchLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = loader.next()) {
    auto t = b->target;
    out.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return out;
}

TEST(PrefetchLoader, YieldsBatchesInOrderWithShortLastBatch) {
  auto ds = counting(100);
  std::vector<int64_t> idx = {9, 8, 7, 6, 5, 4, 3};
  ddp::PrefetchLoader loader(ds, idx, ddp::PrefetchLoaderOptions().batch_size(3));
  EXPECT_EQ(loader.num_batches(), 3);
  auto got = drain(loader);
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{9, 8, 7}, {6, 5, 4}, {3}}));
  EXPECT_FALSE(loader.next().has_value());  // stays at the end
}

TEST(PrefetchLoader, DropLastDropsTheShortBatch) {
  auto ds = counting(100);
  ddp::PrefetchLoader loader(ds, {1, 2, 3, 4, 5},
                             ddp::PrefetchLoaderOptions().batch_size(2).drop_last(true));
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(drain(loader), (std::vector<std::vector<int64_t>>{{1, 2}, {3, 4}}));
}

TEST(PrefetchLoader, ProducerExceptionReachesConsumerAfterEarlierBatches) {
  auto ds = counting(10);
  ddp::PrefetchLoader loader(
      [&](const std::vector<int64_t>& idx) {
        if (idx[0] == 4) throw ddp::UsageError("sample 4 is corrupt");
        return ds.get_batch(idx);
      },
      {0, 1, 2, 3, 4, 5}, ddp::PrefetchLoaderOptions().batch_size(2));
  EXPECT_TRUE(loader.next().has_value());
  EXPECT_TRUE(loader.next().has_value());
  try {
    loader.next();
    FAIL() << "expected the producer's error";
  } catch (const ddp::UsageError& e) {
    EXPECT_STREQ(e.what(), "sample 4 is corrupt");
  }
  EXPECT_FALSE(loader.next().has_value());
}

TEST(PrefetchLoader, QueueIsBoundedAndDestructorStopsProducer) {
  auto ds = counting(1000);
  std::vector<int64_t> idx(1000);
  std::iota(idx.begin(), idx.end(), 0);
  std::atomic<int> fetched{0};
  {
    ddp::PrefetchLoader loader(
        [&](const std::vector<int64_t>& i) {
          ++fetched;
          return ds.get_batch(i);
        },
        idx, ddp::PrefetchLoaderOptions().batch_size(1).queue_depth(2));
    ASSERT_TRUE(loader.next().has_value());
    // Destroyed with ~998 batches unread: must return (join) rather than hang.
  }
  // 1 consumed + at most 2 queued + 1 assembled while blocked.
  EXPECT_LE(fetched.load(), 4);
}

TEST(PrefetchLoader, NextTimesOutOnAStuckFetch) {
  auto ds = counting(4);
  std::promise<void> release;
  auto released = release.get_future().share();
  ddp::PrefetchLoader loader(
      [&](const std::vector<int64_t>& i) {
        released.wait();
        return ds.get_batch(i);
      },
      {0, 1}, ddp::PrefetchLoaderOptions().batch_size(1).timeout(std::chrono::milliseconds(20)));
  EXPECT_THROW(loader.next(), ddp::TimeoutError);
  release.set_value();
}

// "No limit" (milliseconds::max()) must wait, not overflow the deadline into the past.
TEST(PrefetchLoader, NextWithoutLimitWaitsForASlowFetch) {
  auto ds = counting(4);
  ddp::PrefetchLoader loader(
      [&](const std::vector<int64_t>& i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return ds.get_batch(i);
      },
      {0, 1}, ddp::PrefetchLoaderOptions().batch_size(2).timeout(std::chrono::milliseconds::max()));
  auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->target.size(0), 2);
}

TEST(PrefetchLoader, RejectsBadOptions) {
  auto ds = counting(4);
  EXPECT_THROW(ddp::PrefetchLoader(ds, {0}, ddp::PrefetchLoaderOptions().batch_size(0)),
               ddp::UsageError);
  EXPECT_THROW(ddp::PrefetchLoader(ds, {0}, ddp::PrefetchLoaderOptions().queue_depth(0)),
               ddp::UsageError);
}

}  // namespace

#include "ddp/torch/progress/progress.hpp"

namespace {

std::string run_progress(bool terminal) {
  std::FILE* f = std::tmpfile();
  {
    ddp::Progress p("epoch 1", 20, 64, ddp::ProgressOptions().out(f).terminal(terminal));
    for (int i = 1; i <= 20; ++i) {
      p.update(i, 0.5);
      if (i == 10) p.print_line("a log line");
    }
  }
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  std::fclose(f);
  return s;
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  const std::string s = run_progress(false);
  EXPECT_EQ(s.find('\r'), std::string::npos) << s;
  EXPECT_EQ(s.find("\033["), std::string::npos) << s;
  // 10%, 20%, ... 90%, the log line and the final 100% line.
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 11) << s;
  EXPECT_NE(s.find("epoch 1 2/20  10%"), std::string::npos) << s;
  EXPECT_NE(s.find("a log line\n"), std::string::npos) << s;
  EXPECT_NE(s.find("epoch 1 20/20 100%"), std::string::npos) << s;
  EXPECT_NE(s.find("samples/s  ETA"), std::string::npos) << s;
}

TEST(Progress, RedrawnBarOnATerminal) {
  const std::string s = run_progress(true);
  EXPECT_NE(s.find("\r\033[Kepoch 1 [####################] 20/20 100%"), std::string::npos) << s;
  EXPECT_NE(s.find("\r\033[Ka log line\n"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\n');
}

TEST(Progress, DisabledPrintsNothing) {
  std::FILE* f = std::tmpfile();
  {
    ddp::Progress p("x", 5, 1, ddp::ProgressOptions().out(f).enabled(false).terminal(false));
    p.update(5);
    p.print_line("hidden");
  }
  EXPECT_EQ(std::ftell(f), 0);
  std::fclose(f);
}

}  // namespace
