#pragma once
// Which of a worker's standard streams go to log files only (--redirects) or to log files and
// the console (--tee), in torchrun's syntax: one digit for every local rank ("3"), or a
// per-rank map ("0:1,1:2"). Digits: 0 none, 1 stdout, 2 stderr, 3 both.

#include <map>
#include <string>

namespace ddp::launcher {

enum class Std : int { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

inline bool includes_stdout(Std s) {
  return (static_cast<int>(s) & 1) != 0;
}
inline bool includes_stderr(Std s) {
  return (static_cast<int>(s) & 2) != 0;
}

// A parsed -r/-t value. Ranks absent from a map get kNone, like torchrun.
struct StdSpec {
  Std all = Std::kNone;         // used when per_rank is empty
  std::map<int, Std> per_rank;  // local rank -> streams, when given as a map

  Std for_local_rank(int local_rank) const;
};

// Parses "N" or "R:N,R:N,...". `flag` names the flag in the UsageError thrown on bad input,
// e.g. "--tee: 'x' is not 0-3 or a map like 0:1,1:2".
StdSpec parse_std_spec(const std::string& text, const std::string& flag);

}  // namespace ddp::launcher
