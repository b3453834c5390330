// Every collective x dtype x op for world sizes 1..8, ranks as threads sharing a HashStore,
// checked against references computed locally.

#include <gtest/gtest.h>

#include <numeric>

#include "buffers.hpp"
#include "ddp/comm/init.hpp"
#include "rank_threads.hpp"

namespace ddp::test {
namespace {

struct Param {
  std::string backend;
  int world;
};

class Collectives : public ::testing::TestWithParam<Param> {
 protected:
  void run(const std::function<void(ProcessGroup&)>& fn) {
    run_ranks(GetParam().world, thread_options(GetParam().backend), fn);
  }
  int world() const { return GetParam().world; }
};

TEST_P(Collectives, AllReduceEveryDtypeAndOp) {
  run([&](ProcessGroup& pg) {
    for (DataType t : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{37}, size_t{5000}}) {
          auto buf = make_input(t, count, pg.rank(), op);
          wait(pg.all_reduce(buf.data(), count, t, op));
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(get(t, buf.data(), i), expected_reduction(t, op, world(), i))
                << to_string(t) << " " << to_string(op) << " count " << count << " index " << i
                << " rank " << pg.rank();
          }
        }
      }
    }
  });
}

TEST_P(Collectives, AllReduceLargePipelined) {
  // Larger than one 1 MiB staging slot: several pipelined chunks with uneven tails.
  const size_t count = 300001;
  run([&](ProcessGroup& pg) {
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto buf = make_input(t, count, pg.rank(), op);
        wait(pg.all_reduce(buf.data(), count, t, op));
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(get(t, buf.data(), i), expected_reduction(t, op, world(), i))
              << to_string(t) << " " << to_string(op) << " index " << i;
        }
      }
    }
  });
}

TEST_P(Collectives, ReduceToEveryRoot) {
  run([&](ProcessGroup& pg) {
    for (int root = 0; root < pg.size(); ++root) {
      for (DataType t : kAllDtypes) {
        for (ReduceOp op : kAllOps) {
          const size_t count = 19;
          auto buf = make_input(t, count, pg.rank(), op);
          wait(pg.reduce(buf.data(), count, t, op, root));
          if (pg.rank() != root) continue;
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(get(t, buf.data(), i), expected_reduction(t, op, world(), i))
                << to_string(t) << " " << to_string(op) << " root " << root;
          }
        }
      }
    }
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  run([&](ProcessGroup& pg) {
    for (int root = 0; root < pg.size(); ++root) {
      for (size_t count : {size_t{0}, size_t{3}, size_t{3000000}}) {
        std::vector<int32_t> buf(count + 1, -1);
        if (pg.rank() == root) std::iota(buf.begin(), buf.end(), root * 10);
        wait(pg.broadcast(buf.data(), count, DataType::kInt32, root));
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(buf[i], static_cast<int32_t>(root * 10 + i)) << "root " << root;
        }
        ASSERT_EQ(buf[count], pg.rank() == root ? static_cast<int32_t>(root * 10 + count) : -1)
            << "wrote past the end";
      }
    }
  });
}

TEST_P(Collectives, AllGatherAndGather) {
  run([&](ProcessGroup& pg) {
    const int n = pg.size();
    for (size_t count : {size_t{0}, size_t{5}, size_t{400000}}) {
      std::vector<double> in(count);
      for (size_t i = 0; i < count; ++i) in[i] = pg.rank() * 1e6 + i;
      std::vector<double> out(count * n + 1, -1);
      wait(pg.all_gather(in.data(), out.data(), count, DataType::kFloat64));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r * count + i], r * 1e6 + i);
      }
      ASSERT_EQ(out[count * n], -1);
      const int root = n - 1;
      std::vector<double> gathered(count * n, -1);
      wait(pg.gather(in.data(), gathered.data(), count, DataType::kFloat64, root));
      if (pg.rank() == root) {
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(gathered[r * count + i], r * 1e6 + i);
        }
      }
    }
  });
}

TEST_P(Collectives, AllGatherVUnequalSizes) {
  run([&](ProcessGroup& pg) {
    const int n = pg.size();
    for (size_t scale : {size_t{1}, size_t{100000}}) {
      std::vector<size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = ((r * 3) % 4) * scale;  // includes zeros
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      std::vector<uint8_t> in(counts[pg.rank()] + 1);
      for (size_t i = 0; i < counts[pg.rank()]; ++i) in[i] = static_cast<uint8_t>(pg.rank() + i);
      std::vector<uint8_t> out(total + 1, 0xee);
      wait(pg.all_gather_v(in.data(), out.data(), counts, DataType::kUInt8));
      size_t off = 0;
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < counts[r]; ++i) {
          ASSERT_EQ(out[off + i], static_cast<uint8_t>(r + i)) << "block " << r << " i " << i;
        }
        off += counts[r];
      }
      ASSERT_EQ(out[total], 0xee);
    }
  });
}

TEST_P(Collectives, Scatter) {
  run([&](ProcessGroup& pg) {
    const int n = pg.size();
    for (int root : {0, n - 1}) {
      for (size_t count : {size_t{0}, size_t{7}, size_t{300000}}) {
        std::vector<int64_t> in;
        if (pg.rank() == root) {
          in.resize(count * n);
          for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i) * 3 + root;
        }
        std::vector<int64_t> out(count + 1, -1);
        wait(pg.scatter(in.data(), out.data(), count, DataType::kInt64, root));
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[i], static_cast<int64_t>(pg.rank() * count + i) * 3 + root);
        }
        ASSERT_EQ(out[count], -1);
      }
    }
  });
}

TEST_P(Collectives, ReduceScatterEveryDtypeAndOp) {
  run([&](ProcessGroup& pg) {
    const int n = pg.size();
    for (DataType t : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        for (size_t count : {size_t{0}, size_t{11}, size_t{70000}}) {
          if (count > 11 && t != DataType::kFloat32) continue;
          auto in = make_input(t, count * n, pg.rank(), op);
          std::vector<uint8_t> out(count * element_size(t) + 1);
          wait(pg.reduce_scatter(in.data(), out.data(), count, t, op));
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(get(t, out.data(), i),
                      expected_reduction(t, op, world(), pg.rank() * count + i))
                << to_string(t) << " " << to_string(op) << " count " << count << " i " << i;
          }
        }
      }
    }
  });
}

TEST_P(Collectives, AllToAll) {
  run([&](ProcessGroup& pg) {
    const int n = pg.size();
    for (size_t count : {size_t{0}, size_t{4}, size_t{200000}}) {
      std::vector<int32_t> in(count * n), out(count * n + 1, -1);
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i)
          in[j * count + i] = pg.rank() * 1000000 + j * 1000 + i % 1000;
      }
      wait(pg.all_to_all(in.data(), out.data(), count, DataType::kInt32));
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[j * count + i],
                    static_cast<int32_t>(j * 1000000 + pg.rank() * 1000 + i % 1000));
        }
      }
      ASSERT_EQ(out[count * n], -1);
    }
  });
}

TEST_P(Collectives, BarrierAndManyInFlight) {
  run([&](ProcessGroup& pg) {
    // Issue many operations before waiting on any: they must complete in issue order.
    constexpr int kOps = 64;
    std::vector<std::vector<float>> bufs(kOps);
    std::vector<WorkPtr> works;
    for (int k = 0; k < kOps; ++k) {
      bufs[k].assign(k % 2 == 0 ? 10 : 50000, static_cast<float>(pg.rank() + k));
      works.push_back(
          pg.all_reduce(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kSum));
      if (k % 16 == 0) works.push_back(pg.barrier());
    }
    for (auto& w : works) wait(w);
    const int n = pg.size();
    for (int k = 0; k < kOps; ++k) {
      const float expect = static_cast<float>(n * (n - 1) / 2 + n * k);
      for (float v : bufs[k]) ASSERT_EQ(v, expect) << "op " << k;
    }
  });
}

class LargestAllReduce : public ::testing::TestWithParam<std::string> {};

TEST_P(LargestAllReduce, SixtyFourMegabytesWorldTwo) {
  const size_t count = (size_t{64} << 20) / sizeof(float);
  run_ranks(2, thread_options(GetParam()), [&](ProcessGroup& pg) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 1000) + pg.rank());
    wait(pg.all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum));
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(buf[i], static_cast<float>(2 * (i % 1000) + 1)) << "index " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, LargestAllReduce, ::testing::Values("cpu", "gloo"));

std::vector<Param> params() {
  std::vector<Param> out;
  for (const char* b : {"cpu", "gloo"}) {
    for (int w = 1; w <= 8; ++w) out.push_back({b, w});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, Collectives, ::testing::ValuesIn(params()), [](const auto& info) {
  return info.param.backend + "_world" + std::to_string(info.param.world);
});

}  // namespace
}  // namespace ddp::test
