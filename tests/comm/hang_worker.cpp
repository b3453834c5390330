// hang_worker: one rank of the flight recorder tests, run under ddprun. Every rank issues
// float32 sum all_reduces of 256 elements (call tag "iter=<i>"), then a barrier.
//
//   hang_worker <backend> stall RANK AFTER     RANK stops after collective #AFTER and sleeps
//   hang_worker <backend> mismatch RANK AT     RANK calls broadcast at collective #AT
//   hang_worker <backend> exit RANK AFTER      RANK exits 0 after collective #AFTER (no dump)
//   hang_worker <backend> kill RANK AFTER      RANK dies by SIGKILL after collective #AFTER
//   hang_worker <backend> sigstop RANK AFTER   RANK stops itself (SIGSTOP) after #AFTER: alive
//                                              but frozen, until ddprun's SIGCONT
//
// The group timeout is HANG_WORKER_TIMEOUT_MS (default 3000). Exit 0 on success, 1 with
// "rank R: error" on stderr when a collective fails.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/init.hpp"

using namespace ddp;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: hang_worker <backend> stall|mismatch|exit|kill|sigstop RANK N\n");
    return 2;
  }
  const std::string mode = argv[2];
  const int who = std::atoi(argv[3]);
  const int at = std::atoi(argv[4]);
  const char* rank_env = std::getenv("RANK");
  try {
    InitOptions o;
    o.backend = argv[1];
    const char* t = std::getenv("HANG_WORKER_TIMEOUT_MS");
    o.timeout = std::chrono::milliseconds(t ? std::atoi(t) : 3000);
    auto pg = init_process_group(o);
    std::vector<float> buf(256, 1.0f);
    for (int i = 1; i <= 20; ++i) {
      pg->set_call_tag("iter=" + std::to_string(i));
      if (mode == "stall" && pg->rank() == who && i == at + 1) {
        std::this_thread::sleep_for(std::chrono::seconds(60));  // ddprun stops us first
        return 3;
      }
      if (mode == "exit" && pg->rank() == who && i == at + 1) std::_Exit(0);
      if (mode == "kill" && pg->rank() == who && i == at + 1) ::raise(SIGKILL);
      if (mode == "sigstop" && pg->rank() == who && i == at + 1) {
        ::raise(SIGSTOP);
        std::this_thread::sleep_for(std::chrono::seconds(60));  // continued only to be stopped
        return 3;
      }
      if (mode == "mismatch" && pg->rank() == who && i == at) {
        pg->broadcast(buf.data(), buf.size(), DataType::kFloat32, 0)->wait(pg->timeout());
      } else {
        pg->all_reduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)
            ->wait(pg->timeout());
      }
    }
    pg->barrier()->wait(pg->timeout());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %s: %s\n", rank_env ? rank_env : "?", e.what());
    return 1;
  }
  return 0;
}
