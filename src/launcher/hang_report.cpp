// The hang report after a failed attempt (hang_report_for_directory), `ddprun trace`, and the
// state of a rank's process as the report names it. The analysis: hang_analysis.cpp; reading
// dumps: flight_dumps.cpp; the multi-node share: hang_report_nodes.cpp.
#include "ddp/launcher/hang_report.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ddp/launcher/kill_cause.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace fs = std::filesystem;

std::vector<std::string> hang_report_for_directory(const std::string& dir,
                                                   const std::vector<RankProcess>& processes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  try {
    return analyze_hang(read_flight_dumps({dir}), processes);
  } catch (const UsageError& e) {
    const std::string what = e.what();
    if (what.find("no flight recorder dumps") != std::string::npos) return {};
    return {"hang report: could not read the flight recorder dumps: " + what};
  } catch (const std::exception& e) {
    return {std::string("hang report: could not read the flight recorder dumps: ") + e.what()};
  }
}

RankProcess::State process_state(int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  std::getline(in, stat);
  return process_state_from_stat(in ? stat : std::string());
}

RankProcess::State process_state_from_stat(const std::string& stat) {
  switch (stat_state(stat)) {
    case 'T':
    case 't':
      return RankProcess::State::kStopped;
    case 'D':
      return RankProcess::State::kUninterruptible;
    case 'Z':
    case 'X':
    case 0:
      return RankProcess::State::kExited;
    default:
      return RankProcess::State::kRunning;
  }
}

int run_trace_command(const std::vector<std::string>& paths) {
  for (const auto& line : analyze_hang(read_flight_dumps(paths))) {
    std::printf("ddprun: %s\n", line.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace ddp::launcher
