#include "ddp/launcher/run_directory.hpp"

#include <fmt/format.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"

namespace ddp::launcher {

namespace fs = std::filesystem;

namespace {

// "" when `dir` is a folder of this user that no one else may write into; otherwise what it is
// instead. Another user who can write into a run folder can plant what the workers run (a
// usercustomize.py beside the --hang-timeout hook on their PYTHONPATH) or links that ddprun's
// log files would be written through (issue 49, finding 1).
std::string run_folder_problem(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    return fmt::format("cannot be read: {}", std::strerror(errno));
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "is not a folder";
  if (st.st_uid != ::geteuid()) {
    return fmt::format("belongs to uid {}, not to you (uid {})", st.st_uid, ::geteuid());
  }
  if ((st.st_mode & 022) != 0) {
    return fmt::format("has mode {:04o}: other users can write into it", st.st_mode & 07777);
  }
  return "";
}

}  // namespace

RunDirectory::RunDirectory(const std::optional<std::string>& log_dir, const std::string& run_id) {
  if (log_dir) {
    persistent_ = true;
    root_ = (fs::path(*log_dir) / run_id).string();
    std::error_code ec;
    fs::create_directories(fs::path(root_).parent_path(), ec);
    if (ec || (::mkdir(root_.c_str(), 0700) != 0 && errno != EEXIST)) {
      throw UsageError(fmt::format("--log-dir: cannot create {}: {}; choose a writable directory",
                                   root_, ec ? ec.message() : std::strerror(errno)));
    }
    if (const std::string problem = run_folder_problem(root_); !problem.empty()) {
      throw UsageError(fmt::format(
          "--log-dir: the run folder {} {}, so another user could place files there that the "
          "workers would run or that ddprun would write through; use a --log-dir of your own, "
          "or a --run-id whose folder does not exist yet (ddprun creates it private)",
          root_, problem));
    }
    return;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = fmt::format("{}/ddprun-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(
        fmt::format("cannot create a temporary directory {}: {}; set TMPDIR to a "
                    "writable directory or pass --log-dir",
                    pattern, std::strerror(errno)));
  }
  root_ = pattern;
}

RunDirectory::~RunDirectory() {
  remove_temporary();
}

void RunDirectory::remove_temporary() noexcept {
  if (persistent_ || root_.empty()) return;
  std::error_code ec;
  ddp::remove_tree(root_, ec);  // best effort: nothing sensible to do on failure at exit
}

std::string RunDirectory::rank_dir(int attempt, int global_rank) const {
  fs::path dir = fs::path(root_) / fmt::format("attempt_{}", attempt) / std::to_string(global_rank);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(fmt::format("cannot create log directory {}: {}", dir.string(), ec.message()));
  return dir.string();
}

}  // namespace ddp::launcher
