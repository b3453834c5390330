// allreduce_bench: one rank of the all_reduce benchmark. Joins through init_process_group
// (environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or mpirun for "mpi"), times
// float32 sum all_reduce for each size and prints, on rank 0, one JSON object per line:
//   {"bench":"allreduce","backend":"cpu","world":2,"bytes":16777216,"iters":40,"us":...,
//    "busbw_gbps":...}
// With --memcpy, rank 0 also prints the time of a memcpy of the same bytes (the yardstick).
//
//   allreduce_bench <backend> [--sizes 4096,1048576,...] [--memcpy]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/comm/init.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

int iterations_for(size_t bytes) {
  // About 256 MiB moved per size, at least 10 and at most 5000 iterations.
  const size_t n = (size_t{256} << 20) / std::max<size_t>(bytes, 1);
  return static_cast<int>(std::min<size_t>(5000, std::max<size_t>(10, n)));
}

// Median of `reps` timed loops of `iters` calls, in microseconds per call.
template <typename Fn>
double time_us(int iters, int reps, Fn&& fn) {
  std::vector<double> results;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    results.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
  }
  std::sort(results.begin(), results.end());
  return results[results.size() / 2];
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
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--memcpy") == 0) {
      with_memcpy = true;
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
      const int iters = iterations_for(bytes);
      auto once = [&] {
        pg->all_reduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum)
            ->wait(std::chrono::seconds(120));
      };
      for (int i = 0; i < std::min(iters, 20); ++i) once();  // warm up: page faults, caches
      pg->barrier()->wait(std::chrono::seconds(120));
      const double us = time_us(iters, 3, once);
      if (pg->rank() == 0) {
        const double busbw = bytes * 2.0 * (n - 1) / n / (us * 1e-6) / 1e9;
        std::printf(
            "{\"bench\":\"allreduce\",\"backend\":\"%s\",\"world\":%d,\"bytes\":%zu,"
            "\"iters\":%d,\"us\":%.2f,\"busbw_gbps\":%.3f}\n",
            argv[1], n, bytes, iters, us, busbw);
        std::fflush(stdout);
      }
      if (with_memcpy && pg->rank() == 0) {
        std::vector<char> src(bytes, 1), dst(bytes, 0);
        std::memcpy(dst.data(), src.data(), bytes);
        const double mus = time_us(iters, 3, [&] {
          std::memcpy(dst.data(), src.data(), bytes);
          asm volatile("" ::"r"(dst.data()) : "memory");
        });
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
