// Flight recorder cost per collective, one JSON object per line:
//   {"bench":"flight_recorder","what":"ring","entries":2000,"ns_per_collective":...}
//     record + started + finished on a FlightRecorder alone
//   {"bench":"flight_recorder","what":"all_reduce_world1","entries":N,"ns_per_collective":...}
//     a 1-element all_reduce on a world-1 cpu group (inline path, the cheapest collective there
//     is), with the recorder off (N=0) and on (N=2000); the difference is the recorder's cost
// Each figure is the median of 7 repetitions.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

template <typename F>
double median_ns_per_iteration(int iterations, F&& body) {
  std::vector<double> reps;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iterations; ++i) body(i);
    reps.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                   iterations);
  }
  std::sort(reps.begin(), reps.end());
  return reps[reps.size() / 2];
}

}  // namespace

int main() {
  constexpr int kIterations = 200000;
  {
    FlightRecorderIdentity id;
    id.group = "bench/0/";
    FlightRecorder r(id, FlightRecorder::kDefaultEntries);
    r.set_tag("bucket=3 iter=120");
    CollectiveRecordInfo info;
    info.op = "all_reduce";
    info.dtype = DataType::kFloat32;
    info.has_reduce_op = true;
    info.count = 256;
    const double ns = median_ns_per_iteration(kIterations, [&](int i) {
      info.seq = static_cast<uint64_t>(i);
      const uint64_t rid = r.record(info);
      r.started(rid);
      r.finished(rid, true);
    });
    std::printf(
        "{\"bench\":\"flight_recorder\",\"what\":\"ring\",\"entries\":%zu,"
        "\"ns_per_collective\":%.1f}\n",
        FlightRecorder::kDefaultEntries, ns);
  }
  for (const char* entries : {"0", "2000", "0", "2000"}) {
    ::setenv("DDP_FLIGHT_RECORDER_ENTRIES", entries, 1);
    InitOptions o;
    o.store = std::make_shared<HashStore>();
    o.rank = 0;
    o.world_size = 1;
    auto pg = init_process_group(o);
    float x = 1.0f;
    const double ns = median_ns_per_iteration(kIterations, [&](int) {
      pg->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum)->wait(pg->timeout());
    });
    std::printf(
        "{\"bench\":\"flight_recorder\",\"what\":\"all_reduce_world1\",\"entries\":%s,"
        "\"ns_per_collective\":%.1f}\n",
        entries, ns);
  }
  return 0;
}
