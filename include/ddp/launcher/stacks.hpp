#pragma once
// Worker stacks: what each rank's threads are doing now, as read by py-spy (Python frames) or
// eu-stack (native frames) (stack_capture.hpp), folded so that identical stacks print once
// with their rank list and the odd ones come first. `ddprun stacks` and the failure and hang
// reports print them (docs/ddprun.md, "My job is stuck").
//
// Contract: the parsers never throw on a tool's output: what they cannot read is left out and,
// when nothing is readable, the caller records the tool's own message as the rank's error.
// Folding compares function names and source positions, never addresses (ASLR differs per
// process), so ranks in the same code fold together.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::launcher {

struct StackFrame {
  std::string function;  // "all_reduce", "gloo::transport::tcp::Loop::run()", "??" unknown
  std::string file;      // Python: the file as py-spy shows it; native: "" or the module
  int line = 0;          // 0: none
};

struct ThreadStack {
  int64_t tid = 0;
  std::string name;                // "MainThread", a /proc comm name, "" unknown
  std::vector<StackFrame> frames;  // innermost first
};

// One rank's stacks, or why they could not be read.
struct RankStacks {
  int global_rank = 0;
  int64_t pid = 0;
  std::string host;
  std::string tool;  // "py-spy", "eu-stack"
  std::vector<ThreadStack> threads;
  std::string error;  // "" when read
  int64_t main_tid() const { return pid; }
};

// py-spy `dump --json` output (an array of threads with frames). Python threads only.
std::vector<ThreadStack> parse_py_spy_json(const std::string& text);

// eu-stack output ("TID 12:" then "#0  0x... function" lines). Thread names are not in it:
// the caller fills them (from /proc/<pid>/task/<tid>/comm).
std::vector<ThreadStack> parse_eu_stack(const std::string& text);

// Ranks sharing one stack (every thread the same, in tid order relative to the main thread);
// `sample` is the lowest rank's.
struct StackGroup {
  std::vector<int> ranks;
  RankStacks sample;
};

// Folds identical stacks. Groups with fewer ranks come first (the odd ones), ties by their
// lowest rank; ranks whose stacks could not be read form groups by error text, last.
std::vector<StackGroup> fold_stacks(const std::vector<RankStacks>& stacks);

// "ranks 0-2,5", "rank 3".
std::string rank_list_text(const std::vector<int>& ranks);

// Where a rank is, in one phrase: "all_reduce called from train.py:88" (the innermost frame
// and the innermost frame of the user's own code when they differ), "slow_rank at train.py:3",
// or "nanosleep" for native frames. Uses the main thread (tid == pid, else the first).
std::string where_text(const RankStacks& stacks);

// One line for a report: "ranks 0,2 were in all_reduce called from train.py:10; rank 1 was in
// slow_rank at train.py:3" (odd ranks first); "" when `stacks` is empty.
std::string stacks_summary(const std::vector<RankStacks>& stacks);

// The folded stacks as printable lines (no trailing newlines): per group a header
// "ranks 0,2 (2 of 3), pids ...: all_reduce called from train.py:10" then each thread
// "  thread 42 \"MainThread\":" with its frames indented below. `main_thread_only`: each
// group's main thread, and a count of the others (for the console; files get every thread).
std::vector<std::string> format_folded(const std::vector<RankStacks>& stacks,
                                       bool main_thread_only = false);

// JSON transport between agents and `ddprun stacks`: an array of RankStacks.
std::string encode_stacks(const std::vector<RankStacks>& stacks);
// Throws ddp::ProtocolError on malformed input.
std::vector<RankStacks> decode_stacks(const std::string& json_text);

}  // namespace ddp::launcher
