#include "ddp/launcher/root_cause.hpp"

#include <fmt/format.h>

#include <ctime>

namespace ddp::launcher {

namespace {

std::string format_time(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %z", &tm);
  return buf;
}

void indent_into(std::string& out, const std::string& text, const char* indent) {
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string::npos ? text.size() : nl;
    out += indent;
    out.append(text, start, end - start);
    out += '\n';
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
}

// "killed by SIGKILL from outside (...)", "killed by the kernel's out-of-memory killer ...";
// "" when ddprun has nothing to add to the exit status.
std::string cause_text(const WorkerFailure& f) {
  const std::string& t = f.kill.text;
  return t.rfind("was ", 0) == 0 ? t.substr(4) : t;
}

std::string cause_suffix(const WorkerFailure& f) {
  return f.kill.text.empty() ? "" : "; " + cause_text(f);
}

}  // namespace

std::string describe_failure(const WorkerFailure& f) {
  const std::string who =
      fmt::format("rank {} (local rank {}, pid {})", f.global_rank, f.local_rank, f.pid);
  if (f.kill.cause == KillCause::kOutOfMemory) return who + " " + f.kill.text;
  return fmt::format("{} failed: {}{}", who, f.status.describe(), cause_suffix(f));
}

std::string format_failure_report(const FailureReport& r) {
  const WorkerFailure& f = r.root_cause;
  std::string out;
  out += "========================================================\n";
  out += fmt::format("ddprun: worker group '{}' FAILED (run id {}, {} of {} restarts used)\n",
                     r.role, r.run_id, r.restart_count, r.max_restarts);
  out += "Root cause (first failure):\n";
  out += fmt::format("  rank:       {} (local rank {})\n", f.global_rank, f.local_rank);
  out += fmt::format("  host:       {}\n", f.host);
  out += fmt::format("  pid:        {}\n", f.pid);
  out += fmt::format("  exit:       {}\n", f.status.describe());
  if (!f.kill.text.empty()) out += fmt::format("  cause:      {}\n", cause_text(f));
  out += fmt::format("  time:       {}\n", format_time(f.time));
  if (f.error) {
    out += fmt::format("  error file: {}\n", f.error_file);
    out += fmt::format("  message:    {}\n", f.error->message);
    if (!f.error->traceback.empty()) {
      out += "  traceback:\n";
      indent_into(out, f.error->traceback, "    ");
    }
  } else {
    out +=
        "  error file: <none written> (a Python worker can write one with "
        "torch.distributed.elastic.multiprocessing.errors.record)\n";
  }
  if (f.stderr_tail.empty()) {
    out += "  stderr:     <empty>\n";
  } else {
    out += fmt::format("  stderr (last {} lines):\n", f.stderr_tail.size());
    for (const auto& line : f.stderr_tail) {
      out += "    ";
      out += line;
      out += '\n';
    }
  }
  std::string failed, stopped;
  for (const auto& o : r.others) {
    std::string item = fmt::format("  rank {} (local rank {}, pid {}): {}{}\n", o.global_rank,
                                   o.local_rank, o.pid, o.status.describe(), cause_suffix(o));
    (o.stopped_by_launcher ? stopped : failed) += item;
  }
  if (!failed.empty()) out += "Other failures:\n" + failed;
  if (!stopped.empty()) out += "Stopped by ddprun after the root cause:\n" + stopped;
  if (!r.stacks_summary.empty()) {
    out += "Where the running workers were when ddprun stopped them:\n";
    out += "  " + r.stacks_summary + "\n";
    if (!r.stacks_file.empty() && r.stacks_file_kept) {
      out += "  every stack: " + r.stacks_file + "\n";
    } else if (!r.stacks_file.empty()) {
      out +=
          "  every stack: not kept (ddprun's temporary run folder is removed at exit); rerun "
          "with --log-dir DIR to keep every thread's stack in DIR/<run id>/attempt_<n>/\n";
    }
  }
  out += "========================================================\n";
  return out;
}

}  // namespace ddp::launcher
