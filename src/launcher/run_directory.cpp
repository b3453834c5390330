#include "ddp/launcher/run_directory.hpp"

#include <fmt/format.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"

namespace ddp::launcher {

namespace fs = std::filesystem;

RunDirectory::RunDirectory(const std::optional<std::string>& log_dir, const std::string& run_id) {
  if (log_dir) {
    persistent_ = true;
    root_ = (fs::path(*log_dir) / run_id).string();
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec) {
      throw UsageError(fmt::format("--log-dir: cannot create {}: {}; choose a writable directory",
                                   root_, ec.message()));
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
