// A C++ worker on ddp's own process group for the --hang-timeout test (issue 28): every rank
// all-reduces 5 times; then rank HANG_RANK (argv[1]) sleeps in wait_forever() while the others
// wait in the 6th all_reduce. ddp's recorder reports the progress (no Python hook involved);
// ddprun must end the job and name HANG_RANK. argv[2]: the backend (cpu or gloo). argv[3]
// "exit": HANG_RANK exits with code 7 instead (its peers' all_reduce then fails).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddp/comm/init.hpp"

namespace {

// Named so the report's stack line can be checked.
[[gnu::noinline]] void wait_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: collective_hang_worker HANG_RANK BACKEND [exit]\n");
    return 2;
  }
  const int hang_rank = std::atoi(argv[1]);
  ddp::InitOptions options;
  options.backend = argv[2];
  auto pg = ddp::init_process_group(options);
  float x = 1.0f;
  for (int i = 0; i < 5; ++i) {
    pg->all_reduce(&x, 1, ddp::DataType::kFloat32, ddp::ReduceOp::kSum)->wait(pg->timeout());
  }
  std::printf("rank %d: 5 all_reduces done\n", pg->rank());
  std::fflush(stdout);
  if (pg->rank() == hang_rank) {
    if (argc > 3 && std::string(argv[3]) == "exit") std::_Exit(7);
    wait_forever();
  }
  pg->all_reduce(&x, 1, ddp::DataType::kFloat32, ddp::ReduceOp::kSum)->wait(pg->timeout());
  return 0;
}
