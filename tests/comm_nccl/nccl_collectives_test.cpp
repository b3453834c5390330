// Every collective of the NCCL backend for every dtype, at world size 1 and, with 2 or more
// GPUs, at world size 2 or 4 (one thread per rank, one GPU each, a shared HashStore), checked
// against host-computed references. Without a visible GPU every test skips and says why.

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/store/hash_store.hpp"
#include "device_buffer.hpp"
#include "reference.hpp"

namespace ddp::test {
namespace {

constexpr std::chrono::milliseconds kTimeout{std::chrono::seconds(120)};
constexpr const char* kNoGpu = "no CUDA device visible: NCCL tests need a GPU";

// World sizes to test: 1, and the largest of 2 and 4 the GPUs allow (powers of two keep
// ncclAvg's multiply-by-1/size exact for the reference).
std::vector<int> world_sizes() {
  const int gpus = visible_gpus();
  std::vector<int> sizes{1};
  if (gpus >= 4) {
    sizes.push_back(4);
  } else if (gpus >= 2) {
    sizes.push_back(2);
  }
  return sizes;
}

// Runs body(group) on `world` ranks, one thread and one GPU per rank.
void run_ranks(int world, const std::function<void(ProcessGroup&)>& body) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        cuda_ok(cudaSetDevice(rank), "cudaSetDevice");
        auto group = make_nccl_process_group(store, rank, world, rank, kTimeout);
        body(*group);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
}

void fill(DeviceBuffer& buffer, size_t begin, size_t n, const std::function<double(size_t)>& f) {
  for (size_t i = 0; i < n; ++i) buffer.host.set(begin + i, f(i));
}

class NcclCollectives : public ::testing::TestWithParam<DataType> {
 protected:
  void SetUp() override {
    if (visible_gpus() == 0) GTEST_SKIP() << kNoGpu;
  }
  const DataType dtype = GetParam();
};

TEST_P(NcclCollectives, ReductionsMatchTheReference) {
  for (int world : world_sizes()) {
    run_ranks(world, [&](ProcessGroup& pg) {
      const int rank = pg.rank();
      for (ReduceOp op : kAllOps) {
        for (size_t count : kCounts) {
          DeviceBuffer buffer(dtype, count);
          fill(buffer, 0, count, [&](size_t i) { return contribution(rank, i, op); });
          buffer.upload();
          pg.all_reduce(buffer.data(), count, dtype, op)->wait(kTimeout);
          buffer.download();
          EXPECT_TRUE(
              elements_equal(buffer.host, 0, count,
                             [&](size_t i) { return expected_reduction(op, world, i, dtype); }))
              << "all_reduce " << describe(dtype, op, count) << " world " << world;
        }
        for (int root = 0; root < world; ++root) {
          const size_t count = 37;
          DeviceBuffer buffer(dtype, count);
          fill(buffer, 0, count, [&](size_t i) { return contribution(rank, i, op); });
          buffer.upload();
          pg.reduce(buffer.data(), count, dtype, op, root)->wait(kTimeout);
          buffer.download();
          if (rank == root) {
            EXPECT_TRUE(
                elements_equal(buffer.host, 0, count,
                               [&](size_t i) { return expected_reduction(op, world, i, dtype); }))
                << "reduce " << describe(dtype, op, count) << " root " << root;
          }
        }
        const size_t count = 17;
        DeviceBuffer in(dtype, count * world);
        fill(in, 0, count * world, [&](size_t j) { return contribution(rank, j, op); });
        in.upload();
        DeviceBuffer out(dtype, count);
        pg.reduce_scatter(in.data(), out.data(), count, dtype, op)->wait(kTimeout);
        out.download();
        EXPECT_TRUE(elements_equal(
            out.host, 0, count,
            [&](size_t i) { return expected_reduction(op, world, rank * count + i, dtype); }))
            << "reduce_scatter " << describe(dtype, op, count);
      }
    });
  }
}

TEST_P(NcclCollectives, DataMovementMatchesTheReference) {
  auto value = [](int r, size_t i) { return contribution(r, i, ReduceOp::kSum); };
  for (int world : world_sizes()) {
    run_ranks(world, [&](ProcessGroup& pg) {
      const int rank = pg.rank();
      for (int root = 0; root < world; ++root) {
        DeviceBuffer buffer(dtype, 1000);
        fill(buffer, 0, 1000, [&](size_t i) { return rank == root ? value(root, i) : 99; });
        buffer.upload();
        pg.broadcast(buffer.data(), 1000, dtype, root)->wait(kTimeout);
        buffer.download();
        EXPECT_TRUE(elements_equal(buffer.host, 0, 1000, [&](size_t i) { return value(root, i); }))
            << "broadcast root " << root;
      }
      {
        const size_t count = 513;
        DeviceBuffer in(dtype, count);
        fill(in, 0, count, [&](size_t i) { return value(rank, i); });
        in.upload();
        DeviceBuffer out(dtype, count * world);
        pg.all_gather(in.data(), out.data(), count, dtype)->wait(kTimeout);
        out.download();
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(
              elements_equal(out.host, r * count, count, [&](size_t i) { return value(r, i); }))
              << "all_gather block " << r;
        }
      }
      {
        std::vector<size_t> counts(world);
        size_t total = 0;
        for (int r = 0; r < world; ++r) total += counts[r] = r % 2 ? 0 : 5 + 300 * r;
        DeviceBuffer in(dtype, counts[rank]);
        fill(in, 0, counts[rank], [&](size_t i) { return value(rank, i); });
        in.upload();
        DeviceBuffer out(dtype, total);
        pg.all_gather_v(in.data(), out.data(), counts, dtype)->wait(kTimeout);
        out.download();
        size_t offset = 0;
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(
              elements_equal(out.host, offset, counts[r], [&](size_t i) { return value(r, i); }))
              << "all_gather_v block " << r;
          offset += counts[r];
        }
      }
      for (int root = 0; root < world; ++root) {
        const size_t count = 13;
        DeviceBuffer in(dtype, count);
        fill(in, 0, count, [&](size_t i) { return value(rank, i); });
        in.upload();
        DeviceBuffer out(dtype, count * world);
        pg.gather(in.data(), out.data(), count, dtype, root)->wait(kTimeout);
        out.download();
        for (int r = 0; rank == root && r < world; ++r) {
          EXPECT_TRUE(
              elements_equal(out.host, r * count, count, [&](size_t i) { return value(r, i); }))
              << "gather root " << root << " block " << r;
        }
        DeviceBuffer whole(dtype, count * world);
        for (int r = 0; r < world; ++r)
          fill(whole, r * count, count, [&](size_t i) { return value(r, i); });
        whole.upload();
        DeviceBuffer mine(dtype, count);
        pg.scatter(whole.data(), mine.data(), count, dtype, root)->wait(kTimeout);
        mine.download();
        EXPECT_TRUE(elements_equal(mine.host, 0, count, [&](size_t i) { return value(rank, i); }))
            << "scatter root " << root;
      }
      {
        auto code = [](int s, int d, size_t i) {
          return static_cast<double>((s * 7 + d * 3 + i) % 50);
        };
        const size_t count = 300;
        DeviceBuffer in(dtype, count * world);
        for (int d = 0; d < world; ++d)
          fill(in, d * count, count, [&](size_t i) { return code(rank, d, i); });
        in.upload();
        DeviceBuffer out(dtype, count * world);
        pg.all_to_all(in.data(), out.data(), count, dtype)->wait(kTimeout);
        out.download();
        for (int s = 0; s < world; ++s) {
          EXPECT_TRUE(elements_equal(out.host, s * count, count,
                                     [&](size_t i) { return code(s, rank, i); }))
              << "all_to_all block from " << s;
        }
      }
      if (world >= 2) {
        // A ring; NCCL matches a send with the peer's recv in issue order (tags are not sent).
        const size_t count = 77;
        const int next = (rank + 1) % world;
        const int prev = (rank + world - 1) % world;
        DeviceBuffer mine(dtype, count);
        fill(mine, 0, count, [&](size_t i) { return value(rank, i); });
        mine.upload();
        DeviceBuffer got(dtype, count);
        // A send completes only once the peer's recv runs, and each rank's operations run
        // in issue order on one stream, so odd ranks receive first to break the cycle.
        WorkPtr sent;
        WorkPtr received;
        if (rank % 2 == 0) {
          sent = pg.send(mine.data(), count, dtype, next, 3);
          received = pg.recv(got.data(), count, dtype, prev, 3);
        } else {
          received = pg.recv(got.data(), count, dtype, prev, 3);
          sent = pg.send(mine.data(), count, dtype, next, 3);
        }
        sent->wait(kTimeout);
        received->wait(kTimeout);
        got.download();
        EXPECT_TRUE(elements_equal(got.host, 0, count, [&](size_t i) { return value(prev, i); }))
            << "recv from " << prev;
      }
      auto barrier = pg.barrier();
      barrier->wait(kTimeout);
      EXPECT_TRUE(barrier->is_completed());
    });
  }
}

// The flight recorder sees every collective (not send/recv) in issue order, with sequence
// numbers from 1; a barrier's blocking wait observes its completion.
TEST(NcclFlightRecorder, RecordsCollectivesInIssueOrder) {
  if (visible_gpus() == 0) GTEST_SKIP() << kNoGpu;
  run_ranks(1, [&](ProcessGroup& pg) {
    ASSERT_NE(pg.flight_recorder(), nullptr) << "on by default (DDP_FLIGHT_RECORDER_ENTRIES)";
    DeviceBuffer buffer(DataType::kFloat32, 256);
    {
      FlightRecorder::ScopedThreadTag tag("DDP bucket 0, iteration 1");
      pg.all_reduce(buffer.data(), 256, DataType::kFloat32, ReduceOp::kSum)->wait(kTimeout);
    }
    pg.broadcast(buffer.data(), 256, DataType::kFloat32, 0)->wait(kTimeout);
    pg.barrier()->wait(kTimeout);
    const auto doc = nlohmann::json::parse(pg.flight_recorder()->dump_json("test"));
    ASSERT_EQ(doc["entries"].size(), 3u) << doc.dump(1);
    EXPECT_EQ(doc["backend"], "nccl");
    EXPECT_EQ(doc["entries"][0]["op"], "all_reduce");
    EXPECT_EQ(doc["entries"][0]["tag"], "DDP bucket 0, iteration 1");
    EXPECT_EQ(doc["entries"][1]["op"], "broadcast");
    EXPECT_EQ(doc["entries"][1]["root"], 0);
    EXPECT_EQ(doc["entries"][2]["op"], "barrier");
    EXPECT_EQ(doc["entries"][2]["seq"], 3);
    EXPECT_EQ(doc["entries"][2]["state"], "completed");
  });
}

std::string dtype_param_name(const ::testing::TestParamInfo<DataType>& info) {
  return describe_dtype(info.param);
}

INSTANTIATE_TEST_SUITE_P(EveryDtype, NcclCollectives, ::testing::ValuesIn(kAllDtypes),
                         dtype_param_name);

}  // namespace
}  // namespace ddp::test
