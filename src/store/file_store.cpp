#include "ddp/store/file_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr char kHeader[] = "DDPFSv1\n";
constexpr size_t kHeaderBytes = sizeof(kHeader) - 1;
constexpr size_t kRecordHeaderBytes = 9;  // op u8, key length u32, value length u32
constexpr Ms kFirstPoll{1};
constexpr Ms kMaxPoll{50};

uint32_t load_u32(const char* p) {
  auto b = reinterpret_cast<const uint8_t*>(p);
  return uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
}

void append_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void sleep_until_at_most(Ms step, Clock::time_point deadline) {
  auto now = Clock::now();
  if (now < deadline) std::this_thread::sleep_for(std::min<Clock::duration>(step, deadline - now));
}

}  // namespace

// flock held for one operation; acquisition is retried (LOCK_NB) until the deadline.
class FileStore::Lock {
 public:
  Lock(int fd, bool exclusive, const std::string& path, Ms limit) : fd_(fd) {
    auto deadline = deadline_after(limit);
    Ms step = kFirstPoll;
    for (;;) {
      if (flock(fd_, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return;
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        throw StoreError(
            fmt::format("FileStore at {}: cannot lock the file: {}", path, std::strerror(errno)));
      }
      if (Clock::now() >= deadline) {
        throw TimeoutError(fmt::format(
            "FileStore at {}: could not lock the file within {} ms; another process holds the "
            "lock (is one stopped or hung?)",
            path, limit.count()));
      }
      sleep_until_at_most(step, deadline);
      step = std::min(step * 2, kMaxPoll);
    }
  }
  ~Lock() { flock(fd_, LOCK_UN); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, Ms timeout) : path_(std::move(path)) {
  timeout_ = timeout;
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw StoreError(
        fmt::format("FileStore: cannot open '{}': {}; the directory must exist and "
                    "be writable by every process (a shared filesystem)",
                    path_, std::strerror(errno)));
  }
  try {
    std::lock_guard<std::mutex> guard(mutex_);
    Lock lock(fd_, /*exclusive=*/true, path_, timeout_);
    struct stat st {};
    if (fstat(fd_, &st) == 0 && st.st_size == 0) {
      if (::write(fd_, kHeader, kHeaderBytes) != static_cast<ssize_t>(kHeaderBytes)) {
        throw StoreError(fmt::format("FileStore at {}: cannot write the header: {}", path_,
                                     std::strerror(errno)));
      }
    }
    refresh_locked(/*exclusive=*/true);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

FileStore::~FileStore() {
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::refresh_locked(bool exclusive) {
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    throw StoreError(fmt::format("FileStore at {}: stat failed: {}", path_, std::strerror(errno)));
  }
  auto size = static_cast<uint64_t>(st.st_size);
  if (size == offset_) return;
  if (size < offset_) {
    throw StoreError(
        fmt::format("FileStore at {}: the file shrank from {} to {} bytes; it was "
                    "replaced or truncated while in use (remove it only between "
                    "jobs)",
                    path_, offset_, size));
  }
  std::string bytes(size - offset_, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = pread(fd_, bytes.data() + got, bytes.size() - got, offset_ + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  size_t pos = 0;
  if (offset_ == 0) {
    if (bytes.size() < kHeaderBytes || bytes.compare(0, kHeaderBytes, kHeader) != 0) {
      throw StoreError(
          fmt::format("FileStore at {}: the file is not a ddp FileStore (bad "
                      "header); remove it or choose another path",
                      path_));
    }
    pos = kHeaderBytes;
  }
  while (bytes.size() - pos >= kRecordHeaderBytes) {
    char op = bytes[pos];
    uint64_t klen = load_u32(&bytes[pos + 1]);
    uint64_t vlen = load_u32(&bytes[pos + 5]);
    if (op != 'S' && op != 'D') {
      throw StoreError(
          fmt::format("FileStore at {}: corrupt record at byte {}; the file was "
                      "written by something else: remove it",
                      path_, offset_ + pos));
    }
    if (bytes.size() - pos - kRecordHeaderBytes < klen + vlen) break;  // torn tail
    std::string key = bytes.substr(pos + kRecordHeaderBytes, klen);
    if (op == 'S') {
      data_[key] = bytes.substr(pos + kRecordHeaderBytes + klen, vlen);
    } else {
      data_.erase(key);
    }
    pos += kRecordHeaderBytes + klen + vlen;
  }
  offset_ += pos;
  if (exclusive && offset_ < size) {
    // A writer died mid-record; nobody else can be writing now (we hold the exclusive lock).
    if (ftruncate(fd_, static_cast<off_t>(offset_)) != 0) {
      throw StoreError(fmt::format("FileStore at {}: cannot remove a torn record: {}", path_,
                                   std::strerror(errno)));
    }
  }
}

void FileStore::append_locked(char op,
                              const std::vector<std::pair<std::string, std::string>>& records) {
  // Catch up first: this also cuts off a torn record left by a writer that died, so our
  // records (O_APPEND) follow the last complete one instead of the torn bytes, where the
  // replay below would stop and truncate them away.
  refresh_locked(/*exclusive=*/true);
  std::string bytes;
  for (const auto& [key, value] : records) {
    if (key.size() > UINT32_MAX || value.size() > UINT32_MAX) {
      throw UsageError(fmt::format("FileStore at {}: key or value over 4 GiB", path_));
    }
    bytes.push_back(op);
    append_u32(bytes, static_cast<uint32_t>(key.size()));
    append_u32(bytes, static_cast<uint32_t>(value.size()));
    bytes += key;
    bytes += value;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw StoreError(fmt::format("FileStore at {}: write failed: {} (disk full or quota?)", path_,
                                   std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  // Replay our own records so data_ and offset_ stay in step with the file.
  refresh_locked(/*exclusive=*/true);
}

void FileStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true, path_, timeout_);
  append_locked('S', {{key, value}});
}

void FileStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw UsageError(fmt::format("multi_set: {} keys but {} values; pass one value per key",
                                 keys.size(), values.size()));
  }
  std::vector<std::pair<std::string, std::string>> records;
  for (size_t i = 0; i < keys.size(); ++i) records.emplace_back(keys[i], values[i]);
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true, path_, timeout_);
  append_locked('S', records);
}

std::string FileStore::get(const std::string& key) {
  std::unique_lock<std::mutex> guard(mutex_);
  wait_locked(guard, {key}, timeout_);
  return data_.at(key);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true, path_, timeout_);
  refresh_locked(true);
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    try {
      size_t used = 0;
      current = std::stoll(it->second, &used);
      if (used != it->second.size()) throw std::invalid_argument("trailing bytes");
    } catch (const std::exception&) {
      throw StoreError(fmt::format(
          "FileStore at {}: add on key '{}': its value is not an integer; use a key that only "
          "add() writes",
          path_, key));
    }
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    throw StoreError(fmt::format("FileStore at {}: add on key '{}': {} + {} overflows int64", path_,
                                 key, current, delta));
  }
  append_locked('S', {{key, std::to_string(result)}});
  return result;
}

std::string FileStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true, path_, timeout_);
  refresh_locked(true);
  auto it = data_.find(key);
  if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
    append_locked('S', {{key, desired}});
    return desired;
  }
  return it == data_.end() ? expected : it->second;
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true, path_, timeout_);
  refresh_locked(true);
  if (data_.count(key) == 0) return false;
  append_locked('D', {{key, ""}});
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, false, path_, timeout_);
  refresh_locked(false);
  return static_cast<int64_t>(data_.size());
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, false, path_, timeout_);
  refresh_locked(false);
  return has_all(keys);
}

void FileStore::wait(const std::vector<std::string>& keys, Ms timeout) {
  std::unique_lock<std::mutex> guard(mutex_);
  wait_locked(guard, keys, timeout);
}

bool FileStore::has_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return data_.count(key) > 0; });
}

void FileStore::wait_locked(std::unique_lock<std::mutex>& guard,
                            const std::vector<std::string>& keys, Ms timeout) {
  auto start = Clock::now();
  auto deadline = deadline_after(timeout);
  Ms step = kFirstPoll;
  for (;;) {
    {
      Lock lock(fd_, false, path_,
                std::max(Ms{0}, std::chrono::duration_cast<Ms>(deadline - Clock::now())));
      refresh_locked(false);
    }
    if (has_all(keys)) return;
    if (Clock::now() >= deadline) break;
    // Let other threads use the store while this one sleeps.
    guard.unlock();
    sleep_until_at_most(step, deadline);
    step = std::min(step * 2, kMaxPoll);
    guard.lock();
  }
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  auto elapsed = std::chrono::duration_cast<Ms>(Clock::now() - start);
  throw TimeoutError(
      fmt::format("FileStore at {}: timed out after {} ms (limit {} ms) waiting "
                  "for keys [{}]",
                  path_, elapsed.count(), timeout.count(), fmt::join(missing, ", ")));
}

}  // namespace ddp
