#pragma once
// Where per-attempt, per-rank files live:
//   ROOT/attempt_<n>/<global rank>/{stdout.log, stderr.log, error.json}
// With a log dir, ROOT = <log dir>/<run id> and is kept (a reused run id overwrites its
// files). Without one, ROOT is a fresh temporary directory removed when this object dies.
// Global ranks (not local ones) name the rank folders so several nodes can share one log dir.

#include <optional>
#include <string>

namespace ddp::launcher {

class RunDirectory {
 public:
  // Throws ddp::UsageError naming the directory when it cannot be created.
  RunDirectory(const std::optional<std::string>& log_dir, const std::string& run_id);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& root() const { return root_; }
  bool persistent() const { return persistent_; }

  // Creates (if needed) and returns ROOT/attempt_<attempt>/<rank>.
  std::string rank_dir(int attempt, int global_rank) const;

  // Removes a temporary ROOT now, for exits that skip destructors (std::_Exit); a persistent
  // one (--log-dir) is kept. Best effort, never throws.
  void remove_temporary() noexcept;

 private:
  std::string root_;
  bool persistent_ = false;
};

}  // namespace ddp::launcher
