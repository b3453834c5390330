#pragma once
// Live progress of this process's ddp process groups for ddprun's hang watchdog (internal
// header; ddprun's side: include/ddp/launcher/torch_progress.hpp).
//
// ddprun --hang-timeout gives every worker DDPRUN_PROGRESS_DIR (the attempt folder). When it is
// set, the first flight recorder of the process starts one thread that, every
// DDPRUN_PROGRESS_INTERVAL_S (default 1 s, as the Python hook), sums the registered recorders
// and writes (temporary file, rename)
//   <DDPRUN_PROGRESS_DIR>/progress.rank<RANK>.ddp.json
//     {"rank": R, "pid": P, "completed": N, "enqueued": M, "open_op": "cpu:all_reduce",
//      "open_seq": S, "open_since_us": T}
// completed: operations (collectives and point-to-point) completed, over every group of the
// process; enqueued: operations issued; open_*: the oldest issued, not yet ended one (when it
// was issued, Unix microseconds; 0 and "" when none is open). The Python hook writes the same
// fields from PyTorch's recorder to progress.rank<R>.json; ddprun adds the two.
//
// Without DDPRUN_PROGRESS_DIR nothing starts and registration costs one mutex section per
// group. The thread and the registry live until the process exits (never destroyed: a group
// destroyed during static destruction must still find the registry).

namespace ddp {
class FlightRecorder;
}

namespace ddp::detail {

// Called by FlightRecorder's constructor and destructor (enabled recorders only).
void register_progress_source(const FlightRecorder* recorder);
void unregister_progress_source(const FlightRecorder* recorder);

}  // namespace ddp::detail
