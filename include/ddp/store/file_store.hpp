#pragma once
// FileStore: a Store kept in one file on a filesystem every process can see (NFS, Lustre,
// GPFS): the fallback for clusters whose nodes cannot open ports to each other
// (c10d's FileStore, init_method="file://...").
//
// Format: an append-only log (header "DDPFSv1\n", then records op | key length | value length
// | key | value, integers u32 little-endian; op 'S' sets, 'D' deletes). Writers append one
// record per write() under an exclusive flock; readers replay new records under a shared
// flock. A record cut short by a writer that died mid-write is ignored, and removed by the
// next writer. Locks are taken with LOCK_NB and retried, so a stuck lock holder is a
// TimeoutError, not a hang. Blocking get/wait re-read the file when it grows, polling with a
// backoff (1 ms doubling to 50 ms) bounded by the timeout.
//
// The file grows with every write and is never compacted; remove it between jobs (the store
// never deletes it, since another process may still be using it). Thread-safe.

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp {

class FileStore : public Store {
 public:
  // Opens or creates path. Throws StoreError naming the path if it cannot, or if the file is
  // not a FileStore log.
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  const std::string& path() const { return path_; }

 private:
  class Lock;  // RAII flock with a deadline (file_store.cpp)

  // Replays records appended since the last call. With `exclusive`, also cuts off a torn
  // trailing record. Requires the flock and mutex_.
  void refresh_locked(bool exclusive);
  // Appends records (pairs of key, value; op 'S' or 'D') after the last complete record (a torn
  // tail is cut off first). Requires the exclusive flock.
  void append_locked(char op, const std::vector<std::pair<std::string, std::string>>& records);
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout);
  bool has_all(const std::vector<std::string>& keys) const;

  std::string path_;
  int fd_ = -1;
  std::mutex mutex_;
  std::map<std::string, std::string> data_;
  uint64_t offset_ = 0;  // bytes of the log already replayed into data_
};

}  // namespace ddp
