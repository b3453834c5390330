#include "checkpoint_dir.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/torch/snapshot/snapshot_file.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/remove_tree.hpp"

namespace ddp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step-";
constexpr const char* kStaging = ".saving-";

// The step of a staging directory's name (step-<digits>.saving-<digits>, and the same with
// ".old": a checkpoint being replaced on a file system without renameat2), or nullopt.
std::optional<int64_t> step_of_staging_name(const std::string& name) {
  const size_t dot = name.find(kStaging);
  if (dot == std::string::npos) return std::nullopt;
  std::string id = name.substr(dot + std::strlen(kStaging));
  if (id.size() > 4 && id.compare(id.size() - 4, 4, ".old") == 0) id.resize(id.size() - 4);
  if (id.empty() || id.size() > 18 || id.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return step_of_name(name.substr(0, dot));
}

bool is_moved_aside_name(const std::string& name) {
  return name.size() > 4 && name.compare(name.size() - 4, 4, ".old") == 0 &&
         step_of_staging_name(name).has_value();
}

// Checkpoints a replace on a file system without renameat2 moved aside (step-N.saving-ID.old)
// while step-N itself is absent: a kill came between the replace's two renames, so the moved
// one is still step N's checkpoint.
std::vector<StepDir> moved_aside_without_their_step(const std::string& dir) {
  std::vector<StepDir> r;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_moved_aside_name(name) || e.is_symlink(ec) || !e.is_directory(ec)) continue;
    const int64_t step = *step_of_staging_name(name);
    if (!fs::exists(step_dir(dir, step), ec)) r.push_back({step, e.path().string()});
  }
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string step_dir(const std::string& dir, int64_t step) {
  return fmt::format("{}/{}{:08d}", dir, kPrefix, step);
}

std::string staging_dir(const std::string& dir, int64_t step, int64_t save_id) {
  return fmt::format("{}{}{}", step_dir(dir, step), kStaging, save_id);
}

void publish(const std::string& staging, const std::string& final_path) {
  const std::string parent = fs::path(final_path).parent_path().string();
  std::error_code ec;
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) == 0) {
    ddp::fsync_directory(parent);
    return;
  }
  if (errno == EEXIST) {
    // Step saved before: the new checkpoint and the old swap places in one step; the old one,
    // now under the staging name, goes.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) ==
        0) {
      ddp::fsync_directory(parent);
      ddp::remove_tree(staging, ec);
      ddp::fsync_directory(parent);
      return;
    }
  }
  if (errno != EINVAL && errno != ENOSYS) {
    throw Error(fmt::format("checkpoint: cannot move {} to {}: {}", staging, final_path,
                            std::strerror(errno)));
  }
  // A file system without renameat2's flags (some network file systems).
  const std::string old = staging + ".old";
  if (fs::exists(final_path, ec) && ::rename(final_path.c_str(), old.c_str()) != 0) {
    throw Error(
        fmt::format("checkpoint: cannot move {} aside: {}", final_path, std::strerror(errno)));
  }
  if (::rename(staging.c_str(), final_path.c_str()) != 0) {
    throw Error(fmt::format("checkpoint: cannot move {} to {}: {}", staging, final_path,
                            std::strerror(errno)));
  }
  ddp::fsync_directory(parent);
  ddp::remove_tree(old, ec);
}

std::optional<int64_t> step_of_name(const std::string& name) {
  const size_t n = std::strlen(kPrefix);
  if (name.size() <= n || name.compare(0, n, kPrefix) != 0 || name.size() > n + 18) {
    return std::nullopt;
  }
  int64_t v = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<StepDir> step_dirs(const std::string& dir) {
  std::vector<StepDir> r;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (auto step = step_of_name(e.path().filename().string())) {
      r.push_back({*step, e.path().string()});
    }
  }
  std::sort(r.begin(), r.end(), [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  return r;
}

dcp::Metadata read_complete(const std::string& path) {
  const std::string md_path = path + "/.metadata";
  std::error_code ec;
  if (!fs::exists(md_path, ec)) {
    throw UsageError(fmt::format("{}: no .metadata (a save that did not finish)", path));
  }
  dcp::Metadata md = dcp::decode(read_file(md_path), md_path);
  std::map<std::string, int64_t> needed;  // file -> bytes its records need
  auto need = [&](const dcp::Storage& s) {
    auto& n = needed[s.relative_path];
    n = std::max(n, s.offset + s.length);
  };
  for (const auto& e : md.entries) {
    if (e.is_tensor) {
      for (const auto& c : e.chunks) need(c.storage);
    } else {
      need(e.bytes);
    }
  }
  for (const auto& [file, bytes] : needed) {
    const auto size = fs::file_size(path + "/" + file, ec);
    if (ec) throw UsageError(fmt::format("{}: {} is missing", path, file));
    if (static_cast<int64_t>(size) < bytes) {
      throw UsageError(fmt::format("{}: {} has {} bytes, its records need {} (truncated)", path,
                                   file, size, bytes));
    }
  }
  return md;
}

std::vector<StepDir> complete_step_dirs(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<StepDir> candidates = step_dirs(dir);
  for (auto& d : moved_aside_without_their_step(dir)) candidates.push_back(std::move(d));
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  std::vector<StepDir> r;
  for (auto& d : candidates) {
    try {
      read_complete(d.path);
      r.push_back(d);
    } catch (const UsageError& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return r;
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  // The snapshots' writer: a new temporary of a random name (never a file or link planted
  // under a fixed one), fsynced, renamed, the folder fsynced; removed on any failure.
  ddp::write_file_atomically(path, std::vector<char>(bytes.begin(), bytes.end()));
}

void remove_incomplete(const std::string& dir, std::optional<int64_t> below_step) {
  std::error_code ec;
  // A checkpoint a killed replace moved aside goes back under its step's name first (it is
  // that step's only copy); the staging sweep below would otherwise remove it.
  bool restored = false;
  for (const auto& d : moved_aside_without_their_step(dir)) {
    if (below_step && d.step >= *below_step) continue;
    try {
      read_complete(d.path);
    } catch (const UsageError&) {
      continue;
    }
    const std::string back = step_dir(dir, d.step);
    int rc = ::renameat2(AT_FDCWD, d.path.c_str(), AT_FDCWD, back.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
      rc = ::rename(d.path.c_str(), back.c_str());  // the step is still absent (listed so)
    }
    restored = restored || rc == 0;
  }
  if (restored) ddp::fsync_directory(dir);
  for (const auto& d : step_dirs(dir)) {
    if (below_step && d.step >= *below_step) continue;
    if (!fs::exists(d.path + "/.metadata", ec)) ddp::remove_tree(d.path, ec);
  }
  // Staging directories were never published, whatever they hold (a kill between the commit
  // and the rename leaves a complete one: the checkpoint before it stays the newest).
  std::vector<std::string> staging;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = step_of_staging_name(e.path().filename().string());
    if (!step || (below_step && *step >= *below_step)) continue;
    if (e.is_directory(ec) && !e.is_symlink(ec)) staging.push_back(e.path().string());
  }
  for (const auto& path : staging) ddp::remove_tree(path, ec);
}

void prune_complete(const std::string& dir, int keep) {
  std::error_code ec;
  const auto complete = complete_step_dirs(dir);
  for (size_t i = static_cast<size_t>(keep); i < complete.size(); ++i) {
    // .metadata first: a directory half removed by a kill is incomplete, never half complete.
    fs::remove(complete[i].path + "/.metadata", ec);
    ddp::remove_tree(complete[i].path, ec);
  }
}

}  // namespace ddp::checkpoint
