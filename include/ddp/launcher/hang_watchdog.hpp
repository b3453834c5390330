#pragma once
// ddprun's no-progress watchdog (--hang-timeout SECONDS, off by default): ends a job whose
// collectives stopped completing, long before the process groups' own timeouts (PyTorch: 10 to
// 30 minutes). Progress is a completed collective, as the workers report it
// (torch_progress.hpp: PyTorch's flight recorder, read by ddprun's Python hook).
//
// It fires when both hold for at least the timeout:
// - no rank reported a completed collective (the sum of the ranks' counts did not change), and
// - some rank has been waiting in an issued, uncompleted collective.
// So a long phase without collectives (evaluation, a checkpoint write) is not a hang, however
// long, while one rank that never reaches a collective the others wait in is.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/torch_progress.hpp"

namespace ddp::launcher {

class HangWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  explicit HangWatchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // Feeds the ranks' latest records (`ranks`: every rank of this node, with or without a
  // record) seen at `now` (`now_unix_us` in Unix time). Returns the verdict once it fires: "no
  // collective completed for 15.2 s (--hang-timeout 15): ranks 0,2 wait in gloo:all_reduce #2
  // since 15.2 s; rank 1 is in no collective (last completed: 1)".
  std::optional<std::string> observe(const std::vector<int>& ranks,
                                     const std::vector<RankProgress>& records,
                                     Clock::time_point now, int64_t now_unix_us);

  // Ranks named as waiting / as in no collective by the last verdict.
  const std::vector<int>& waiting() const { return waiting_; }
  const std::vector<int>& idle() const { return idle_; }

 private:
  std::chrono::milliseconds timeout_;
  int64_t last_total_ = -1;
  Clock::time_point last_change_{};
  std::vector<int> waiting_, idle_;
};

}  // namespace ddp::launcher
