// DistributedSampler against PyTorch's own DistributedSampler, run at test time.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "ddp/torch/data/distributed_sampler.hpp"
#include "ddp/util/error.hpp"
#include "python_helper.hpp"

namespace {

// One line per case: N R rank seed epoch shuffle drop_last num_samples total_size indices...
const char* kScript = R"(
import torch
from torch.utils.data.distributed import DistributedSampler
cases = []
for n in [0, 1, 2, 5, 10, 17, 100, 1001]:
    for world in [1, 2, 3, 4, 7]:
        for seed in [0, 42]:
            for epoch in [0, 3]:
                for shuffle in [True, False]:
                    for drop in [True, False]:
                        if not shuffle and (seed or epoch):
                            continue
                        cases.append((n, world, seed, epoch, shuffle, drop))
cases += [(60000, 2, 0, e, True, False) for e in range(3)] + [(60000, 3, 7, 1, True, True)]
for (n, world, seed, epoch, shuffle, drop) in cases:
    for rank in range(world):
        s = DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=shuffle,
                               seed=seed, drop_last=drop)
        s.set_epoch(epoch)
        idx = list(iter(s))
        print(n, world, rank, seed, epoch, int(shuffle), int(drop), s.num_samples, s.total_size,
              *idx)
)";

TEST(DistributedSampler, MatchesPyTorchExactly) {
  if (auto why = ddp::test::python_torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const auto py = ddp::test::run_python(kScript);
  ASSERT_EQ(py.status, 0) << "the PyTorch reference script failed";
  std::istringstream lines(py.out);
  std::string line;
  int cases = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    int64_t n, world, rank, seed, epoch, shuffle, drop, num_samples, total_size;
    in >> n >> world >> rank >> seed >> epoch >> shuffle >> drop >> num_samples >> total_size;
    std::vector<int64_t> want;
    for (int64_t v; in >> v;) want.push_back(v);

    ddp::DistributedSampler sampler(
        n, ddp::DistributedSamplerOptions(world, rank).shuffle(shuffle).seed(seed).drop_last(drop));
    sampler.set_epoch(epoch);
    SCOPED_TRACE(line.substr(0, 60));
    EXPECT_EQ(sampler.num_samples(), num_samples);
    EXPECT_EQ(sampler.total_size(), total_size);
    EXPECT_EQ(sampler.indices(), want);
    ++cases;
  }
  EXPECT_GT(cases, 500);
}

TEST(DistributedSampler, PadsByCyclingWhenPaddingExceedsDataset) {
  // N=2, 7 replicas, no shuffle: total 7 = [0 1] + [0 1 0 1 0] (padding 5 > N 2).
  std::vector<int64_t> all;
  for (int r = 0; r < 7; ++r) {
    ddp::DistributedSampler s(2, ddp::DistributedSamplerOptions(7, r).shuffle(false));
    auto idx = s.indices();
    ASSERT_EQ(idx.size(), 1u);
    all.push_back(idx[0]);
  }
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0}));
}

TEST(DistributedSampler, EpochChangesOrderIdenticallyOnAllRanks) {
  ddp::DistributedSampler a(100, ddp::DistributedSamplerOptions(2, 0));
  ddp::DistributedSampler b(100, ddp::DistributedSamplerOptions(2, 1));
  auto e0 = a.indices();
  a.set_epoch(1);
  b.set_epoch(1);
  EXPECT_NE(a.indices(), e0);
  // The two ranks' shards partition the dataset (100 is divisible by 2: no padding).
  auto x = a.indices(), y = b.indices();
  x.insert(x.end(), y.begin(), y.end());
  std::sort(x.begin(), x.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(x[i], i);
}

TEST(DistributedSampler, RejectsBadRankAndWorld) {
  EXPECT_THROW(ddp::DistributedSampler(10, ddp::DistributedSamplerOptions(2, 2)), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedSampler(10, ddp::DistributedSamplerOptions(2, -1)), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedSampler(10, ddp::DistributedSamplerOptions(0, 0)), ddp::UsageError);
  try {
    ddp::DistributedSampler(10, ddp::DistributedSamplerOptions(4, 9));
    FAIL();
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid rank 9"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[0, 3]"), std::string::npos) << e.what();
  }
}

}  // namespace
