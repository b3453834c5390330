#pragma once
// HashStore: an in-process Store for ranks that are threads of one process (tests, world 1).
// Thread-safe; blocking calls wait on a condition variable, bounded by the timeout.

#include <condition_variable>
#include <map>
#include <mutex>

#include "ddp/store/store.hpp"

namespace ddp {

class HashStore : public Store {
 public:
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

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

}  // namespace ddp
