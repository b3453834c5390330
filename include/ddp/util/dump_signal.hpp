#pragma once
// The signal with which ddprun asks a worker's process groups to write their flight recorder
// record now (a rank died, so the survivors never reach a timeout that would make them dump).
//
// Contract: SIGRTMIN + 6, a real-time signal no common runtime claims (SIGUSR1/SIGUSR2 are
// the jobs' own, for preemption). A ddp process group with a recorder installs its handler
// only when the signal's disposition is still the default, and ddprun sends it only to a
// process whose /proc/<pid>/status shows it caught (SigCgt): a program that is not a ddp
// worker, whose default action for it would be to terminate, never receives it.

#include <signal.h>

namespace ddp {

inline int flight_recorder_dump_signal() {
  return SIGRTMIN + 6;
}

}  // namespace ddp
