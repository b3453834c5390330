// allreduce_bench: one rank of the all_reduce benchmark. Joins through init_process_group
// (environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or mpirun for "mpi"), times
// float32 sum all_reduce for each size and prints, on rank 0, one JSON object per line:
//   {"bench":"allreduce","backend":"cpu","world":2,"bytes":16777216,"iters":40,"us":...,
//    "busbw_gbps":...}
// "us" is the median over 3 loops of the mean time per call; "p50_us" and "p99_us" are
// percentiles of every timed call on rank 0 (each call timed alone: the tail that a mean hides).
// With --memcpy, rank 0 also prints the time of a memcpy of the same bytes (the yardstick).
// --max-iters caps the iterations per loop (quick runs); DDP_BENCH_MAX_ITERS does the same.
// --budget-ms B (slow links): 2 warm-up calls instead of half the timed ones, and rank 0 picks (and
// broadcasts) the iterations so that the 3 loops take about B ms in all, at least 1 call each.
//
//   allreduce_bench <backend> [--sizes 4096,1048576,...] [--memcpy] [--max-iters N]
//                   [--budget-ms B]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/comm/init.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

int iterations_for(size_t bytes, int max_iters) {
  // About 256 MiB moved per size, at least 10 and at most 5000 iterations.
  const size_t n = (size_t{256} << 20) / std::max<size_t>(bytes, 1);
  const int iters = static_cast<int>(std::min<size_t>(5000, std::max<size_t>(10, n)));
  return max_iters > 0 ? std::min(iters, max_iters) : iters;
}

// The same rule as torch_allreduce.py, so every backend warms up alike.
int warmup_calls(int iters) {
  return std::max(std::min(iters, 20), iters / 2);
}

struct Timing {
  double mean_us = 0;  // median over the loops of the mean per call
  double p50_us = 0;   // percentiles of all calls
  double p99_us = 0;
};

// `reps` timed loops of `iters` calls; every call is also timed alone.
template <typename Fn>
Timing time_calls(int iters, int reps, Fn&& fn) {
  std::vector<double> loops, calls;
  calls.reserve(static_cast<size_t>(iters) * reps);
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    auto prev = t0;
    for (int i = 0; i < iters; ++i) {
      fn();
      const auto now = Clock::now();
      calls.push_back(std::chrono::duration<double, std::micro>(now - prev).count());
      prev = now;
    }
    loops.push_back(std::chrono::duration<double, std::micro>(prev - t0).count() / iters);
  }
  std::sort(loops.begin(), loops.end());
  std::sort(calls.begin(), calls.end());
  auto pct = [&](double p) {
    return calls[std::min(calls.size() - 1, static_cast<size_t>(p * calls.size()))];
  };
  return {loops[loops.size() / 2], pct(0.50), pct(0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: allreduce_bench <backend> [--sizes a,b,c] [--memcpy]\n");
    return 2;
  }
  if (std::strcmp(argv[1], "--backends") == 0) {
    for (const auto& b : available_backends()) std::printf("%s\n", b.c_str());
    return 0;
  }
  std::vector<size_t> sizes{4096, 1 << 20, 16 << 20, 64 << 20};
  bool with_memcpy = false;
  int max_iters = 0;
  double budget_ms = 0;
  if (const char* v = std::getenv("DDP_BENCH_MAX_ITERS")) max_iters = std::atoi(v);
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--memcpy") == 0) {
      with_memcpy = true;
    } else if (std::strcmp(argv[i], "--max-iters") == 0 && i + 1 < argc) {
      max_iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--budget-ms") == 0 && i + 1 < argc) {
      budget_ms = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      for (std::string item; std::getline(ss, item, ',');) sizes.push_back(std::stoull(item));
    }
  }
  try {
    InitOptions o;
    o.backend = argv[1];
    o.timeout = std::chrono::seconds(120);
    auto pg = init_process_group(o);
    const int n = pg->size();
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      std::vector<float> buf(count, 1.0f);
      int iters = iterations_for(bytes, max_iters);
      auto once = [&] {
        pg->all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum)
            ->wait(std::chrono::seconds(120));
      };
      if (budget_ms > 0) {
        once();  // warm up: page faults, caches, connections
        pg->barrier()->wait(std::chrono::seconds(120));
        const auto t0 = Clock::now();
        once();
        const double one_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        // Every rank must loop the same number of times: rank 0's choice wins.
        int64_t chosen =
            std::clamp<int64_t>(static_cast<int64_t>(budget_ms / 3 / one_ms), 1, iters);
        pg->broadcast(&chosen, 1, DataType::kInt64, 0)->wait(std::chrono::seconds(120));
        iters = static_cast<int>(chosen);
      } else {
        // Warm up (page faults, caches) for half the timed calls: on this VM a fresh process's
        // first milliseconds are noisy (about 300 of the first 5000 4 KB calls took ~50 us,
        // flight recorder on or off), which is start-up, not the steady state the p99 reports.
        for (int i = 0; i < warmup_calls(iters); ++i) once();
      }
      pg->barrier()->wait(std::chrono::seconds(120));
      const Timing t = time_calls(iters, 3, once);
      if (pg->rank() == 0) {
        const double busbw = bytes * 2.0 * (n - 1) / n / (t.mean_us * 1e-6) / 1e9;
        std::printf(
            "{\"bench\":\"allreduce\",\"backend\":\"%s\",\"world\":%d,\"bytes\":%zu,"
            "\"iters\":%d,\"us\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
            "\"busbw_gbps\":%.3f}\n",
            argv[1], n, bytes, iters, t.mean_us, t.p50_us, t.p99_us, busbw);
        std::fflush(stdout);
      }
      if (with_memcpy && pg->rank() == 0) {
        std::vector<char> src(bytes, 1), dst(bytes, 0);
        std::memcpy(dst.data(), src.data(), bytes);
        const double mus = time_calls(iters, 3, [&] {
                             std::memcpy(dst.data(), src.data(), bytes);
                             asm volatile("" ::"r"(dst.data()) : "memory");
                           }).mean_us;
        std::printf(
            "{\"bench\":\"allreduce\",\"backend\":\"memcpy\",\"world\":1,\"bytes\":%zu,"
            "\"iters\":%d,\"us\":%.2f,\"gbps\":%.3f}\n",
            bytes, iters, mus, bytes / (mus * 1e-6) / 1e9);
        std::fflush(stdout);
      }
      pg->barrier()->wait(std::chrono::seconds(120));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
