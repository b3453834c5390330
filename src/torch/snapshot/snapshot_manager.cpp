#include <c10/util/Exception.h>
#include <dirent.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/snapshot/snapshot.hpp"
#include "ddp/torch/snapshot/snapshot_file.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/rank_list.hpp"

namespace ddp {

namespace {

constexpr const char* kEpochTag = ".epoch-";

bool stat_file(const std::string& path, struct stat* st) {
  return ::stat(path.c_str(), st) == 0;
}

}  // namespace

SnapshotManager::SnapshotManager(SnapshotOptions options) : options_(std::move(options)) {
  if (options_.path_.empty()) throw UsageError("snapshot path is empty; pass e.g. snapshot.pt");
  if (options_.keep_ < 1) {
    throw UsageError(fmt::format("snapshot keep={} must be at least 1", options_.keep_));
  }
  const std::string& p = options_.path_;
  const auto slash = p.rfind('/');
  dir_ = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  if (base.empty()) throw UsageError("snapshot path " + p + " names a directory, not a file");
  const auto dot = base.rfind('.');
  stem_ = (dot == std::string::npos || dot == 0) ? base : base.substr(0, dot);
  ext_ = (dot == std::string::npos || dot == 0) ? "" : base.substr(dot);
}

bool SnapshotManager::is_series_file(const std::string& base) const {
  if (base == stem_ + ext_) return true;
  const std::string prefix = stem_ + kEpochTag;
  if (base.size() <= prefix.size() + ext_.size() || base.compare(0, prefix.size(), prefix) != 0 ||
      base.compare(base.size() - ext_.size(), ext_.size(), ext_) != 0) {
    return false;
  }
  const std::string digits = base.substr(prefix.size(), base.size() - prefix.size() - ext_.size());
  return !digits.empty() && digits.size() <= 12 &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void SnapshotManager::remove_stale_temporaries() const {
  // Left by a writer killed mid-write. Only this series' own temporaries (another series in
  // the same directory, e.g. model_best beside model, keeps its in-flight files), and only
  // those whose writer is gone: a live process (this one included) may still be writing.
  // Process ids are this host's: on a file system shared between nodes, a temporary left by
  // rank 0 of an earlier attempt on another node is removed once its pid is free here.
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const auto t = parse_temporary_name(e->d_name);
    if (!t || !is_series_file(t->target_base) || t->pid <= 0 || t->pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(t->pid), 0) == 0 || errno != ESRCH) continue;  // alive
    stale.push_back(dir_ + "/" + e->d_name);
  }
  ::closedir(d);
  for (const auto& path : stale) ::unlink(path.c_str());
}

std::string SnapshotManager::epoch_file(int64_t epochs_run) const {
  return fmt::format("{}/{}{}{:06d}{}", dir_, stem_, kEpochTag, epochs_run, ext_);
}

std::vector<std::pair<int64_t, std::string>> SnapshotManager::epoch_files() const {
  std::vector<std::pair<int64_t, std::string>> out;
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return out;
  const std::string prefix = stem_ + kEpochTag;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() + ext_.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - ext_.size(), ext_.size(), ext_) != 0) {
      continue;
    }
    const std::string digits =
        name.substr(prefix.size(), name.size() - prefix.size() - ext_.size());
    if (digits.empty() || digits.size() > 12 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    out.emplace_back(std::stoll(digits), dir_ + "/" + name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string SnapshotManager::save(const Snapshot& snapshot) {
  remove_stale_temporaries();
  const std::vector<char> bytes = encode_snapshot(snapshot);
  const std::string file = epoch_file(snapshot.epochs_run);
  write_file_atomically(file, bytes);

  // The main path becomes the newest snapshot: a hard link renamed into place (atomic), or a
  // second atomic write where the file system has no hard links. link(2) never replaces or
  // follows what is at the temporary's name; a collision just takes another name.
  std::string tmp;
  int link_errno = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp = temporary_path(options_.path_, "link");
    link_errno = ::link(file.c_str(), tmp.c_str()) == 0 ? 0 : errno;
    if (link_errno != EEXIST) break;
  }
  if (link_errno == 0) {
    if (::rename(tmp.c_str(), options_.path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw Error(
          fmt::format("cannot rename {} to {}: {}", tmp, options_.path_, std::strerror(err)));
    }
    fsync_directory(dir_);
  } else {
    write_file_atomically(options_.path_, bytes);
  }

  // Keep the newest `keep` epoch files. The one just written is among them unless older runs
  // left files with higher epochs, which stay: they are newer by the resume rule.
  const auto files = epoch_files();
  bool removed = false;
  for (size_t i = static_cast<size_t>(options_.keep_); i < files.size(); ++i) {
    if (files[i].second == file) continue;
    removed |= ::unlink(files[i].second.c_str()) == 0;
  }
  if (removed) fsync_directory(dir_);
  return file;
}

std::optional<ResumePoint> SnapshotManager::load_newest_valid(
    std::vector<std::string>* skipped_out) const {
  std::vector<std::string> skipped;
  // A snapshot that reads, verifies (or has no ddp checksum) and decodes; else a reason.
  auto try_load = [&](const std::string& path) -> std::optional<ResumePoint> {
    try {
      const std::vector<char> bytes = read_whole_file(path);
      std::string detail;
      const ChecksumStatus status = verify_zip_checksum(bytes, &detail);
      if (status == ChecksumStatus::kMismatch || status == ChecksumStatus::kNotZip) {
        skipped.push_back(path + ": " + detail);
        return std::nullopt;
      }
      return ResumePoint{
          decode_snapshot(bytes, path), path, detail, sha256_hex(bytes.data(), bytes.size()), {}};
    } catch (const Error& e) {
      skipped.push_back(path + ": " + e.what());
      return std::nullopt;
    } catch (const c10::Error& e) {  // LibTorch rejecting a decoded value
      skipped.push_back(path + ": " + e.what_without_backtrace());
      return std::nullopt;
    }
  };

  // Epoch files newest first; the first good one wins among them.
  std::optional<ResumePoint> best;
  std::vector<std::pair<uint64_t, uint64_t>> inodes;
  for (const auto& [epoch, path] : epoch_files()) {
    struct stat st {};
    if (stat_file(path, &st)) inodes.emplace_back(st.st_dev, st.st_ino);
    if (!best) best = try_load(path);
  }
  // The main path, when it is a file of its own (not a link to an epoch file, e.g. written by
  // a Python trainer), competes by the epoch recorded inside.
  struct stat main_st {};
  if (stat_file(options_.path_, &main_st) &&
      std::find(inodes.begin(), inodes.end(),
                std::pair<uint64_t, uint64_t>(main_st.st_dev, main_st.st_ino)) == inodes.end()) {
    auto main = try_load(options_.path_);
    if (main && (!best || main->snapshot.epochs_run > best->snapshot.epochs_run)) {
      best = std::move(main);
    }
  }
  if (best) best->skipped = skipped;
  if (skipped_out) *skipped_out = skipped;
  return best;
}

namespace {

// One rank's answer in the exchange: epochs_run (-1: no snapshot) and the file's SHA-256.
constexpr size_t kDigestBytes = 32;
constexpr size_t kRecordBytes = 8 + kDigestBytes;

std::string hex_of(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

}  // namespace

std::optional<ResumePoint> SnapshotManager::load_agreed(ProcessGroup& pg) const {
  std::optional<ResumePoint> mine = load_newest_valid();
  // An all-gather made of one all-reduce (sum): each rank fills its own row of a zeroed
  // [world, 5] int64 table with epochs_run (-1: none) and the 32 digest bytes.
  const int world = pg.size();
  auto table = torch::zeros({world, 1 + static_cast<int64_t>(kDigestBytes / 8)}, torch::kInt64);
  {
    uint8_t row[kRecordBytes] = {};
    const int64_t epochs = mine ? mine->snapshot.epochs_run : -1;
    std::memcpy(row, &epochs, 8);
    for (size_t i = 0; mine && i < kDigestBytes; ++i) {
      row[8 + i] = static_cast<uint8_t>(std::stoi(mine->sha256.substr(2 * i, 2), nullptr, 16));
    }
    std::memcpy(table[pg.rank()].data_ptr<int64_t>(), row, kRecordBytes);
  }
  table = table.to(comm_device(pg));
  auto work = all_reduce(pg, table);
  wait_on_current_stream(pg, *work, pg.timeout());
  const torch::Tensor all = table.cpu().contiguous();
  const auto* bytes = reinterpret_cast<const uint8_t*>(all.data_ptr<int64_t>());

  // Ranks grouped by what they hold, in order of their lowest rank.
  std::map<std::string, std::vector<int>> holders;
  std::vector<std::string> order;
  std::map<std::string, std::string> describe;
  int64_t newest_epochs = -1;
  int newest_rank = 0;  // the lowest rank holding the newest snapshot
  for (int r = 0; r < world; ++r) {
    const uint8_t* rec = bytes + static_cast<size_t>(r) * kRecordBytes;
    int64_t epochs = 0;
    std::memcpy(&epochs, rec, 8);  // -1: none
    const std::string key = hex_of(rec, kRecordBytes);
    if (!holders.count(key)) {
      order.push_back(key);
      describe[key] = epochs < 0 ? std::string("no snapshot")
                                 : fmt::format("the snapshot at epoch {} (sha256 {}...)", epochs,
                                               hex_of(rec + 8, 6));
    }
    holders[key].push_back(r);
    if (epochs > newest_epochs) {
      newest_epochs = epochs;
      newest_rank = r;
    }
  }
  if (order.size() == 1) return mine;

  std::error_code ec;  // the directory as an absolute path: "." would tell the user nothing
  std::string absolute_dir = std::filesystem::absolute(dir_, ec).lexically_normal().string();
  if (ec || absolute_dir.empty()) absolute_dir = dir_;
  if (absolute_dir.size() > 1 && absolute_dir.back() == '/') absolute_dir.pop_back();
  std::string who;
  for (const auto& key : order) {
    const auto& ranks = holders[key];
    who += fmt::format("{}{} {} {}", who.empty() ? "" : "; ", ranks.size() == 1 ? "rank" : "ranks",
                       format_rank_list(ranks),
                       ranks.size() == 1 ? "has " + describe[key] : "have " + describe[key]);
  }
  throw UsageError(fmt::format(
      "snapshot resume: the ranks would resume from different snapshots of {}: {}. This rank ({}) "
      "read {}. Every rank must resume from the same snapshot, or parameters and epochs drift "
      "apart and the ranks hang. Put the snapshot path on a file system every node shares, or "
      "copy the snapshot directory ({} on this node) from rank {}'s node to every node before "
      "starting (or remove it everywhere to start afresh)",
      options_.path_, who, pg.rank(), mine ? mine->path : std::string("no snapshot file"),
      absolute_dir, newest_rank));
}

}  // namespace ddp
