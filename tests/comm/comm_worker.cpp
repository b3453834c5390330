// comm_worker: one rank of a multi-process comm test. Reads the worker environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT), joins through init_process_group (rank 0 hosts the
// TcpStore) and checks collectives against local references. Exit 0 on success; otherwise
// prints "rank R: error" to stderr and exits 1.
//
//   comm_worker <backend> [--exit-rank R]   (rank R exits right after init: the others must
//                                           fail with a timeout naming it, not hang)

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

#include "buffers.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/util/error.hpp"

using namespace ddp;

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("check failed: " + what);
}

void run(ProcessGroup& pg) {
  const auto t = std::chrono::seconds(60);
  const int n = pg.size();
  for (DataType dt : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
        auto buf = test::make_input(dt, count, pg.rank(), op);
        pg.all_reduce(buf.data(), count, dt, op)->wait(t);
        for (size_t i = 0; i < count; ++i) {
          if (test::get(dt, buf.data(), i) != test::expected_reduction(dt, op, n, i)) {
            check(false, std::string("all_reduce ") + to_string(dt) + " " + to_string(op) +
                             " count " + std::to_string(count) + " index " + std::to_string(i));
          }
        }
      }
    }
  }
  for (int root = 0; root < n; ++root) {
    std::vector<int32_t> b(100000, pg.rank() == root ? root + 7 : 0);
    pg.broadcast(b.data(), b.size(), DataType::kInt32, root)->wait(t);
    for (int v : b) check(v == root + 7, "broadcast from " + std::to_string(root));
  }
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r * 1000;
  std::vector<uint8_t> in(counts[pg.rank()], static_cast<uint8_t>(pg.rank()));
  std::vector<uint8_t> out(std::accumulate(counts.begin(), counts.end(), size_t{0}));
  pg.all_gather_v(in.data(), out.data(), counts, DataType::kUInt8)->wait(t);
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < counts[r]; ++i) check(out[off + i] == r, "all_gather_v");
    off += counts[r];
  }
  // A ring of sends: post the recv first, then the send.
  std::vector<float> msg(70000, static_cast<float>(pg.rank())), got(70000, -1);
  const int next = (pg.rank() + 1) % n, prev = (pg.rank() + n - 1) % n;
  if (n > 1) {
    auto r = pg.recv(got.data(), got.size(), DataType::kFloat32, prev, 3);
    auto s = pg.send(msg.data(), msg.size(), DataType::kFloat32, next, 3);
    s->wait(t);
    r->wait(t);
    for (float v : got) check(v == static_cast<float>(prev), "send/recv ring");
  }
  pg.barrier()->wait(t);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_worker <backend> [--exit-rank R]\n");
    return 2;
  }
  int exit_rank = -1;
  if (argc >= 4 && std::strcmp(argv[2], "--exit-rank") == 0) exit_rank = std::atoi(argv[3]);
  const char* rank_env = std::getenv("RANK");
  try {
    InitOptions o;
    o.backend = argv[1];
    o.timeout = std::chrono::milliseconds(exit_rank >= 0 ? 3000 : 60000);
    auto pg = init_process_group(o);
    if (pg->rank() == exit_rank) return 0;
    run(*pg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %s: %s\n", rank_env ? rank_env : "?", e.what());
    return 1;
  }
  return 0;
}
