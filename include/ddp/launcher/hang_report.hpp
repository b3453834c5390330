#pragma once
// Hang report: reads the flight recorder dumps the process groups write when a collective times
// out or fails (include/ddp/comm/flight_recorder.hpp) and says why the job hung: a rank behind
// the others, two ranks calling different collectives at one sequence number, a rank that died
// (no dump), or ranks all stuck in one collective. `ddprun trace FILES...` prints it.
//
// Contract: parsing errors throw UsageError naming the file; the analysis never throws on
// well-formed dumps, whatever their content (empty records, a single rank, several groups).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launcher {

struct FlightEntry {
  uint64_t seq = 0;
  std::string op;     // "all_reduce", ...
  std::string dtype;  // "float32", ...
  uint64_t count = 0;
  std::string reduce_op;  // "" when the op has none
  int root = -1;
  std::string state;                                    // queued, started, completed, failed
  int64_t queued_us = 0, started_us = 0, ended_us = 0;  // Unix time; 0 = not reached
  std::string tag, error;
};

struct FlightDump {
  std::string path;  // where it was read from ("" for hand-made records)
  std::string group = "default_pg/0/";
  std::string backend;
  int rank = 0;         // rank in the group
  int global_rank = 0;  // rank in the default group
  int group_size = 1;
  std::vector<int> global_ranks;  // empty: same as group ranks
  int64_t pid = 0;
  std::string host, reason;
  int64_t dumped_at_us = 0;
  uint64_t recorded = 0;             // collectives recorded in total (the ring keeps the last ones)
  std::vector<FlightEntry> entries;  // oldest first
};

// What the launcher saw of a rank's process when the attempt failed (the first worker failure),
// before it stopped the others. The dumps cannot tell a rank that died from one that is frozen:
// neither writes a record (a SIGSTOPped process cannot run its watcher). The agent can.
struct RankProcess {
  enum class State {
    kRunning,          // alive, scheduled normally (running or sleeping)
    kStopped,          // alive but stopped (SIGSTOP, SIGTSTP, a debugger): state T or t in /proc
    kExited,           // gone before the failure was seen (or is the failure)
    kUninterruptible,  // alive in uninterruptible sleep (state D): unkillable until the kernel
                       // call returns
  };
  int global_rank = 0;
  int64_t pid = 0;
  std::string host;
  State state = State::kRunning;
  std::string exit;   // kExited: "exited with code 0", "was killed by SIGKILL"
  std::string wchan;  // kUninterruptible: the kernel function it waits in ("" unknown)
  int64_t at_us = 0;  // kExited: when it exited; else when it was observed (Unix time)
};

// Parses one dump (the JSON written by FlightRecorder::dump_json). `path` names it in errors.
FlightDump parse_flight_dump(const std::string& json_text, const std::string& path);

// Reads the dumps among `paths`: files, or directories searched recursively for
// flight_recorder.*.json. Throws UsageError when a path is missing or nothing is found.
// PyTorch's own flight recorder, as ddprun's Python hook writes it (torch_progress.hpp:
// {"format": "torch-flight-recorder", "rank", "pid", "host", "dumped_at_us", "trace": the JSON of
// torch's _dump_fr_trace_json}): one FlightDump per process group, group "torch:<pg name>",
// collectives by their collective_seq_id, op without the backend prefix ("gloo:all_reduce" ->
// "all_reduce"), "completed" up to the group's last_completed_collective and "started" after.
// Throws UsageError naming the file when it is not such a dump.
std::vector<FlightDump> parse_torch_flight_dump(const std::string& json_text,
                                                const std::string& path);

std::vector<FlightDump> read_flight_dumps(const std::vector<std::string>& paths);

// The analysis, one line each. The first line starts with "hang report: " and names the most
// likely cause; the next lines give the other findings and one line per rank. `processes`
// (from the launcher; empty offline) turns "wrote no record" into "died" or "is frozen".
std::vector<std::string> analyze_hang(const std::vector<FlightDump>& dumps,
                                      const std::vector<RankProcess>& processes = {});

// What ddprun prints after a failed attempt: the analysis of the dumps in `dir` (searched
// recursively), or nothing when there are none. Never throws: an unreadable dump becomes a
// line saying so.
std::vector<std::string> hang_report_for_directory(const std::string& dir,
                                                   const std::vector<RankProcess>& processes = {});

// Multi-node: one node's share of the report, published through the rendezvous store so the
// report on every node covers the whole job. encode_node_records packs the dumps found in
// `dir` (each cut to its last kSharedEntries entries, paths prefixed "HOST:") and `processes`
// into one JSON text; "" when `dir` holds no dump and `processes` is empty.
inline constexpr size_t kSharedEntries = 400;
std::string encode_node_records(const std::string& dir, const std::vector<RankProcess>& processes,
                                const std::string& host);
// The analysis of every node's share (encode_node_records texts; "" entries are skipped, a
// dump seen twice, from a log dir the nodes share, counts once). Empty when no node had a dump.
// Never throws: a malformed share becomes a line saying so.
std::vector<std::string> hang_report_for_nodes(const std::vector<std::string>& node_records);

// Reads the state of a live process from /proc/<pid>/stat (kRunning, kStopped or
// kUninterruptible); kExited when it is gone or a zombie.
RankProcess::State process_state(int64_t pid);
// The same from the text of a /proc/<pid>/stat line ("" or malformed: kExited).
RankProcess::State process_state_from_stat(const std::string& proc_pid_stat);

// `ddprun trace FILES...`: reads, analyses and prints each line prefixed "ddprun: " on stdout.
// Returns the exit code (0; UsageError propagates for bad input).
int run_trace_command(const std::vector<std::string>& paths);

}  // namespace ddp::launcher
