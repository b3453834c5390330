#include "shard_io.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "checkpoint_dir.hpp"
#include "ddp/torch/snapshot/snapshot_file.hpp"
#include "ddp/torch/snapshot/torch_save.hpp"
#include "ddp/util/error.hpp"

namespace ddp::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string report_path(const std::string& step_path, int rank) {
  return fmt::format("{}/__{}.ddp-shard", step_path, rank);
}

// Appends to a new temporary beside `path` (exclusive, random name, never through a link),
// counting the bytes written; sync_and_close renames it over `path`. A shard being rewritten
// (the same step saved twice) is replaced whole or not at all: a kill meanwhile leaves the
// complete old one. A ShardFile destroyed before that removes its temporary.
class ShardFile {
 public:
  explicit ShardFile(std::string path)
      : path_(std::move(path)), fd_(ddp::create_temporary(path_, &tmp_)) {}
  ~ShardFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  size_t write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, p + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw Error(fmt::format("cannot write {} (after {} bytes): {}", tmp_, offset_ + done,
                                std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    offset_ += static_cast<int64_t>(size);
    return size;
  }
  void sync_and_close() {
    if (::fsync(fd_) != 0) {
      throw Error(fmt::format("cannot sync {}: {}", tmp_, std::strerror(errno)));  // ~: unlinks
    }
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      throw Error(fmt::format("cannot rename {} to {}: {}", tmp_, path_, std::strerror(err)));
    }
  }
  int64_t offset() const { return offset_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int64_t offset_ = 0;
};

std::string read_shard_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

void write_shard(const std::string& step_path, int rank, const std::vector<Item>& items) {
  std::error_code ec;
  fs::create_directories(step_path, ec);
  if (ec) throw Error(fmt::format("cannot create {}: {}", step_path, ec.message()));
  fs::remove(report_path(step_path, rank), ec);

  const std::string file = fmt::format("__{}_0.distcp", rank);
  ShardFile out(step_path + "/" + file);
  dcp::Metadata part;
  for (const auto& item : items) {
    dcp::Storage s;
    s.relative_path = file;
    s.offset = out.offset();
    write_torch_save(item.tensor.defined() ? c10::IValue(item.tensor) : item.value,
                     [&](const void* data, size_t n) { return out.write(data, n); });
    s.length = out.offset() - s.offset;
    dcp::Entry e;
    e.fqn = item.fqn;
    e.path = item.path;
    if (item.tensor.defined()) {
      e.is_tensor = true;
      e.dtype = dtype_name(item.tensor.scalar_type());
      e.size = item.tensor.sizes().vec();
      dcp::Chunk c;
      c.offsets.assign(e.size.size(), 0);
      c.sizes = e.size;
      c.storage = s;
      e.chunks.push_back(std::move(c));
    } else {
      e.bytes = s;
    }
    part.entries.push_back(std::move(e));
  }
  out.sync_and_close();
  write_file_atomically(report_path(step_path, rank), dcp::encode(part));
}

void commit(const std::string& step_path, int world, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  dcp::Metadata merged;
  for (int r = 0; r < world; ++r) {
    const std::string path = report_path(step_path, r);
    std::error_code ec;
    while (!fs::exists(path, ec)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<int> missing;
        for (int m = r; m < world; ++m) {
          if (!fs::exists(report_path(step_path, m), ec)) missing.push_back(m);
        }
        throw TimeoutError(fmt::format(
            "checkpoint {}: rank(s) {} did not report their shard within {} ms; the checkpoint "
            "stays incomplete (the previous one is still the newest). Is {} on a file system "
            "every rank sees?",
            step_path, fmt::join(missing, ","), timeout.count(), step_path));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    dcp::Metadata part = dcp::decode(read_shard_file(path), path);
    for (auto& e : part.entries) merged.entries.push_back(std::move(e));
  }
  std::random_device rd;
  merged.save_id = fmt::format("ddp-{:08x}{:08x}", rd(), rd());
  write_file_atomically(step_path + "/.metadata", dcp::encode(merged));
  for (int r = 0; r < world; ++r) {
    std::error_code ec;
    fs::remove(report_path(step_path, r), ec);
  }
}

}  // namespace ddp::checkpoint
