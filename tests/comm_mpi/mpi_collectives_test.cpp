// Every collective of the MPI backend, for every dtype, against references each rank computes
// locally from the known contributions of all ranks. Run by mpirun with 2 and 4 ranks; all
// ranks run the same tests in the same order. Value checks use EXPECT (never ASSERT between
// collectives) so a failing rank keeps issuing the collectives its peers expect.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "mpi_world.hpp"

namespace ddp::test {
namespace {

class MpiCollectives : public ::testing::TestWithParam<DataType> {
 protected:
  ProcessGroup& pg = world();
  const DataType dtype = GetParam();
  const int rank = pg.rank();
  const int size = pg.size();
};

TEST_P(MpiCollectives, AllReduceEveryOp) {
  for (ReduceOp op : kAllOps) {
    for (size_t count : kCounts) {
      TypedBuffer buffer(dtype, count);
      for (size_t i = 0; i < count; ++i) buffer.set(i, contribution(rank, i, op));
      pg.all_reduce(buffer.data(), count, dtype, op)->wait(kTimeout);
      EXPECT_TRUE(elements_equal(buffer, 0, count, [&](size_t i) {
        return expected_reduction(op, size, i, dtype);
      })) << describe(dtype, op, count);
    }
  }
}

TEST_P(MpiCollectives, BroadcastFromEveryRoot) {
  for (int root = 0; root < size; ++root) {
    for (size_t count : kCounts) {
      TypedBuffer buffer(dtype, count);
      for (size_t i = 0; i < count; ++i) {
        buffer.set(i, rank == root ? contribution(root, i, ReduceOp::kSum) : 99);
      }
      pg.broadcast(buffer.data(), count, dtype, root)->wait(kTimeout);
      EXPECT_TRUE(elements_equal(buffer, 0, count,
                                 [&](size_t i) { return contribution(root, i, ReduceOp::kSum); }))
          << "root " << root << " count " << count;
    }
  }
}

TEST_P(MpiCollectives, ReduceToEveryRootEveryOp) {
  for (int root = 0; root < size; ++root) {
    for (ReduceOp op : kAllOps) {
      const size_t count = 37;
      TypedBuffer buffer(dtype, count);
      for (size_t i = 0; i < count; ++i) buffer.set(i, contribution(rank, i, op));
      pg.reduce(buffer.data(), count, dtype, op, root)->wait(kTimeout);
      if (rank == root) {
        EXPECT_TRUE(elements_equal(
            buffer, 0, count, [&](size_t i) { return expected_reduction(op, size, i, dtype); }))
            << describe(dtype, op, count) << " root " << root;
      }
    }
  }
}

TEST_P(MpiCollectives, AllGather) {
  for (size_t count : kCounts) {
    TypedBuffer in(dtype, count);
    for (size_t i = 0; i < count; ++i) in.set(i, contribution(rank, i, ReduceOp::kSum));
    TypedBuffer out(dtype, count * size);
    pg.all_gather(in.data(), out.data(), count, dtype)->wait(kTimeout);
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(elements_equal(out, r * count, count,
                                 [&](size_t i) { return contribution(r, i, ReduceOp::kSum); }))
          << "block of rank " << r << " count " << count;
    }
  }
}

TEST_P(MpiCollectives, AllGatherInPlace) {
  const size_t count = 11;
  TypedBuffer out(dtype, count * size);
  for (size_t i = 0; i < count; ++i)
    out.set(rank * count + i, contribution(rank, i, ReduceOp::kSum));
  pg.all_gather(out.at(rank * count), out.data(), count, dtype)->wait(kTimeout);
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(elements_equal(out, r * count, count,
                               [&](size_t i) { return contribution(r, i, ReduceOp::kSum); }))
        << "block of rank " << r;
  }
}

TEST_P(MpiCollectives, AllGatherVWithEmptyContributions) {
  // Odd ranks contribute nothing; even ranks contribute different lengths.
  std::vector<size_t> counts(size);
  size_t total = 0;
  for (int r = 0; r < size; ++r) total += counts[r] = r % 2 ? 0 : 5 + 300 * r;
  TypedBuffer in(dtype, counts[rank]);
  for (size_t i = 0; i < counts[rank]; ++i) in.set(i, contribution(rank, i, ReduceOp::kSum));
  TypedBuffer out(dtype, total);
  pg.all_gather_v(in.data(), out.data(), counts, dtype)->wait(kTimeout);
  size_t offset = 0;
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(elements_equal(out, offset, counts[r],
                               [&](size_t i) { return contribution(r, i, ReduceOp::kSum); }))
        << "block of rank " << r;
    offset += counts[r];
  }
}

TEST_P(MpiCollectives, GatherToEveryRoot) {
  const size_t count = 13;
  for (int root = 0; root < size; ++root) {
    TypedBuffer in(dtype, count);
    for (size_t i = 0; i < count; ++i) in.set(i, contribution(rank, i, ReduceOp::kSum));
    TypedBuffer out(dtype, rank == root ? count * size : 0);
    pg.gather(in.data(), out.data(), count, dtype, root)->wait(kTimeout);
    if (rank != root) continue;
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(elements_equal(out, r * count, count,
                                 [&](size_t i) { return contribution(r, i, ReduceOp::kSum); }))
          << "root " << root << " block of rank " << r;
    }
  }
}

TEST_P(MpiCollectives, ScatterFromEveryRoot) {
  const size_t count = 9;
  for (int root = 0; root < size; ++root) {
    TypedBuffer in(dtype, rank == root ? count * size : 0);
    if (rank == root) {
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < count; ++i)
          in.set(r * count + i, contribution(r, i, ReduceOp::kMax));
      }
    }
    TypedBuffer out(dtype, count);
    pg.scatter(in.data(), out.data(), count, dtype, root)->wait(kTimeout);
    EXPECT_TRUE(elements_equal(out, 0, count,
                               [&](size_t i) { return contribution(rank, i, ReduceOp::kMax); }))
        << "root " << root;
  }
}

TEST_P(MpiCollectives, ReduceScatterEveryOp) {
  const size_t count = 17;
  for (ReduceOp op : kAllOps) {
    TypedBuffer in(dtype, count * size);
    for (size_t j = 0; j < count * size; ++j) in.set(j, contribution(rank, j, op));
    TypedBuffer out(dtype, count);
    pg.reduce_scatter(in.data(), out.data(), count, dtype, op)->wait(kTimeout);
    EXPECT_TRUE(elements_equal(out, 0, count, [&](size_t i) {
      return expected_reduction(op, size, rank * count + i, dtype);
    })) << describe(dtype, op, count);
  }
}

TEST_P(MpiCollectives, AllToAll) {
  // Element i of the block rank s sends to rank d encodes (s, d, i), exactly in every dtype.
  auto code = [](int s, int d, size_t i) { return static_cast<double>((s * 7 + d * 3 + i) % 50); };
  for (size_t count : {size_t{0}, size_t{5}, size_t{3000}}) {
    TypedBuffer in(dtype, count * size);
    for (int d = 0; d < size; ++d) {
      for (size_t i = 0; i < count; ++i) in.set(d * count + i, code(rank, d, i));
    }
    TypedBuffer out(dtype, count * size);
    pg.all_to_all(in.data(), out.data(), count, dtype)->wait(kTimeout);
    for (int s = 0; s < size; ++s) {
      EXPECT_TRUE(elements_equal(out, s * count, count, [&](size_t i) { return code(s, rank, i); }))
          << "block from rank " << s << " count " << count;
    }
  }
}

TEST_P(MpiCollectives, SendRecvMatchesByTagNotOrder) {
  // Each rank sends two messages to the next rank (tags 1 then 2); the receiver posts the
  // recv for tag 2 first, so only tag matching delivers the right payloads.
  const size_t count = 21;
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  TypedBuffer first(dtype, count);
  TypedBuffer second(dtype, count);
  for (size_t i = 0; i < count; ++i) {
    first.set(i, contribution(rank, i, ReduceOp::kSum));
    second.set(i, contribution(rank, i, ReduceOp::kSum) + 1);
  }
  TypedBuffer got_first(dtype, count);
  TypedBuffer got_second(dtype, count);
  auto recv_second = pg.recv(got_second.data(), count, dtype, prev, 2);
  auto recv_first = pg.recv(got_first.data(), count, dtype, prev, 1);
  auto send_first = pg.send(first.data(), count, dtype, next, 1);
  auto send_second = pg.send(second.data(), count, dtype, next, 2);
  for (auto* work : {&recv_second, &recv_first, &send_first, &send_second}) (*work)->wait(kTimeout);
  EXPECT_TRUE(elements_equal(got_first, 0, count,
                             [&](size_t i) { return contribution(prev, i, ReduceOp::kSum); }));
  EXPECT_TRUE(elements_equal(got_second, 0, count,
                             [&](size_t i) { return contribution(prev, i, ReduceOp::kSum) + 1; }));
}

std::string dtype_param_name(const ::testing::TestParamInfo<DataType>& info) {
  return describe_dtype(info.param);
}

INSTANTIATE_TEST_SUITE_P(EveryDtype, MpiCollectives, ::testing::ValuesIn(kAllDtypes),
                         dtype_param_name);

TEST(MpiGroup, ReportsRankSizeAndBackend) {
  ProcessGroup& pg = world();
  EXPECT_EQ(pg.backend_name(), "mpi");
  EXPECT_GE(pg.size(), 1);
  EXPECT_GE(pg.rank(), 0);
  EXPECT_LT(pg.rank(), pg.size());
}

TEST(MpiGroup, ManyOutstandingOperationsCompleteWhenWaitedInReverse) {
  ProcessGroup& pg = world();
  constexpr int kOps = 8;
  std::vector<TypedBuffer> buffers;
  for (int k = 0; k < kOps; ++k) {
    buffers.emplace_back(DataType::kInt64, 100);
    for (size_t i = 0; i < 100; ++i) buffers.back().set(i, k + pg.rank());
  }
  std::vector<WorkPtr> works;
  for (int k = 0; k < kOps; ++k) {
    works.push_back(pg.all_reduce(buffers[k].data(), 100, DataType::kInt64, ReduceOp::kSum));
  }
  works.push_back(pg.barrier());
  for (int k = kOps; k >= 0; --k) works[k]->wait(kTimeout);
  for (auto& work : works) EXPECT_TRUE(work->is_completed());
  const int n = pg.size();
  for (int k = 0; k < kOps; ++k) {
    EXPECT_TRUE(elements_equal(
        buffers[k], 0, 100, [&](size_t) { return static_cast<double>(k * n + n * (n - 1) / 2); }))
        << "operation " << k;
  }
}

// milliseconds::max() means "no limit": the wait must block until the barrier completes, not
// convert max() to the clock's nanoseconds (an overflow to a deadline in the past) and throw
// at once. Rank 0 enters late so the other ranks' first poll finds the barrier incomplete.
TEST(MpiGroup, WaitWithoutLimitCompletes) {
  ProcessGroup& pg = world();
  if (pg.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  WorkPtr work = pg.barrier();
  EXPECT_NO_THROW(work->wait(std::chrono::milliseconds::max()));
  EXPECT_TRUE(work->is_completed());
}

TEST(MpiGroup, ThreadsDriveSeparateGroupsConcurrently) {
  // Groups are created in the same order on every rank (creation is collective); each thread
  // then issues collectives on its own group, which MPI_THREAD_MULTIPLE allows.
  constexpr int kThreads = 3;
  std::vector<ProcessGroupPtr> groups;
  for (int t = 0; t < kThreads; ++t) groups.push_back(make_mpi_process_group(kTimeout));
  std::vector<double> sums(kThreads, -1);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        ProcessGroup& group = *groups[t];
        int64_t value = 0;
        for (int round = 0; round < 50; ++round) {
          value = group.rank() + t;
          group.all_reduce(&value, 1, DataType::kInt64, ReduceOp::kSum)->wait(kTimeout);
        }
        sums[t] = static_cast<double>(value);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const int n = world().size();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(sums[t], static_cast<double>(t * n + n * (n - 1) / 2)) << "thread " << t;
  }
}

TEST(MpiGroup, BarrierCompletes) {
  auto work = world().barrier();
  work->wait(kTimeout);
  EXPECT_TRUE(work->is_completed());
}

}  // namespace
}  // namespace ddp::test
