#pragma once
// PyTorch workers' progress for ddprun's hang watchdog (--hang-timeout), read from PyTorch's own
// flight recorder. PyTorch 2.13 keeps that recorder in the worker's memory (TORCH_FR_BUFFER_SIZE
// turns it on; its gloo backend writes no dump on a timeout), so ddprun gives Python workers a
// small startup hook: a `sitecustomize` module, written into ddprun's run folder and put first
// on PYTHONPATH (the user's own sitecustomize still runs: the hook imports it next). Once
// torch.distributed is initialised, a daemon thread of the hook reads the recorder every
// DDPRUN_PROGRESS_INTERVAL_S (default 1 s; it never imports torch itself) and writes
//   <attempt dir>/progress.rank<R>.json   {"completed": N, "enqueued": M, "open_op": ...,
//                                          "open_seq": S, "open_since_us": T, "pid": P}
// and, when ddprun creates <attempt dir>/torch_fr.request (a hang or a failure), the whole
// recorder as <attempt dir>/torch_fr.rank<R>.json, which `ddprun trace` reads beside ddp's
// own dumps (hang_report.hpp). Writes are atomic (temporary file, rename). Workers on ddp's own
// process groups (C++, or Python on the `ddp` backend) write the same record from ddp's
// recorder to progress.rank<R>.ddp.json, with no hook (src/comm/progress_report.hpp).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

// Writes ROOT/python_hook/sitecustomize.py (the hook) and returns that directory. Throws
// ddp::Error naming the path when it cannot be written.
std::string write_python_hook(const std::string& root);

// The worker environment for the hook: PYTHONPATH gets `hook_dir` first, DDPRUN_PROGRESS_DIR is
// the attempt folder, and PyTorch's recorder is turned on (TORCH_FR_BUFFER_SIZE=2000) unless
// the user set TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE.
void add_torch_progress_env(std::vector<std::string>& env, const std::string& hook_dir,
                            const std::string& attempt_dir);

// One rank's last progress record.
struct RankProgress {
  int global_rank = 0;
  int64_t pid = 0;
  int64_t completed = 0;  // collectives completed, summed over its process groups
  int64_t enqueued = 0;   // collectives issued
  std::string open_op;    // the oldest issued, not completed one: "gloo:all_reduce"
  int64_t open_seq = 0;
  int64_t open_since_us = 0;  // Unix time it was issued; 0 when none is open
};

// Parses a progress.rank<R>.json; nullopt when malformed.
std::optional<RankProgress> parse_progress(const std::string& json_text);

// One rank's progress over PyTorch's and ddp's recorders: counts added, the older open
// operation kept.
RankProgress merge_progress(const RankProgress& a, const RankProgress& b);

// Reads <attempt_dir>/progress.rank<R>.json (the Python hook: PyTorch's recorder) and
// progress.rank<R>.ddp.json (ddp's own process groups, src/comm/progress_report.hpp) and
// merges what is there; nullopt when neither is readable.
std::optional<RankProgress> read_progress(const std::string& attempt_dir, int global_rank);

}  // namespace ddp::launcher
